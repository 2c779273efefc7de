"""The SAF-OPD paper's claims, judged from a miniature study's numbers (`graft reproduce --pair
tiny_saf`).

Claims (opd_saf.md §6):

1. **saf_beats_fixed** — SAF beats fixed-coefficient GRPO+OPD fusion on the aggregate score (the
   paper: in all 6 model × domain settings, by +0.51 to +2.70 points).
2. **fixed_collapses_entropy** — fixed fusion collapses the policy's entropy early in training, SAF
   does not (SAF "avoids entropy collapse and keeps entropy and response length higher").

Each claim is a difference with a 95% interval over seeds: 1. mean(SAF) − mean(fixed) of the eval
average (pass@1 %, macro over the evaluated sets), the t-interval over the seeds' scores paired
where both arms ran the same seeds, with its variance decomposition
(:func:`graft_cli.report.stats.compare`; the Welch interval over the recorded averages where the
per-problem files are missing); 2. the relative entropy drop over the early window (steps
1..``early_steps``: 1 − H(end of window)/H(step 1), H the token-mean policy entropy logged in
training) of fixed fusion minus SAF's. Verdict: ``held`` when the interval excludes 0 in the paper's
direction, ``not significant`` when it straddles 0, ``did not hold`` when it excludes 0 the other
way, ``not measured`` with fewer than 2 seeds on a side. :func:`judge` is pure; :func:`measure`
reads the run directories. """

from __future__ import annotations

import os

import numpy as np

from graft_cli.report.claims import pair_key, paired_eval_var, write_section
from graft_cli.report.markdown import md_table, mean_sd
from graft_cli.report.power import VARIANCE_COLUMNS, VARIANCE_NOTE, variance_row
from graft_cli.eval.files import read_problem_stats
from graft_cli.report.stats import compare, verdict, welch_interval
from graft_cli.rundir import eval_step_dir
from graft_cli.rundir import atomic_write_json, read_metrics

DEFAULTS = {"kind": "saf", "grpo": "grpo", "fixed": "grpo_opd", "saf": "saf", "opd_only": "opd_only",
            "early_steps": 10, "policy": "a", "label": "math", "arms": [], "n_boot": 2000}
PAPER = {"saf_beats_fixed": "SAF > fixed fusion in 6/6 settings, +0.51 to +2.70 pp aggregate (per-method numbers "
                            "[U]); 4B ablation: magnitude control alone 44.35% vs fixed fusion 44.38%",
         "fixed_collapses_entropy": "fixed fusion's entropy collapses early; SAF keeps entropy and response length "
                                    "higher (curves only, no numbers)"}


def settings(cfg: dict | None) -> dict:
    return {**DEFAULTS, **(cfg or {})}


def arms(cfg: dict | None) -> list[dict]:
    """The settings of each arm the claims are judged on: the plan's ``claims`` (label ``math`` by
    default), then each entry of its ``arms`` (e.g. ``{label: code, grpo: grpo_code, fixed:
    grpo_opd_code, saf: saf_code, opd_only: opd_only_code}``), which inherits what it does not set.
    The paper judges SAF in both domains."""
    base = settings(cfg)
    out = [{**base, "arms": []}]
    for a in base["arms"] or []:
        if not isinstance(a, dict) or not a.get("label"):
            raise ValueError(f"claims.arms: each entry needs a label, got {a!r}")
        out.append({**base, "arms": [], **a})
    return out


def entropy_drop(curve: dict[int, float], early_steps: int) -> float | None:
    """1 − H(last step ≤ early_steps)/H(first step): the relative entropy lost over the early
    window."""
    steps = sorted(s for s in curve if s <= early_steps)
    if len(steps) < 2 or not curve[steps[0]]:
        return None
    return 1.0 - curve[steps[-1]] / curve[steps[0]]


