"""Intervals and verdicts for the claims reports (pure functions, numpy only).

- :func:`hierarchical_bootstrap`: a paired two-level bootstrap of a difference of means (training
  seeds, then problems shared by both arms), macro-averaged over benchmarks.
- :func:`welch_interval` and :func:`verdict`: the 95% Welch t-interval over seeds and the
  directional verdict (``held`` / ``not significant`` / ``did not hold`` from an interval's sign).
- :func:`equivalence_verdict`: the verdict of a "matches" claim against an equivalence margin.
- :func:`compare`: Δ of two arms' per-problem scores (bootstrap and Welch intervals, per benchmark
  too).
- :func:`mean_interval` / :func:`diff_interval`: intervals of per-step quantities (t / Welch over
  seeds with ≥ 2 seeds, else the percentile bootstrap over steps).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from graft_cli.report.power import decompose, seed_interval, t975


def welch_interval(x: list[float], y: list[float]) -> tuple[float, float, float] | None:
    """mean(x) − mean(y) and its 95% Welch t-interval (Welch–Satterthwaite df, rounded down); None
    with fewer than 2 values on a side."""
    if len(x) < 2 or len(y) < 2:
        return None
    mx, my = float(np.mean(x)), float(np.mean(y))
    vx, vy = float(np.var(x, ddof=1)) / len(x), float(np.var(y, ddof=1)) / len(y)
    d = mx - my
    se = math.sqrt(vx + vy)
    if se == 0:
        return d, d, d
    df = (vx + vy) ** 2 / ((vx ** 2) / (len(x) - 1) + (vy ** 2) / (len(y) - 1))
    t = t975(max(1, int(df)))
    return d, d - t * se, d + t * se


def verdict(iv) -> str:
    if iv is None:
        return "not measured"
    lo, hi = iv[1], iv[2]
    if lo > 0:
        return "held"
    if hi < 0:
        return "did not hold"
    return "not significant"


def powered_verdict(iv, target: float = 1.0, n: int | None = None, per_seed_variance: float | None = None) -> str:
    """The verdict of :func:`verdict`, except ``underpowered`` in place of ``not significant`` or
    ``did not hold`` when the interval's half-width exceeds ``target`` (points): too wide to say
    whether an effect of the size the study was built to resolve is absent (an interval above zero
    still reads ``held``). With ``per_seed_variance`` (σ² of one seed pair, eq. 4 of power.py) it
    says how many seeds ±``target`` would take."""
    if iv is None:
        return "not measured"
    if (iv[2] - iv[1]) / 2 <= target or verdict(iv) == "held":  # a resolved effect in the claim's direction stands
        return verdict(iv)
    if per_seed_variance is None:
        return "underpowered"
    need = next((m for m in range(2, 501) if t975(m - 1) * math.sqrt(per_seed_variance / m) <= target), None)
    return f"underpowered ({need} seeds for ±{target:g})" if need else "underpowered"


def comparison_verdict(c: dict, target: float = 1.0) -> str:
    """:func:`powered_verdict` of a :func:`compare` result (pass@1 points), with the seeds
    ±``target`` would take from its decomposition's per-seed variance (training + evaluation)."""
    per = ((c.get("decomposition") or {}).get("per_seed") or {})
    var = None if per.get("evaluation") is None else per["training"] + per["evaluation"]
    return powered_verdict(c.get("interval"), target, per_seed_variance=var)


def overall_verdict(verdicts) -> str:
    """One claim's verdict from its per-model verdicts: the common label when every model has the
    same one, ``not measured`` when none was measured, else ``mixed`` (the per-model verdicts stay
    in the evidence)."""
    vs = [v.split(" (")[0] for v in verdicts]  # "underpowered (13 seeds for ±1)" counts as "underpowered"
    if not vs or all(v == "not measured" for v in vs):
        return "not measured"
    return vs[0] if len(set(vs)) == 1 else "mixed"


__all__ = ["as_benchmarks", "common_benchmarks", "compare", "comparison_verdict", "diff_interval",
           "equivalence_verdict", "hierarchical_bootstrap", "macro_mean", "mean_interval", "overall_verdict",
           "paired", "points", "powered_verdict", "verdict", "welch_interval"]

Arm = Mapping  # seed -> np.ndarray (one benchmark) or a sequence of np.ndarray (one per benchmark)


