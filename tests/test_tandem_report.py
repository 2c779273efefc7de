"""The Tandem RLVR claims report (graft_cli/report/tandem_claims.py) and its statistics (graft_cli/report/stats.py).

Every expected value is worked by hand in a comment next to the data that produces it."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from graft_cli.report.stats import equivalence_verdict, hierarchical_bootstrap
from graft_cli.report.tandem_claims import judge, measure, write_claims

A = np.array


# ------------------------------------------------------------------------------------------ the bootstrap
def test_bootstrap_collapses_on_a_constant_paired_difference():
    # every seed of an arm is the same array and x − y = 0.25 on every problem: any resample of seeds and (shared)
    # problems gives Δ = 0.25, although the problems' own scores vary
    a = A([0.0, 0.25, 1.0, 0.5])
    d, lo, hi = hierarchical_bootstrap({1: a + 0.25, 2: a + 0.25, 3: a + 0.25}, {1: a, 2: a}, n_boot=200)
    assert (d, lo, hi) == pytest.approx((0.25, 0.25, 0.25))
    # two benchmarks, constant differences +0.25 (4 problems) and −0.5 (2 problems): the macro is the unweighted
    # mean over benchmarks (0.25 − 0.5)/2 = −0.125, not the pooled mean over the 6 problems (1 − 1)/6 = 0
    b = A([1.0, 0.5])
    x = {0: [a + 0.25, b - 0.5]}
    y = {0: [a, b], 1: [a, b]}
    assert hierarchical_bootstrap(x, y, n_boot=200) == pytest.approx((-0.125, -0.125, -0.125))


def test_bootstrap_one_seed_per_arm_by_hand():
    # x = [1, 1, 0, 0.5] (mean 0.625), y = [0.5, 0, 0, 0.5] (mean 0.25): Δ = 0.375; the paired differences are
    # [0.5, 1, 0, 0], so every replicate's mean lies in [0, 1]
    x, y = {7: A([1.0, 1.0, 0.0, 0.5])}, {7: A([0.5, 0.0, 0.0, 0.5])}
    d, lo, hi = hierarchical_bootstrap(x, y, n_boot=500, seed=3)
    assert d == pytest.approx(0.375)
    assert 0.0 <= lo < d < hi <= 1.0
    assert hierarchical_bootstrap(x, y, n_boot=500, seed=3) == (d, lo, hi)  # deterministic given the seed
    assert hierarchical_bootstrap(x, y, n_boot=500, seed=4) != (d, lo, hi)


def test_bootstrap_resamples_seeds():
    # x has seeds scoring 1 and 0 on every problem, y one seed at 0: Δ = 0.5. A replicate draws the two x seeds
    # with replacement: mean 0 (p = 1/4), 0.5 (1/2) or 1 (1/4), whatever the problems, so the 2.5% and 97.5%
    # percentiles of 2000 replicates are 0 and 1
    d, lo, hi = hierarchical_bootstrap({0: A([1.0, 1.0]), 1: A([0.0, 0.0])}, {0: A([0.0, 0.0])}, n_boot=2000)
    assert (d, lo, hi) == pytest.approx((0.5, 0.0, 1.0))


def test_bootstrap_none_cases():
    x = {0: A([1.0, 0.0])}
    assert hierarchical_bootstrap({}, x) is None and hierarchical_bootstrap(x, {}) is None
    assert hierarchical_bootstrap(x, {0: A([1.0, 0.0, 1.0])}) is None  # problem counts differ
    assert hierarchical_bootstrap({0: A([1.0, 0.0]), 1: A([1.0])}, x) is None  # within an arm too
    assert hierarchical_bootstrap({0: [A([1.0]), A([0.0])]}, {0: [A([1.0])]}) is None  # benchmark counts differ
    assert hierarchical_bootstrap({0: A([])}, {0: A([])}) is None  # no problems


@pytest.mark.parametrize("iv, want", [
    ((0.0, -1.0, 1.0), "held"),
    ((0.0, -2.0, 2.0), "held"),  # the margin's edges are inside
    ((2.0, 2.0, 2.0), "held"),
    ((0.0, -3.0, 3.0), "inconclusive"),
    ((1.5, 1.0, 3.0), "inconclusive"),
    ((-1.5, -3.0, -1.0), "inconclusive"),
    ((3.0, 2.01, 4.0), "did not hold"),
    ((-3.0, -4.0, -2.5), "did not hold"),
    (None, "not measured"),
])
def test_equivalence_verdict(iv, want):
    assert equivalence_verdict(iv, 2.0) == want


# ------------------------------------------------------------------------------------------ judge
def _problems(solo_t, solo_g, hand_t, hand_g):
    return {"problems": {"solo": {"tandem": solo_t, "grpo": solo_g}, "handoff": {"tandem": hand_t, "grpo": hand_g}}}


def test_judge_by_hand():
    b1, b2 = A([1.0, 0.5, 0.0]), A([0.5, 0.25])
    grpo = {0: {"b1": b1, "b2": b2}, 1: {"b1": b1, "b2": b2}}
    # solo: Tandem = GRPO + 0.01 everywhere → Δ = +1 pt, interval collapses → within ±2: held; Welch: the seeds
    # agree (se = 0) → (1, 1, 1). Tandem's extra benchmark b3 is not in GRPO's files and is left out.
    # handoff: Tandem = GRPO + 0.1 → Δ = +10 pts: held
    up = lambda arm, c: {s: {b: v + c for b, v in d.items()} for s, d in arm.items()}
    solo_t = {s: {**d, "b3": A([1.0])} for s, d in up(grpo, 0.01).items()}
    c1, c2 = judge(_problems(solo_t, grpo, up(grpo, 0.1), grpo), {"n_boot": 100})
    assert c1["key"] == "solo_matches_grpo" and c1["verdict"] == "held"
    assert c1["interval"] == pytest.approx((1.0, 1.0, 1.0)) and c1["welch"] == pytest.approx((1.0, 1.0, 1.0))
    assert c1["benchmarks"] == ["b1", "b2"] and c1["seeds"] == [2, 2]
    assert c2["key"] == "handoff_beats_grpo" and c2["verdict"] == "held"
    assert c2["interval"] == pytest.approx((10.0, 10.0, 10.0))
    assert c2["per_benchmark"]["b1"] == pytest.approx((10.0, 10.0, 10.0))
    # solo Δ = +5 pts (outside ±2) → did not hold; handoff Δ = −5 pts → did not hold
    c1, c2 = judge(_problems(up(grpo, 0.05), grpo, up(grpo, -0.05), grpo), {"n_boot": 100})
    assert (c1["verdict"], c2["verdict"]) == ("did not hold", "did not hold")
    # a wider margin (6 pts) makes the same +5 pts a match
    assert judge(_problems(up(grpo, 0.05), grpo, {}, grpo), {"n_boot": 100, "margin": 6.0})[0]["verdict"] == "held"
    # no Tandem handoff files, no GRPO at all → not measured
    c1, c2 = judge(_problems(grpo, {}, {}, grpo))
    assert (c1["verdict"], c2["verdict"]) == ("not measured", "not measured")
    assert c1["interval"] is None and c2["welch"] is None
    assert [c["verdict"] for c in judge({})] == ["not measured", "not measured"]


# ------------------------------------------------------------------------------------------ end to end
def _grades(p: float) -> list[float]:
    """Two samples with pass@1 p ∈ {0, 0.5, 1}."""
    return {0.0: [0.0, 0.0], 0.5: [1.0, 0.0], 1.0: [1.0, 1.0]}[p]


def write_eval(folder, problems: dict, pass_at_k: dict, senior_frac=None):
    """One run, two samples per problem; ``pass_at_k``: bench -> (pass@1, pass@2) as fractions."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump({"settings": {"samples": 2},
                   "benchmarks": {b: {"num_problems": len(v)} for b, v in problems.items()}}, f)
    for bench, ps in problems.items():
        rows = [{"benchmark": bench, "problem_id": f"{bench}-{i}", "problem_index": i, "run": 1, "sample": j,
                 "seed": 17, "answer": "1", "response": "…", "extracted": "1", "grade": g, "timed_out": False,
                 "truncated": False, "num_tokens": 10, **({} if senior_frac is None else {"senior_frac": senior_frac})}
                for i, p in enumerate(ps) for j, g in enumerate(_grades(p))]
        with open(os.path.join(folder, f"{bench}_run1.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in reversed(rows))  # order on disk does not matter
    pk = lambda v: {"mean": v, "std": None, "runs": [v]}
    benches = {b: {"mean": p1, "std": None, "num_samples": 2, "pass@k": {"1": pk(p1), "2": pk(p2)}}
               for b, (p1, p2) in pass_at_k.items()}
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump({"benchmarks": benches, "average": {"mean": float(np.mean([v[0] for v in pass_at_k.values()])),
                                                      "std": None, "runs": []}}, f)


def write_legibility(E, macro_ce):
    os.makedirs(os.path.join(E, "legibility"), exist_ok=True)
    with open(os.path.join(E, "legibility", "summary.json"), "w") as f:
        json.dump({"junior": "tiny-junior", "benchmarks": {"b1": {"ce": macro_ce, "ce_response_mean": macro_ce,
                                                                   "num_tokens": 40, "num_responses": 4}},
                   "macro_ce": macro_ce}, f)


SOLO = {"b1": [1.0, 0.5], "b2": [0.5, 0.0]}
SOLO_PK = {"b1": (0.75, 1.0), "b2": (0.25, 0.5)}  # macro pass@1 = 50 %, pass@2 = 75 %
# handoff per-problem pass@1: Tandem ≥ 0.5 where GRPO ≤ 0.5 on b1 and Tandem ≥ 0.5 where GRPO = 0 on b2
HANDOFF = {("tandem", 0): {"b1": [1.0, 1.0], "b2": [1.0, 0.5]},
           ("tandem", 1): {"b1": [1.0, 0.5], "b2": [0.5, 0.5]},
           ("grpo", 0): {"b1": [0.0, 0.0], "b2": [0.0, 0.0]},
           ("grpo", 1): {"b1": [0.5, 0.0], "b2": [0.0, 0.0]}}
HANDOFF_PK = {("tandem", 0): {"b1": (1.0, 1.0), "b2": (0.75, 1.0)},   # macro pass@1 87.5 %
              ("tandem", 1): {"b1": (0.75, 1.0), "b2": (0.5, 0.5)},   # 62.5 %
              ("grpo", 0): {"b1": (0.0, 0.0), "b2": (0.0, 0.0)},      # 0 %
              ("grpo", 1): {"b1": (0.25, 0.5), "b2": (0.0, 0.0)}}     # 12.5 %
SENIOR = {("tandem", 0): 0.6, ("tandem", 1): 0.4, ("grpo", 0): 0.5, ("grpo", 1): 0.5}
CE = {("tandem", 0): 1.2, ("tandem", 1): 1.4, ("grpo", 0): 2.0}  # GRPO seed 1 has no legibility files


def build_plan(root) -> list[dict]:
    records = []
    for name in ("tandem", "grpo"):
        for seed in (0, 1):
            d = os.path.join(root, f"{name}-s{seed}")
            E = os.path.join(d, "eval", "a", "step_000010")
            write_eval(E, SOLO, SOLO_PK)
            write_eval(os.path.join(E, "handoff"), HANDOFF[name, seed], HANDOFF_PK[name, seed], SENIOR[name, seed])
            if (name, seed) in CE:
                write_legibility(E, CE[name, seed])
            records.append({"name": name, "seed": seed, "dir": d, "scores": {"a": {"step": 10, "avg": 50.0}}})
    # a failed KL-Reg run: torn summary and run file; a GRPO n=16 run that never got evaluated (no step)
    E = os.path.join(root, "grpo_kl-s0", "eval", "a", "step_000010")
    os.makedirs(E)
    for f in ("summary.json", "b1_run1.jsonl"):
        with open(os.path.join(E, f), "w") as fh:
            fh.write('{"benchmarks": {"b1"')
    records.append({"name": "grpo_kl", "seed": 0, "dir": os.path.join(root, "grpo_kl-s0"),
                    "scores": {"a": {"step": 10, "avg": None}}})
    records.append({"name": "grpo_n16", "seed": 0, "dir": os.path.join(root, "missing"), "scores": {}})
    return records


def test_write_claims_end_to_end(tmp_path):
    records = build_plan(str(tmp_path / "runs"))
    report = tmp_path / "report"
    report.mkdir()
    (report / "report.md").write_text("# graft report\n\nintro\n\n## Table 1\n\n| x |\n")

    measured = measure(records)
    assert set(measured["problems"]["solo"]) == {"tandem", "grpo"}  # the torn KL-Reg files are not measured
    assert measured["arms"]["grpo_kl"]["solo"] == {} and "grpo_n16" not in measured["arms"]
    assert measured["problems"]["handoff"]["tandem"][1]["b1"] == pytest.approx([1.0, 0.5])

    md, claims = write_claims(str(report), records, {"n_boot": 2000})
    c1, c2 = claims
    # solo: both arms, both seeds have the same per-problem scores → Δ = 0 with a collapsed interval: held;
    # Welch: equal seeds (se = 0) → (0, 0, 0)
    assert c1["verdict"] == "held" and c1["interval"] == pytest.approx((0.0, 0.0, 0.0))
    assert c1["welch"] == pytest.approx((0.0, 0.0, 0.0)) and c1["benchmarks"] == ["b1", "b2"]
    # handoff, per benchmark mean over seeds and problems: Tandem b1 (1+1+1+.5)/4 = .875, b2 (1+.5+.5+.5)/4 = .625;
    # GRPO b1 (0+0+.5+0)/4 = .125, b2 0 → Δ = (.75 + .625)/2 = .6875 = +68.75 pts. Every paired per-problem
    # difference of seed-resampled means is ≥ .5 (Tandem ≥ [1, .5] and GRPO ≤ [.5, 0] on b1; ≥ .5 and 0 on b2)
    # and ≤ 1, so 50 ≤ lo ≤ hi ≤ 100: held.
    d, lo, hi = c2["interval"]
    assert d == pytest.approx(68.75) and 50.0 <= lo <= d <= hi <= 100.0 and c2["verdict"] == "held"
    # Welch over the seeds' macro pass@1: Tandem [(1 + .75)/2, (.75 + .5)/2] = [87.5, 62.5] (mean 75, var 312.5),
    # GRPO [0, (.25 + 0)/2] = [0, 12.5] (mean 6.25, var 78.125): se = √(156.25 + 39.0625) = 13.975425,
    # df = 195.3125² / (156.25² + 39.0625²) = 1.47 → t = 12.706: 68.75 ± 177.571748
    assert c2["welch"] == pytest.approx((68.75, -108.821748, 246.321748), abs=1e-5)
    assert c2["per_benchmark"]["b1"][0] == pytest.approx(75.0) and c2["per_benchmark"]["b2"][0] == pytest.approx(62.5)

    text = (report / "report.md").read_text()
    assert "## Tandem RLVR on this pair (from the measured numbers)" in text
    assert text.index("intro") < text.index("## Tandem RLVR") < text.index("## Table 1")  # before the first table
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in text.splitlines()
            if line.startswith("| ") and " | " in line}
    # Method, Run, Seeds, Solo pass@1,2,4,8, Handoff pass@1,2,4,8, senior share, CE
    t = rows["Tandem RLVR"]
    assert t[1:3] == ["tandem", "2"]
    assert t[3:7] == ["50.00 ± 0.00", "75.00 ± 0.00", "—", "—"]
    # handoff pass@1: [87.5, 62.5] → 75 ± 17.68; pass@2: [(1 + 1)/2, (1 + .5)/2] = [100, 75] → 87.5 ± 17.68
    assert t[7:11] == ["75.00 ± 17.68", "87.50 ± 17.68", "—", "—"]
    assert t[11] == "50.0 ± 14.1"  # senior share [60, 40] %
    assert t[12].rstrip(" |") == "1.300 ± 0.141"  # CE [1.2, 1.4]
    g = rows["GRPO"]
    assert g[7] == "6.25 ± 8.84" and g[11] == "50.0 ± 0.0" and g[12].rstrip(" |") == "2.000"  # CE: seed 0 only
    assert rows["KL-Reg GRPO"][1:4] == ["grpo_kl", "0", "—"] and rows["GRPO n=16"][2] == "0"
    assert "| 1 | Tandem RLVR matches vanilla GRPO on solo pass@1 (±2 pts) | held | +0.00 [+0.00, +0.00]" in text
    assert "+6.6 pts on AIME" in text and "tiny-junior" in text
    assert "![solo and handoff pass@k](plots/tandem_pass_at_k.png)" in text
    assert (report / "plots" / "tandem_pass_at_k.png").stat().st_size > 1000

    saved = json.loads((report / "claims.json").read_text())
    assert saved["settings"]["kind"] == "tandem" and saved["settings"]["n_boot"] == 2000
    assert [c["verdict"] for c in saved["claims"]] == ["held", "held"]
    assert saved["claims"][1]["interval"][0] == pytest.approx(68.75)
    assert saved["measured"]["arms"]["tandem"]["legibility_ce"] == [1.2, 1.4]
    assert saved["measured"]["arms"]["grpo"]["senior_frac"] == [0.5, 0.5]

    # a second write replaces the section instead of adding another
    write_claims(str(report), records, {"n_boot": 200})
    assert (report / "report.md").read_text().count("## Tandem RLVR on this pair") == 1
