"""Throughput of ``run.staleness`` k = 1 against k = 0, side by side in one command (docs/async.md).

    python benchmarks/async_speed.py --method graft --steps 6 --reps 3 --threads 2
    python benchmarks/async_speed.py --override rollout.max_new_tokens=96 --override data.prompt_batch=32   # longer

Runs ``graft train --pair tiny --method M`` at k = 0 and k = 1 alternately (0, 1, 0, 1, ...: drift on a shared
machine hits both), ``--reps`` times each, and reads each run's metrics: generated tokens per second of wall time
over steps 2..S (the first step compiles, warms caches and starts the reward workers), the median seconds per step,
and at k = 1 the median time the trainer waited for a collection (``time/rollout_wait``: 0 when generation is hidden
behind the update). Prints the ratio k1 / k0 of tokens/s with a 95% t-interval over the repetitions (paired by
repetition) and writes the raw numbers to ``--out``/async_speed.json. On 2 shared CPU cores both phases compete
for the same cores, which bounds the gain; the deployment asynchronous training exists for gives generation
resources of its own (``rollout.engine=vllm_server``, a GPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def run(method: str, k: int, rep: int, steps: int, threads: int, out: str, extra: list[str]) -> dict:
    name = f"k{k}-r{rep}"
    cmd = [sys.executable, "-m", "graft_cli.cli", "train", "--pair", "tiny", "--method", method, "--steps", str(steps),
           "--seed", "0", "--out", out, "--no-progress", f"run.threads={threads}", "run.save_every=1000",
           "run.log_rollouts=false", f"run.staleness={k}", f"run.name={name}", *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(out, name, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    kept = [r for r in rows if int(r["step"]) > 1]
    steps_kept = sorted({int(r["step"]) for r in kept})
    step_s = {s: next(r["time/step"] for r in kept if int(r["step"]) == s) for s in steps_kept}
    tokens = sum(r.get("num_tokens", 0) for r in kept)
    waits = [r["time/rollout_wait"] for r in kept if "time/rollout_wait" in r]
    return {"tokens_per_s": tokens / sum(step_s.values()), "step_s": statistics.median(step_s.values()),
            "rollout_wait_s": statistics.median(waits) if waits else None}


def interval(xs: list[float]) -> tuple[float, float, float]:
    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, float("nan"), float("nan")
    h = T975.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - h, m + h


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="graft")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--override", action="append", default=[], help="a config key=value for every run")
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="graft_async_speed_")
    res: dict = {0: [], 1: []}
    t0 = time.time()
    for rep in range(args.reps):
        for k in (0, 1):
            res[k].append(run(args.method, k, rep, args.steps, args.threads, out, args.override))
            print(f"rep {rep} k={k}: {res[k][-1]['tokens_per_s']:.0f} tok/s, {res[k][-1]['step_s']:.2f} s/step",
                  flush=True)
    ratio = interval([b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(res[0], res[1])])
    print("\n| k | tokens/s (mean [95% CI]) | s/step (median of runs) | trainer waiting for rollouts (s/step) |")
    print("|---|---|---|---|")
    for k in (0, 1):
        m, lo, hi = interval([r["tokens_per_s"] for r in res[k]])
        waits = [r["rollout_wait_s"] for r in res[k] if r["rollout_wait_s"] is not None]
        print(f"| {k} | {m:.0f} [{lo:.0f}, {hi:.0f}] | {statistics.median(r['step_s'] for r in res[k]):.2f} | "
              f"{statistics.median(waits) if waits else float('nan'):.2f} |")
    print(f"\nk=1 / k=0 tokens/s: {ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}] over {args.reps} paired repetitions "
          f"({args.method}, {args.steps} steps, {args.threads} threads, {time.time() - t0:.0f} s); {out}")
    with open(os.path.join(out, "async_speed.json"), "w") as f:
        json.dump({"args": vars(args), "runs": res, "ratio": ratio}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