# ----------------------------------------------------------------------------------------------- pure
def judge(measured: dict, cfg: dict | None = None) -> list[dict]:
    s = settings(cfg)
    sc, drops = measured["scores"], measured["entropy_drop"]
    probs = measured.get("problems") or {}
    if probs.get(s["saf"]) and probs.get(s["fixed"]):
        pev = ((measured.get("eval_var_paired") or {}).get(pair_key(s["saf"], s["fixed"])) or {}).get(s["policy"])
        c = compare(probs, s["saf"], s["fixed"], int(s["n_boot"]), eval_var=measured.get("eval_var"),
                    eval_var_paired=pev)
        iv1, method, dec = c["interval"], c["method"] or "—", c["decomposition"]
    else:
        iv1, method, dec = welch_interval(sc.get(s["saf"], []), sc.get(s["fixed"], [])), "Welch t over seeds", None
    iv2 = welch_interval(drops.get(s["fixed"], []), drops.get(s["saf"], []))
    return [
        {"key": "saf_beats_fixed", "claim": "SAF beats fixed-coefficient fusion (aggregate score)",
         "paper": PAPER["saf_beats_fixed"], "verdict": verdict(iv1), "interval": iv1, "method": method,
         "decomposition": dec, "measured": f"Δ = SAF − fixed, eval average pass@1 % (95%: {method})"},
        {"key": "fixed_collapses_entropy",
         "claim": f"fixed fusion collapses entropy early, SAF does not (steps 1–{s['early_steps']})",
         "paper": PAPER["fixed_collapses_entropy"], "verdict": verdict(iv2), "interval": iv2,
         "measured": "Δ = relative entropy drop of fixed − of SAF over the early window (95% Welch t-interval)"},
    ]


# ---------------------------------------------------------------------------------------------- measure
def curves(run_dir: str, policy: str) -> dict[str, dict[int, float]]:
    """Per step: training entropy, and validation score (``validation/score``) when validation
    ran."""
    out: dict[str, dict[int, float]] = {"entropy": {}, "validation": {}}
    for r in read_metrics(run_dir):
        if r.get("policy") != policy:
            continue
        if "time/step" in r and r.get("entropy") is not None:
            out["entropy"][int(r["step"])] = float(r["entropy"])
        elif r.get("validation/score") is not None:
            out["validation"][int(r["step"])] = float(r["validation/score"])
    return out


def measure(records: list[dict], cfg: dict | None = None) -> dict:
    s = settings(cfg)
    scores: dict = {}
    drops: dict = {}
    curve: dict = {}
    problems: dict = {}  # name -> seed -> benchmark -> per-problem pass@1
    eval_var: dict = {}  # name -> seed -> benchmark -> v_b (graft_cli.report.power eq. 2)
    for r in records:
        sc = (r.get("scores") or {}).get(s["policy"]) or {}
        if sc.get("avg") is not None:
            scores.setdefault(r["name"], []).append(float(sc["avg"]))  # plan records hold pass@1 in %
            if sc.get("step") is not None and r.get("dir"):
                arrays, var, _ = read_problem_stats(eval_step_dir(r["dir"], s["policy"], sc["step"]))
                if arrays:
                    problems.setdefault(r["name"], {})[str(r["seed"])] = arrays
                    eval_var.setdefault(r["name"], {})[str(r["seed"])] = var
        if os.path.isdir(r.get("dir") or ""):
            c = curves(r["dir"], s["policy"])
            curve.setdefault(r["name"], []).append(c)
            d = entropy_drop(c["entropy"], int(s["early_steps"]))
            if d is not None:
                drops.setdefault(r["name"], []).append(d)
    return {"scores": scores, "entropy_drop": drops, "curves": curve, "problems": problems, "eval_var": eval_var,
            "eval_var_paired": paired_eval_var(records, [(s["saf"], s["fixed"])])}


# ---------------------------------------------------------------------------------------------- render
def table_markdown(measured: dict, cfg: dict | None = None) -> str:
    s = settings(cfg)
    names = [(s["grpo"], "GRPO"), (s["fixed"], "GRPO+OPD (fixed)"), (s["saf"], "SAF-OPD"), (s["opd_only"], "OPD-only")]
    paper = {s["fixed"]: "baseline of the SAF comparison", s["saf"]: "fixed + 0.51 … 2.70 pp",
             s["grpo"]: "[U]", s["opd_only"]: "[U]"}
    rows = []
    for key, label in names:
        sc = measured["scores"].get(key, [])
        dr = measured["entropy_drop"].get(key, [])
        rows.append([label, key, str(len(sc)), mean_sd(sc), mean_sd([100 * x for x in dr]), paper.get(key, "—")])
    return md_table(["Method", "Run", "Seeds", "Aggregate pass@1 % (mean ± std)",
                     f"Entropy drop % (steps 1–{s['early_steps']})", "Paper (aggregate)"], rows)


