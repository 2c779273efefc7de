"""Markdown table rendering shared by reports and plans."""

from __future__ import annotations

import numpy as np


def mean_sd(xs, digits: int = 2) -> str:
    """mean ± sample std (ddof 1) over seeds; the mean alone for one seed; — for none."""
    if not len(xs):
        return "—"
    s = f"{float(np.mean(xs)):.{digits}f}"
    return s + (f" ± {float(np.std(xs, ddof=1)):.{digits}f}" if len(xs) > 1 else "")


def md_table(columns: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return "\n".join(out)
