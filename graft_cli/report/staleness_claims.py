"""What bounded staleness does to the science: one method at ``run.staleness`` 0 and k, side by side
(`graft reproduce --pair tiny_staleness`).

Reported, not judged against a paper (no paper runs GRAFT asynchronously). Per trained policy, for
the arm at staleness k (``k1``) against the arm at 0 (``k0``), seeds paired by number (the same data
order and sampling seeds):

1. **pass@1** — the eval average (macro over the evaluated sets, %) of the last checkpoint: Δ with
   the t-interval over the seeds' macro scores, paired, and the variance decomposition
   (:func:`graft_cli.report.stats.compare`).
2. **admitted** — the gate's admitted share of grafted responses, ``graft/frac_admitted``, the mean
   over steps of each seed's run (%): Δ with the paired t-interval over seeds
   (:func:`graft_cli.report.power.seed_interval`).
3. **peer clip** — the clipped share of grafted tokens, ``clip_ratio/peer``, the mean over the steps
   with grafted tokens (%): the same interval.

Reading of each Δ: ``differs`` when its 95% interval excludes 0, ``no difference resolved`` when it
straddles 0 (the half-width says how large an effect it rules out), ``not measured`` with fewer than
2 paired seeds. Beside them, the k arm's own staleness figures (mean over steps and seeds):
``async/staleness``, the truncated IS weight's clipped share and the behaviour-vs-proximal KL.
:func:`judge` is pure; :func:`measure` reads the run directories. """

from __future__ import annotations

import os

import numpy as np

from graft_cli.eval.files import read_problem_stats
from graft_cli.report.claims import pair_key, paired_eval_var, write_section
from graft_cli.report.markdown import md_table, mean_sd
from graft_cli.report.power import VARIANCE_COLUMNS, VARIANCE_NOTE, seed_interval, variance_row
from graft_cli.report.stats import compare
from graft_cli.rundir import atomic_write_json, eval_step_dir, read_metrics, training_rows

DEFAULTS = {"kind": "staleness", "k0": "graft", "k1": "graft_k1", "n_boot": 2000}
#: per-step training metrics averaged per seed: name in the report -> (metric, scale to %)
STEP_MEASURES = {"admitted": ("graft/frac_admitted", 100.0), "peer_clip": ("clip_ratio/peer", 100.0)}
#: the k arm's own staleness figures: label -> metric
STALENESS_FIGURES = {"staleness (versions)": "async/staleness",
                     "IS weight clipped share": "sampling/importance_sampling_ratio/clipped_fraction",
                     "KL(behaviour ‖ proximal)": "rollout_corr/kl"}
LABELS = {"pass1": "held-out pass@1 %", "admitted": "gate's admitted share %", "peer_clip": "grafted tokens clipped %"}


def settings(cfg: dict | None) -> dict:
    return {**DEFAULTS, **(cfg or {})}


def reading(iv) -> str:
    """``differs`` when the interval excludes 0, ``no difference resolved`` when it holds 0."""
    if iv is None:
        return "not measured"
    return "differs" if iv[1] > 0 or iv[2] < 0 else "no difference resolved"


# ----------------------------------------------------------------------------------------------- pure
def judge(measured: dict, cfg: dict | None = None) -> list[dict]:
    """One entry per (measure, policy): Δ = k1 − k0 with its paired 95% interval and its reading."""
    s = settings(cfg)
    out = []
    for pol in measured["policies"]:
        probs = {name: (measured["problems"].get(name) or {}).get(pol) or {} for name in (s["k1"], s["k0"])}
        if probs[s["k1"]] and probs[s["k0"]]:
            pev = ((measured.get("eval_var_paired") or {}).get(pair_key(s["k1"], s["k0"])) or {}).get(pol)
            ev = {name: (measured.get("eval_var", {}).get(name) or {}).get(pol) or {} for name in probs}
            c = compare(probs, s["k1"], s["k0"], int(s["n_boot"]), eval_var=ev, eval_var_paired=pev)
            iv, method, dec = c["interval"], c["method"], c["decomposition"]
        else:
            t = seed_interval(*(measured["scores"].get(n, {}).get(pol, {}) for n in (s["k1"], s["k0"])))
            iv, method, dec = (t or {}).get("interval"), "t over seeds", None
        out.append({"key": f"pass1/{pol}", "measure": "pass1", "policy": pol, "interval": iv, "method": method,
                    "decomposition": dec, "reading": reading(iv)})
        for m in STEP_MEASURES:
            per = measured["steps"].get(m, {})
            t = seed_interval(*((per.get(n) or {}).get(pol, {}) for n in (s["k1"], s["k0"])))
            iv = (t or {}).get("interval")
            out.append({"key": f"{m}/{pol}", "measure": m, "policy": pol, "interval": iv,
                        "method": (("paired t" if t["paired"] else "Welch t") + f" over {t['n'][0]} seeds")
                        if t else None, "decomposition": None, "reading": reading(iv)})
    return out


# ---------------------------------------------------------------------------------------------- measure
def step_means(run_dir: str) -> dict[str, dict[str, float]]:
    """metric -> policy -> mean over the training steps that log it (``metrics.jsonl``)."""
    vals: dict[str, dict[str, list]] = {}
    for r in training_rows(read_metrics(run_dir)):
        for metric, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v):
                vals.setdefault(metric, {}).setdefault(str(r.get("policy")), []).append(float(v))
    return {m: {p: float(np.mean(v)) for p, v in per.items()} for m, per in vals.items()}


