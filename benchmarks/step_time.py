"""Step time of methods relative to GRPO on the tiny pair, one method after the other in one command.

    python benchmarks/step_time.py --methods grpo,graft,hacpo,sgt,grpo_kl,grpo_dapo --steps 4 --threads 2
    python benchmarks/step_time.py --methods grpo,grpo_opd,saf,opd_only --solo-grpo    # student a alone
    python benchmarks/step_time.py --pair tiny3 --methods grpo,graft --independent      # three peers

``--independent`` adds the reference of the N-peer issue: one GRPO run per model of the pair, all started at
once as separate processes (one thread each when the threads do not go round), side by side on the same
machine; its s/step is the slowest of those runs' median step times (they advance together).

Each method trains ``--steps`` steps (``graft train --pair tiny``, seed 0) into a scratch folder; the first
step (compilation, caches, reward workers starting) is dropped and the median ``time/step`` of the others is
reported with its ratio to GRPO's, plus the per-phase medians (rollout, reward, old log-probs, frozen-model
scoring, update) summed over the policies. Run it on an otherwise idle machine: two runs on 2 cores slow each
other down. Prints a markdown table and writes it with the raw numbers to ``--out``/step_time.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

PHASES = ("time/rollout", "time/reward", "time/old_logprob", "time/score_frozen", "time/update")


def command(pair: str, method: str, steps: int, threads: int, out: str, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "graft_cli.cli", "train", "--pair", pair, "--method", method, "--steps", str(steps),
            "--seed", "0", "--out", out, "--no-progress", f"run.threads={threads}", "run.save_every=1000",
            "run.log_rollouts=false", *extra]


def measure(method: str, steps: int, threads: int, out: str, extra: list[str], pair: str = "tiny",
            name: str | None = None) -> dict:
    if name is not None:
        extra = [*extra, f"run.name={name}"]
    subprocess.run(command(pair, method, steps, threads, out, extra), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return summarise(os.path.join(out, name or f"{pair}-{method}-s0"))


def independent(pair: str, steps: int, threads: int, out: str) -> dict:
    """One GRPO run per policy of ``pair``, all at once in separate processes; the slowest median step."""
    from graft_cli import config as C

    pols = [(p.name, p.model) for p in C.compose([f"pair={pair}"]).policies]
    each = max(1, threads // len(pols))
    procs = {n: subprocess.Popen(command(pair, "grpo", steps, each, out,
                                         [f"policies=[{{name: {n}, model: '{m}'}}]", f"run.name=solo-{n}"]),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for n, m in pols}
    for n, p in procs.items():
        if p.wait() != 0:
            raise SystemExit(f"the independent GRPO run of {n} failed (exit {p.returncode})")
    per = {n: summarise(os.path.join(out, f"solo-{n}")) for n in procs}
    slow = max(per.values(), key=lambda r: r["step_s"])
    return {**slow, "per_policy": {n: r["step_s"] for n, r in per.items()}, "threads_each": each}


def summarise(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    by_step: dict[int, list[dict]] = {}
    for r in rows:
        if "time/step" in r:
            by_step.setdefault(int(r["step"]), []).append(r)
    kept = [by_step[s] for s in sorted(by_step) if s > 1] or [by_step[s] for s in sorted(by_step)]
    res = {"step_s": statistics.median(rs[0]["time/step"] for rs in kept), "steps": len(kept)}
    for ph in PHASES:
        vals = [sum(r.get(ph, 0.0) for r in rs) for rs in kept]
        res[ph] = statistics.median(vals)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="grpo,graft,hacpo,sgt,grpo_kl,grpo_dapo")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--solo-grpo", action="store_true",
                    help="the GRPO baseline trains policy a alone (the reference for the OPD methods' student)")
    ap.add_argument("--pair", default="tiny")
    ap.add_argument("--override", action="append", default=[], help="a config key=value for every run")
    ap.add_argument("--independent", action="store_true",
                    help="also time one GRPO run per policy, all at once as separate processes")
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="graft_step_time_")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if "grpo" not in methods:
        methods.insert(0, "grpo")
    res = {}
    for m in methods:
        extra = ["policies=[{name: a, model: 'tiny:a'}]"] if (m == "grpo" and args.solo_grpo) else []
        extra = [*extra, *args.override]
        res[m] = measure(m, args.steps, args.threads, out, extra, pair=args.pair)
        print(f"{m}: {res[m]['step_s']:.1f} s/step", flush=True)
    if args.independent:
        res["grpo x independent"] = independent(args.pair, args.steps, args.threads, out)
        print(f"independent GRPO runs: {res['grpo x independent']['per_policy']} s/step", flush=True)
    base = res["grpo"]["step_s"]
    lines = ["| method | s/step | × GRPO | " + " | ".join(p.split("/")[1] for p in PHASES) + " |",
             "|---|---|---|" + "---|" * len(PHASES)]
    for m, r in res.items():
        lines.append(f"| {m} | {r['step_s']:.1f} | {r['step_s'] / base:.2f} | "
                     + " | ".join(f"{r[p]:.1f}" for p in PHASES) + " |")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(out, "step_time.json"), "w") as f:
        json.dump({"pair": args.pair, "overrides": args.override, "steps": args.steps, "threads": args.threads,
                   "results": res, "table": table}, f, indent=1)
    print(f"written to {os.path.join(out, 'step_time.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