def claims_markdown(claims: list[dict]) -> str:
    rows = []
    for i, c in enumerate(claims, 1):
        iv = c["interval"]
        meas = "—" if iv is None else f"{iv[0]:+.3f} [{iv[1]:+.3f}, {iv[2]:+.3f}]"
        rows.append([str(i), c["claim"], c["verdict"], meas, c["paper"]])
    return md_table(["#", "Claim", "Verdict", "Measured Δ [95% CI]", "Paper"], rows)


def plot(measured: dict, cfg: dict | None, path: str) -> str | None:
    """Entropy and validation accuracy over steps for the four methods (mean over seeds)."""
    try:
        # lazy: matplotlib is only needed for plots
        import matplotlib

        matplotlib.use("Agg")
        # lazy: matplotlib is only needed for plots
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    s = settings(cfg)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in ((s["grpo"], "GRPO"), (s["fixed"], "GRPO+OPD fixed"), (s["saf"], "SAF-OPD"),
                       (s["opd_only"], "OPD-only")):
        for ax, what in zip(axes, ("entropy", "validation")):
            runs = [c[what] for c in measured["curves"].get(key, []) if c[what]]
            if not runs:
                continue
            steps = sorted(set().union(*runs))
            ys = [np.mean([r[st] for r in runs if st in r]) for st in steps]
            ax.plot(steps, [100 * y for y in ys] if what == "validation" else ys, marker="." if what == "validation"
                    else None, label=f"{label} ({len(runs)} seed{'s' if len(runs) > 1 else ''})")
    axes[0].set(title="policy entropy (token mean, training)", xlabel="step", ylabel="nats")
    axes[1].set(title="validation pass@1 % (held-out)", xlabel="step", ylabel="%")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_claims(report_dir: str, records: list[dict], cfg: dict | None = None) -> tuple[str, list[dict]]:
    """The SAF section (per arm: table, plot, claims) into ``<report_dir>/report.md`` and
    ``claims.json``. The first arm's claims keep their keys; a further arm's are keyed
    ``<label>/<key>``."""
    parts, all_claims, per_arm = ["## SAF-OPD on this pair (from the measured numbers)", ""], [], {}
    var_rows = []
    arm_list = arms(cfg)
    for i, arm in enumerate(arm_list):
        measured = measure(records, arm)
        claims = judge(measured, arm)
        if i:
            claims = [{**c, "key": f"{arm['label']}/{c['key']}", "claim": f"[{arm['label']}] {c['claim']}"}
                      for c in claims]
        name = "saf_entropy_validation" + (f"_{arm['label']}" if i else "") + ".png"
        png = plot(measured, arm, os.path.join(report_dir, "plots", name))
        if len(arm_list) > 1:
            parts += [f"### The {arm['label']} arm", ""]
        parts += [table_markdown(measured, arm), "",
                  *([f"![entropy and validation]({os.path.relpath(png, report_dir)})", ""] if png else []),
                  "#### Claims" if len(arm_list) > 1 else "### Claims", "", claims_markdown(claims), ""]
        all_claims += claims
        var_rows.append(variance_row(f"SAF − fixed ({arm['label']})", arm["policy"], claims[0].get("decomposition")))
        per_arm[arm["label"]] = {"settings": arm, "measured": {k: v for k, v in measured.items() if k != "curves"}}
    parts += ["Verdicts: `held` when the 95% interval excludes 0 in the paper's direction, `not significant` "
              "when it straddles 0, `did not hold` when it excludes 0 the other way.", ""]
    if any(r[2] != "—" for r in var_rows):
        parts += ["### Where the variance comes from (claim 1)", "", md_table(VARIANCE_COLUMNS, var_rows), "",
                  VARIANCE_NOTE, ""]
    md = "\n".join(parts)
    write_section(report_dir, md)
    first = per_arm[arm_list[0]["label"]]
    atomic_write_json(os.path.join(report_dir, "claims.json"),
                      {"settings": settings(cfg), "measured": first["measured"], "claims": all_claims,
                       "arms": per_arm})
    return md, all_claims
