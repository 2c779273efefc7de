"""Step time of methods relative to GRPO on the tiny pair, one method after the other in one command.

    python benchmarks/step_time.py --methods grpo,graft,hacpo,sgt,grpo_kl,grpo_dapo --steps 4 --threads 2
    python benchmarks/step_time.py --methods grpo,grpo_opd,saf,opd_only --solo-grpo    # student a alone

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


def measure(method: str, steps: int, threads: int, out: str, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "graft_cli.cli", "train", "--pair", "tiny", "--method", method, "--steps", str(steps),
           "--seed", "0", "--out", out, "--no-progress", f"run.threads={threads}", "run.save_every=1000",
           "run.log_rollouts=false", *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(out, f"tiny-{method}-s0", "metrics.jsonl")) as f:
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
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="graft_step_time_")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if "grpo" not in methods:
        methods.insert(0, "grpo")
    res = {}
    for m in methods:
        extra = ["policies=[{name: a, model: 'tiny:a'}]"] if (m == "grpo" and args.solo_grpo) else []
        res[m] = measure(m, args.steps, args.threads, out, extra)
        print(f"{m}: {res[m]['step_s']:.1f} s/step", flush=True)
    base = res["grpo"]["step_s"]
    lines = ["| method | s/step | × GRPO | " + " | ".join(p.split("/")[1] for p in PHASES) + " |",
             "|---|---|---|" + "---|" * len(PHASES)]
    for m, r in res.items():
        lines.append(f"| {m} | {r['step_s']:.1f} | {r['step_s'] / base:.2f} | "
                     + " | ".join(f"{r[p]:.1f}" for p in PHASES) + " |")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(out, "step_time.json"), "w") as f:
        json.dump({"steps": args.steps, "threads": args.threads, "results": res, "table": table}, f, indent=1)
    print(f"written to {os.path.join(out, 'step_time.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
