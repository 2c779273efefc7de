"""Published studies re-judged from their own files under the current interval rules
(``claims.json`` only).

Every comparison a study stored with its variance decomposition (Δ, interval, ``total`` = SE²,
``evaluation`` = V_E, df) is re-judged by the floored rule, SE² = max(SE², V_E) at the same df
(graft_cli/report/power.py eq. 5), and the verdict reads ``underpowered`` past ±1 point
(:func:`graft_cli.report.stats.powered_verdict`). A GRAFT study that keeps its per-problem scores
(results/tiny) is re-judged by design as well: each ``designs`` entry names the seeds it keeps and
its analysis (fixed, or group-sequential looks), and :func:`graft_cli.report.claims.judge` judges
claims 2-3 from the stored numbers.

    python -m graft_cli.report.rejudge results/tiny3 results/tiny_tandem python -m
    graft_cli.report.rejudge results/tiny --design "fixed-13:13:" --design
    "sequential-18:18:9,13,18"

writes ``<dir>/rejudge.md`` and ``<dir>/rejudge.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os

from graft_cli.report.markdown import md_table
from graft_cli.report.power import TARGET_HALF_WIDTH, t975
from graft_cli.report.stats import equivalence_verdict, overall_verdict, powered_verdict, verdict
from graft_cli.rundir import atomic_write_json, atomic_write_text, read_json

__all__ = ["floored", "judge_designs", "rejudge_stored", "stored_comparisons"]


def floored(entry: dict) -> dict | None:
    """A stored comparison under the floored rule: (Δ, lo, hi) with SE² = max(total, evaluation) at
    the stored df, whether the floor binds, and the powered verdict (with the seeds ±1 would take at
    the stored per-seed variance)."""
    dec, iv = entry.get("decomposition") or {}, entry.get("interval")
    if not iv or dec.get("total") is None or dec.get("evaluation") is None or not dec.get("df"):
        return None
    se2 = max(float(dec["total"]), float(dec["evaluation"]))
    h = t975(float(dec["df"])) * math.sqrt(se2)
    new = (float(iv[0]), float(iv[0]) - h, float(iv[0]) + h)
    per = dec.get("per_seed") or {}
    var = None if per.get("evaluation") is None else float(per["training"]) + float(per["evaluation"])
    if entry.get("margin") is not None:  # an equivalence claim ("matches"): judged against its margin
        v = equivalence_verdict(new, float(entry["margin"]))
    elif entry.get("unit") not in (None, "points"):  # not pass@1 points (nats): the ±1-point power rule does not apply
        v = verdict(new)
    else:
        v = powered_verdict(new, TARGET_HALF_WIDTH, per_seed_variance=var)
    return {"interval": new, "floor_binds": float(dec["evaluation"]) > float(dec["total"]), "verdict": v}


def stored_comparisons(obj, path: str = "") -> list[tuple[str, dict]]:
    """Every (path, comparison) in a claims.json tree that carries an interval and a
    decomposition."""
    out = []
    if isinstance(obj, dict):
        if "interval" in obj and isinstance(obj.get("decomposition"), dict):
            out.append((path, obj))
        for k, v in obj.items():
            if k not in ("decomposition", "measured"):
                out += stored_comparisons(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            key = v.get("key") if isinstance(v, dict) and v.get("key") else str(i)
            out += stored_comparisons(v, f"{path}[{key}]")
    return out


def _fmt(iv) -> str:
    return "—" if iv is None else f"{iv[0]:+.2f} [{iv[1]:+.2f}, {iv[2]:+.2f}]"


def rejudge_stored(claims: dict) -> list[dict]:
    """One row per stored comparison: its path, stored interval and verdict, the floored interval
    and verdict."""
    rows = []
    for path, c in stored_comparisons(claims.get("claims")):
        f = floored(c)
        if f is None:
            continue
        dec = c["decomposition"]
        rows.append({"comparison": path, "seeds": dec.get("n"), "stored": c["interval"],
                     "stored_verdict": c.get("verdict"), "se2": dec["total"], "v_e": dec["evaluation"],
                     "floored": f["interval"], "floor_binds": f["floor_binds"], "verdict": f["verdict"]})
    return rows


def _restrict(measured: dict, keep: set) -> dict:
    """``measured`` with only the seeds in ``keep`` in its per-seed maps (scores, problems, sampling
    variances)."""
    m = json.loads(json.dumps(measured))
    for key in ("scores", "problems", "eval_var", "eval_var_paired"):
        for run in (m.get(key) or {}).values():
            for pol in list(run):
                run[pol] = {s: v for s, v in run[pol].items() if s in keep}
    return m


def judge_designs(claims: dict, designs: list[tuple[str, int, list[int] | None]]) -> list[dict]:
    """Claims 2-3 of a GRAFT study judged under each design (name, seeds kept: 0..n−1, sequential
    looks or None)."""
    from graft_cli.report.claims import judge  # the GRAFT claims

    rows = []
    for name, n, looks in designs:
        analysis = {"interval": "floored_t", "alpha": 0.05,
                    "sequential": {"spending": "obrien_fleming", "looks": looks} if looks else None}
        m = _restrict(claims["measured"], {str(s) for s in range(n)})
        for c in judge(m, {**claims["settings"], "analysis": analysis})[1:3]:
            for p, v in c.per_model.items():
                rows.append({"design": name, "claim": c.key, "model": p, "interval": v["interval"],
                             "verdict": v["verdict"], "judged_at": v.get("look"), "method": v.get("method")})
            rows.append({"design": name, "claim": c.key, "model": "both",
                         "verdict": overall_verdict(v["verdict"] for v in c.per_model.values())})
    return rows


def markdown(dest: str, stored: list[dict], designs: list[dict]) -> str:
    lines = [f"# {dest}: re-judged from its claims.json", "",
             "Floored interval: SE² = max(SE², V_E) at the stored df (graft_cli/report/power.py eq. 5); "
             f"`underpowered`: half-width over ±{TARGET_HALF_WIDTH:g} point (with the seeds ±1 would take at the "
             "stored per-seed variance; an equivalence claim is judged against its margin, a claim in nats by its "
             "sign). V_E is the stored evaluation variance of Δ̂ (from the paired grades where the study had them, "
             "else each arm's: an upper bound).", ""]
    if designs:
        lines += ["## By design", "", md_table(["design", "claim", "model", "Δ [interval]", "verdict", "judged at"],
                                               [[r["design"], r["claim"], r["model"], _fmt(r.get("interval")),
                                                 r["verdict"], r.get("judged_at") or "—"] for r in designs]), ""]
    lines += ["## Every stored comparison", "",
              md_table(["comparison", "seeds", "stored Δ [interval]", "stored verdict", "SE²", "V_E",
                        "floored Δ [interval]", "floor binds", "verdict"],
                       [[r["comparison"], "/".join(map(str, r["seeds"] or [])), _fmt(r["stored"]),
                         r["stored_verdict"] or "—", f"{r['se2']:.3f}", f"{r['v_e']:.3f}", _fmt(r["floored"]),
                         "yes" if r["floor_binds"] else "no", r["verdict"]] for r in stored]), ""]
    return "\n".join(lines)


def _design(text: str) -> tuple[str, int, list[int] | None]:
    name, n, looks = text.split(":")
    return name, int(n), [int(x) for x in looks.split(",")] if looks else None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m graft_cli.report.rejudge", description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", help="published study folders (each with claims.json)")
    ap.add_argument("--design", action="append", default=[],
                    help="NAME:SEEDS:LOOKS (a GRAFT study: seeds 0..SEEDS-1; LOOKS comma-separated, empty: fixed)")
    a = ap.parse_args(argv)
    for d in a.dirs:
        claims = read_json(os.path.join(d, "claims.json"))
        stored = rejudge_stored(claims)
        designs = judge_designs(claims, [_design(x) for x in a.design]) if a.design else []
        md = markdown(d, stored, designs)
        atomic_write_text(os.path.join(d, "rejudge.md"), md)
        atomic_write_json(os.path.join(d, "rejudge.json"), {"stored": stored, "designs": designs})
        print(md)
        print(f"wrote {os.path.join(d, 'rejudge.md')} and rejudge.json")


if __name__ == "__main__":
    main()
