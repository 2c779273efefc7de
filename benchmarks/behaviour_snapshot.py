"""Record (or compare) a behaviour snapshot of the trainer on the tiny pair.

Runs ``graft train --pair tiny --method M --steps 3 --seed 0`` for M in grpo, graft, graft_hacpo_update, saf and
tandem (the last two validating at step 3 on the tiny aime24 set) and ``graft_stored`` (receiver a against the grpo
run's b logs), then writes one JSON object holding, per run, every non-time key of metrics.jsonl and the sha256 of
every file the last checkpoint saved for a policy (``model.safetensors`` and ``optimizer.pt``). Beside the training
runs (``--no-extra`` leaves them out) it records what the other commands make of them, every value that is not a
time: ``graft eval --run`` of the grpo run (two benchmarks) and of the tandem run (its handoff and legibility
evaluations), ``graft complementarity`` from the grpo run's logs and from two models sampled afresh,
``graft report`` over the runs, and a reduced tiny build (``Recipe.reduced()``, in a folder of its own: the
default cache is never touched) with its weight hashes, token statistics and ``check_tiny`` measurements. Used to
show that a refactor changes nothing:

    python benchmarks/behaviour_snapshot.py --out /tmp/before --json before.json   # on the old tree
    python benchmarks/behaviour_snapshot.py --out /tmp/after --json after.json     # on the new tree
    python benchmarks/behaviour_snapshot.py --compare before.json after.json       # prints every difference

Bit-identical on CPU is the expectation (same torch, same threads) at ``--threads 1``. At 2 threads the runs of one
policy (graft_stored, saf, tandem) can differ from one run to the next in the last bits (~1e-8 relative: the same
tree, run twice on a loaded machine), so a refactor's check is made at ``--threads 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from graft_cli.rundir import sha256_file  # noqa: E402

METHODS = ("grpo", "graft", "graft_hacpo_update")
VALIDATE = ["eval.every=3", "eval.benchmarks=[aime24]", "eval.samples=2"]  # the saf and tandem runs validate
TIME_WORDS = {"time", "times", "seconds", "second", "sec", "hours", "hour", "date", "commit", "machine", "host",
              "hostname", "python", "torch", "wall", "elapsed", "platform", "created", "timestamp", "git"}


def train(method: str, out: str, steps: int, extra: list[str], threads: int = 2) -> str:
    """One 3-step run on ``threads`` torch threads (1: no value depends on how a parallel sum is split)."""
    cmd = [sys.executable, "-m", "graft_cli.cli", "train", "--pair", "tiny", "--method", method, "--steps",
           str(steps), "--seed", "0", "--out", out, "--no-progress", f"run.threads={threads}", "run.save_every=100",
           *extra]
    subprocess.run(cmd, check=True)
    name = f"tiny-{method}-s0"
    return os.path.join(out, name)


def snapshot(run: str) -> dict:
    with open(os.path.join(run, "metrics.jsonl")) as f:
        rows = [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")} for line in f if line.strip()]
    ck = os.path.join(run, "checkpoints")
    last = sorted(d for d in os.listdir(ck) if d.startswith("step_") and ".tmp" not in d)[-1]
    files = {}
    for pol in sorted(os.listdir(os.path.join(ck, last))):
        d = os.path.join(ck, last, pol)
        if os.path.isdir(d):
            for fn in sorted(os.listdir(d)):
                if fn.endswith((".safetensors", "optimizer.pt")):
                    files[f"{pol}/{fn}"] = sha256_file(os.path.join(d, fn))
    return {"metrics": rows, "weights": files, "checkpoint": last}


def _timeless(o, key: str = ""):
    """``o`` with every key that names a time, a date or the machine left out (recursively)."""
    if isinstance(o, dict):
        return {k: _timeless(v, k) for k, v in sorted(o.items()) if not _is_time(str(k))}
    if isinstance(o, list):
        return [_timeless(v) for v in o]
    return o


def _is_time(key: str) -> bool:
    """A key that names a time, a date or the machine (``time/step``, ``build_seconds``, ``gpu_hours``, ``wall_s``)."""
    k = key.lower()
    return k.startswith("time/") or k.endswith("_s") or bool(set(re.split(r"[^a-z0-9]+", k)) & TIME_WORDS)


def _jsons(folder: str, suffixes=(".json", ".jsonl")) -> dict:
    """relative path -> the timeless content of every JSON / JSONL file under ``folder``."""
    out = {}
    for dp, _, names in sorted(os.walk(folder)):
        for f in sorted(names):
            path = os.path.join(dp, f)
            rel = os.path.relpath(path, folder)
            if f.endswith(".jsonl") and f.endswith(suffixes):
                with open(path) as fh:
                    out[rel] = [_timeless(json.loads(line)) for line in fh if line.strip()]
            elif f.endswith(".json") and f.endswith(suffixes):
                with open(path) as fh:
                    out[rel] = _timeless(json.load(fh))
    return out


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "graft_cli.cli", *args], check=True)


def extras(out: str) -> dict:
    """What eval, complementarity, report and a reduced tiny build make (module docstring), all times left out."""
    res = {}
    grpo, tandem = os.path.join(out, "tiny-grpo-s0"), os.path.join(out, "tiny-tandem-s0")
    cli("eval", "--run", grpo, "--benchmarks", "aime24,amc23", "--runs", "1", "--samples", "2", "--no-progress")
    res["eval_grpo"] = _jsons(os.path.join(grpo, "eval")) | {"best.json": _jsons(grpo, ("best.json",))}
    cli("eval", "--run", tandem, "--benchmarks", "aime24", "--runs", "1", "--samples", "2", "--no-progress")
    res["eval_tandem"] = _jsons(os.path.join(tandem, "eval"))
    cli("complementarity", "--runs", grpo, "--out", os.path.join(out, "comp_runs"), "--no-progress")
    res["complementarity_runs"] = _jsons(os.path.join(out, "comp_runs"))
    probs = os.path.join(out, "problems.jsonl")
    with open(os.path.join(os.path.expanduser(os.environ.get("GRAFT_CACHE") or "~/.cache/graft/tiny"), "task",
                           "eval_amc23.jsonl")) as f, open(probs, "w") as g:
        g.writelines(f.readlines()[:16])
    cli("complementarity", "--models", "tiny:a", "tiny:b", "--data", probs, "--samples", "4", "--max-new-tokens",
        "96", "--out", os.path.join(out, "comp_models"), "--no-progress")
    res["complementarity_models"] = _jsons(os.path.join(out, "comp_models"))
    cli("report", out, "--out", os.path.join(out, "report"), "--no-plots")
    res["report"] = _jsons(os.path.join(out, "report"))
    res["tiny_reduced"] = reduced_tiny(os.path.join(out, "tiny_reduced"))
    return res


def reduced_tiny(cache: str) -> dict:
    """A reduced tiny build (``Recipe.reduced()``, two workers) in ``cache`` and ``check_tiny`` on it: the
    manifest's hashes, token statistics and models (times left out) and the measured properties."""
    code = f"""
import json, sys
try:
    from graft_cli.tiny import build as B, check as C
except ImportError:
    from graft_cli.models import tiny as B
    C = B
paths = B.build_tiny({cache!r}, seed=0, force=True, progress=False, recipe=B.Recipe.reduced())
man = B.read_manifest({cache!r})
props = C.check_tiny(paths, num_prompts=32, n=4, seed=0, heldout=16, max_new_tokens=man["max_new_tokens"])
for r in ("a", "b"):
    for k in ("s", "s_correct", "s_family"):
        props.get("regime", {{}}).get(r, {{}}).pop(k, None)
print(json.dumps({{"manifest": man, "check": props}}, default=str))
"""
    r = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return _timeless(json.loads(r.stdout.strip().splitlines()[-1]))


