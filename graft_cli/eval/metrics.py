"""Pure scoring arithmetic of the evaluation protocol (graft.md §1, docs/spec/conventions.md §6.1).

Grades of one benchmark are an array ``correct[run, problem, sample]`` of 0/1 values.

* **pass@1 of one run** = mean over samples, then over problems (:func:`pass_at_1`).
* **unbiased pass@k** (Chen et al. 2021, Codex paper): for a problem with ``n`` samples of which
  ``c`` are correct, ``pass@k = 1 - C(n-c, k) / C(n, k)`` (1 when ``n - c < k``); averaged over
  problems (:func:`pass_at_k`, :func:`pass_at_k_run`). ``pass@1`` is the special case ``c / n``.
* **mean ± std over runs**: the std is the *sample* standard deviation (``ddof=1``, Bessel), as the
  paper's "mean ± std over 5 eval runs" and its Table 4 ("sample std over 3 training runs") read;
  with a single run the std is undefined and reported as ``None`` (JSON ``null``)
  (:func:`mean_std`).
* **five-benchmark average**: the unweighted mean of the benchmarks' pass@1 *within each run*, then
  mean ± std over runs (:func:`average_over_benchmarks`). Its std is therefore the spread of the
  per-run averages, not a mean of per-benchmark stds.

All values are fractions in [0, 1]; tables multiply by 100.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from graft_cli.batch import is_correct


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``n`` samples, ``c`` correct: ``1 - C(n-c,k)/C(n,k)``.

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` (numerically stable, same value)."""
    if not (0 <= c <= n) or k < 1 or k > n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k_run(correct: np.ndarray, k: int) -> float:
    """Mean over problems of the unbiased pass@k of one run; ``correct`` is ``(problems,
    samples)``."""
    correct = np.asarray(correct)
    n = correct.shape[1]
    counts = is_correct(correct).sum(axis=1)
    return float(np.mean([pass_at_k(n, int(c), k) for c in counts])) if len(counts) else math.nan


def pass_at_1(correct: np.ndarray) -> float:
    """Mean over samples, then over problems, of one run's ``(problems, samples)`` grades."""
    correct = np.asarray(correct, dtype=np.float64)
    if correct.size == 0:
        return math.nan
    return float(correct.mean(axis=1).mean())


def mean_std(values: Sequence[float], ddof: int = 1) -> tuple[float, float | None]:
    """``(mean, sample std)``; the std is ``None`` when fewer than ``ddof + 1`` values exist."""
    a = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if a.size == 0:
        return math.nan, None
    mean = float(a.mean())
    std = float(a.std(ddof=ddof)) if a.size > ddof else None
    return mean, std


def summarize_benchmark(correct: np.ndarray, ks: Sequence[int] | None = None) -> dict:
    """Summary of one benchmark's ``correct[run, problem, sample]`` grades::

        {"num_runs", "num_problems", "num_samples",
         "runs": [pass@1 of each run], "mean", "std",
         "pass@k": {"1": {"mean", "std", "runs"}, "2": ..., ...}}

    ``ks`` defaults to 1, 2, 4, ... up to the number of samples (and the number of samples
    itself)."""
    correct = np.asarray(correct, dtype=np.float64)
    if correct.ndim != 3:
        raise ValueError(f"expected correct[run, problem, sample], got shape {correct.shape}")
    R, P, S = correct.shape
    runs = [pass_at_1(correct[r]) for r in range(R)]
    mean, std = mean_std(runs)
    if ks is None:
        ks = sorted({2**i for i in range(int(math.log2(S)) + 1)} | {S}) if S else []
    pk = {}
    for k in ks:
        if 1 <= k <= S:
            vals = [pass_at_k_run(correct[r], k) for r in range(R)]
            m, s = mean_std(vals)
            pk[str(k)] = {"mean": m, "std": s, "runs": vals}
    return {"num_runs": R, "num_problems": P, "num_samples": S, "runs": runs, "mean": mean, "std": std, "pass@k": pk}


def average_over_benchmarks(per_bench_runs: Mapping[str, Sequence[float]]) -> dict:
    """The benchmark average: ``mean`` = the unweighted mean over benchmarks of each benchmark's
    pass@1 averaged over all its runs; ``runs`` = the average within each run that every benchmark
    has (aligned by index), and ``std`` their sample std. With the same runs everywhere ``mean`` is
    the mean of ``runs``; where some benchmarks have more runs (``eval.final.bench_runs``) ``mean``
    uses them all.

    ``per_bench_runs`` maps benchmark -> pass@1 of each run."""
    if not per_bench_runs:
        return {"runs": [], "mean": math.nan, "std": None, "benchmarks": []}
    R = min(len(v) for v in per_bench_runs.values())
    runs = [float(np.mean([per_bench_runs[b][r] for b in per_bench_runs])) for r in range(R)]
    mean, std = mean_std(runs)
    if len({len(v) for v in per_bench_runs.values()}) > 1:
        mean = float(np.mean([np.mean(v) for v in per_bench_runs.values()]))
    return {"runs": runs, "mean": mean, "std": std, "benchmarks": list(per_bench_runs)}


def pm(mean: float | None, std: float | None, scale: float = 100.0, digits: int = 2) -> str:
    """``"72.08±0.52"`` (percent by default); ``"72.08"`` when the std is undefined; ``"—"`` for no
    value."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "—"
    s = f"{mean * scale:.{digits}f}"
    if std is not None and not (isinstance(std, float) and math.isnan(std)):
        s += f"±{std * scale:.{digits}f}"
    return s
