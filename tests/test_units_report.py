"""Unit tests of the report's building blocks: markdown tables and mean ± sd cells (report/markdown.py), the
:class:`Table` and its markdown and LaTeX renderings (report/render.py), and the GRAFT paper's numbers with their
lookups (report/paper_numbers.py), checked against their own arithmetic (averages, deltas) computed here."""

from __future__ import annotations

import math
import statistics

import pytest

from graft_cli.report import paper_numbers as P
from graft_cli.report.markdown import md_table, mean_sd
from graft_cli.report.render import Table, fdelta, fmt, tex_escape, to_latex, to_markdown


# ============================================================================================ markdown.py
@pytest.mark.parametrize("xs,digits", [([1.0, 2.0, 3.0], 2), ([0.25, 1.0, 4.0, 9.5], 3), ([10, 11], 1)])
def test_mean_sd_is_mean_and_sample_std(xs, digits):
    """mean ± sample std (ddof 1) at ``digits`` decimals, computed here with the statistics module."""
    want = f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}"
    assert mean_sd(xs, digits) == want


def test_mean_sd_one_seed_and_none():
    """One value: the mean alone (no ±); no values: an em dash."""
    assert mean_sd([3.14159]) == "3.14"
    assert mean_sd([2.0], digits=0) == "2"
    assert mean_sd([]) == "—"


def test_md_table_header_separator_rows_and_pipe_escape():
    """A markdown table: header, one ``---`` per column, cells stringified and their pipes escaped."""
    out = md_table(["a", "b"], [[1, "x|y"], [None, 2.5]])
    assert out.splitlines() == ["| a | b |", "|---|---|", "| 1 | x\\|y |", "| None | 2.5 |"]
    assert md_table(["only"], []) == "| only |\n|---|"


# ============================================================================================== render.py
def _table():
    t = Table(key="t1", title="Pass@1 (%)", columns=["method", "math500", "avg"])
    t.add(["Pair 1", "", ""], "head")
    t.add(["GRPO", 72.08, "—"], "paper")
    t.add(["graft|x", "1.5±0.2", ""])
    t.notes.append("Seeds: 3.")
    return t


def test_table_add_stringifies_and_to_json_round_trips():
    """``add`` keeps each cell as a string with the row's style; ``to_json`` holds every field."""
    t = _table()
    assert t.rows[1] == ["GRPO", "72.08", "—"] and t.styles == ["head", "paper", None]
    assert t.to_json() == {"key": "t1", "title": "Pass@1 (%)", "columns": ["method", "math500", "avg"],
                           "rows": t.rows, "styles": ["head", "paper", None], "notes": ["Seeds: 3."]}


def test_to_markdown_styles_escapes_and_notes():
    """Markdown: a heading per table, head rows bold, paper rows italic (empty and — cells left bare), pipes escaped."""
    lines = to_markdown([_table()]).split("\n")  # the table ends in a newline
    assert lines == [
        "## Pass@1 (%)",
        "",
        "| method | math500 | avg |",
        "|---|---|---|",
        "| **Pair 1** |  |  |",
        "| *GRPO* | *72.08* | — |",
        "| graft\\|x | 1.5±0.2 |  |",
        "",
        "Seeds: 3.",
        "",
    ]


def test_to_latex_booktabs_layout():
    """LaTeX: caption and label from the table, ``l`` then ``c`` columns, head rows spanning, paper rows italic."""
    tex = to_latex([_table()]).splitlines()
    i = tex.index("\\begin{table}[t]")
    assert tex[i:i + 9] == ["\\begin{table}[t]", "\\centering", "\\small", "\\caption{Pass@1 (\\%)}",
                            "\\label{tab:t1}", "\\begin{tabular}{lcc}", "\\toprule", "method & math500 & avg \\\\",
                            "\\midrule"]
    assert tex[i + 9] == "\\multicolumn{3}{l}{\\textbf{Pair 1}} \\\\"
    assert tex[i + 10] == "\\textit{GRPO} & \\textit{72.08} & \\textit{--} \\\\"
    assert tex[i + 11] == "graft|x & 1.5$\\pm$0.2 &  \\\\"
    assert tex[i + 12:i + 16] == ["\\bottomrule", "\\end{tabular}", "\\\\[2pt]{\\footnotesize Seeds: 3.}",
                                  "\\end{table}"]


@pytest.mark.parametrize("raw,want", [
    ("a & b", "a \\& b"),
    ("50%", "50\\%"),
    ("x_1 #2", "x\\_1 \\#2"),
    ("{k}", "\\{k\\}"),
    ("1±2", "1$\\pm$2"),
    ("Δ ≥ δ", "$\\Delta$ $\\geq$ $\\delta$"),
    ("a — b ← Σ", "a -- b $\\leftarrow$ $\\Sigma$"),
])
def test_tex_escape_table(raw, want):
    """LaTeX's special characters and the report's symbols are escaped (table of cases)."""
    assert tex_escape(raw) == want


