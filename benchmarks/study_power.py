"""Where a published study's variance comes from, what a design would buy, and whether its interval keeps its 95%.

    python benchmarks/study_power.py                       # results/tiny/claims.json, the plan's design
    python benchmarks/study_power.py --studies 2000 --json out.json

From a claims file's ``measured`` section (per-seed, per-problem pass@1 of each arm; its sampling variance from the
file, or from the pass rates and the samples per problem it was evaluated with, ``--samples``): per claim and model
the decomposition of Var(Δ̂) (graft_cli/report/power.py), the projected half-width of the plan's design (its seeds
and per-benchmark runs, experiments/reproduce/<plan>.yaml), and the coverage of today's and the proposed intervals
in simulated studies (graft_cli/report/coverage.py), and the coverage of the sequential rule a study used
(``--looks``: judged at looks, extended while the half-width exceeds ``--stop-target``; the repeated confidence
intervals of graft_cli/report/sequential.py beside the intervals read as if the design had been fixed). Prints
markdown tables; ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from graft_cli.plan.spec import load_reproduce  # noqa: E402
from graft_cli.report.coverage import components, coverage_table, sequential_coverage  # noqa: E402
from graft_cli.report.markdown import md_table  # noqa: E402
from graft_cli.report.power import EvalDesign, binomial_variance, projected_half_width  # noqa: E402
from graft_cli.report.stats import compare  # noqa: E402

CLAIMS = {"graft_beats_grpo": ("graft", "grpo"), "gate_matters": ("graft", "graft_nogate")}


def with_eval_var(measured: dict, samples: dict[str, int]) -> dict:
    """``measured`` with ``eval_var`` from the per-problem pass rates where the file has none (0/1 grades)."""
    if measured.get("eval_var"):
        return measured
    ev = {run: {pol: {s: {b: binomial_variance(np.asarray(a), samples[b]) for b, a in bb.items()}
                      for s, bb in seeds.items()} for pol, seeds in pols.items()}
          for run, pols in measured["problems"].items()}
    return {**measured, "eval_var": ev}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--claims", default=os.path.join(ROOT, "results", "tiny", "claims.json"))
    ap.add_argument("--plan", default="tiny", help="the plan whose design is projected (experiments/reproduce/)")
    ap.add_argument("--samples", type=int, default=4, help="0/1 grades per problem in the file's evaluation, where "
                                                           "it records no sampling variance")
    ap.add_argument("--studies", type=int, default=1000, help="simulated studies per coverage cell")
    ap.add_argument("--n-boot", type=int, default=400, help="bootstrap replicates of today's interval (simulation)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--also-seeds", default="", help="more designs to simulate: seed counts at the file's samples, "
                                                      "e.g. 2,3")
    ap.add_argument("--json", default=None)
    ap.add_argument("--looks", default="9,13,18", help="sequential looks (seeds) whose rule is simulated; empty: none")
    ap.add_argument("--stop-target", type=float, default=1.0,
                    help="stop at the first look whose paired-t half-width is at most this (points); the rule "
                         "results/tiny's extensions followed")
    ap.add_argument("--seq-studies", type=int, default=500, help="simulated studies per sequential row")
    a = ap.parse_args()

    t0 = time.time()
    measured = json.load(open(a.claims))["measured"]
    first_arm = next(iter(measured["problems"].values()))  # policy -> seed -> benchmark -> per-problem pass@1
    benches = sorted(next(iter(next(iter(first_arm.values())).values())))
    measured = with_eval_var(measured, {b: a.samples for b in benches})
    plan = load_reproduce(a.plan)
    seeds = {r.name: 0 for r in plan.runs}
    for r in plan.runs:
        seeds[r.name] += 1
    factors = {b: plan.eval.bench_runs.get(b, plan.eval.runs) * (plan.eval.samples or 8) / a.samples for b in benches}
    out: dict = {"claims_file": os.path.relpath(a.claims, ROOT), "plan": a.plan, "factors": factors, "rows": []}

    rows = []
    for key, (x, y) in CLAIMS.items():
        for pol in measured["policies"]:
            probs, evar = measured["problems"], measured["eval_var"]
            c = compare({"x": probs[x][pol], "y": probs[y][pol]}, "x", "y", n_boot=2000,
                        eval_var={"x": evar[x][pol], "y": evar[y][pol]})
            d = c["decomposition"]
            n_plan = min(seeds.get(x, 0), seeds.get(y, 0))
            proj = projected_half_width(d["per_seed"], n_plan, factors)
            rec = {"claim": key, "model": pol, "seeds": d["n"][0], "interval": c["interval"],
                   "bootstrap": c["bootstrap"], "parts": {k: d[k] for k in ("seeds", "evaluation", "problems")},
                   "shares": d["shares"], "per_seed": d["per_seed"], "plan_seeds": n_plan, "projected": proj}
            out["rows"].append(rec)
            hw = (c["interval"][2] - c["interval"][1]) / 2
            bw = (c["bootstrap"][2] - c["bootstrap"][1]) / 2
            inside = d["seeds"] + d["evaluation"]  # the interval's variance: V_T + V_E (V_P is beside it)
            rows.append([key, pol, str(d["n"][0]), f"{hw:.2f}", f"{bw:.2f}",
                         *[f"{d[k]:.3f} ({100 * d[k] / inside:.0f}% of V_T+V_E)" for k in ("seeds", "evaluation")],
                         f"{d['problems']:.3f} ({100 * d['problems'] / inside:.0f}% of V_T+V_E, outside the interval)",
                         f"{d['per_seed']['training']:.2f}", f"{d['per_seed']['evaluation']:.2f}",
                         f"{n_plan}: {proj:.2f}"])
    print(f"## Variance of the claims in {out['claims_file']} (points²)\n")
    print(md_table(["Claim", "Model", "Seeds", "Paired t ±", "Bootstrap ±", "Var: seeds", "Var: evaluation",
                    "Var: problems", "σ²_T per pair", "σ²_E per pair", f"Plan {a.plan}: seeds: projected ±"], rows))

    four = {b: a.samples for b in benches}
    planned = {b: int(round(a.samples * factors[b])) for b in benches}
    today = len(measured["problems"]["graft"][measured["policies"][0]])
    designs = [EvalDesign(int(n), four) for n in a.also_seeds.split(",") if n.strip()]
    designs += [EvalDesign(today, four), EvalDesign(seeds["graft"], planned)]
    cov_rows, out["coverage"] = [], []
    procs = ("bootstrap", "welch", "paired_t", "floored_t")
    nulls_done: set = set()
    for key, (x, y) in CLAIMS.items():
        for pol in measured["policies"]:
            comp = components(measured, x, y, pol)
            for r in coverage_table(comp, designs, studies=a.studies, seed=a.seed, n_boot=a.n_boot):
                if r["truth"] == "Δ = 0":  # the null (y := x) depends on arm x alone: one row per model and x arm
                    if (pol, x, r["design"], r["shifts"]) in nulls_done:
                        continue
                    nulls_done.add((pol, x, r["design"], r["shifts"]))
                    r = {**r, "null_of": x}
                out["coverage"].append({"claim": key if r["truth"] != "Δ = 0" else f"null of {x}", "model": pol, **r})
                cov_rows.append([key if r["truth"] != "Δ = 0" else f"(null: {x} vs itself)", pol, r["design"],
                                 r["truth"], f"{r['true_delta']:+.2f}", r["shifts"],
                                 *[f"{100 * r[p]['coverage']:.1f}% (±{r[p]['half_width']:.2f})" for p in procs]])
    print(f"\n## Coverage of 95% intervals ({a.studies} simulated studies per row, seed {a.seed}; training shifts "
          "from each arm's own σ_T, sampling binomial at the design's samples)\n")
    print(md_table(["Claim", "Model", "Design", "Truth", "Δ (pts)", "Shifts", "Bootstrap", "Welch t",
                    "Paired t", "Floored t (of record)"], cov_rows))
    if a.looks:
        looks = [int(n) for n in a.looks.split(",")]
        samples = {b: plan.eval.bench_runs.get(b, plan.eval.runs) * (plan.eval.samples or 8) for b in benches}
        seq_rows, out["sequential"] = [], []
        for key, (x, y) in CLAIMS.items():
            for pol in measured["policies"]:
                comp = components(measured, x, y, pol)
                r = sequential_coverage(comp, looks, samples, studies=a.seq_studies, seed=a.seed,
                                        target=a.stop_target)
                out["sequential"].append({"claim": key, "model": pol, **r})
                seq_rows.append([key, pol, f"{r['true_delta']:+.2f}",
                                 " / ".join(f"{n}: {100 * c / a.seq_studies:.0f}%" for n, c in r["stops"].items()),
                                 *[f"{100 * r[p]['coverage']:.1f}% ({100 * r[p]['simultaneous']:.1f}%) "
                                   f"±{r[p]['half_width']:.2f}" for p in ("naive", "floored", "rci")]])
        stop = (f"stopped at the first look with a paired-t half-width ≤ {a.stop_target:g}, else at the last"
                if a.stop_target is not None else "judged at the last look")
        print(f"\n## Coverage of the sequential rule (looks {looks}, O'Brien-Fleming; {stop}; {a.seq_studies} "
              "simulated studies per row): at the stopping look (and at every look)\n")
        print(md_table(["Claim", "Model", "Δ (pts)", "Stops", "Paired t as if fixed", "Floored t as if fixed",
                        "Repeated CI (floored, of record)"], seq_rows))
    out["seconds"] = round(time.time() - t0, 1)
    print(f"\n({out['seconds']} s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=float)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
