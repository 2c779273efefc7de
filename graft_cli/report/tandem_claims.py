"""The Tandem RLVR paper's claims, judged from a plan's measured numbers (tandem.md §2.9, §2.10,
§3).

Claims (tandem.md §3: "TRL matches vanilla GRPO on solo; handoff robustness beats the GRPO senior by
up to 6.6 pts on AIME"; §2.9: KL-Reg GRPO, k3 to the frozen base = the junior, is the baseline that
separates "stay near the base" from co-generation; §2.10: legibility, the junior's cross-entropy on
the senior's solutions):

1. **solo_matches_grpo** — Δ = Tandem RLVR − vanilla GRPO solo pass@1 (points), macro over the
   benchmarks both arms have. Verdict :func:`~graft_cli.report.stats.equivalence_verdict` with the
   margin ``margin`` (points): ``held`` when the 95% interval lies within ±margin, ``did not hold``
   when it lies outside, else ``inconclusive``.
2. **handoff_beats_grpo** — Δ = Tandem RLVR − GRPO handoff pass@1 (points, same macro). Verdict
   :func:`~graft_cli.report.stats.verdict`: ``held`` when the interval excludes 0 upwards, ``not
   significant`` when it straddles 0, ``did not hold`` when it excludes 0 downwards.
3. **handoff_beats_kl** — Δ = Tandem RLVR − KL-Reg GRPO handoff pass@1 (points): "tandem beats
   KL-regularised GRPO" on the metric the paper's robustness claim is about (handoff pass@1; our
   choice of metric, the paper's tables are [U]). Verdict as claim 2.
4. **more_legible_than_grpo** — Δ = CE(GRPO) − CE(Tandem RLVR), nats per token: how much lower the
   junior's cross-entropy on the tandem senior's solo answers is than on GRPO's. Per problem the CE
   of its responses pooled (Σ nll / Σ tokens,
   :func:`graft_cli.eval.tandem_evals.legibility_problems`), problems without a scored token in some
   seed of either arm left out; Δ = the macro over benchmarks of the mean over problems (the table's
   ``macro_ce`` pools tokens per benchmark instead, so its difference can differ slightly). Verdict
   as claim 2 (``held``: the tandem senior is more legible to the junior).

The interval of record is the t-interval over the seeds' macro values, paired where the arms ran the
same seeds (:func:`graft_cli.report.stats.compare`; one seed on a side: the hierarchical bootstrap
over problems), with the variance decomposition of :mod:`graft_cli.report.power` beside it and the
paired hierarchical bootstrap (``bootstrap``) and the Welch interval (``welch``) for comparison.
Also measured, without a verdict: solo and handoff pass@{1,2,4,8} (summary files), the pass@k curves
k = 1..8 from the run files (:func:`graft_cli.eval.tandem_evals.pass_at_k_curve`; table and plot in
the claims section), the legibility CE and the senior's token share in handoff chains, for every arm
(Tandem RLVR, GRPO, KL-Reg GRPO, GRPO n=16).

Files of a record (policy ``policy``, its evaluated step): ``E =
<dir>/eval/<policy>/step_<step:06d>/`` with the solo evaluation (``summary.json``,
``<bench>_run<k>.jsonl``), ``E/handoff/`` (same layout, rows with ``senior_frac``) and
``E/legibility/`` (``summary.json``, ``<bench>.jsonl``). Anything missing or unreadable is not
measured. :func:`judge` is pure; :func:`measure` reads the run directories. """

from __future__ import annotations

import os

import numpy as np

from graft_cli.eval.files import read_problem_stats
from graft_cli.eval.tandem_evals import CURVE_KS, legibility_problems, macro_pass_at_k, pass_at_k_curve
from graft_cli.report.claims import write_section
from graft_cli.report.markdown import md_table, mean_sd
from graft_cli.report.power import VARIANCE_COLUMNS, VARIANCE_NOTE, variance_row
from graft_cli.report.stats import compare, comparison_verdict, equivalence_verdict, verdict
from graft_cli.rundir import atomic_write_json, eval_step_dir, read_json_or_none

DEFAULTS = {"kind": "tandem", "tandem": "tandem", "grpo": "grpo", "kl": "grpo_kl", "n16": "grpo_n16",
            "policy": "a", "margin": 2.0, "n_boot": 2000}
