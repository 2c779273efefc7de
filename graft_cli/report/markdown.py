"""Markdown table rendering shared by reports and plans."""

from __future__ import annotations


def md_table(columns: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return "\n".join(out)
