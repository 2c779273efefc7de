"""Reward throughput: 1,024 responses (128 prompts x 8 samples, about half correct) graded in-process
and with 1 and 2 worker processes, for integer answers and for MATH-like mixed answer types.

    python benchmarks/reward_speed.py [--n 1024] [--group 8] [--repeats 2]

Each configuration grades fresh batches (new gold answers, as in a new RL step: every gold is parsed
once per worker, then reused by its group). Workers are started and warmed before timing.
"""

from __future__ import annotations

import argparse
import os
import random
import time

from graft_cli.reward.pool import MathVerifyGrader

FILLER = ("We first rewrite the condition, then simplify both sides and check the boundary cases. "
          "Substituting back confirms the value. ") * 6


def _answers(kind: int, a: int, b: int, c: int, d: int) -> tuple[str, list[str], str]:
    """(gold, two equivalent right answers, a wrong answer that depends on ``d``)."""
    if kind == 0:
        return str(a * b), [f"{a * b}", f"{a * b}.0"], f"{a * b + d}"
    if kind == 1:
        return f"\\frac{{{a}}}{{{b}}}", [f"\\dfrac{{{2 * a}}}{{{2 * b}}}", f"{a}/{b}"], f"\\frac{{{a + d}}}{{{b}}}"
    if kind == 2:
        return f"{c}\\sqrt{{{a}}}", [f"\\sqrt{{{c * c * a}}}", f"{c}\\sqrt{{{a}}}"], f"{c + d}\\sqrt{{{a}}}"
    if kind == 3:
        return f"(-\\infty, {a}]", [f"(-\\infty,{a}]", f"(-\\infty, {a}]"], f"(-\\infty, {a + d})"
    if kind == 4:
        return f"\\{{{a},{b}\\}}", [f"\\{{{b},{a}\\}}", f"{a}, {b}"], f"\\{{{a},{b + d}\\}}"
    if kind == 5:
        return f"x={a}", [f"{a}", f"x = {a}"], f"x={a + d}"
    return f"{a}.{c}", [f"\\frac{{{a * 10 + c}}}{{10}}", f"{a}.{c}"], f"{a}.{c + d}"


def make_batch(seed: int, n: int, group: int, mixed: bool = True) -> tuple[list[str], list[str]]:
    """``n // group`` golds, each repeated ``group`` times. ``mixed``: MATH-like answer types (integers,
    fractions, radicals, intervals, sets, equations, decimals); else integers only (the tiny task).
    About half the samples are right, in one of two equivalent forms; wrong answers differ per sample."""
    rng = random.Random(seed)
    responses, golds = [], []
    for _ in range(n // group):
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
        kind = rng.randrange(7) if mixed else 0
        for _ in range(group):
            gold, right, wrong = _answers(kind, a, b, c, rng.randint(1, 50))
            ans = rng.choice(right) if rng.random() < 0.5 else wrong
            responses.append(f"{FILLER}Therefore the answer is $\\boxed{{{ans}}}$.")
            golds.append(gold)
    return responses, golds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--chunk-size", type=int, default=64)
    args = ap.parse_args()

    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (other processes slow these numbers)")
    seed = 0
    for mixed in (False, True):
        print(f"{'MATH-like mixed answers' if mixed else 'integer answers'}: {args.n} responses, "
              f"{args.n // args.group} golds x {args.group}, chunk_size {args.chunk_size}")
        for workers in (0, 1, 2):
            t0 = time.perf_counter()
            grader = MathVerifyGrader(num_workers=workers, timeout_s=5.0, chunk_size=args.chunk_size).start()
            start_s = time.perf_counter() - t0
            grader.grade(*make_batch(10_000 + workers, 64, args.group, mixed))  # warm parser caches
            rates, cpu_rates = [], []
            for _ in range(args.repeats):
                seed += 1  # fresh golds and answers every run, as in a new RL step
                responses, golds = make_batch(seed, args.n, args.group, mixed)
                t, c = time.perf_counter(), time.process_time()
                out = grader.grade(responses, golds)
                dt, dc = time.perf_counter() - t, time.process_time() - c
                rates.append(args.n / dt)
                cpu_rates.append(args.n / dc)
                assert not out.timed_out.any()
            grader.close()
            name = "in-process" if workers == 0 else f"{workers} worker{'s' if workers > 1 else ''}"
            # in-process, CPU time measures the per-core rate independently of other load on the machine
            cpu = f"; {max(cpu_rates):.0f}/s per CPU-second" if workers == 0 else ""
            print(f"  {name:>10}: {max(rates):6.0f} responses/s ({args.n / max(rates):.2f} s per batch; runs "
                  f"{', '.join(f'{r:.0f}' for r in rates)}/s{cpu}; start-up {start_s:.2f} s; "
                  f"mean reward {float(out.rewards.mean()):.2f})")

if __name__ == "__main__":
    main()