PAPER = {"solo_matches_grpo": "TRL matches vanilla GRPO on solo accuracy (tables [U])",
         "handoff_beats_grpo": "handoff robustness beats the GRPO senior by up to +6.6 pts on AIME "
                               "(reasoning-step schedule)",
         "handoff_beats_kl": "KL-Reg GRPO (k3 to the frozen base, the junior) separates staying near the base from "
                             "co-generation (tandem.md §2.9); its numbers [U]",
         "more_legible_than_grpo": "legibility CE reported for every arm (tandem.md §2.10); the paper's "
                                   "\"drift from the junior\" metric is [U]"}
KS = (1, 2, 4, 8)
MODES = ("solo", "handoff")
BOOT_SEED = 0


def settings(cfg: dict | None) -> dict:
    return {**DEFAULTS, **(cfg or {})}


def arms(cfg: dict | None) -> list[tuple[str, str]]:
    """(run name, label) of the four arms, in table order."""
    s = settings(cfg)
    return [(s["tandem"], "Tandem RLVR"), (s["grpo"], "GRPO"), (s["kl"], "KL-Reg GRPO"), (s["n16"], "GRPO n=16")]


# ----------------------------------------------------------------------------------------------- pure
def finite_common(problems: dict, a: str, b: str) -> dict:
    """Arms ``a`` and ``b`` of ``problems`` (name -> seed -> bench -> per-problem array) restricted,
    per benchmark every seed of both has with the same number of problems, to the problems finite in
    all of them; a benchmark left with no problem is dropped."""
    xa, xb = problems.get(a) or {}, problems.get(b) or {}
    seeds = list(xa.values()) + list(xb.values())
    if not xa or not xb:
        return {}
    benches = sorted(set.intersection(*[set(v) for v in seeds]))
    out = {a: {s: {} for s in xa}, b: {s: {} for s in xb}}
    for bn in benches:
        arrs = [np.asarray(v[bn], dtype=np.float64) for v in seeds]
        if len({len(x) for x in arrs}) != 1:
            continue
        ok = np.all(np.isfinite(np.stack(arrs)), axis=0)
        if not ok.any():
            continue
        for name, arm in ((a, xa), (b, xb)):
            for sd, v in arm.items():
                out[name][sd][bn] = np.asarray(v[bn], dtype=np.float64)[ok]
    return out


def _handoff_claim(key: str, claim: str, c: dict, other: str) -> dict:
    """A "Tandem beats ``other`` on handoff pass@1" claim from its comparison ``c``
    (:func:`compare`)."""
    return {"key": key, "claim": claim, "paper": PAPER[key], "verdict": comparison_verdict(c),
            **_intervals(c), "measured": f"Δ = Tandem − {other} handoff pass@1 (points, macro over benchmarks); "
                                         f"95% interval: {c['method'] or '—'}"}


def _intervals(c: dict) -> dict:
    """The interval of record and what stands beside it (:func:`graft_cli.report.stats.compare`)."""
    return {k: c[k] for k in ("interval", "method", "bootstrap", "welch", "decomposition", "benchmarks", "seeds",
                              "per_benchmark")}


