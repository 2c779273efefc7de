"""Every reference solution of HumanEval+ and MBPP+ (the official release files) graded by the code reward, through
the sandbox a policy's answer runs in: how many score 1 on the base inputs and on base + plus.

The expected outputs are computed first (the references run in the sandbox on every input, cached by the file's
sha256 in ``$GRAFT_EVALPLUS_CACHE`` or ``~/.cache/graft/evalplus``; the time it took is printed), then each task's
``prompt + canonical_solution`` is graded as an answer (in a python fence, as a chat model writes it).

    python benchmarks/evalplus_references.py [--data ../shared/data/evalplus] [--datasets humaneval,mbpp]
        [--workers 2] [--tasks 0]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from evalplus_agreement import DEFAULT_DATA, FILES, graft_detail, slice_file  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA, help="folder with the EvalPlus release files")
    ap.add_argument("--datasets", default="humaneval,mbpp")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=0, help="first N tasks of each file (0: all)")
    args = ap.parse_args()
    from graft_cli.data.evalplus_files import evalplus_problems, read_release
    from graft_cli.reward.code_grader import CodeGrader
    from graft_cli.reward.evalplus import cache_dir

    print(f"expected outputs cached in {cache_dir()}")
    with tempfile.TemporaryDirectory(prefix="evalplus-refs-") as tmp:
        for ds in args.datasets.split(","):
            path = slice_file(os.path.join(args.data, FILES[ds]), args.tasks, tmp)
            t0 = time.perf_counter()
            probs = evalplus_problems(path, ds, num_workers=args.workers)
            prep = time.perf_counter() - t0
            rows = read_release(path, ds)
            n_base = sum(len(r["base_input"]) for r in rows)
            n_plus = sum(len(r["plus_input"]) for r in rows)
            g = CodeGrader(num_workers=args.workers, allow_root=True)
            try:
                t0 = time.perf_counter()
                res = g.grade(["```python\n" + r["prompt"] + r["canonical_solution"] + "\n```" for r in rows],
                              [p.answer for p in probs])
                dt = time.perf_counter() - t0
            finally:
                g.close()
            base, plus = int((res.base == 1).sum()), int((res.rewards == 1).sum())
            print(f"{ds}: {os.path.basename(path)}, {len(rows)} tasks, {n_base} base + {n_plus} plus inputs; "
                  f"expected outputs ready in {prep:.1f} s; references graded in {dt:.1f} s at {args.workers} workers")
            print(f"{ds}: references passing base {base}/{len(rows)}, base + plus {plus}/{len(rows)}; statuses "
                  f"{dict(collections.Counter(res.status))}")
            for r, prob, b, p in zip(rows, probs, res.base, res.rewards):
                if not (b == 1 and p == 1):
                    print(f"  FAIL {r['task_id']}: base {b}, plus {p}: "
                          f"{graft_detail(prob, r['prompt'] + r['canonical_solution'])}")


if __name__ == "__main__":
    main()
