"""The weak-family dose experiment judged from its runs (``claims.kind: dose``;
experiments/reproduce/tiny_dose.yaml).

Per receiver (policy) p with weak family f_p (``claims.weak``) and per seed s of each arm, two
metrics of the last evaluated step:

- **weak**: held-out pass@1 on f_p, the mean over the ``weak_benchmark`` problems of family f_p
  (their family read from the training file the run names) of each problem's mean grade over runs ×
  samples;
- **macro**: the macro pass@1 over the ``macro`` benchmarks (eq. 1 of graft_cli/report/power.py).

Contrasts (points): no-gate − GRPO (primary), GRAFT − GRPO, GRAFT − no-gate, each with the
registered interval (:func:`graft_cli.report.stats.compare`: the paired t-interval over seeds, SE²
floored at the measured evaluation variance of the difference, from the paired grades; at a
sequential look, the repeated confidence interval of :mod:`graft_cli.report.sequential`), the
verdict (``underpowered`` past ±1 point) and, for the primary contrast, the pre-registered reading
against ``threshold`` T (+2 points):

    lo ≥ T: the gate or the dose is the bottleneck;  hi < T and lo ≤ 0 ≤ hi: peer solutions do not
    teach the skill at this scale;  lo ≤ 0 and hi ≥ T: open at this power;  otherwise the interval
    lies outside the pre-registered readings (0 < lo < T: a gain below T; hi < 0: a loss).

The dose: per arm, receiver and seed the mean over steps of ``graft/admitted`` (grafted responses
the gate admitted) and ``graft/transferred`` (offered), from metrics.jsonl. """

from __future__ import annotations

import json
import os

import numpy as np

from graft_cli.data.problems import field_value
from graft_cli.eval.files import read_grades, read_jsonl
from graft_cli.models.loading import resolve_path
from graft_cli.report.markdown import md_table
from graft_cli.report.power import TARGET_HALF_WIDTH
from graft_cli.report.sequential import judged_look
from graft_cli.report.stats import compare, comparison_verdict
from graft_cli.rundir import atomic_write_json, eval_step_dir, read_metrics, run_config_raw, training_rows

DEFAULTS = {"kind": "dose", "baseline": "grpo", "method": "graft", "no_gate": "graft_nogate",
            "weak": {"a": "two", "b": "lin"}, "weak_benchmark": "heldout",
            "macro": ["math500", "aime24", "aime25", "amc23", "minerva"], "threshold": 2.0, "n_boot": 2000,
            "analysis": {"interval": "floored_t", "alpha": 0.05, "sequential": None}}
METRICS = ("weak", "macro")

__all__ = ["judge", "measure", "reading", "write_claims"]


def settings(cfg: dict | None) -> dict:
    return {**DEFAULTS, **(cfg or {})}


def _variance(g: np.ndarray) -> float:
    """Eq. (2) of power.py for one benchmark's grades ``g[run, problem, sample]``: (1/N²) Σ_p s²_p /
    n_p."""
    d = g.transpose(1, 0, 2).reshape(g.shape[1], -1)
    return float(np.sum(d.var(axis=1, ddof=1) / d.shape[1])) / d.shape[0] ** 2 if d.shape[1] > 1 else 0.0


def _family_of(run_dir: str) -> dict[str, str]:
    """problem id -> family of the run's training file (``data.train``: a local JSONL or a ``tiny:``
    name)."""
    train = str((run_config_raw(run_dir).get("data") or {}).get("train") or "")
    path = resolve_path(train) if train else ""
    if not path or not os.path.exists(path):
        return {}
    out = {}
    for row in read_jsonl(path):
        fam = field_value(row, "family")
        if isinstance(fam, str) and row.get("id") is not None:
            out[str(row["id"])] = fam
    return out


def _weak_mask(step_dir: str, bench: str, family: str, fam_of: dict) -> np.ndarray | None:
    """Which problems (by problem_index) of ``bench`` belong to ``family``."""
    path = os.path.join(step_dir, f"{bench}_run1.jsonl")
    if not os.path.exists(path):
        return None
    ids: dict[int, str] = {}
    for r in read_jsonl(path):
        ids[int(r["problem_index"])] = str(r.get("problem_id"))
    return np.array([fam_of.get(ids[i]) == family for i in range(len(ids))])


