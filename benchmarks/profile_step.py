"""Where one tiny-pair training step spends its time: torch.profiler (operators) and cProfile (Python).

    python benchmarks/profile_step.py --method graft --threads 2            # defaults: pair tiny, 64 prompts
    python benchmarks/profile_step.py --method graft -- algo.old_logprobs=rollout

One warm-up step, then one profiled step of ``Trainer.train_step`` (the policies one after the other,
``run.policy_workers=1``, so operator times add up). Prints three markdown tables and writes them with the
raw numbers to ``--out``/profile.json: the step's phases (its ``time/*`` metrics, summed over the policies),
the operators by self CPU time (torch.profiler ``key_averages``), and the Python functions by cumulative time
(cProfile, filtered to graft_cli and the libraries' entry points).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PHASES = ("time/rollout", "time/reward", "time/old_logprob", "time/exchange", "time/update", "time/step")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="tiny")
    ap.add_argument("--method", default="graft")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--out", default=None)
    ap.add_argument("overrides", nargs="*", help="graft config key=value")
    a = ap.parse_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile

    from graft_cli import config as C
    from graft_cli.train.loop import Trainer

    torch.set_num_threads(a.threads)
    out = a.out or tempfile.mkdtemp(prefix="graft_profile_")
    os.makedirs(out, exist_ok=True)
    cfg = C.compose([f"pair={a.pair}", f"method={a.method}", f"run.out={out}", "run.name=p", f"run.threads={a.threads}",
                     "run.policy_workers=1", "run.log_rollouts=false", "run.save_every=1000", *a.overrides])
    tr = Trainer(cfg, os.path.join(out, "p"), progress=False)
    try:
        tr.train_step()  # warm-up: reward workers, caches, first-call costs
        pr = cProfile.Profile()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            pr.enable()
            rows = tr.train_step()
            pr.disable()
    finally:
        tr.close()
    phases = {p: sum(r.get(p, 0.0) for r in rows) for p in PHASES}
    phases["time/step"] = rows[0]["time/step"]
    ka = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in ka) or 1.0
    ops = sorted(ka, key=lambda e: -e.self_cpu_time_total)[: a.top]
    op_rows = [{"op": e.key, "calls": e.count, "self_s": e.self_cpu_time_total / 1e6,
                "share": e.self_cpu_time_total / total} for e in ops]
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    funcs = []
    for (file, line, name), (_cc, nc, _tt, ct, _callers) in st.stats.items():
        if "graft_cli" in file or name in ("generate", "forward", "backward", "step"):
            funcs.append({"function": f"{os.path.relpath(file, ROOT) if 'graft_cli' in file else file}:{line}({name})",
                          "calls": nc, "cumulative_s": ct})
    funcs = sorted(funcs, key=lambda f: -f["cumulative_s"])[: a.top]
    lines = [f"{a.pair} {a.method}, {a.threads} thread(s), policies in sequence; overrides: {a.overrides or 'none'}",
             "", "| phase (summed over policies) | s |", "|---|---|"]
    lines += [f"| {p.split('/')[1]} | {v:.2f} |" for p, v in phases.items()]
    lines += ["", "| operator (torch.profiler, self CPU) | calls | s | share |", "|---|---|---|---|"]
    lines += [f"| `{r['op']}` | {r['calls']} | {r['self_s']:.2f} | {100 * r['share']:.1f}% |" for r in op_rows]
    lines += ["", "| Python function (cProfile, cumulative) | calls | s |", "|---|---|---|"]
    lines += [f"| `{f['function']}` | {f['calls']} | {f['cumulative_s']:.2f} |" for f in funcs]
    text = "\n".join(lines)
    print(text)
    res = {"pair": a.pair, "method": a.method, "threads": a.threads, "overrides": a.overrides,
           "torch": torch.__version__, "phases": phases, "operators": op_rows, "functions": funcs, "table": text}
    with open(os.path.join(out, "profile.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"written to {os.path.join(out, 'profile.json')}")
    return res


if __name__ == "__main__":
    main()
