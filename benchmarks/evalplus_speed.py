"""Throughput on HumanEval+ and MBPP+ (base + plus inputs): answers graded per second by graft's code reward and by
EvalPlus's own evaluator, on the same answers, in the same run, at 1 and 2 worker processes.

The answers: the first ``--tasks`` tasks of each release file, each task's canonical solution and its mutants
(benchmarks/evalplus_agreement.py, every kind but the quadratic one, whose time-outs measure the time limits, not
the grader). graft: :class:`graft_cli.reward.code_grader.CodeGrader` with ``--workers`` workers, started and warmed
before the clock starts, its expected outputs cached before; EvalPlus: ``evalplus.evaluate.evaluate`` with
``parallel`` = the same count and its defaults (printed), its expected outputs cached before, the clock around the
call (its process pool's start included: it starts one per call). Both stop a group at its first failure.

    python benchmarks/evalplus_speed.py [--data ../shared/data/evalplus] [--datasets humaneval,mbpp] [--tasks 40]
        [--workers 1,2] [--out docs/measurements/evalplus]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from evalplus_agreement import (  # noqa: E402
    DEFAULT_DATA,
    EVALPLUS_SETTINGS,
    FILES,
    HERE,
    KINDS,
    answers_for,
    evalplus_verdicts,
    graft_problems,
    graft_verdicts,
    slice_file,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA, help="folder with the EvalPlus release files")
    ap.add_argument("--datasets", default="humaneval,mbpp")
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(HERE, "..", "docs", "measurements", "evalplus"))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    from graft_cli.data.evalplus_files import read_release
    from graft_cli.reward.sandbox import Sandbox

    sb = Sandbox(0)
    try:
        feats = sb.features()
    finally:
        sb.close()
    print("sandbox here:", ", ".join(f"{k}={'on' if v else 'off'}" for k, v in sorted(feats.items())), flush=True)
    out = {"sandbox": feats, "rows": []}
    settings = None
    with tempfile.TemporaryDirectory(prefix="evalplus-speed-") as tmp:
        for ds in args.datasets.split(","):
            release = slice_file(os.path.join(args.data, FILES[ds]), args.tasks, tmp)
            rows = read_release(release, ds)
            answers = [a for a in answers_for(rows, len(KINDS), args.seed) if a["kind"] != "quadratic"]
            probs = graft_problems(ds, release, max(int(x) for x in args.workers.split(",")))["problems"]
            for w in [int(x) for x in args.workers.split(",")]:
                ours = graft_verdicts(probs, answers, w)
                theirs = evalplus_verdicts(ds, release, answers, w, tmp)
                settings = theirs
                same = sum(a == b for a, b in zip(ours["verdicts"], theirs["verdicts"]))
                row = {"dataset": ds, "tasks": len(rows), "answers": len(answers), "workers": w,
                       "graft_s": ours["seconds"], "evalplus_s": theirs["seconds"],
                       "graft_per_s": len(answers) / ours["seconds"],
                       "evalplus_per_s": len(answers) / theirs["seconds"], "same_verdicts": same,
                       "plus_pass": sum(v[1] for v in ours["verdicts"])}
                out["rows"].append(row)
                print(f"{ds:9s} workers={w}: {len(answers)} answers ({row['plus_pass']} pass base + plus) - graft "
                      f"{ours['seconds']:6.2f} s = {row['graft_per_s']:6.1f}/s, EvalPlus {theirs['seconds']:6.2f} s = "
                      f"{row['evalplus_per_s']:6.1f}/s (ratio {row['graft_per_s'] / row['evalplus_per_s']:.2f}); "
                      f"same verdicts {same}/{len(answers)}", flush=True)
    line = EVALPLUS_SETTINGS.format(m=settings["min_time_limit"], f=settings["gt_time_limit_factor"]) + \
        f"; evalplus {settings['version']}"
    print(line)
    out["evalplus_settings"] = line
    if not args.no_write:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "speed.json"), "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
        print("wrote", os.path.join(args.out, "speed.json"))


if __name__ == "__main__":
    main()
