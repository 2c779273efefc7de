"""A plan's results: each run's record completed from its directory (:func:`measured_record`:
status, the scores of its evaluated step, training seconds, provenance) and the plan's results
files, ``<out>/plan_<name>.json`` (the plan, each execution's wall time and commit, the tiny build,
the records) and ``<out>/plan_<name>.md`` (a table). """

from __future__ import annotations

import os
import time

from graft_cli.config import EXPERIMENTS_DIR
from graft_cli.plan import status as S
from graft_cli.plan.spec import Plan, PlanRun
from graft_cli.report.markdown import md_table
from graft_cli.rundir import (
    atomic_write_json,
    atomic_write_text,
    best_path,
    read_json_or_none,
    read_metrics,
    training_rows,
)
from graft_cli.train.provenance import read_provenance, source_commit


def run_scores(run_dir: str, steps_spec: str) -> dict:
    """policy -> {step, avg, std, num_runs, benchmarks} (pass@1 in %) of the evaluated step that
    stands for the run: the selected (best.json) step for ``best``; otherwise the latest evaluated
    step of the spec."""
    out = {}
    targets = S.eval_targets(run_dir, steps_spec) or {}
    best = read_json_or_none(best_path(run_dir)) or {}
    for pol in S.run_policies(run_dir):
        cands = targets.get(pol) or []
        step = None
        if steps_spec == "best" and pol in (best.get("policies") or {}):
            step = int(best["policies"][pol]["step"])
        if step is None or S.eval_summary(run_dir, pol, step) is None:
            done = [s for s in cands if S.eval_summary(run_dir, pol, s) is not None]
            step = done[-1] if done else None
        if step is None:
            continue
        summ = S.eval_summary(run_dir, pol, step)
        avg = summ.get("average") or {}
        out[pol] = {"step": step, "avg": _pct(avg.get("mean")), "std": _pct(avg.get("std")),
                    "num_runs": summ.get("num_runs"),
                    "benchmarks": {b: _pct(v.get("mean")) for b, v in (summ.get("benchmarks") or {}).items()}}
    return out


def _pct(v):
    return None if v is None else 100.0 * float(v)


def train_seconds(run_dir: str) -> float:
    """Σ time/step over metrics.jsonl (training lines, one per step)."""
    tot, seen = 0.0, set()
    for m in training_rows(read_metrics(run_dir)):
        if m.get("step") not in seen:
            seen.add(m.get("step"))
            tot += float(m["time/step"])
    return tot


def run_provenance(run_dir: str) -> dict | None:
    """The run's first session (commit, dirty, start), its config and tiny build hashes and its
    session count."""
    prov = read_provenance(run_dir)
    if not prov:
        return None
    first = (prov.get("sessions") or [{}])[0]
    return {"commit": first.get("commit"), "dirty": first.get("dirty"), "started": first.get("started"),
            "sessions": len(prov.get("sessions") or []), "config_hash": prov.get("config_hash"),
            "tiny_build_hash": (prov.get("tiny_build") or {}).get("hash")}


def measured_record(plan: Plan, r: PlanRun, rec: dict) -> dict:
    """``rec`` completed from run ``r``'s directory: status, scores of its evaluated step, training
    seconds, provenance."""
    rec.pop("_finished", None)
    rec["status"] = S.run_status(rec["dir"], plan.steps).label()
    rec["provenance"] = run_provenance(rec["dir"])
    ev = plan.eval_for(r)
    rec["scores"] = run_scores(rec["dir"], ev.steps) if ev.enabled else {}
    rec["train_time_s"] = train_seconds(rec["dir"])
    return rec


def disk_records(plan: Plan, out: str) -> list[dict]:
    """One record per run from what its directory holds (runs trained elsewhere, e.g. as Slurm
    jobs)."""
    return [measured_record(plan, r, {"key": r.key, "name": r.name, "method": r.method, "seed": r.seed,
                                      "run": plan.run_name(r), "dir": plan.run_dir(r, out),
                                      "overrides": list(r.overrides), "partner": r.partner_key(),
                                      "trained": "elsewhere", "evaluated": "elsewhere", "error": None,
                                      "train_s": 0.0, "eval_s": 0.0}) for r in plan.runs]