@pytest.mark.parametrize("cell,digits,want", [
    (None, 2, "—"),
    ((None, 1.0), 2, "—"),
    ((math.nan, 1.0), 2, "—"),
    ((37.064, None), 2, "37.06"),
    ((37.064, math.nan), 2, "37.06"),
    ((37.064, 0.671), 2, "37.06±0.67"),
    ((1.25, 0.05), 1, "1.2±0.1"),  # round-half-even on exact binary .25; 0.05 is above .05 in binary
    ((2.0, 0.0), 0, "2±0"),
])
def test_fmt_cells(cell, digits, want):
    """``fmt``: a (mean, std) cell, std omitted when None or nan, an em dash for a missing or nan mean."""
    assert fmt(cell, digits) == want


@pytest.mark.parametrize("d,want", [(None, "—"), (math.nan, "—"), (1.5, "+1.50"), (-0.254, "-0.25"), (0.0, "+0.00")])
def test_fdelta_signs(d, want):
    """``fdelta``: a signed two-decimal delta, an em dash when missing."""
    assert fdelta(d) == want


# ======================================================================================= paper_numbers.py
@pytest.mark.parametrize("s,want", [("72.08±0.52", (72.08, 0.52)), (" 35.17 ", (35.17, None)), ("—", None),
                                    ("-", None), ("", None), ("-1.5±0.25", (-1.5, 0.25))])
def test_cell_parsing(s, want):
    """A paper cell: ``mean±std`` → (mean, std), a bare mean → (mean, None), a dash → None."""
    assert P._cell(s) == want


def test_row_parsing_and_count_check():
    """A paper row: five benchmarks then the average after ``|``; a wrong count is refused naming the row."""
    r = P._row("graft", "1", "1±0.1 2 — 4±0.4 5 | 3.0±0.3", +1.5)
    assert r == {"method": "graft", "pair": "1", "math500": (1.0, 0.1), "aime24": (2.0, None), "aime25": None,
                 "amc23": (4.0, 0.4), "minerva": (5.0, None), "avg": (3.0, 0.3), "delta": 1.5}
    with pytest.raises(ValueError, match="expected 5 benchmark cells in '1 2 3 4 | 2.5'"):
        P._row("x", None, "1 2 3 4 | 2.5", None)


def _all_rows():
    for rs in P.TABLE1.values():
        yield from rs
    for rs in P.TABLE7.values():
        yield from rs
    for d in (*P.DELTA_SWEEP.values(), *P.TABLE8.values(), *P.TABLE6.values()):
        yield from d.values()
    for d in P.TABLE4.values():
        for dd in d.values():
            yield from dd.values()


def test_every_full_row_average_is_the_mean_of_its_benchmarks():
    """Each row with five benchmark means has an Avg within rounding (5 cells and the Avg at 2 decimals) of their
    mean: an OCR slip in a cell would break it."""
    n = 0
    for r in _all_rows():
        if all(r[b] is not None for b in P.BENCHMARKS):
            n += 1
            mean = sum(r[b][0] for b in P.BENCHMARKS) / 5
            assert abs(mean - r["avg"][0]) <= 0.0101, (r["method"], r["pair"], mean, r["avg"])
    assert n >= 60


def test_table1_deltas_are_against_grpo_n8_of_the_same_model():
    """Table 1's delta column is each row's Avg minus that model's GRPO n=8 Avg (to the paper's rounding)."""
    for model, rows in P.TABLE1.items():
        base = P.table1(model, "grpo", None)["avg"][0]
        for r in rows:
            if r["delta"] is not None:
                assert r["avg"][0] - base == pytest.approx(r["delta"], abs=0.011), (model, r["method"], r["pair"])


def test_ablation_deltas_are_against_full_graft():
    """Tables 7/8 and the δ sweep: delta = Avg − full GRAFT's Avg on the same receiver."""
    for model in ("smol", "qwen"):
        full = P.ablation(model, "graft")["avg"][0]
        methods = [r["method"] for r in P.TABLE7[model]] + list(P.DELTA_SWEEP) + list(P.TABLE8)
        for m in methods:
            r = P.ablation(model, m)
            if r["delta"] is not None:
                assert r["avg"][0] - full == pytest.approx(r["delta"], abs=0.011), (model, m)


