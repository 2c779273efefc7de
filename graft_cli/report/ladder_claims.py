"""The transfer ladder judged from its runs (``claims.kind: ladder``;
experiments/reproduce/tiny_ladder.yaml; docs/studies.md, "Can anything the peer writes teach the
receiver").

Per receiver p with weak family f_p (``claims.weak``), per arm and seed: **weak**, the held-out
pass@1 on f_p at the last evaluated step (:func:`graft_cli.report.dose_claims.measure`, the dose
experiment's metric and its evaluation variances).

**Rungs** (``claims.rungs``, top first): arms whose content and dose change one thing at a time,
each contrasted with the baseline (GRPO) with the registered interval
(:func:`graft_cli.report.stats.compare`; on the seeds every measured arm finished, so that every
contrast uses the same seeds). A rung **teaches** when its
interval's lower end lies above 0. The pre-registered ladder reading, per receiver, is the first
rule that applies, top down (:func:`ladder_reading`):

1. the top rung (gold in the receiver's style at the designed dose) does not teach: *the miniature
   cannot teach the weak skill in its budget*;
2. a rung teaches and the next one down does not: *<the next rung's barrier>* (the designed dose →
   the default trigger: *the default trigger's dose*; own style → the peer's style: *style*; gold
   → the peer's own solutions: *the peer's content*);
3. every rung teaches: *every rung teaches*.

A rung that was not measured stops the reading there (*not judged past <rung>*). **Controls**
(``claims.controls``): further contrasts judged the same way but outside the reading (the
supervised control against GRPO and against the top rung).

**Mechanism** per arm, receiver and seed, mean over the steps of metrics.jsonl (a step with no
grafted row counts 0 grafted rows): grafted rows offered and admitted per step on the weak family
(``graft/family/<f>/offered``, ``/admitted``; the dose) and on all families (``graft/transferred``,
``graft/admitted``), the grafted rows' share of the batch (``graft/grafted_share``) and of the
gradient norm (``grad_share/grafted``, at ``algo.grad_share_every``), the mean importance ratio of
own and grafted tokens (``ratio/self``, ``ratio/peer``) and the clipped share of grafted tokens
(``clip_ratio/peer``). """

from __future__ import annotations

import json
import os

import numpy as np

from graft_cli.report.dose_claims import measure as measure_grades
from graft_cli.report.markdown import md_table
from graft_cli.report.power import TARGET_HALF_WIDTH
from graft_cli.report.sequential import judged_look
from graft_cli.report.stats import compare, comparison_verdict
from graft_cli.rundir import atomic_write_json, read_metrics, training_rows

DEFAULTS = {"kind": "ladder", "baseline": "grpo", "rungs": [], "controls": [], "weak": {"a": "two", "b": "lin"},
            "weak_benchmark": "heldout", "macro": [], "threshold": 3.0, "n_boot": 2000,
            "analysis": {"interval": "floored_t", "alpha": 0.05, "sequential": None}}
MECHANISM = ("weak_offered", "weak_admitted", "offered", "admitted", "grafted_share", "grad_share", "ratio_self",
             "ratio_peer", "clip_peer")

__all__ = ["judge", "ladder_reading", "measure", "mechanism", "write_claims"]


def settings(cfg: dict | None) -> dict:
    return {**DEFAULTS, **(cfg or {})}


def arms_of(s: dict) -> list[str]:
    """The baseline, the rungs' arms and the controls' arms, in that order, once each."""
    out = [s["baseline"]]
    for r in s["rungs"]:
        out.append(r["arm"])
    for c in s["controls"]:
        out += [c["x"], c["y"]]
    return list(dict.fromkeys(out))


def _step_mean(rows: list[dict], key: str, absent: float | None) -> float | None:
    vals = [x.get(key, absent) for x in rows]
    vals = [float(v) for v in vals if v is not None]
    return float(np.mean(vals)) if vals else None


