"""The CPU cost of a LoRA step against a full-weight one, side by side in one run.

    python benchmarks/lora_cost.py                         # the tiny pair and the long workload, r 8, 3 steps
    python benchmarks/lora_cost.py --workloads tiny --steps 4 --reps 2

KL-regularised GRPO (``method=grpo_kl``: a frozen reference of the initial policy, which a LoRA policy gets for free:
its base with the adapter disabled) on

* ``tiny``: the tiny pair's ``a`` (1.8M parameters), 32 prompts x 8 samples, 96 new tokens at most;
* ``long``: benchmarks/cpu_trl_compare.py's long workload (a 19.0M-parameter Qwen3, 4 prompts x 8 samples of 512
  tokens, ``ignore_eos``).

Each configuration trains in a fresh process (``--child``), full weights and LoRA alternating ``--reps`` times; per
run: seconds per step and per update (the trainer's ``time/step`` / ``time/update``, the first step dropped), the
process's peak resident memory (``ru_maxrss``), and the bytes of the weights and optimizer state it holds
(parameters, the frozen reference's copy, AdamW's two moments and the gradients of what trains). The last line is
``JSON {...}`` with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def overrides(workload: str, model: str | None, data: str | None, out: str, steps: int, r: int) -> list[str]:
    ov = ["method=grpo_kl", f"run.out={out}", f"run.steps={steps}", "run.save_every=0", "run.log_rollouts=false",
          "reward.num_workers=1"]
    if workload == "tiny":
        ov += ["pair=tiny", "policies=[{name: a, model: 'tiny:a'}]", "data.prompt_batch=32", "algo.minibatch_prompts=8"]
    else:
        from cpu_trl_compare import WORKLOADS

        w = WORKLOADS["long"]
        ov += ["pair=tiny", f"policies=[{{name: a, model: '{model}'}}]", f"data.train={data}",
               f"data.prompt_batch={w['prompts']}", f"algo.minibatch_prompts={w['prompts']}", f"rollout.n={w['n']}",
               f"rollout.max_new_tokens={w['new_tokens']}", "+rollout.engine_kwargs.ignore_eos=true",
               "rollout.max_prompt_tokens=512"]
    if r:
        ov.append(f"policies.0.lora.r={r}")
    return ov


def child(spec: dict) -> None:
    """One run in this process; prints ``RESULT {json}``."""
    import torch

    from graft_cli import config as C
    from graft_cli.train.loop import Trainer

    torch.set_num_threads(spec["threads"])
    with tempfile.TemporaryDirectory() as out:
        cfg = C.compose(overrides(spec["workload"], spec.get("model"), spec.get("data"), out, spec["steps"],
                                  spec["r"]))
        tr = Trainer(cfg, os.path.join(out, "r"), progress=False)
        rows = [tr.train_step()[0] for _ in range(spec["steps"])]
        pol = tr.policies["a"]
        trainable = sum(p.numel() * p.element_size() for p in pol.model.parameters() if p.requires_grad)
        params = sum(p.numel() * p.element_size() for p in pol.model.parameters())
        copies = sum(p.numel() * p.element_size() for f in tr.frozen.values() if f.model is not pol.model
                     for p in f.model.parameters())
        tr.close()
    held = params + copies + 3 * trainable  # weights, a reference copy, gradients and AdamW's two moments
    print("RESULT " + json.dumps({
        "s_per_step": statistics.mean(r["time/step"] for r in rows[1:]),
        "update_s": statistics.mean(r["time/update"] for r in rows[1:]),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "weights_and_states_mib": held / 2**20, "trainable_params": trainable // 4,
        "reference_copy_mib": copies / 2**20}), flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="tiny,long")
    ap.add_argument("--steps", type=int, default=3, help="steps per run (the first is dropped)")
    ap.add_argument("--reps", type=int, default=1, help="full / LoRA pairs per workload, alternating")
    ap.add_argument("--r", type=int, default=8, help="LoRA rank")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(json.loads(a.child))
        return
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for wl in a.workloads.split(","):
            spec = {"workload": wl, "steps": a.steps, "threads": a.threads}
            if wl == "long":
                from cpu_trl_compare import WORKLOADS, build

                spec["model"], spec["data"] = build(tmp, "long", WORKLOADS["long"], 16)
            for rep in range(a.reps):
                for r in (0, a.r):
                    res = subprocess.run([sys.executable, __file__, "--child", json.dumps({**spec, "r": r})],
                                         capture_output=True, text=True, cwd=ROOT,
                                         env={**os.environ, "OMP_NUM_THREADS": str(a.threads)})
                    line = next((x for x in res.stdout.splitlines() if x.startswith("RESULT ")), None)
                    if res.returncode != 0 or line is None:
                        raise SystemExit(f"{wl} r={r}: the run failed: {res.stderr.strip().splitlines()[-1:]}")
                    got = json.loads(line[7:])
                    results.setdefault(f"{wl}/{'lora' if r else 'full'}", []).append(got)
                    print(f"{wl:5s} {'LoRA r=' + str(r) if r else 'full weights':13s} rep {rep}: "
                          f"{got['s_per_step']:.2f} s/step (update {got['update_s']:.2f} s), peak RSS "
                          f"{got['peak_rss_mib']:.0f} MiB, weights + states {got['weights_and_states_mib']:.1f} MiB "
                          f"(reference copy {got['reference_copy_mib']:.1f}), trainable {got['trainable_params']:,}",
                          flush=True)
    summary = {k: {m: statistics.mean(x[m] for x in v) for m in v[0]} for k, v in results.items()}
    print("JSON " + json.dumps({"r": a.r, "steps": a.steps, "threads": a.threads, "runs": results, "mean": summary}))


if __name__ == "__main__":
    main()
