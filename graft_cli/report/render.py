"""A report table (:class:`Table`: title, columns, rows with a style each, notes) and its markdown
and LaTeX renderings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field




@dataclass
class Table:
    key: str
    title: str
    columns: list
    rows: list = field(default_factory=list)  # list of cell lists (strings)
    styles: list = field(default_factory=list)  # per row: None | "paper" | "head"
    notes: list = field(default_factory=list)

    def add(self, cells, style=None):
        self.rows.append([str(c) for c in cells])
        self.styles.append(style)

    def to_json(self) -> dict:
        return {"key": self.key, "title": self.title, "columns": self.columns, "rows": self.rows,
                "styles": self.styles, "notes": self.notes}


# ------------------------------------------------------------------------------------------ rendering
def to_markdown(tables: list[Table]) -> str:
    out = []
    for t in tables:
        out.append(f"## {t.title}\n")
        out.append("| " + " | ".join(t.columns) + " |")
        out.append("|" + "|".join("---" for _ in t.columns) + "|")
        for row, style in zip(t.rows, t.styles):
            cells = [c.replace("|", "\\|") for c in row]
            if style == "paper":
                cells = [f"*{c}*" if c and c != "—" else c for c in cells]
            elif style == "head":
                cells = [f"**{c}**" if c else c for c in cells]
            out.append("| " + " | ".join(cells) + " |")
        for n in t.notes:
            out.append(f"\n{n}")
        out.append("")
    return "\n".join(out)


_TEX = [("\\", "\\textbackslash{}"), ("&", "\\&"), ("%", "\\%"), ("_", "\\_"), ("#", "\\#"), ("{", "\\{"),
        ("}", "\\}"), ("±", "$\\pm$"), ("Δ", "$\\Delta$"), ("δ", "$\\delta$"), ("←", "$\\leftarrow$"),
        ("Σ", "$\\Sigma$"), ("—", "--"), ("≥", "$\\geq$")]


_TEX_TABLE = str.maketrans(dict(_TEX))


def tex_escape(s: str) -> str:
    """``s`` with each character of ``_TEX`` replaced in one pass (a replacement is never escaped
    again)."""
    return s.translate(_TEX_TABLE)


def to_latex(tables: list[Table]) -> str:
    out = ["% graft report: tables in the layout of the GRAFT paper (booktabs)", ""]
    for t in tables:
        ncol = len(t.columns)
        out += ["\\begin{table}[t]", "\\centering", "\\small", f"\\caption{{{tex_escape(t.title)}}}",
                f"\\label{{tab:{t.key}}}", "\\begin{tabular}{l" + "c" * (ncol - 1) + "}", "\\toprule",
                " & ".join(tex_escape(c) for c in t.columns) + " \\\\", "\\midrule"]
        for row, style in zip(t.rows, t.styles):
            if style == "head":
                out.append(f"\\multicolumn{{{ncol}}}{{l}}{{\\textbf{{{tex_escape(row[0])}}}}} \\\\")
                continue
            cells = [tex_escape(c) for c in row]
            if style == "paper":
                cells = [f"\\textit{{{c}}}" if c else c for c in cells]
            out.append(" & ".join(cells) + " \\\\")
        out += ["\\bottomrule", "\\end{tabular}"]
        if t.notes:
            out.append("\\\\[2pt]{\\footnotesize " + tex_escape(" ".join(t.notes)) + "}")
        out += ["\\end{table}", ""]
    return "\n".join(out)


def fmt(cell, digits: int = 2) -> str:
    if cell is None or cell[0] is None or (isinstance(cell[0], float) and math.isnan(cell[0])):
        return "—"
    m, s = cell
    return f"{m:.{digits}f}" + (f"±{s:.{digits}f}" if s is not None and not math.isnan(s) else "")


def fdelta(d) -> str:
    return "—" if d is None or (isinstance(d, float) and math.isnan(d)) else f"{d:+.2f}"