def mechanism(records: list[dict], s: dict) -> dict:
    """arm -> receiver -> seed -> the mechanism's step means (module docstring)."""
    out: dict = {}
    arms = set(arms_of(s))
    for r in records:
        if r["name"] not in arms or not os.path.isdir(r["dir"]):
            continue
        rows = training_rows(read_metrics(r["dir"]))
        for p, fam in s["weak"].items():
            mine = [x for x in rows if x.get("policy") == p]
            if not mine:
                continue
            out.setdefault(r["name"], {}).setdefault(p, {})[str(r["seed"])] = {
                "weak_offered": _step_mean(mine, f"graft/family/{fam}/offered", 0.0),
                "weak_admitted": _step_mean(mine, f"graft/family/{fam}/admitted", 0.0),
                "offered": _step_mean(mine, "graft/transferred", 0.0),
                "admitted": _step_mean(mine, "graft/admitted", 0.0),
                "grafted_share": _step_mean(mine, "graft/grafted_share", 0.0),
                "grad_share": _step_mean(mine, "grad_share/grafted", None),
                "ratio_self": _step_mean(mine, "ratio/self", None),
                "ratio_peer": _step_mean(mine, "ratio/peer", None),
                "clip_peer": _step_mean(mine, "clip_ratio/peer", None),
            }
    return out


def measure(records: list[dict], cfg: dict | None = None) -> dict:
    s = settings(cfg)
    out = measure_grades(records, {**s, "arms": arms_of(s)})
    out["mechanism"] = mechanism(records, s)
    return out


def _contrast(measured: dict, s: dict, x: str, y: str, p: str) -> dict:
    g, ev, pev = (measured[k]["weak"] for k in ("grades", "eval_var", "eval_var_paired"))
    arms = [(g.get(a) or {}).get(p) or {} for a in arms_of(s)]
    measured_arms = [a for a in arms if a]  # an arm with no finished run is not measured, and judged nowhere
    common = set.intersection(*(set(a) for a in measured_arms)) if measured_arms else set()
    if not (g.get(x) or {}).get(p) or not (g.get(y) or {}).get(p):
        common = set()
    keep, boundary, look = judged_look(s["analysis"], common)
    sub = lambda d, keep=frozenset(keep): {k: v for k, v in (d or {}).items() if k in keep}  # noqa: E731
    if not keep:
        return {"interval": None, "method": None, "look": look, "seeds": 0, "verdict": "not measured",
                "half_width": None, "variance": {}, "teaches": None}
    c = compare({"x": sub((g.get(x) or {}).get(p)), "y": sub((g.get(y) or {}).get(p))}, "x", "y", int(s["n_boot"]),
                eval_var={"x": sub((ev.get(x) or {}).get(p)), "y": sub((ev.get(y) or {}).get(p))},
                eval_var_paired=sub((pev.get(f"{x}|{y}") or {}).get(p)) or None,
                rule=s["analysis"].get("interval", "floored_t"), boundary=boundary)
    dec = c["decomposition"] or {}
    iv = c["interval"]
    return {"interval": iv, "method": c["method"], "look": look, "seeds": len(keep),
            "verdict": comparison_verdict(c, TARGET_HALF_WIDTH),
            "half_width": None if iv is None else (iv[2] - iv[1]) / 2,
            "variance": {k: dec.get(k) for k in ("seeds", "evaluation", "problems", "total")},
            "teaches": None if iv is None else bool(iv[1] > 0)}


def ladder_reading(rungs: list[dict], teaches: list[bool | None]) -> str:
    """The pre-registered reading from each rung's verdict, top first (module docstring):
    ``teaches[i]`` True / False / None (not measured); ``rungs[i]["barrier"]``: what fails when rung
    i is the first that does not teach."""
    if not rungs:
        return "no rung registered"
    for i, (rung, t) in enumerate(zip(rungs, teaches)):
        if t is None:
            return f"not judged past {rungs[i - 1]['label'] if i else 'the top rung'} ({rung['label']} not measured)"
        if not t:
            return ("the miniature cannot teach the weak skill in its budget" if i == 0
                    else f"{rung['barrier']} is the barrier")
    return "every rung teaches"