def _norm(v):
    """An absolute path compares by its last component: the two trees may read the pair from different caches."""
    return os.path.basename(v) if isinstance(v, str) and v.startswith("/") and "\n" not in v else v


def _untimed_report(rep):
    """``graft report``'s tables without Table 5 (compute: seconds per step and GPU-hours are times)."""
    if isinstance(rep, dict) and isinstance(rep.get("report.json"), dict):
        rj = dict(rep["report.json"])
        rj["tables"] = [t for t in rj.get("tables", []) if not str(t.get("title", "")).startswith("Table 5: compute")]
        rep = {**rep, "report.json": rj}
    return rep


def compare_extra(a: dict, b: dict, path: str = "") -> int:
    """Every difference between two timeless trees (printed; absolute paths by their last component); their
    count."""
    if isinstance(a, dict) and isinstance(b, dict):
        bad = 0
        for k in sorted(set(a) | set(b)):
            if k not in a:  # added later (a new field or metric): listed, not counted as a change
                print(f"{path}/{k}: only in after (added: {str(b[k])[:40]})")
            elif k not in b:
                print(f"{path}/{k}: only in before")
                bad += 1
            else:
                bad += compare_extra(a[k], b[k], f"{path}/{k}")
        return bad
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return sum(compare_extra(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
    a, b = _norm(a), _norm(b)
    if a != b and not (isinstance(a, float) and isinstance(b, float) and a != a and b != b):  # nan == nan
        print(f"{path}: {str(a)[:120]!r} != {str(b)[:120]!r}")
        return 1
    return 0


def _leaves(o) -> int:
    if isinstance(o, dict):
        return sum(_leaves(v) for v in o.values())
    if isinstance(o, list):
        return sum(_leaves(v) for v in o)
    return 1


def compare(a: dict, b: dict) -> int:
    bad = 0
    ea, eb = a.pop("_extra", None), b.pop("_extra", None)
    if ea is not None or eb is not None:
        if ea is None or eb is None:
            print(f"extra outputs only in {'after' if ea is None else 'before'}")
            bad += 1
        else:
            ea["report"], eb["report"] = _untimed_report(ea.get("report")), _untimed_report(eb.get("report"))
            for k in sorted(set(ea) | set(eb)):
                n = compare_extra(ea.get(k), eb.get(k), k)
                print(f"{k}: {_leaves(ea.get(k))} values compared, {n} differences")
                bad += n
    for run in sorted(set(a) | set(b)):
        ra, rb = a.get(run), b.get(run)
        if ra is None or rb is None:
            print(f"{run}: only in {'after' if ra is None else 'before'}")
            bad += 1
            continue
        added = set()
        for i, (x, y) in enumerate(zip(ra["metrics"], rb["metrics"])):
            added |= set(y) - set(x)  # new metrics (a feature added later) are listed, not counted as changes
            for k in sorted(set(x)):
                if x.get(k) != y.get(k):
                    print(f"{run} row {i} ({x.get('policy')} step {x.get('step')}): {k}: {x.get(k)!r} != {y.get(k)!r}")
                    bad += 1
        if added:
            print(f"{run}: metrics only in the second snapshot: {', '.join(sorted(added))}")
        if len(ra["metrics"]) != len(rb["metrics"]):
            print(f"{run}: {len(ra['metrics'])} vs {len(rb['metrics'])} metric rows")
            bad += 1
        for k in sorted(set(ra["weights"]) | set(rb["weights"])):
            if ra["weights"].get(k) != rb["weights"].get(k):
                print(f"{run}: {k}: sha256 differs")
                bad += 1
        n_keys = sum(len(r) for r in ra["metrics"])
        print(f"{run}: {len(ra['metrics'])} rows, {n_keys} values, {len(ra['weights'])} weight files compared")
    print("identical" if bad == 0 else f"{bad} differences")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/graft_snapshot")
    ap.add_argument("--json", default="snapshot.json")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    ap.add_argument("--no-extra", action="store_true", help="the training runs only (no eval, report, tiny build)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the training runs (default 2)")
    args = ap.parse_args()
    if args.compare:
        with open(args.compare[0]) as f, open(args.compare[1]) as g:
            return compare(json.load(f), json.load(g))
    out = {}
    for m in METHODS:
        out[m] = snapshot(train(m, args.out, args.steps, [], args.threads))
    partner = os.path.join(args.out, "tiny-grpo-s0")
    stored = [f"exchange.params.partner_run={partner}", "exchange.params.partner_policy=b"]
    out["graft_stored"] = snapshot(train("graft_stored", args.out, args.steps, stored, args.threads))
    for m in ("saf", "tandem"):
        out[m] = snapshot(train(m, args.out, args.steps, VALIDATE, args.threads))
    if not args.no_extra:
        out["_extra"] = extras(args.out)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"snapshot written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