def judge(measured: dict, cfg: dict | None = None) -> list[dict]:
    """The four claims from ``measured["problems"][mode][run name][seed][bench]`` (per-problem
    pass@1, 0..1, for the modes solo and handoff; per-problem CE in nats for ``legibility``)."""
    s = settings(cfg)
    probs = measured.get("problems") or {}
    n_boot, margin = int(s["n_boot"]), float(s["margin"])
    ev = measured.get("eval_var") or {}
    rule = (s.get("analysis") or {}).get("interval", "floored_t")  # the plan's registered interval rule
    solo = compare(probs.get("solo") or {}, s["tandem"], s["grpo"], n_boot, eval_var=ev.get("solo"), rule=rule)
    hand = compare(probs.get("handoff") or {}, s["tandem"], s["grpo"], n_boot, eval_var=ev.get("handoff"), rule=rule)
    hand_kl = compare(probs.get("handoff") or {}, s["tandem"], s["kl"], n_boot, eval_var=ev.get("handoff"), rule=rule)
    leg = compare(finite_common(probs.get("legibility") or {}, s["grpo"], s["tandem"]), s["grpo"], s["tandem"],
                  n_boot, scale=1.0)
    return [
        {"key": "solo_matches_grpo", "claim": f"Tandem RLVR matches vanilla GRPO on solo pass@1 (±{margin:g} pts)",
         "paper": PAPER["solo_matches_grpo"], "verdict": equivalence_verdict(solo["interval"], margin),
         "margin": margin, **_intervals(solo),
         "measured": f"Δ = Tandem − GRPO solo pass@1 (points, macro over benchmarks); 95% interval: "
                     f"{solo['method'] or '—'}"},
        _handoff_claim("handoff_beats_grpo", "Tandem RLVR beats GRPO on handoff pass@1 (reasoning-step schedule)",
                       hand, "GRPO"),
        _handoff_claim("handoff_beats_kl", "Tandem RLVR beats KL-Reg GRPO on handoff pass@1", hand_kl, "KL-Reg GRPO"),
        {"key": "more_legible_than_grpo",
         "claim": "Tandem RLVR is more legible to the junior than GRPO (lower legibility CE)",
         "paper": PAPER["more_legible_than_grpo"], "verdict": verdict(leg["interval"]),
         "unit": "nats", "digits": 4, **_intervals(leg),
         "measured": "Δ = CE(GRPO) − CE(Tandem), nats per token (the junior on each senior's solo answers; per "
                     "problem its responses pooled; macro over benchmarks of the mean over problems); 95% interval: "
                     f"{leg['method'] or '—'}"},
    ]


# ---------------------------------------------------------------------------------------------- measure
def legibility_ce(summary: dict | None) -> float | None:
    """``macro_ce`` of a legibility summary (nats), None when absent or not a finite number."""
    try:
        v = float((summary or {})["macro_ce"])
    except (KeyError, TypeError, ValueError):
        return None
    return v if np.isfinite(v) else None


def _new_arm() -> dict:
    return {"seeds": [], "steps": [], "solo": {}, "handoff": {}, "legibility_ce": [], "senior_frac": [],
            "junior": [], "curve": {m: {} for m in MODES}}


def measure(records: list[dict], cfg: dict | None = None) -> dict:
    """``{"arms": name -> per-seed lists, "problems": mode -> name -> seed -> bench -> per-problem
    pass@1}``.

    Per arm: ``seeds``/``steps`` of the records with an evaluated step, ``solo``/``handoff``: k ->
    [macro pass@k % of each seed] (k = 1, 2, 4, 8 from the summaries), ``curve``: mode -> k ->
    [macro pass@k % of each seed] for k = 1..8 from the run files, ``legibility_ce``: [macro CE of
    each seed], ``senior_frac``: [mean senior token share of each seed's handoff rows], ``junior``:
    the legibility junior(s). ``problems["legibility"]``: name -> seed -> bench -> per-problem
    CE."""
    s = settings(cfg)
    out: dict = {"arms": {}, "problems": {m: {} for m in (*MODES, "legibility")}, "eval_var": {m: {} for m in MODES}}
    for r in records:
        name, seed = r.get("name"), r.get("seed")
        sc = (r.get("scores") or {}).get(s["policy"]) or {}
        if name is None or sc.get("step") is None or not os.path.isdir(r.get("dir") or ""):
            continue
        try:
            E = eval_step_dir(r["dir"], s["policy"], int(sc["step"]))
        except (TypeError, ValueError):
            continue
        arm = out["arms"].setdefault(name, _new_arm())
        arm["seeds"].append(seed)
        arm["steps"].append(int(sc["step"]))
        for mode, folder in (("solo", E), ("handoff", os.path.join(E, "handoff"))):
            for k, v in macro_pass_at_k(read_json_or_none(os.path.join(folder, "summary.json"))).items():
                arm[mode].setdefault(k, []).append(v)
            for k, v in pass_at_k_curve(folder).items():
                arm["curve"][mode].setdefault(str(k), []).append(100.0 * v)
            probs, var, fracs = read_problem_stats(folder)
            if probs:
                out["problems"][mode].setdefault(name, {})[seed] = probs
                out["eval_var"][mode].setdefault(name, {})[seed] = var
            if mode == "handoff" and fracs:
                arm["senior_frac"].append(float(np.mean(fracs)))
        ce_probs = legibility_problems(os.path.join(E, "legibility"))
        if ce_probs:
            out["problems"]["legibility"].setdefault(name, {})[seed] = ce_probs
        leg = read_json_or_none(os.path.join(E, "legibility", "summary.json"))
        ce = legibility_ce(leg)
        if ce is not None:
            arm["legibility_ce"].append(ce)
            if isinstance(leg, dict) and isinstance(leg.get("junior"), str) and leg["junior"] not in arm["junior"]:
                arm["junior"].append(leg["junior"])
    return out