def judge(measured: dict, cfg: dict | None = None) -> list[dict]:
    """One claim per rung and per control (per receiver: Δ, interval, verdict, teaches), then the
    ladder's reading per receiver."""
    s = settings(cfg)
    out = []
    for i, rung in enumerate(s["rungs"]):
        per = {p: _contrast(measured, s, rung["arm"], s["baseline"], p) for p in measured["policies"]}
        for p in per:
            per[p]["weak_family"] = s["weak"][p]
        out.append({"key": f"weak:{rung['arm']}_vs_{s['baseline']}", "metric": "weak", "rung": i + 1,
                    "label": rung["label"], "x": rung["arm"], "y": s["baseline"], "primary": True, "per_model": per})
    for c in s["controls"]:
        per = {p: _contrast(measured, s, c["x"], c["y"], p) for p in measured["policies"]}
        for p in per:
            per[p]["weak_family"] = s["weak"][p]
        out.append({"key": f"weak:{c['x']}_vs_{c['y']}", "metric": "weak", "rung": None, "label": c["label"],
                    "x": c["x"], "y": c["y"], "primary": False, "per_model": per})
    readings = {p: ladder_reading(s["rungs"], [o["per_model"][p]["teaches"] for o in out if o["rung"]])
                for p in measured["policies"]}
    out.append({"key": "ladder:reading", "metric": "weak", "rung": None, "label": "the ladder's reading",
                "primary": True, "per_model": {p: {"reading": r} for p, r in readings.items()}})
    return out


def _fmt(iv) -> str:
    return "—" if iv is None else f"{iv[0]:+.2f} [{iv[1]:+.2f}, {iv[2]:+.2f}]"


def _mean(vals) -> str:
    v = [x for x in vals if x is not None]
    return "—" if not v else f"{np.mean(v):.3g}"


def mechanism_rows(measured: dict, s: dict) -> list[list[str]]:
    rows = []
    for arm in arms_of(s):
        for p, seeds in sorted(((measured.get("mechanism") or {}).get(arm) or {}).items()):
            v = list(seeds.values())
            rows.append([arm, p, str(len(v))] + [_mean([x[k] for x in v]) for k in MECHANISM])
    return rows


def claims_markdown(claims: list[dict], measured: dict, cfg: dict | None = None) -> str:
    s = settings(cfg)
    weak = ", ".join(f"{p}: `{f}`" for p, f in s["weak"].items())
    lines = ["## Claims", "", f"The transfer ladder (weak families {weak}; registered analysis: "
             f"`{s['analysis'].get('interval')}` interval, sequential {json.dumps(s['analysis'].get('sequential'))}). "
             f"Δ in held-out weak-family pass@1 points, x − y; a rung *teaches* when its interval lies above 0; "
             f"`underpowered`: half-width over ±{TARGET_HALF_WIDTH:g}.", ""]
    rows = []
    for c in claims:
        if c["key"] == "ladder:reading":
            continue
        for p, v in c["per_model"].items():
            rows.append([str(c["rung"]) if c["rung"] else "control", c["label"], f"{c['x']} − {c['y']}", p,
                         str(v["seeds"]), _fmt(v["interval"]), {True: "yes", False: "no", None: "—"}[v["teaches"]],
                         v["verdict"], v["look"]])
    lines += [md_table(["rung", "content, dose", "contrast", "receiver", "seeds", "Δ [interval]", "teaches",
                        "verdict", "judged at"], rows), ""]
    reading = next(c for c in claims if c["key"] == "ladder:reading")
    lines += ["**The ladder's reading** (pre-registered): " + "; ".join(
        f"{p}: *{v['reading']}*" for p, v in reading["per_model"].items()), "", "### Mechanism", "",
        "Per arm and receiver, means over steps and seeds: grafted rows offered / admitted per step on the weak family "
        "(the dose) and on all families, the grafted rows' share of the batch's rows and of the gradient norm "
        "(`grad_share/grafted`), the mean importance ratio of own and grafted tokens, the clipped share of grafted "
        "tokens.", "",
        md_table(["arm", "receiver", "seeds", "weak offered", "weak admitted", "offered", "admitted",
                  "rows share", "grad-norm share", "ratio own", "ratio grafted", "clip grafted"],
                 mechanism_rows(measured, s)), ""]
    return "\n".join(lines)


def write_claims(report_dir: str, records: list[dict], cfg: dict | None = None) -> tuple[str, list[dict]]:
    """Judge the ladder from ``records``, append the section to ``report.md``, write
    ``claims.json``."""
    from graft_cli.report.claims import write_section  # lazy: the GRAFT claims module is large

    measured = measure(records, cfg)
    claims = judge(measured, cfg)
    md = claims_markdown(claims, measured, cfg)
    write_section(report_dir, md)
    atomic_write_json(os.path.join(report_dir, "claims.json"),
                      {"settings": settings(cfg), "measured": measured, "claims": claims})
    return md, claims