def test_headline_numbers_follow_from_table1():
    """The headline mean and max delta of GRAFT over GRPO are those of Table 1's six GRAFT rows."""
    deltas = [r["delta"] for rs in P.TABLE1.values() for r in rs if r["method"] == "graft"]
    assert len(deltas) == 6
    assert sum(deltas) / 6 == pytest.approx(P.HEADLINE["mean_delta_graft_vs_grpo"], abs=5e-4)
    assert max(deltas) == P.HEADLINE["max_delta"]


def test_table5_averages_equal_table1():
    """Table 5's per-model Avg repeats Table 1's Pair-1 Avg wherever Table 1 has the method."""
    checked = 0
    for method, c in P.TABLE5.items():
        for model in ("smol", "qwen"):
            r = P.table1(model, method, "1")
            if r is not None:
                assert c[model]["avg"][0] == r["avg"][0], (method, model)
                checked += 1
    assert checked == 12  # grpo, n16, n32, hacpo, sgt, graft for both models


@pytest.mark.parametrize("model,want", [
    ("HuggingFaceTB/SmolLM3-3B-Base", "smol"), ("Qwen/Qwen3-1.7B-Base", "qwen"),
    ("/models/OctoThinker-3B-Hybrid-Base/", "octo"), ("/ckpt/SmolLM3-3B-Base", "smol"),
    ("Qwen/Qwen3-1.7B", None), ("", None), (None, None),
])
def test_model_key(model, want):
    """Hub ids and local copies named after them map to the paper's model keys; anything else to None."""
    assert P.model_key(model) == want


def test_lookups_by_model_method_pair():
    """The lookups pick the right row: GRPO baselines for any pair, pair-specific peers, pair 1 only for ablations."""
    assert P.table1("smol", "grpo", "3")["avg"] == (32.60, 0.49)
    assert P.table1("smol", "graft", "3")["avg"] == (33.26, 0.32)
    assert P.table1("smol", "graft", "1")["avg"] == (37.06, 0.67)
    assert P.table1("qwen", "graft", "3") is None  # Qwen is not in pair 3
    assert P.table1("nobody", "grpo", "1") is None
    assert P.ablation("qwen", "graft_nogate")["delta"] == -2.51
    assert P.ablation("smol", "graft_delta0p9")["avg"] == (36.14, 0.18)
    assert P.ablation("qwen", "graft_luffy")["avg"] == (31.41, 0.50)
    assert P.ablation("smol", "graft_nogate", pair="2") is None
    assert P.ablation("smol", "unknown_method") is None
    assert P.compute("graft", "1")["both"] == {"best": 40.9, "full": 43.3}
    assert P.compute("graft", "2") is None
    assert P.repeats("2", "octo", "graft")["delta"] == 2.05
    assert P.repeats(None, "octo", "graft") is None
    assert P.stored("3", "octo")["avg"] == (21.98, 0.33)
    assert P.stored("1", "octo") is None


def test_tex_escape_replaces_each_character_once():
    """A backslash becomes \\textbackslash{} whose braces stay braces; the other specials are escaped beside it."""
    from graft_cli.report.render import tex_escape

    assert tex_escape("a\\b") == "a\\textbackslash{}b"
    assert tex_escape("{x}_1 & 5% ± δ") == "\\{x\\}\\_1 \\& 5\\% $\\pm$ $\\delta$"


def test_compute_costs_split_each_step_by_the_policies_own_times():
    """Table 5's attribution: step s's wall-clock shared by each policy's rollout+reward+old-log-prob+update time;
    GPU-h = devices x Σ seconds / 3600, through a step or for the whole run."""
    from graft_cli.report import compute_table as CT

    class FakeRun:
        policies = [{"name": "a"}, {"name": "b"}]

        def train_rows(self):
            return [{"step": 1, "time/step": 10.0, "policy": "a", "time/rollout": 3.0, "time/update": 1.0},
                    {"step": 1, "time/step": 10.0, "policy": "b", "time/rollout": 4.0, "time/reward": 2.0},
                    {"step": 2, "time/step": 20.0, "policy": "a", "time/update": 5.0},
                    {"step": 2, "time/step": 20.0, "policy": "b", "time/old_logprob": 5.0}]

    c = CT._costs(FakeRun(), devices=8)
    assert c["steps"] == [1, 2] and c["joint"] == {1: 10.0, 2: 20.0}
    assert c["share"]["a"] == {1: 0.4, 2: 0.5} and c["share"]["b"] == {1: 0.6, 2: 0.5}
    assert CT._gpu_h(c, None) == pytest.approx(8 * 30.0 / 3600)
    assert CT._gpu_h(c, 1, "b") == pytest.approx(8 * 6.0 / 3600)
    assert CT._gpu_h(c, None, "a") == pytest.approx(8 * (4.0 + 10.0) / 3600)