def as_benchmarks(value) -> list[np.ndarray]:
    """One seed's value as a list of 1-d float arrays, one per benchmark (a single array is one
    benchmark)."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return [value.astype(np.float64)]
    if isinstance(value, Sequence) and value and not isinstance(value[0], (int, float, np.number)):
        return [np.asarray(v, dtype=np.float64).reshape(-1) for v in value]
    return [np.asarray(value, dtype=np.float64).reshape(-1)]


def macro_mean(benchmarks: Sequence[np.ndarray]) -> float:
    """(1/B) Σ_b mean_p a_b[p]: the unweighted mean over benchmarks of each benchmark's mean over
    problems."""
    return float(np.mean([np.mean(a) for a in benchmarks]))


def _stack(arm: Arm) -> list[np.ndarray] | None:
    """Per benchmark b the matrix A_b[s, p] over the arm's seeds (sorted); None when the shapes
    disagree."""
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

    ``x`` and ``y`` map a training seed to its per-problem scores (e.g. pass@1 of each problem, the
    mean over samples and runs): one array, or one array per benchmark b = 1..B (problem p of
    benchmark b is the same problem in every seed of both arms). The statistic is

        Δ = (1/B) Σ_b [ mean_{s∈S_x, p∈P_b} x_s[b][p] − mean_{s∈S_y, p∈P_b} y_s[b][p] ],

    the unweighted mean over benchmarks of each benchmark's difference of means. Each of ``n_boot``
    replicates resamples with replacement, independently, the seeds of x (|S_x| draws) and the seeds
    of y (|S_y| draws), and for every benchmark one resample of its problem indices (|P_b| draws)
    shared by both arms and by all seeds, then recomputes Δ. The interval is the (α/2, 1 − α/2)
    percentiles of the replicates (numpy's linear interpolation). Deterministic given ``seed``
    (``numpy.random.default_rng``). Returns (Δ, lo, hi), or None when an arm has no seeds, the arms
    (or the seeds of an arm) disagree in their number of benchmarks or in a benchmark's number of
    problems, or a benchmark has no problems. """
    if not x or not y:
        return None
    X, Y = _stack(x), _stack(y)
    if X is None or Y is None or len(X) != len(Y) or any(a.shape[1] != b.shape[1] for a, b in zip(X, Y)):
        return None
    delta = float(np.mean([a.mean() - b.mean() for a, b in zip(X, Y)]))
    rng = np.random.default_rng(seed)
    nx, ny = X[0].shape[0], Y[0].shape[0]
    # seed resamples as weights: w[r, s] = (times seed s is drawn in replicate r) / (number of
    # draws)
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

    ``held`` when −m ≤ lo and hi ≤ m (the whole interval within the margin), ``did not hold`` when
    lo > m or hi < −m (the whole interval outside it), otherwise ``inconclusive``; ``not measured``
    when iv is None."""
    if iv is None:
        return "not measured"
    _, lo, hi = iv
    if lo >= -margin and hi <= margin:
        return "held"
    if lo > margin or hi < -margin:
        return "did not hold"
    return "inconclusive"


def common_benchmarks(*arms_: dict) -> list[str]:
    """The benchmarks every seed of every given arm (seed -> bench -> per-problem array) has,
    sorted."""
    sets = [set(b) for arm in arms_ for b in arm.values()]
    return sorted(set.intersection(*sets)) if sets else []


def paired(problems: dict, a: str, b: str) -> tuple[dict, dict, list[str]]:
    """Arms ``a`` and ``b`` of ``problems`` (name -> seed -> bench -> array) as seed -> [array per
    common bench]."""
    xa, xb = problems.get(a) or {}, problems.get(b) or {}
    benches = common_benchmarks(xa, xb) if xa and xb else []
    if not benches:
        return {}, {}, []
    pick = lambda arm: {s: [np.asarray(v[bn], dtype=np.float64) for bn in benches] for s, v in arm.items()}
    return pick(xa), pick(xb), benches


def points(iv, scale: float = 100.0):
    """(Δ, lo, hi) of an interval (extra entries, e.g. a method label, dropped) scaled, e.g. to
    points (%)."""
    return None if iv is None else tuple(scale * float(v) for v in iv[:3])


def compare(problems: dict, a: str, b: str, n_boot: int = 2000, seed: int = 0, scale: float = 100.0,
            eval_var: dict | None = None, eval_var_paired: dict | None = None, rule: str = "floored_t",
            boundary: float | None = None) -> dict:
    """Δ = a − b in points (%; ``scale`` 1: in the scores' own unit, e.g. nats) over the benchmarks
    both arms have.

    ``interval``, the interval of record: the t-interval over the seeds' macro scores, paired when
    both arms ran the same seeds (:func:`graft_cli.report.power.seed_interval`); with one seed on a
    side, the hierarchical bootstrap over problems (the only variation measured). ``method`` names
    it. Alongside: ``bootstrap`` (the paired hierarchical percentile bootstrap over seeds and
    problems), ``welch``, ``decomposition`` (the parts of Var(Δ̂),
    :func:`graft_cli.report.power.decompose`; its sampling part from ``eval_var_paired``: seed ->
    benchmark -> v^d_{s,b} of the pair's grade differences where given, else from ``eval_var``: name
    -> seed -> benchmark -> v_{s,b}), the benchmarks, seeds per arm and each benchmark's bootstrap
    Δ. ``rule``: ``floored_t`` (SE² floored at the decomposition's evaluation variance,
    :func:`graft_cli.report.power.seed_interval`) or ``paired_t``; ``boundary``: a sequential look's
    boundary c_k (the repeated confidence interval)."""
    x, y, benches = paired(problems, a, b)
    empty = {"interval": None, "method": None, "bootstrap": None, "welch": None, "decomposition": None,
             "benchmarks": [], "seeds": [len(x), len(y)], "per_benchmark": {}}
    if not benches:
        return empty
    boot = points(hierarchical_bootstrap(x, y, n_boot=n_boot, seed=seed), scale)
    mx = {s: scale * macro_mean(v) for s, v in x.items()}
    my = {s: scale * macro_mean(v) for s, v in y.items()}
    welch = welch_interval(list(mx.values()), list(my.values()))
    ev = eval_var or {}
    arm = lambda name, vals: {s: dict(zip(benches, v)) for s, v in vals.items()}
    dec = decompose(arm(a, x), arm(b, y), _ev(ev.get(a), benches), _ev(ev.get(b), benches), benches, scale=scale,
                    ed=_ev(eval_var_paired, benches))
    floor = dec["evaluation"] if rule == "floored_t" and dec and dec.get("per_seed", {}).get(
        "evaluation") is not None else None
    t = seed_interval(mx, my, floor=floor, boundary=boundary)
    if t is not None:
        interval = t["interval"]
        method = (f"paired t over {t['n'][0]} seeds" if t["paired"]
                  else f"Welch t over {t['n'][0]} vs {t['n'][1]} seeds")
        method += (", SE floored at the evaluation variance" if t["floored"] else "") + (
            f", sequential look (boundary {boundary:.3f})" if boundary is not None else "")
    else:
        interval, method = boot, "bootstrap over problems (one seed: no training-seed variance measured)"
    per = {bn: points(hierarchical_bootstrap({s: v[i] for s, v in x.items()}, {s: v[i] for s, v in y.items()},
                                              n_boot=n_boot, seed=seed), scale)
           for i, bn in enumerate(benches)}
    return {"interval": interval, "method": method, "bootstrap": boot, "welch": welch, "decomposition": dec,
            "benchmarks": benches, "seeds": [len(x), len(y)], "per_benchmark": per}


def _ev(e: dict | None, benches: list[str]) -> dict | None:
    """seed -> benchmark -> v_{s,b} for ``benches``, or None when a seed lacks one of them."""
    if not e or any(bn not in v for v in e.values() for bn in benches):
        return None
    return {s: {bn: float(v[bn]) for bn in benches} for s, v in e.items()}


def _percentile_boot(values: list[np.ndarray], n_boot: int, seed: int, alpha: float = 0.05):
    rng = np.random.default_rng(seed)
    reps = np.zeros(n_boot)
    for sign, v in values:
        idx = rng.integers(0, len(v), (n_boot, len(v)))
        reps += sign * v[idx].mean(axis=1)
    lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def mean_interval(per_seed: Mapping, offset: float = 0.0, n_boot: int = 2000, seed: int = 0,
                  alpha: float = 0.05):
    """Δ = mean − ``offset`` of a quantity measured per training step in each seed (``seed ->
    [values]``), the mean being over seeds of each seed's mean over steps. With ≥ 2 seeds the
    interval is the one-sample 95% t-interval over the seeds' means (df = seeds − 1); with one seed,
    the percentile bootstrap over its steps. Returns (Δ, lo, hi, method) or None without values."""
    means = [float(np.mean(v)) for v in per_seed.values() if len(v)]
    if not means:
        return None
    d = float(np.mean(means)) - offset
    if len(means) >= 2:
        se = float(np.std(means, ddof=1)) / np.sqrt(len(means))
        t = t975(len(means) - 1)
        return d, d - t * se, d + t * se, f"t over {len(means)} seeds"
    v = np.asarray(next(iter(x for x in per_seed.values() if len(x))), dtype=np.float64)
    lo, hi = _percentile_boot([(1.0, v)], n_boot, seed, alpha)
    return d, lo - offset, hi - offset, f"bootstrap over {len(v)} steps"


def diff_interval(x: Mapping, y: Mapping, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05):
    """Δ = mean(x) − mean(y) of per-step quantities (``seed -> [values]`` per arm; each arm's mean
    is over its seeds of each seed's mean over steps). With ≥ 2 seeds on both sides: the Welch
    t-interval over the seeds' means; otherwise the percentile bootstrap over the steps of each arm,
    pooled over its seeds (independent resamples per arm). Returns (Δ, lo, hi, method) or None when
    an arm is empty."""
    mx = [float(np.mean(v)) for v in x.values() if len(v)]
    my = [float(np.mean(v)) for v in y.values() if len(v)]
    if not mx or not my:
        return None
    d = float(np.mean(mx)) - float(np.mean(my))
    if len(mx) >= 2 and len(my) >= 2:
        iv = welch_interval(mx, my)
        return iv[0], iv[1], iv[2], f"Welch over {len(mx)} vs {len(my)} seeds"
    vx = np.concatenate([np.asarray(v, dtype=np.float64) for v in x.values() if len(v)])
    vy = np.concatenate([np.asarray(v, dtype=np.float64) for v in y.values() if len(v)])
    lo, hi = _percentile_boot([(1.0, vx), (-1.0, vy)], n_boot, seed, alpha)
    return d, lo, hi, f"bootstrap over {len(vx)} vs {len(vy)} steps"
