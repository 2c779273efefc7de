"""Record (or compare) a behaviour snapshot of the trainer on the tiny pair.

Runs ``graft train --pair tiny --method M --steps 3 --seed 0`` for M in grpo, graft, graft_hacpo_update and
``graft_stored`` (receiver a against the grpo run's b logs), then writes one JSON object holding, per run,
every non-time key of metrics.jsonl and the sha256 of every file the last checkpoint saved for a policy
(``model.safetensors`` and ``optimizer.pt``). Used to show that a refactor changes nothing:

    python benchmarks/behaviour_snapshot.py --out /tmp/before --json before.json   # on the old tree
    python benchmarks/behaviour_snapshot.py --out /tmp/after --json after.json     # on the new tree
    python benchmarks/behaviour_snapshot.py --compare before.json after.json       # prints every difference

Bit-identical on CPU is the expectation (same torch, same threads).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from graft_cli.rundir import sha256_file  # noqa: E402

METHODS = ("grpo", "graft", "graft_hacpo_update")


def train(method: str, out: str, steps: int, extra: list[str]) -> str:
    cmd = [sys.executable, "-m", "graft_cli.cli", "train", "--pair", "tiny", "--method", method, "--steps",
           str(steps), "--seed", "0", "--out", out, "--no-progress", "run.threads=2", "run.save_every=100", *extra]
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


def compare(a: dict, b: dict) -> int:
    bad = 0
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
    args = ap.parse_args()
    if args.compare:
        with open(args.compare[0]) as f, open(args.compare[1]) as g:
            return compare(json.load(f), json.load(g))
    out = {}
    for m in METHODS:
        out[m] = snapshot(train(m, args.out, args.steps, []))
    partner = os.path.join(args.out, "tiny-grpo-s0")
    stored = [f"exchange.params.partner_run={partner}", "exchange.params.partner_policy=b"]
    out["graft_stored"] = snapshot(train("graft_stored", args.out, args.steps, stored))
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"snapshot written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
