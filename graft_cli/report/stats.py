"""Intervals and verdicts for the claims reports (pure functions, numpy only).

- :func:`hierarchical_bootstrap`: a paired two-level bootstrap of a difference of means (training seeds, then
  problems shared by both arms), macro-averaged over benchmarks.
- :func:`welch_interval` and :func:`verdict` (re-exported from :mod:`graft_cli.report.saf_claims`, where they
  are defined): the 95% Welch t-interval over seeds and the directional verdict.
- :func:`equivalence_verdict`: the verdict of a "matches" claim against an equivalence margin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from graft_cli.report.saf_claims import verdict, welch_interval

__all__ = ["as_benchmarks", "equivalence_verdict", "hierarchical_bootstrap", "macro_mean", "verdict",
           "welch_interval"]

Arm = Mapping  # seed -> np.ndarray (one benchmark) or a sequence of np.ndarray (one per benchmark)


def as_benchmarks(value) -> list[np.ndarray]:
    """One seed's value as a list of 1-d float arrays, one per benchmark (a single array is one benchmark)."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return [value.astype(np.float64)]
    if isinstance(value, Sequence) and value and not isinstance(value[0], (int, float, np.number)):
        return [np.asarray(v, dtype=np.float64).reshape(-1) for v in value]
    return [np.asarray(value, dtype=np.float64).reshape(-1)]


def macro_mean(benchmarks: Sequence[np.ndarray]) -> float:
    """(1/B) Σ_b mean_p a_b[p]: the unweighted mean over benchmarks of each benchmark's mean over problems."""
    return float(np.mean([np.mean(a) for a in benchmarks]))


def _stack(arm: Arm) -> list[np.ndarray] | None:
    """Per benchmark b the matrix A_b[s, p] over the arm's seeds (sorted); None when the shapes disagree."""
    per_seed = [as_benchmarks(arm[s]) for s in sorted(arm, key=str)]
    B = len(per_seed[0])
    if B == 0 or any(len(v) != B for v in per_seed):
        return None
    out = []
    for b in range(B):
        sizes = {len(v[b]) for v in per_seed}
        if len(sizes) != 1 or 0 in sizes:
            return None
        out.append(np.stack([v[b] for v in per_seed]))
    return out


def hierarchical_bootstrap(x: Arm, y: Arm, n_boot: int = 2000, seed: int = 0,
                           alpha: float = 0.05) -> tuple[float, float, float] | None:
    """Δ = x − y with a paired hierarchical percentile bootstrap interval.

    ``x`` and ``y`` map a training seed to its per-problem scores (e.g. pass@1 of each problem, the mean over
    samples and runs): one array, or one array per benchmark b = 1..B (problem p of benchmark b is the same
    problem in every seed of both arms). The statistic is

        Δ = (1/B) Σ_b [ mean_{s∈S_x, p∈P_b} x_s[b][p] − mean_{s∈S_y, p∈P_b} y_s[b][p] ],

    the unweighted mean over benchmarks of each benchmark's difference of means. Each of ``n_boot`` replicates
    resamples with replacement, independently, the seeds of x (|S_x| draws) and the seeds of y (|S_y| draws),
    and for every benchmark one resample of its problem indices (|P_b| draws) shared by both arms and by all
    seeds, then recomputes Δ. The interval is the (α/2, 1 − α/2) percentiles of the replicates (numpy's linear
    interpolation). Deterministic given ``seed`` (``numpy.random.default_rng``). Returns (Δ, lo, hi), or None
    when an arm has no seeds, the arms (or the seeds of an arm) disagree in their number of benchmarks or in a
    benchmark's number of problems, or a benchmark has no problems.
    """
    if not x or not y:
        return None
    X, Y = _stack(x), _stack(y)
    if X is None or Y is None or len(X) != len(Y) or any(a.shape[1] != b.shape[1] for a, b in zip(X, Y)):
        return None
    delta = float(np.mean([a.mean() - b.mean() for a, b in zip(X, Y)]))
    rng = np.random.default_rng(seed)
    nx, ny = X[0].shape[0], Y[0].shape[0]
    # seed resamples as weights: w[r, s] = (times seed s is drawn in replicate r) / (number of draws)
    wx = np.stack([np.bincount(i, minlength=nx) for i in rng.integers(0, nx, (n_boot, nx))]) / nx
    wy = np.stack([np.bincount(i, minlength=ny) for i in rng.integers(0, ny, (n_boot, ny))]) / ny
    reps = np.zeros(n_boot)
    for a, b in zip(X, Y):
        P = a.shape[1]
        j = rng.integers(0, P, (n_boot, P))  # the problems of replicate r, shared by both arms
        diff = wx @ a - wy @ b  # [r, p]: seed-resampled mean of x minus that of y, per problem
        reps += np.take_along_axis(diff, j, axis=1).mean(axis=1)
    reps /= len(X)
    lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
    return delta, float(lo), float(hi)


def equivalence_verdict(iv, margin: float) -> str:
    """Verdict of "x matches y" from an interval (Δ, lo, hi) and an equivalence margin m > 0:

    ``held`` when −m ≤ lo and hi ≤ m (the whole interval within the margin), ``did not hold`` when lo > m or
    hi < −m (the whole interval outside it), otherwise ``inconclusive``; ``not measured`` when iv is None."""
    if iv is None:
        return "not measured"
    _, lo, hi = iv
    if lo >= -margin and hi <= margin:
        return "held"
    if lo > margin or hi < -margin:
        return "did not hold"
    return "inconclusive"