def measure(records: list[dict], cfg: dict | None = None) -> dict:
    """Per metric, arm, policy and seed: the per-problem mean grades
    (``grades[metric][arm][policy][seed]``: benchmark -> array) and the grade matrices' sampling
    variances; the dose per arm, policy and seed. The arms are ``cfg["arms"]`` where given (the
    transfer ladder's), else the baseline, the method and the no-gate arm."""
    s = settings(cfg)
    arms = tuple(s.get("arms") or (s["baseline"], s["method"], s["no_gate"]))
    grades: dict = {m: {} for m in METRICS}
    raw: dict = {}  # (arm, policy, seed) -> metric -> bench -> grades[run, problem, sample]
    dose: dict = {}
    fam_cache: dict = {}
    for r in records:
        if r["name"] not in arms:
            continue
        for p, sc in (r.get("scores") or {}).items():
            if sc.get("step") is None or p not in s["weak"]:
                continue
            step_dir = eval_step_dir(r["dir"], p, sc["step"])
            g = read_grades(step_dir)
            macro = {b: g[b] for b in s["macro"] if b in g}
            if len(macro) != len(s["macro"]) or s["weak_benchmark"] not in g:
                continue
            fam_of = fam_cache.setdefault(r["dir"], _family_of(r["dir"]))
            mask = _weak_mask(step_dir, s["weak_benchmark"], s["weak"][p], fam_of)
            if mask is None or not mask.any():
                continue
            by_metric = {"weak": {"weak": g[s["weak_benchmark"]][:, mask, :]}, "macro": macro}
            raw[(r["name"], p, str(r["seed"]))] = by_metric
            for m, benches in by_metric.items():
                grades[m].setdefault(r["name"], {}).setdefault(p, {})[str(r["seed"])] = {
                    b: a.mean(axis=(0, 2)).tolist() for b, a in benches.items()}
        rows = training_rows(read_metrics(r["dir"]))
        for p in s["weak"]:
            mine = [x for x in rows if x.get("policy") == p]
            if mine and any("graft/admitted" in x for x in mine):
                dose.setdefault(r["name"], {}).setdefault(p, {})[str(r["seed"])] = {
                    k: float(np.mean([x.get(f"graft/{k}", 0.0) for x in mine])) for k in ("admitted", "transferred")}
    eval_var = {m: {} for m in METRICS}
    paired = {m: {} for m in METRICS}
    for (arm, p, seed), by_metric in raw.items():
        for m, benches in by_metric.items():
            eval_var[m].setdefault(arm, {}).setdefault(p, {})[seed] = {b: _variance(a) for b, a in benches.items()}
        for other in arms:
            o = raw.get((other, p, seed))
            if other == arm or o is None:
                continue
            for m, benches in by_metric.items():
                if all(benches[b].shape == o[m][b].shape for b in benches):
                    paired[m].setdefault(f"{arm}|{other}", {}).setdefault(p, {})[seed] = {
                        b: _variance(benches[b] - o[m][b]) for b in benches}
    return {"policies": sorted(s["weak"]), "grades": grades, "eval_var": eval_var, "eval_var_paired": paired,
            "dose": dose}


def reading(iv, threshold: float) -> str:
    """The pre-registered reading of the primary contrast's interval (module docstring)."""
    if iv is None:
        return "not measured"
    _, lo, hi = iv
    if lo >= threshold:
        return "the gate or the dose is the bottleneck"
    if hi < threshold and lo <= 0 <= hi:
        return "peer solutions do not teach the skill at this scale"
    if lo <= 0 and hi >= threshold:
        return "open at this power"
    return f"outside the pre-registered readings ({'a gain below the threshold' if lo > 0 else 'a loss'})"


