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
    c1, c2, *_ = judge(_problems(solo_t, grpo, up(grpo, 0.1), grpo), {"n_boot": 100})
    assert c1["key"] == "solo_matches_grpo" and c1["verdict"] == "held"
    assert c1["interval"] == pytest.approx((1.0, 1.0, 1.0)) and c1["welch"] == pytest.approx((1.0, 1.0, 1.0))
    assert c1["benchmarks"] == ["b1", "b2"] and c1["seeds"] == [2, 2]
    assert c2["key"] == "handoff_beats_grpo" and c2["verdict"] == "held"
    assert c2["interval"] == pytest.approx((10.0, 10.0, 10.0))
    assert c2["per_benchmark"]["b1"] == pytest.approx((10.0, 10.0, 10.0))
    # solo Δ = +5 pts (outside ±2) → did not hold; handoff Δ = −5 pts → did not hold
    c1, c2, *_ = judge(_problems(up(grpo, 0.05), grpo, up(grpo, -0.05), grpo), {"n_boot": 100})
    assert (c1["verdict"], c2["verdict"]) == ("did not hold", "did not hold")
    # a wider margin (6 pts) makes the same +5 pts a match
    assert judge(_problems(up(grpo, 0.05), grpo, {}, grpo), {"n_boot": 100, "margin": 6.0})[0]["verdict"] == "held"
    # no Tandem handoff files, no GRPO at all → not measured
    c1, c2, *_ = judge(_problems(grpo, {}, {}, grpo))
    assert (c1["verdict"], c2["verdict"]) == ("not measured", "not measured")
    assert c1["interval"] is None and c2["welch"] is None
    assert [c["verdict"] for c in judge({})] == ["not measured"] * 4


def test_judge_kl_and_legibility_by_hand():
    b1, b2 = A([1.0, 0.5, 0.0]), A([0.5, 0.25])
    kl = {0: {"b1": b1, "b2": b2}, 1: {"b1": b1, "b2": b2}}
    up = lambda arm, c: {s: {b: v + c for b, v in d.items()} for s, d in arm.items()}
    # claim 3: Tandem handoff = KL-Reg + 0.2 on every problem → Δ = +20 pts with a collapsed interval: held;
    # the GRPO arm plays no part in it
    m = {"problems": {"handoff": {"tandem": up(kl, 0.2), "grpo_kl": kl}}}
    c3 = judge(m, {"n_boot": 100})[2]
    assert c3["key"] == "handoff_beats_kl" and c3["verdict"] == "held"
    assert c3["interval"] == pytest.approx((20.0, 20.0, 20.0)) and c3["welch"] == pytest.approx((20.0, 20.0, 20.0))
    assert judge({"problems": {"handoff": {"tandem": up(kl, -0.2), "grpo_kl": kl}}}, {"n_boot": 100})[2][
        "verdict"] == "did not hold"
    # claim 4: per-problem CE; GRPO = Tandem + 0.05 nats on every finite problem → Δ = CE(GRPO) − CE(Tandem) =
    # +0.05 (collapsed): held. Problem 1 of c1 has no scored token in Tandem's seed 1 (NaN): it is left out of
    # every seed of both arms; c2 is all NaN in GRPO: dropped
    ce_t = {0: {"c1": A([1.0, 2.0, 3.0]), "c2": A([1.0])}, 1: {"c1": A([1.0, np.nan, 3.0]), "c2": A([1.0])}}
    ce_g = {0: {"c1": A([1.05, 2.05, 3.05]), "c2": A([np.nan])}}
    c4 = judge({"problems": {"legibility": {"tandem": ce_t, "grpo": ce_g}}}, {"n_boot": 100})[3]
    assert c4["verdict"] == "held" and c4["benchmarks"] == ["c1"] and c4["seeds"] == [1, 2]
    assert c4["interval"] == pytest.approx((0.05, 0.05, 0.05))
    # the other way (the tandem senior less legible) → did not hold
    c4 = judge({"problems": {"legibility": {"tandem": ce_g, "grpo": ce_t}}}, {"n_boot": 100})[3]
    assert c4["verdict"] == "did not hold" and c4["interval"] == pytest.approx((-0.05, -0.05, -0.05))


def test_finite_common():
    from graft_cli.report.tandem_claims import finite_common

    got = finite_common({"x": {0: {"b": A([1.0, np.nan, 2.0]), "c": A([1.0])}},
                         "y": {0: {"b": A([3.0, 4.0, np.nan])}, 1: {"b": A([5.0, 6.0, 7.0])}}}, "x", "y")
    # b: only problem 0 is finite everywhere; c: y's seeds lack it
    assert {n: {s: {b: v.tolist() for b, v in d.items()} for s, d in arm.items()} for n, arm in got.items()} == {
        "x": {0: {"b": [1.0]}}, "y": {0: {"b": [3.0]}, 1: {"b": [5.0]}}}
    assert finite_common({"x": {0: {"b": A([1.0])}}}, "x", "y") == {}