# ---------------------------------------------------------------------------------------------- render
def table_markdown(measured: dict, cfg: dict | None = None) -> str:
    rows = []
    for key, label in arms(cfg):
        a = (measured.get("arms") or {}).get(key) or _new_arm()
        seeds = max([len(v) for m in MODES for v in a[m].values()] + [len(a["legibility_ce"])])
        rows.append([label, key, str(seeds), *[mean_sd(a[m].get(str(k), [])) for m in MODES for k in KS],
                     mean_sd([100 * f for f in a["senior_frac"]], 1), mean_sd(a["legibility_ce"], 3)])
    cols = ["Method", "Run", "Seeds", *[f"{m.capitalize()} pass@{k} %" for m in MODES for k in KS],
            "Senior token share % (handoff)", "Legibility CE (nats, junior on the senior's solo outputs; "
                                              "lower = more legible)"]
    return md_table(cols, rows)


def curves_markdown(measured: dict, cfg: dict | None = None) -> str:
    """The pass@k curves, k = 1..8: per arm and mode the mean over seeds of the macro pass@k (%), —
    where k exceeds the samples or the arm has no run files."""

    rows = []
    for key, label in arms(cfg):
        a = (measured.get("arms") or {}).get(key) or _new_arm()
        for mode in MODES:
            c = (a.get("curve") or {}).get(mode) or {}
            if not c:
                continue
            n = max(len(v) for v in c.values())
            rows.append([label, mode, str(n), *[f"{float(np.mean(c[str(k)])):.2f}" if c.get(str(k)) else "—"
                                                for k in CURVE_KS]])
    if not rows:
        return ""
    return md_table(["Method", "Mode", "Seeds", *[f"pass@{k} %" for k in CURVE_KS]], rows)


def _iv(iv, digits: int = 2) -> str:
    return "—" if iv is None else f"{iv[0]:+.{digits}f} [{iv[1]:+.{digits}f}, {iv[2]:+.{digits}f}]"


def claims_markdown(claims: list[dict]) -> str:
    rows = []
    for i, c in enumerate(claims, 1):
        dg = int(c.get("digits", 2))
        meas = _iv(c["interval"], dg) + (f" {c['unit']}" if c.get("unit") and c["interval"] is not None else "")
        if c.get("welch") is not None:
            meas += f"; Welch {_iv(c['welch'], dg)}"
        rows.append([str(i), c["claim"], c["verdict"], meas, c["paper"]])
    return md_table(["#", "Claim", "Verdict", "Measured Δ [95% CI]", "Paper"], rows)


def per_benchmark_markdown(claim: dict) -> str:
    """One line: each benchmark's own bootstrap Δ [95% CI] of a claim."""
    per = claim.get("per_benchmark") or {}
    if not per:
        return ""
    dg = int(claim.get("digits", 2))
    return "Per benchmark (" + claim["key"] + "): " + ", ".join(f"{b} {_iv(iv, dg)}" for b, iv in per.items()) + "."


