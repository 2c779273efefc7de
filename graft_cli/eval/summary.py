"""A model folder's evaluation summary and a run's selection (graft.md §1 "Evaluation"): pass@1 per
run, mean ± std and unbiased pass@k from the per-sample files (``summary.json``), each policy's
steps in ``<run>/eval/<policy>/summary.json``, the best step by ``eval.select_metric``
(``<run>/best.json``) and its weights kept under ``<run>/best/<policy>/``."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import numpy as np

from graft_cli.errors import GraftError
from graft_cli.eval.benchmarks import FIVE
from graft_cli.eval.files import run_file, step_dirs
from graft_cli.eval.metrics import average_over_benchmarks, summarize_benchmark
from graft_cli.rundir import (atomic_write_json, best_path, checkpoint_dir, read_json, read_jsonl)


# ------------------------------------------------------------------------------------------ summary
def grades_array(rows: list[dict], num_problems: int, samples: int, key: str = "grade") -> np.ndarray:
    a = np.full((num_problems, samples), np.nan)
    for r in rows:
        a[int(r["problem_index"]), int(r["sample"])] = float(r.get(key, r["grade"]))  # a skipped prompt: its grade
    if np.isnan(a).any():
        raise GraftError(f"incomplete run file: {int(np.isnan(a).sum())} of {a.size} grades missing")
    return a


def load_correct(out_dir: str, bench: str, num_problems: int, samples: int, key: str = "grade") -> np.ndarray:
    """``correct[run, problem, sample]`` from the contiguous run files ``run1, run2, ...`` (``key``:
    ``base`` for an EvalPlus benchmark's base tests)."""
    runs = []
    k = 1
    while os.path.exists(run_file(out_dir, bench, k)):
        runs.append(grades_array(read_jsonl(run_file(out_dir, bench, k)), num_problems, samples, key))
        k += 1
    return np.stack(runs) if runs else np.zeros((0, num_problems, samples))


def summarize_dir(out_dir: str) -> dict:
    """Summary of every benchmark recorded in ``meta.json`` that has at least one run file."""
    meta = read_json(os.path.join(out_dir, "meta.json"))
    samples = int(meta["settings"]["samples"])
    benches = {}
    for name, fp in meta["benchmarks"].items():
        correct = load_correct(out_dir, name, int(fp["num_problems"]), samples)
        if correct.shape[0] == 0:
            continue
        s = summarize_benchmark(correct)
        s["source"] = fp["source"]
        s["timeouts"] = _count(out_dir, name, correct.shape[0], "timed_out")
        s["truncated"] = _count(out_dir, name, correct.shape[0], "truncated")
        s["skipped_long"] = _count(out_dir, name, correct.shape[0], "skipped")
        if fp.get("kind", "math") != "math":
            s["kind"] = fp["kind"]
        if fp.get("kind") == "code" and "base" in read_jsonl(run_file(out_dir, name, 1))[0]:
            base = summarize_benchmark(load_correct(out_dir, name, int(fp["num_problems"]), samples, "base"), [1])
            s["base"] = {k: base[k] for k in ("runs", "mean", "std")}  # EvalPlus's base tests, beside the plus pass@1
        benches[name] = s
    order = [b for b in FIVE if b in benches] + [b for b in benches if b not in FIVE]
    benches = {b: benches[b] for b in order}
    code = [b for b in benches if benches[b].get("kind") == "code"]
    maths = [b for b in benches if b not in code]
    use = list(FIVE) if all(b in benches for b in FIVE) else (maths or code)
    avg = average_over_benchmarks({b: benches[b]["runs"] for b in use})
    avg["five"] = use == list(FIVE)
    out = {"settings": meta["settings"], "prompt": meta["prompt"], "benchmarks": benches, "average": avg,
           "num_runs": min((b["num_runs"] for b in benches.values()), default=0)}
    if code and maths:  # the code benchmarks' own average beside the math one (which "average" holds)
        out["code_average"] = average_over_benchmarks({b: benches[b]["runs"] for b in code})
    return out


def _count(out_dir: str, bench: str, runs: int, key: str) -> int:
    return int(sum(bool(r.get(key)) for k in range(1, runs + 1) for r in read_jsonl(run_file(out_dir, bench, k))))


def write_summary(out_dir: str, extra: dict | None = None) -> dict:
    summary = summarize_dir(out_dir)
    path = os.path.join(out_dir, "summary.json")
    if extra is None and os.path.exists(path):
        old = read_json(path)
        extra = {k: old[k] for k in ("model", "policy", "step") if k in old}
    summary = {**(extra or {}), **summary}
    atomic_write_json(path, summary)
    return summary


# ------------------------------------------------------------------------------ run-level bookkeeping
@dataclass(frozen=True)
class Selection:
    """How ``best.json`` picks each policy's checkpoint: ``metric`` (pass@k) averaged over
    ``benchmarks`` (empty: the benchmark average's, the five when present) of the step folders under
    ``<run>/<root>/<policy>/``."""

    root: str = "eval"
    metric: str = "pass@1"
    benchmarks: tuple = ()

    @property
    def default(self) -> bool:
        return self.metric == "pass@1" and not self.benchmarks

    def criterion(self) -> str:
        if self.default:
            return ("unweighted benchmark average of pass@1 (five benchmarks when present), mean over the eval runs "
                    "common to all compared steps; ties -> earlier step")
        where = ", ".join(self.benchmarks) or "the benchmark average"
        return (f"{self.metric} (unbiased) on {where}, mean over the eval runs common to all compared steps "
                f"({self.root}/); ties -> earlier step")


def selection_runs(summary: dict, metric: str = "pass@1", benchmarks=()) -> list[float] | None:
    """Per eval run of one step's ``summary.json``: the mean over ``benchmarks`` (empty: the
    benchmark average's) of ``metric`` (pass@k, the unbiased estimator); None when a benchmark or
    that k is missing."""
    k = int(str(metric).split("@")[1])
    names = list(benchmarks) or list((summary.get("average") or {}).get("benchmarks") or summary["benchmarks"])
    per = []
    for b in names:
        v = summary["benchmarks"].get(b)
        runs = None if v is None else (v["runs"] if k == 1 else ((v.get("pass@k") or {}).get(str(k)) or {}).get("runs"))
        if not runs:
            return None
        per.append(runs)
    if not per:
        return None
    return [float(np.mean([p[r] for p in per])) for r in range(min(len(p) for p in per))]


def write_policy_summary(run_dir: str, policy: str, selection: Selection | None = None) -> dict:
    """``<run>/<root>/<policy>/summary.json`` (root ``eval`` unless ``selection`` says otherwise):
    every evaluated step's average and per-benchmark pass@1, and the best step by ``selection``."""
    sel = selection or Selection()
    pdir = os.path.join(run_dir, sel.root, policy)
    steps = {}
    for step, d in step_dirs(pdir).items():
        s = read_json(os.path.join(d, "summary.json"))
        steps[str(step)] = {
            "average": s["average"]["mean"], "std": s["average"]["std"], "num_runs": s["num_runs"],
            "average_runs": s["average"]["runs"], "five": s["average"].get("five", False),
            "benchmarks": {b: {"mean": v["mean"], "std": v["std"]} for b, v in s["benchmarks"].items()},
        }
        if not sel.default:
            steps[str(step)]["select_runs"] = selection_runs(s, sel.metric, sel.benchmarks)
    best = select_best(steps) if sel.default else select_best(steps, key="select_runs")
    out = {"policy": policy, "steps": steps, "best": best, "criterion": sel.criterion()}
    atomic_write_json(os.path.join(pdir, "summary.json"), out)
    return out


def select_best(steps: dict[str, dict], key: str = "average_runs") -> dict | None:
    """The best step on the benchmark average (graft.md §1 "Checkpoint selection").

    Candidates: steps scored on all five benchmarks when any is, else steps scored on the same
    benchmark set as the latest step. Steps are compared on the mean over the eval runs they all
    have (run 1 for in-training validation; all five when every candidate was fully evaluated). Ties
    go to the earlier step. With another ``key`` (a per-run score list of each step, e.g.
    ``select_runs`` of :func:`selection_runs`) the candidates are the steps that have it, compared
    the same way."""
    if not steps:
        return None
    items = sorted(((int(k), v) for k, v in steps.items()), key=lambda kv: kv[0])
    if key != "average_runs":
        cands = [(k, v) for k, v in items if v.get(key)]
    elif any(v["five"] for _, v in items):
        cands = [(k, v) for k, v in items if v["five"]]
    else:
        last = set(items[-1][1]["benchmarks"])
        cands = [(k, v) for k, v in items if set(v["benchmarks"]) == last]
    cands = [(k, v) for k, v in cands if v[key]]
    if not cands:
        return None
    R = min(len(v[key]) for _, v in cands)
    scored = [(float(np.mean(v[key][:R])), k) for k, v in cands]
    score, step = max(scored, key=lambda t: (t[0], -t[1]))
    return {"step": step, "score": score, "runs_compared": R, "candidates": len(cands)}


def update_best(run_dir: str, policies: list[str] | None = None, selection: Selection | None = None) -> dict:
    """Recompute ``<run>/best.json`` from the policies' summaries under ``selection.root`` (default
    ``eval``)."""
    sel = selection or Selection()
    eval_root = os.path.join(run_dir, sel.root)
    if policies is None:
        policies = sorted(d for d in os.listdir(eval_root) if os.path.isdir(os.path.join(eval_root, d))) \
            if os.path.isdir(eval_root) else []
    out = {"criterion": sel.criterion(), "policies": {}}
    for pol in policies:
        summ = write_policy_summary(run_dir, pol, sel)
        best = summ["best"]
        if best is None:
            continue
        entry = dict(best)
        bdir = os.path.join(run_dir, "best", pol)
        ck = checkpoint_dir(run_dir, best["step"], pol)
        if best_folder_step(bdir) == best["step"]:
            entry["checkpoint"] = os.path.relpath(bdir, run_dir)
        elif os.path.isdir(ck):
            entry["checkpoint"] = os.path.relpath(ck, run_dir)
        else:
            entry["checkpoint"] = None
        out["policies"][pol] = entry
    atomic_write_json(best_path(run_dir), out)
    return out


def best_folder_step(bdir: str) -> int | None:
    try:
        with open(os.path.join(bdir, "BEST_STEP")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def save_best_weights(run_dir: str, policy: str, step: int, model, tokenizer) -> str:
    """Keep the selected checkpoint's weights at ``<run>/best/<policy>/`` (checkpoint pruning would
    delete it); written under a temporary name and renamed."""
    final = os.path.join(run_dir, "best", policy)
    tmp = f"{final}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    with open(os.path.join(tmp, "BEST_STEP"), "w") as f:
        f.write(f"{step}\n")
    old = f"{final}.old-{os.getpid()}"
    if os.path.exists(final):
        os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final