def _write_run_file(folder, bench, run, counts, n):
    """Problem i has ``counts[i]`` correct samples of ``n`` (the first ones)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{bench}_run{run}.jsonl"), "w") as f:
        for i, c in enumerate(counts):
            for j in range(n):
                row = {"problem_index": i, "sample": j, "run": run, "grade": 1.0 if j < c else 0.0}
                f.write(json.dumps(row) + "\n")


def test_pass_at_k_curve_by_hand(tmp_path):
    from graft_cli.eval.tandem_evals import pass_at_k_curve

    d = str(tmp_path / "e")
    # run 1, n = 4: problem 0 c = 1 → pass@k = 1 − C(3,k)/C(4,k) = .25, .5, .75, 1; problem 1 c = 2 →
    # 1 − C(2,k)/C(4,k) = .5, 5/6, 1, 1 → run means .375, 2/3, .875, 1; run 2: every sample correct → 1
    _write_run_file(d, "b1", 1, [1, 2], 4)
    _write_run_file(d, "b1", 2, [4, 4], 4)
    got = pass_at_k_curve(d)
    want = [(0.375 + 1) / 2, (2 / 3 + 1) / 2, (0.875 + 1) / 2, 1.0]
    assert sorted(got) == [1, 2, 3, 4] and [got[k] for k in (1, 2, 3, 4)] == pytest.approx(want)
    # a second benchmark with 2 samples: k ≤ 2 only, macro over both; b2 c = [1, 0] of 2 → .25, .5
    _write_run_file(d, "b2", 1, [1, 0], 2)
    got = pass_at_k_curve(d)
    assert sorted(got) == [1, 2]
    assert got[1] == pytest.approx((want[0] + 0.25) / 2) and got[2] == pytest.approx((want[1] + 0.5) / 2)
    # a malformed file leaves its benchmark out
    with open(os.path.join(d, "b2_run1.jsonl"), "w") as f:
        f.write('{"problem_index": 0')
    assert sorted(pass_at_k_curve(d)) == [1, 2, 3, 4]
    assert pass_at_k_curve(str(tmp_path / "none")) == {}


def test_legibility_problems_by_hand(tmp_path):
    from graft_cli.eval.tandem_evals import legibility_problems

    d = tmp_path / "leg"
    d.mkdir()
    rows = [{"problem_index": 0, "num_tokens": 4, "nll": 2.0}, {"problem_index": 0, "num_tokens": 4, "nll": 4.0},
            {"problem_index": 1, "num_tokens": 0, "nll": -0.0},  # no scored token
            {"problem_index": 2, "num_tokens": 2, "nll": 1.0}]
    (d / "b1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "bad.jsonl").write_text('{"problem_index": ')
    got = legibility_problems(str(d))
    # problem 0: (2 + 4) / (4 + 4) = .75; problem 1: NaN; problem 2: 1 / 2 = .5
    assert set(got) == {"b1"} and got["b1"][0] == pytest.approx(0.75) and np.isnan(got["b1"][1])
    assert got["b1"][2] == pytest.approx(0.5)


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
    """b1's two problems x two samples, every response 10 tokens at CE ``macro_ce``: per-problem CE = macro_ce."""
    os.makedirs(os.path.join(E, "legibility"), exist_ok=True)
    with open(os.path.join(E, "legibility", "summary.json"), "w") as f:
        json.dump({"junior": "tiny-junior", "benchmarks": {"b1": {"ce": macro_ce, "ce_response_mean": macro_ce,
                                                                   "num_tokens": 40, "num_responses": 4}},
                   "macro_ce": macro_ce}, f)
    with open(os.path.join(E, "legibility", "b1.jsonl"), "w") as f:
        for i in range(2):
            for j in range(2):
                f.write(json.dumps({"benchmark": "b1", "problem_index": i, "run": 1, "sample": j, "num_tokens": 10,
                                    "nll": 10 * macro_ce, "ce": macro_ce}) + "\n")


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

    # the by-hand intervals below are the unfloored paired t (the rule `paired_t`; floored_t is tested in
    # tests/test_registration.py)
    md, claims = write_claims(str(report), records, {"n_boot": 2000, "analysis": {"interval": "paired_t"}})
    c1, c2, c3, c4 = claims
    # solo: both arms, both seeds have the same per-problem scores → Δ = 0 with a collapsed interval: held;
    # Welch: equal seeds (se = 0) → (0, 0, 0)
    assert c1["verdict"] == "held" and c1["interval"] == pytest.approx((0.0, 0.0, 0.0))
    assert c1["welch"] == pytest.approx((0.0, 0.0, 0.0)) and c1["benchmarks"] == ["b1", "b2"]
    # handoff, per benchmark mean over seeds and problems: Tandem b1 (1+1+1+.5)/4 = .875, b2 (1+.5+.5+.5)/4 = .625;
    # GRPO b1 (0+0+.5+0)/4 = .125, b2 0 → Δ = (.75 + .625)/2 = .6875 = +68.75 pts. The interval of record pairs
    # the seeds' macro pass@1: Tandem [(1 + .75)/2, (.75 + .5)/2] = [87.5, 62.5], GRPO [0, (.25 + 0)/2] = [0, 12.5]
    # → d = [87.5, 50]: S_d = 37.5/√2, SE = 18.75, t(0.975, 1) = 12.7062047: 68.75 ± 238.241338, not significant
    d, lo, hi = c2["interval"]
    assert (d, lo, hi) == pytest.approx((68.75, 68.75 - 238.241338, 68.75 + 238.241338), abs=1e-4)
    assert c2["verdict"] == "underpowered" and c2["method"] == "paired t over 2 seeds"  # ±238 points
    # beside it the hierarchical bootstrap: every paired per-problem difference of seed-resampled means is ≥ .5
    # (Tandem ≥ [1, .5] and GRPO ≤ [.5, 0] on b1; ≥ .5 and 0 on b2) and ≤ 1, so 50 ≤ lo ≤ hi ≤ 100
    d, lo, hi = c2["bootstrap"]
    assert d == pytest.approx(68.75) and 50.0 <= lo <= d <= hi <= 100.0
    # Welch over the same seed scores: Tandem (mean 75, var 312.5), GRPO (mean 6.25, var 78.125):
    # se = √(156.25 + 39.0625) = 13.975425, df = 195.3125² / (156.25² + 39.0625²) = 1.47 → t(1) = 12.7062047:
    # 68.75 ± 177.574609
    assert c2["welch"] == pytest.approx((68.75, -108.824609, 246.324609), abs=1e-5)
    assert c2["per_benchmark"]["b1"][0] == pytest.approx(75.0) and c2["per_benchmark"]["b2"][0] == pytest.approx(62.5)
    # claim 3: the KL-Reg run's files are torn: not measured
    assert c3["key"] == "handoff_beats_kl" and c3["verdict"] == "not measured" and c3["interval"] is None
    # claim 4: CE(GRPO) − CE(Tandem) on b1's two problems: GRPO one seed at 2.0, Tandem seeds 1.2 and 1.4 → Δ = 0.7;
    # a replicate draws Tandem's seeds with replacement: mean 1.2 (p 1/4), 1.3 (1/2), 1.4 (1/4) → Δ 0.8, 0.7, 0.6,
    # so the 2.5% / 97.5% percentiles are 0.6 and 0.8: held. Welch needs 2 GRPO seeds: None
    assert c4["key"] == "more_legible_than_grpo" and c4["verdict"] == "held"
    assert c4["interval"] == pytest.approx((0.7, 0.6, 0.8)) and c4["welch"] is None and c4["benchmarks"] == ["b1"]

    text = (report / "report.md").read_text()
    assert "## Tandem RLVR on this pair (from the measured numbers)" in text
    assert text.index("intro") < text.index("## Tandem RLVR") < text.index("## Table 1")  # before the first table
    main = text[text.index("## Tandem RLVR"):text.index("### Claims")]  # the arms' table (the curves come after)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in main.splitlines()
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
    # pass@k curves k = 1..8 from the run files (two samples: k = 1, 2), not the summaries: solo b1 c = [2, 1] of 2
    # → pass@1 .75, pass@2 1 (one correct of two is always in a pair); b2 c = [1, 0] → .25, .5: macro 50 %, 75 % in
    # every seed; handoff Tandem seed 0: b1 [2, 2] → 1, 1; b2 [2, 1] → .75, 1: 87.5 %, 100 %; seed 1: b1 [2, 1] →
    # .75, 1; b2 [1, 1] → .5, 1: 62.5 %, 100 % (its summary's pass@2 .5 for b2 is not what its files hold) → mean
    # 75 %, 100 %; GRPO handoff seed 0: 0, 0; seed 1: b1 [1, 0] → .25, .5; b2 0 → 12.5 %, 25 % → 6.25 %, 12.5 %
    assert "| Tandem RLVR | solo | 2 | 50.00 | 75.00 | — | — | — | — | — | — |" in text
    assert "| Tandem RLVR | handoff | 2 | 75.00 | 100.00 | — |" in text
    assert "| GRPO | handoff | 2 | 6.25 | 12.50 | — |" in text
    assert "| 4 | Tandem RLVR is more legible to the junior than GRPO (lower legibility CE) | held | " \
           "+0.7000 [+0.6000, +0.8000] nats" in text
    assert (report / "plots" / "tandem_pass_at_k.png").stat().st_size > 1000

    saved = json.loads((report / "claims.json").read_text())
    assert saved["settings"]["kind"] == "tandem" and saved["settings"]["n_boot"] == 2000
    assert [c["verdict"] for c in saved["claims"]] == ["held", "underpowered", "not measured", "held"]
    assert saved["measured"]["arms"]["tandem"]["curve"]["handoff"]["2"] == pytest.approx([100.0, 100.0])
    assert saved["claims"][1]["interval"][0] == pytest.approx(68.75)
    assert saved["measured"]["arms"]["tandem"]["legibility_ce"] == [1.2, 1.4]
    assert saved["measured"]["arms"]["grpo"]["senior_frac"] == [0.5, 0.5]

    # a second write replaces the section instead of adding another
    write_claims(str(report), records, {"n_boot": 200})
    assert (report / "report.md").read_text().count("## Tandem RLVR on this pair") == 1