def plot(measured: dict, cfg: dict | None, path: str) -> str | None:
    """Solo and handoff pass@k vs k = 1..8 (macro over benchmarks, mean over seeds; from the run
    files, else the summaries' k = 1, 2, 4, 8), one line per arm."""
    try:
        # lazy: matplotlib is only needed for plots
        import matplotlib

        matplotlib.use("Agg")
        # lazy: matplotlib is only needed for plots
        import matplotlib.pyplot as plt

        # lazy: matplotlib is only needed for plots
        import matplotlib.ticker
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for key, label in arms(cfg):
        a = (measured.get("arms") or {}).get(key)
        if not a:
            continue
        for ax, mode in zip(axes, MODES):
            src = (a.get("curve") or {}).get(mode) or a[mode]
            ks = [k for k in CURVE_KS if src.get(str(k))]
            if ks:
                n = max(len(src[str(k)]) for k in ks)
                ax.plot(ks, [float(np.mean(src[str(k)])) for k in ks], marker="o",
                        label=f"{label} ({n} seed{'s' if n > 1 else ''})")
    for ax, mode in zip(axes, MODES):
        ax.set(title=f"{mode} pass@k (macro over benchmarks)", xlabel="k", ylabel="%")
        ax.set_xticks(list(CURVE_KS), [str(k) for k in CURVE_KS])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def section_markdown(measured: dict, claims: list[dict], cfg: dict | None, png: str | None,
                     report_dir: str) -> str:
    s = settings(cfg)
    juniors = sorted({j for a in (measured.get("arms") or {}).values() for j in a.get("junior", [])})
    var_rows = [variance_row(c["claim"].split(" (")[0], s.get("policy", "a"), c.get("decomposition"))
                for c in claims if c.get("decomposition") and c.get("unit") != "nats"]
    return "\n".join([
        "## Tandem RLVR on this pair (from the measured numbers)", "",
        table_markdown(measured, cfg), "",
        f"pass@k: macro over benchmarks of the unbiased estimator, mean ± std over seeds. Legibility junior: "
        f"{', '.join(juniors) if juniors else '—'}.", "",
        "### Claims", "", claims_markdown(claims), "",
        *[line for c in claims if per_benchmark_markdown(c) for line in (per_benchmark_markdown(c), "")],
        *(["### Where the variance comes from", "", md_table(VARIANCE_COLUMNS, var_rows), "", VARIANCE_NOTE, ""]
          if var_rows else []),
        "Intervals: the 95% t-interval over the seeds' macro values (Δ macro-averaged over the benchmarks both "
        "arms have; paired where the arms ran the same seeds, Welch otherwise; one seed on a side: the "
        "hierarchical bootstrap over problems), the evaluation's sampling noise inside each seed's value. "
        "Claim 1 (equivalence, margin "
        f"±{float(s['margin']):g} pts): `held` when the interval lies within the margin, `did not hold` when it "
        "lies outside, `inconclusive` otherwise. Claims 2-4: `held` when the interval excludes 0 upwards, "
        "`not significant` when it straddles 0, `did not hold` when it excludes 0 downwards; `not measured` "
        "when an arm has no evaluation files. Claim 3 compares handoff pass@1 with KL-Reg GRPO (the paper's "
        "KL baseline; the metric is our choice). Claim 4's Δ is CE(GRPO) − CE(Tandem) in nats per token "
        "(positive: the junior finds the tandem senior's solo answers more predictable), per problem its "
        "responses pooled, problems without a scored token in some seed left out.", "",
        "### pass@k curves (k = 1..8)", "",
        *([curves_markdown(measured, cfg), ""] if curves_markdown(measured, cfg) else
          ["No run files to compute the curves from.", ""]),
        *([f"![solo and handoff pass@k]({os.path.relpath(png, report_dir)})", ""] if png else []),
        "Unbiased pass@k (1 − C(n−c, k)/C(n, k)) per problem from the run files, mean over problems and runs, "
        "macro over benchmarks, mean over seeds.", ""])


def write_claims(report_dir: str, records: list[dict], cfg: dict | None = None) -> tuple[str, list[dict]]:
    """The Tandem section (table, plot, claims) into ``<report_dir>/report.md`` and
    ``claims.json``."""

    measured = measure(records, cfg)
    claims = judge(measured, cfg)
    png = plot(measured, cfg, os.path.join(report_dir, "plots", "tandem_pass_at_k.png"))
    md = section_markdown(measured, claims, cfg, png, report_dir)
    write_section(report_dir, md)
    atomic_write_json(os.path.join(report_dir, "claims.json"),
                      {"settings": settings(cfg), "measured": {"arms": measured["arms"]}, "claims": claims})
    return md, claims