def score_cell(sc: dict | None) -> str:
    if not sc or sc.get("avg") is None:
        return "—"
    std = sc.get("std")
    s = f"{sc['avg']:.2f}" + (f"±{std:.2f}" if std is not None and std == std else "")
    return f"{s} @{sc['step']}"


def results_markdown(plan: Plan, records: list[dict]) -> str:
    pols = []
    for r in records:
        for p in r.get("scores") or {}:
            if p not in pols:
                pols.append(p)
    cols = ["run", "method", "seed", "status", "train", "eval", *[f"{p} avg (pass@1 %)" for p in pols], "error"]
    rows = []
    for r in records:
        rows.append([r["run"], r["method"], r["seed"], r.get("status", ""), r.get("trained") or "—",
                     r.get("evaluated") or "—", *[score_cell((r.get("scores") or {}).get(p)) for p in pols],
                     r.get("error") or ""])
    return md_table(cols, rows)


def shown_path(path: str) -> str:
    """``path`` as a results file shows it: relative to the repository when it lies inside it
    (``experiments/reproduce/tiny.yaml``), else its file name (no machine's folders in a published
    file)."""
    if not path:
        return path
    root = os.path.dirname(os.path.abspath(EXPERIMENTS_DIR))
    full = os.path.abspath(path)
    return os.path.relpath(full, root) if full.startswith(root + os.sep) else os.path.basename(full)


def write_results(plan: Plan, out: str, records: list[dict], wall_s: float, tiny: dict | None = None,
                  started: str | None = None, state: str = "finished") -> tuple[str, str]:
    """``plan_<name>.json`` and ``.md`` in ``out``: the runs' records and the plan's executions, this
    one added as a stage (``finished`` time, wall time, commit, runs trained, ``state``: running |
    finished | stopped). An execution that writes again with the same ``started`` time replaces
    its own stage, so a running execution records its stage after every run and a killed one
    leaves the stage as of its last finished run."""
    base = os.path.join(out, f"plan_{plan.name}")
    prev = read_json_or_none(base + ".json") or {}
    commit, dirty = source_commit()
    history = list(prev.get("executions") or [])
    if started is not None and history and history[-1].get("started") == started:
        history.pop()
    history.append({
        "started": started, "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "wall_s": round(wall_s, 1),
        "commit": commit, "dirty": dirty, "state": state,
        "trained": sum(r.get("trained") in ("trained", "resumed") for r in records)})
    atomic_write_json(base + ".json", {
        "plan": plan.name, "source": shown_path(plan.source), "pair": plan.pair, "steps": plan.steps,
        "overrides": plan.overrides, "eval": eval_dict(plan), "claims": plan.claims, "out": shown_path(out),
        "executions": history, "tiny": tiny or prev.get("tiny"), "runs": records})
    md = [f"# Plan {plan.name}", "", f"Pair {plan.pair}; steps {plan.steps}; source {shown_path(plan.source)}; "
          f"last execution {wall_s / 60:.1f} min.", "", results_markdown(plan, records), ""]
    atomic_write_text(base + ".md", "\n".join(md))
    return base + ".json", base + ".md"


def load_results(out: str, name: str) -> dict | None:
    return read_json_or_none(os.path.join(out, f"plan_{name}.json"))


def eval_dict(plan: Plan, r: PlanRun | None = None) -> dict | None:
    """The evaluation settings of run ``r`` (``None``: the plan's own) as a dict; None when
    evaluation is off."""
    ev = plan.eval_for(r) if r is not None else plan.eval
    if not ev.enabled:
        return None
    return {k: getattr(ev, k) for k in ev.__dataclass_fields__}