def measure(records: list[dict], cfg: dict | None = None) -> dict:
    """From plan records (name, seed, dir, scores): per arm, policy and seed the eval average and
    its per-problem pass@1, the per-seed means of :data:`STEP_MEASURES`, and the k arm's
    :data:`STALENESS_FIGURES`."""
    s = settings(cfg)
    arms = (s["k0"], s["k1"])
    pols: list[str] = []
    scores: dict = {}
    problems: dict = {}
    eval_var: dict = {}
    steps: dict = {m: {} for m in STEP_MEASURES}
    stale: dict = {}
    for r in records:
        if r["name"] not in arms:
            continue
        seed = str(r["seed"])
        for p, sc in (r.get("scores") or {}).items():
            if sc.get("avg") is None:
                continue
            if p not in pols:
                pols.append(p)
            scores.setdefault(r["name"], {}).setdefault(p, {})[seed] = float(sc["avg"])
            if sc.get("step") is not None and r.get("dir"):
                arrays, var, _ = read_problem_stats(eval_step_dir(r["dir"], p, sc["step"]))
                if arrays:
                    problems.setdefault(r["name"], {}).setdefault(p, {})[seed] = arrays
                    eval_var.setdefault(r["name"], {}).setdefault(p, {})[seed] = var
        if not os.path.isdir(r.get("dir") or ""):
            continue
        means = step_means(r["dir"])
        for m, (metric, scale) in STEP_MEASURES.items():
            for p, v in (means.get(metric) or {}).items():
                steps[m].setdefault(r["name"], {}).setdefault(p, {})[seed] = scale * v
        if r["name"] == s["k1"]:
            for label, metric in STALENESS_FIGURES.items():
                for p, v in (means.get(metric) or {}).items():
                    stale.setdefault(p, {}).setdefault(label, []).append(v)
    return {"policies": pols, "scores": scores, "problems": problems, "eval_var": eval_var,
            "eval_var_paired": paired_eval_var(records, [(s["k1"], s["k0"])]), "steps": steps,
            "staleness": {p: {k: float(np.mean(v)) for k, v in f.items()} for p, f in stale.items()}}


# ---------------------------------------------------------------------------------------------- render
def arm_values(measured: dict, measure_key: str, name: str, pol: str) -> dict:
    src = measured["scores"] if measure_key == "pass1" else measured["steps"].get(measure_key, {})
    return (src.get(name) or {}).get(pol) or {}


def claims_markdown(claims: list[dict], measured: dict, cfg: dict | None = None) -> str:
    s = settings(cfg)
    rows = []
    for c in claims:
        iv = c["interval"]
        rows.append([LABELS[c["measure"]], c["policy"],
                     mean_sd(list(arm_values(measured, c["measure"], s["k0"], c["policy"]).values())),
                     mean_sd(list(arm_values(measured, c["measure"], s["k1"], c["policy"]).values())),
                     "—" if iv is None else f"{iv[0]:+.2f} [{iv[1]:+.2f}, {iv[2]:+.2f}]",
                     "—" if iv is None else f"{(iv[2] - iv[1]) / 2:.2f}", c["reading"], c["method"] or "—"])
    out = [f"## Staleness: `{s['k1']}` against `{s['k0']}` (from the measured numbers)", "",
           md_table(["Measure", "Policy", f"{s['k0']} (mean ± std over seeds)", f"{s['k1']}", "Δ k − 0 [95%]",
                     "half-width", "reading", "interval"], rows), "",
           "Reported, not judged against a paper. `differs`: the 95% interval excludes 0; `no difference "
           "resolved`: it holds 0, and rules out effects larger than its ends.", ""]
    if measured.get("staleness"):
        labels = list(STALENESS_FIGURES)
        out += [f"The `{s['k1']}` arm's own staleness figures (mean over steps and seeds):", "",
                md_table(["Policy", *labels], [[p, *(f"{f.get(k):.4g}" if f.get(k) is not None else "—"
                                                     for k in labels)] for p, f in measured["staleness"].items()]),
                ""]
    var_rows = [variance_row(f"{s['k1']} − {s['k0']}", c["policy"], c["decomposition"])
                for c in claims if c["measure"] == "pass1"]
    if any(r[2] != "—" for r in var_rows):
        out += ["### Where the variance comes from (pass@1)", "", md_table(VARIANCE_COLUMNS, var_rows), "",
                VARIANCE_NOTE, ""]
    return "\n".join(out)


def write_claims(report_dir: str, records: list[dict], cfg: dict | None = None) -> tuple[str, list[dict]]:
    """The staleness section into ``<report_dir>/report.md`` and ``claims.json``. Returns (markdown,
    claims)."""
    measured = measure(records, cfg)
    claims = judge(measured, cfg)
    md = claims_markdown(claims, measured, cfg)
    write_section(report_dir, md)
    atomic_write_json(os.path.join(report_dir, "claims.json"),
                      {"settings": settings(cfg), "measured": measured,
                       "claims": [{**c, "verdict": c["reading"]} for c in claims]})
    return md, claims
