"""Group-sequential boundaries and repeated confidence intervals (pure functions, numpy + scipy).

A study registered with looks n_1 < ... < n_K (seeds per arm at which its claims may be judged) has information
fractions t_k = n_k / n_K. With a two-sided error rate α spent by a Lan-DeMets function

    O'Brien-Fleming:  α(t) = 2 − 2 Φ(z_{1−α/2} / √t)          Pocock:  α(t) = α · ln(1 + (e − 1) t)        (1)

the boundaries c_1..c_K solve, for standardised statistics Z_k with Corr(Z_i, Z_j) = √(t_i / t_j) (i ≤ j),

    P(|Z_1| < c_1, ..., |Z_{k−1}| < c_{k−1}, |Z_k| ≥ c_k) = α(t_k) − α(t_{k−1})                          (2)

(:func:`boundaries`; computed on the Brownian scale W_k = Z_k √t_k, whose increments are independent
N(0, t_k − t_{k−1}), by numerical integration of the continuation density on a fine grid: Armitage, McPherson
and Rowe 1969; Jennison and Turnbull 2000, ch. 19). The repeated confidence interval at look k is

    Δ̂_k ± q_k · SE_k,   q_k = t_{1 − p_k/2, df_k},   p_k = 2 (1 − Φ(c_k))                                 (3)

the look's boundary carried to Student's t at the nominal level it stands for (the t-statistic version of
Jennison and Turnbull's RCIs, ch. 9): the K intervals cover Δ simultaneously with probability ≥ 1 − α, so a study
judged at any look, or extended to a later one, keeps its error rate (:func:`look_critical`).
With one look (K = 1) c_1 = z_{1−α/2} and (3) is the ordinary t-interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from scipy import optimize
from scipy import stats as sps

__all__ = ["alpha_spent", "boundaries", "current_look", "judged_look", "look_critical", "nominal_level"]

GRID = 801  # points of the continuation density's grid on the Brownian scale


def alpha_spent(t: float, alpha: float = 0.05, spending: str = "obrien_fleming") -> float:
    """α(t) of eq. (1) at information fraction ``t`` ∈ (0, 1]."""
    if t <= 0:
        return 0.0
    if spending == "obrien_fleming":
        return float(2 - 2 * sps.norm.cdf(sps.norm.ppf(1 - alpha / 2) / math.sqrt(t)))
    if spending == "pocock":
        return float(alpha * math.log(1 + (math.e - 1) * min(t, 1.0)))
    raise ValueError(f"spending {spending!r}: obrien_fleming or pocock")


def _step(density: np.ndarray, grid: np.ndarray, var: float, new_grid: np.ndarray) -> np.ndarray:
    """The density of W_{k} on ``new_grid`` from that of W_{k−1} on ``grid`` (restricted to the continuation
    region) plus an independent N(0, var) increment: ∫ f(u) φ((w − u)/√var)/√var du (trapezoid rule)."""
    sd = math.sqrt(var)
    kern = sps.norm.pdf((new_grid[:, None] - grid[None, :]) / sd) / sd
    w = np.full(grid.size, grid[1] - grid[0])
    w[0] = w[-1] = w[0] / 2
    return kern @ (density * w)


def _exit(density: np.ndarray, grid: np.ndarray, var: float, bound: float) -> float:
    """P(|W_{k−1} + N(0, var)| ≥ bound, W_{k−1} in the continuation region) from W_{k−1}'s density."""
    sd = math.sqrt(var)
    p_out = sps.norm.sf((bound - grid) / sd) + sps.norm.cdf((-bound - grid) / sd)
    w = np.full(grid.size, grid[1] - grid[0])
    w[0] = w[-1] = w[0] / 2
    return float(np.sum(density * p_out * w))


@lru_cache(maxsize=64)
def _boundaries(fractions: tuple, alpha: float, spending: str) -> tuple:
    out: list[float] = []
    density = grid = None
    prev_t, spent = 0.0, 0.0
    for t in fractions:
        target = alpha_spent(t, alpha, spending) - spent
        if density is None:  # first look: P(|Z_1| >= c) = target
            c = float(sps.norm.isf(target / 2))
        else:
            var = t - prev_t

            def excess(c, density=density, grid=grid, var=var, t=t, target=target):
                return _exit(density, grid, var, c * math.sqrt(t)) - target
            c = float(optimize.brentq(excess, 0.1, 20.0, xtol=1e-10))
        out.append(c)
        # the continuation density of W at this look, on a grid over (−c√t, c√t)
        half = c * math.sqrt(t)
        new_grid = np.linspace(-half, half, GRID)
        density = (sps.norm.pdf(new_grid / math.sqrt(t)) / math.sqrt(t) if grid is None
                   else _step(density, grid, t - prev_t, new_grid))
        grid, prev_t, spent = new_grid, t, alpha_spent(t, alpha, spending)
    return tuple(out)


def boundaries(looks: Sequence[int], alpha: float = 0.05, spending: str = "obrien_fleming") -> list[float]:
    """c_1..c_K of eq. (2) for looks at ``looks`` seeds (information fractions n_k / n_K)."""
    n_max = float(looks[-1])
    return list(_boundaries(tuple(n / n_max for n in looks), float(alpha), spending))


def nominal_level(c: float) -> float:
    """p_k of eq. (3): the two-sided nominal level a boundary c stands for."""
    return float(2 * sps.norm.sf(c))


def look_critical(c: float, df: float) -> float:
    """q_k of eq. (3): the multiplier of SE at a look with boundary ``c`` and ``df`` degrees of freedom."""
    return float(sps.t.isf(nominal_level(c) / 2, df))


def current_look(looks: Sequence[int], seeds: int) -> int | None:
    """The index k of the largest look n_k ≤ ``seeds`` (None: fewer seeds than the first look)."""
    done = [k for k, n in enumerate(looks) if n <= seeds]
    return done[-1] if done else None


def judged_look(analysis: dict | None, seeds: Sequence) -> tuple[list, float | None, str]:
    """What a registered ``analysis`` judges from the seeds at hand (those every arm has): (the seeds used, the
    boundary c_k or None for a fixed design, a label). A sequential design judges at its largest complete look k
    with the first n_k seeds (in seed order); a fixed design uses every seed."""
    ordered = sorted(seeds, key=lambda s: (int(s) if str(s).lstrip("-").isdigit() else 0, str(s)))
    seq = (analysis or {}).get("sequential")
    if not seq:
        return ordered, None, f"fixed design, {len(ordered)} seeds"
    looks = list(seq["looks"])
    k = current_look(looks, len(ordered))
    if k is None:
        return [], None, f"before the first look ({len(ordered)} of {looks[0]} seeds)"
    c = boundaries(looks, float((analysis or {}).get("alpha", 0.05)), seq.get("spending", "obrien_fleming"))[k]
    return (ordered[:looks[k]], c, f"look {k + 1} of {len(looks)} ({looks[k]} seeds; {seq.get('spending')} "
            f"boundary {c:.3f}, nominal level {nominal_level(c):.4f})")