def judge(measured: dict, cfg: dict | None = None) -> list[dict]:
    """One claim per (metric, contrast), per receiver: Δ, interval, verdict; the primary with its
    reading."""
    s = settings(cfg)
    contrasts = [("nogate_vs_grpo", s["no_gate"], s["baseline"]), ("graft_vs_grpo", s["method"], s["baseline"]),
                 ("graft_vs_nogate", s["method"], s["no_gate"])]
    out = []
    for metric in METRICS:
        g, ev, pev = (measured[k][metric] for k in ("grades", "eval_var", "eval_var_paired"))
        for key, x, y in contrasts:
            per = {}
            for p in measured["policies"]:
                arms = [(g.get(a) or {}).get(p) or {} for a in (s["baseline"], s["method"], s["no_gate"])]
                common = set.intersection(*(set(a) for a in arms)) if all(arms) else set()
                keep, boundary, look = judged_look(s["analysis"], common)
                sub = lambda d, keep=frozenset(keep): {k: v for k, v in (d or {}).items() if k in keep}
                probs = {"x": sub((g.get(x) or {}).get(p)), "y": sub((g.get(y) or {}).get(p))}
                c = compare(probs, "x", "y", int(s["n_boot"]),
                            eval_var={"x": sub((ev.get(x) or {}).get(p)), "y": sub((ev.get(y) or {}).get(p))},
                            eval_var_paired=sub((pev.get(f"{x}|{y}") or {}).get(p)) or None,
                            rule=s["analysis"].get("interval", "floored_t"), boundary=boundary)
                dec = c["decomposition"] or {}
                per[p] = {"interval": c["interval"], "method": c["method"], "look": look, "seeds": len(keep),
                          "verdict": comparison_verdict(c, TARGET_HALF_WIDTH),
                          "half_width": None if c["interval"] is None else (c["interval"][2] - c["interval"][1]) / 2,
                          "variance": {k: dec.get(k) for k in ("seeds", "evaluation", "problems", "total")},
                          "weak_family": s["weak"][p] if metric == "weak" else None}
                if key == "nogate_vs_grpo":
                    per[p]["reading"] = reading(c["interval"], float(s["threshold"]))
            out.append({"key": f"{metric}:{key}", "metric": metric, "contrast": key, "x": x, "y": y,
                        "primary": key == "nogate_vs_grpo" and metric == "weak", "per_model": per})
    return out


def _fmt(iv) -> str:
    return "—" if iv is None else f"{iv[0]:+.2f} [{iv[1]:+.2f}, {iv[2]:+.2f}]"


def dose_rows(measured: dict) -> list[list[str]]:
    rows = []
    for arm, pols in sorted((measured.get("dose") or {}).items()):
        for p, seeds in sorted(pols.items()):
            adm = [v["admitted"] for v in seeds.values()]
            off = [v["transferred"] for v in seeds.values()]
            rows.append([arm, p, str(len(seeds)), f"{np.mean(off):.1f}", f"{np.mean(adm):.1f}",
                         f"{100 * np.mean(adm) / np.mean(off):.0f}%" if np.mean(off) > 0 else "—"])
    return rows


def claims_markdown(claims: list[dict], measured: dict, cfg: dict | None = None) -> str:
    s = settings(cfg)
    weak = ", ".join(f"{p}: `{f}`" for p, f in s["weak"].items())
    lines = ["## Claims", "", f"The weak-family dose experiment (weak families {weak}; registered analysis: "
             f"`{s['analysis'].get('interval')}` interval, sequential "
             f"{json.dumps(s['analysis'].get('sequential'))}). Δ in pass@1 points, x − y, with the registered "
             f"interval; `underpowered`: half-width over ±{TARGET_HALF_WIDTH:g}.", ""]
    rows = []
    for c in claims:
        for p, v in c["per_model"].items():
            rows.append([c["metric"] + (f" ({v['weak_family']})" if v.get("weak_family") else ""),
                         f"{c['x']} − {c['y']}" + (" **(primary)**" if c["primary"] else ""), p, str(v["seeds"]),
                         _fmt(v["interval"]), v["verdict"], v.get("reading") or "—", v["look"]])
    lines += [md_table(["metric", "contrast", "receiver", "seeds", "Δ [interval]", "verdict", "reading", "judged at"],
                        rows), "", "### The dose", "",
              "Grafted responses offered (`graft/transferred`) and admitted by the gate (`graft/admitted`) per step, "
              "mean over steps and seeds.", "",
              md_table(["arm", "receiver", "seeds", "offered / step", "admitted / step", "admitted share"],
                       dose_rows(measured)), ""]
    return "\n".join(lines)


def write_claims(report_dir: str, records: list[dict], cfg: dict | None = None) -> tuple[str, list[dict]]:
    """Judge the dose experiment from ``records``, append the section to ``report.md``, write
    ``claims.json``."""
    from graft_cli.report.claims import write_section  # lazy: the GRAFT claims module is large

    measured = measure(records, cfg)
    claims = judge(measured, cfg)
    md = claims_markdown(claims, measured, cfg)
    write_section(report_dir, md)
    atomic_write_json(os.path.join(report_dir, "claims.json"),
                      {"settings": settings(cfg), "measured": measured, "claims": claims})
    return md, claims
