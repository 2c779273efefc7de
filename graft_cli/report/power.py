"""Where a comparison's variance comes from, the interval of record, and what more seeds or samples would buy
(pure functions, numpy + scipy).

A study compares two arms x and y (e.g. GRAFT and GRPO) of one model. Seed s of an arm is one training run; its
checkpoint is evaluated on B benchmarks, problem p of benchmark b getting n_{b,p} sampled answers with grades g
(0/1 for math). The seed's score is the macro pass@1

    m_s = (1/B) Σ_b (1/N_b) Σ_p ḡ_{s,b,p}.                                                              (1)

Model: m_s = μ + T_s + E_s, with T_s the training seed's deviation and E_s the evaluation sampling's (given the
checkpoint). The sampling variance of (1) is estimated without bias from the checkpoint's own grades,

    v_s = (1/B²) Σ_b v_{s,b},   v_{s,b} = (1/N_b²) Σ_p s²_{s,b,p} / n_{b,p}                              (2)

(s² the grades' sample variance, ddof 1; for 0/1 grades s²/n = p̂(1 − p̂)/(n − 1)).

**Interval of record** (:func:`seed_interval`): a t-interval over the seeds' scores (1), the evaluation noise
inside them. *Paired* when both arms ran the same seed numbers (a plan gives seed k of every arm the same data
order and the same first rollouts): d_s = m^x_s − m^y_s, Δ̂ = mean d, SE² = S²_d / n, df = n − 1. Otherwise
Welch: SE² = S²_x/n_x + S²_y/n_y with Welch–Satterthwaite df. The problems are held fixed (the benchmarks are the
papers' fixed sets); what a new draw of problems would add is reported beside, not inside, the interval.

**Floored interval** (the rule ``floored_t``, the default of every study): a t-interval over n seeds can come out
narrower than its own evaluation noise allows, since S²_d with few degrees of freedom can fall below the variance the
graded answers alone put into Δ̂ (V_E below, measured from thousands of grades). The floored rule uses

    SE² = max(S²_d / n, V_E),   df = n − 1                                                                (5)

(Welch alike with its own df): never narrower than the evaluation allows, and never narrower than the paired t.
Keeping n − 1 when the floor binds is the conservative end of a Satterthwaite df for V_T + V_E: V_E's own df is in
the thousands, so a Satterthwaite df would jump from n − 1 to ~∞ at the floor and make the floored interval narrower
than the unfloored one just below it.

**Decomposition** of SE² (:func:`decompose`), each part estimated from the study's own files:

    evaluation  V_E = mean_s v^d_s / n                          (paired: eq. 2 over the grade differences of the same
                                                                 (problem, run, sample), the arms sharing sampling
                                                                 seeds; without them mean_s (v^x_s + v^y_s) / n, an
                                                                 upper bound; Welch: mean v^x / n_x + mean v^y / n_y)
    seeds       V_T = max(SE² − V_E, 0)                          (training: what remains of the seed-to-seed spread)
    problems    V_P = (1/B²) Σ_b max(S²_p(δ_b) − mean_p q_{b,p}, 0) / N_b                                  (3)

with δ_{b,p} the per-problem difference of the arms' seed means and q_{b,p} its variance from seeds and sampling
(S² over seeds of the per-problem paired differences / n; Welch: S²_{x,p}/n_x + S²_{y,p}/n_y): the method of
moments of a one-way random-effects model. Per seed, σ²_T = n·V_T and σ²_E = n·V_E (per benchmark σ²_{E,b}), so
the half-width with n' seeds and f_b times the samples on benchmark b is

    h(n', f) = t_{0.975, n'−1} · sqrt((σ²_T + Σ_b σ²_{E,b} / f_b) / n')                                   (4)

(:func:`projected_half_width`; :func:`seeds_for`: the smallest n' with h ≤ a target).

**Coverage** (:func:`coverage`): studies simulated from measured components (per-problem success probabilities,
each seed's training shift T ~ N(0, σ²_T) or a heavier-tailed Student t, binomial sampling at the design's
sample counts), each judged by today's and the proposed intervals; the share that covers the true Δ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from graft_cli.report.sequential import look_critical

__all__ = ["EvalDesign", "arm_components", "binomial_variance", "coverage", "decompose", "eval_variance",
           "projected_half_width", "seed_interval", "seeds_for", "t975"]


def t975(df: float) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (scipy)."""
    return float(sps.t.ppf(0.975, df))


# ------------------------------------------------------------------------------------ eq. (2): sampling
def binomial_variance(p_hat: np.ndarray, n: int) -> float:
    """v_b of eq. (2) from per-problem pass rates p̂ over ``n`` 0/1 grades each: (1/N²) Σ_p p̂(1 − p̂)/(n − 1)."""
    p = np.asarray(p_hat, dtype=np.float64)
    if n < 2 or p.size == 0:
        return 0.0
    return float(np.sum(p * (1 - p)) / (n - 1) / p.size ** 2)


def eval_variance(per_bench: Mapping[str, float], benches: Sequence[str] | None = None) -> float:
    """v_s of eq. (2): (1/B²) Σ_b v_{s,b} over ``benches`` (default: all of ``per_bench``)."""
    names = list(benches) if benches is not None else list(per_bench)
    return float(sum(per_bench[b] for b in names)) / len(names) ** 2 if names else 0.0


# ------------------------------------------------------------------------------------ the interval
def seed_interval(x: Mapping, y: Mapping, paired: bool | None = None, floor: float | None = None,
                  boundary: float | None = None) -> dict | None:
    """Δ = mean(x) − mean(y) of seed scores (``seed -> score``) with the 95% t-interval of the module docstring.
    ``paired`` None: paired when both arms have the same seeds (≥ 2). ``floor`` (the *floored* rule, eq. 5): the
    squared standard error is max(SE², floor), floor = V_E the measured evaluation variance of Δ̂, with the df of
    SE² kept. ``boundary``: a group-sequential look's boundary c_k, the multiplier then q_k of
    :mod:`graft_cli.report.sequential` eq. (3) instead of t_{0.975}. Returns {"interval": (Δ, lo, hi), "paired",
    "df", "se", "floored" (the floor set SE), "crit", "n": [n_x, n_y]} or None when a side has < 2 seeds."""
    if paired is None:
        paired = set(map(str, x)) == set(map(str, y))
    if paired:
        keys = sorted(set(map(str, x)) & set(map(str, y)))
        xs, ys = {str(k): float(v) for k, v in x.items()}, {str(k): float(v) for k, v in y.items()}
        d = np.array([xs[k] - ys[k] for k in keys])
        if d.size < 2:
            return None
        delta, se, df = float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size)), float(d.size - 1)
    else:
        xv, yv = np.array([float(v) for v in x.values()]), np.array([float(v) for v in y.values()])
        if xv.size < 2 or yv.size < 2:
            return None
        a, b = xv.var(ddof=1) / xv.size, yv.var(ddof=1) / yv.size
        delta, se = float(xv.mean() - yv.mean()), float(math.sqrt(a + b))
        df = float((a + b) ** 2 / (a ** 2 / (xv.size - 1) + b ** 2 / (yv.size - 1))) if a + b > 0 else float(
            xv.size + yv.size - 2)
    floored = floor is not None and floor > se ** 2
    if floored:
        se = math.sqrt(floor)
    crit = t975(df) if boundary is None else look_critical(boundary, df)
    h = crit * se
    return {"interval": (delta, delta - h, delta + h), "paired": bool(paired), "df": df, "se": se,
            "floored": bool(floored), "crit": crit, "n": [len(x), len(y)]}


# ------------------------------------------------------------------------------------ eq. (3): the parts
def _macro(arr_by_bench: Mapping[str, np.ndarray], benches: Sequence[str]) -> float:
    return float(np.mean([np.mean(arr_by_bench[b]) for b in benches]))


def decompose(x: Mapping, y: Mapping, ex: Mapping | None, ey: Mapping | None, benches: Sequence[str],
              paired: bool | None = None, scale: float = 100.0, ed: Mapping | None = None) -> dict | None:
    """The parts of Var(Δ̂), eq. (3), in ``scale``² units (points² for pass@1 × 100).

    ``x``/``y``: seed -> {benchmark: per-problem mean grades}; ``ex``/``ey``: seed -> {benchmark: v_{s,b}} (eq. 2;
    None: no sampling part is known); ``ed`` (paired): seed -> {benchmark: v^d_{s,b}}, the sampling variance of the
    difference itself, eq. (2) over the paired grade differences g^x − g^y of the same (problem, run, sample): the
    arms are sampled with the same seeds, so their sampling noise can be correlated and v^x + v^y overstates it.
    Returns {"seeds", "evaluation", "problems" (variances of Δ̂), "shares"
    (of their sum), "per_seed": {"training", "evaluation", "evaluation_by_benchmark"} (σ², eq. 4), "paired",
    "n"} or None when an arm has < 2 seeds."""
    if paired is None:
        paired = set(map(str, x)) == set(map(str, y))
    xs = {str(k): v for k, v in x.items()}
    ys = {str(k): v for k, v in y.items()}
    if paired:
        keys = sorted(set(xs) & set(ys))
        xs, ys = {k: xs[k] for k in keys}, {k: ys[k] for k in keys}
    nx, ny = len(xs), len(ys)
    if nx < 2 or ny < 2:
        return None
    s2 = scale ** 2
    mx = {k: scale * _macro(v, benches) for k, v in xs.items()}
    my = {k: scale * _macro(v, benches) for k, v in ys.items()}
    iv = seed_interval(mx, my, paired)
    total = iv["se"] ** 2
    B = len(benches)

    def ev_bench(e, keys):  # per benchmark: mean over seeds of v_{s,b} / B², in scale² units
        if e is None:
            return None
        es = {str(k): v for k, v in e.items()}
        if any(k not in es or any(b not in es[k] for b in benches) for k in keys):
            return None
        return {b: s2 * float(np.mean([es[k][b] for k in keys])) / B ** 2 for b in benches}

    vx, vy = ev_bench(ex, list(xs)), ev_bench(ey, list(ys))
    vd = ev_bench(ed, list(xs)) if paired and ed else None
    if vd is not None:
        by_bench = dict(vd)  # σ²_{E,b} of one seed pair's difference, from the paired grades
        per_seed_eval = float(sum(by_bench.values()))
        v_eval = per_seed_eval / nx
    elif vx is None or vy is None:
        by_bench, v_eval = None, 0.0
        per_seed_eval = None
    elif paired:
        by_bench = {b: vx[b] + vy[b] for b in benches}  # σ²_{E,b} of one seed pair's difference
        per_seed_eval = float(sum(by_bench.values()))
        v_eval = per_seed_eval / nx
    else:
        by_bench = {b: vx[b] + vy[b] for b in benches}  # of one seed of each arm (equal-n reading)
        per_seed_eval = float(sum(by_bench.values()))
        v_eval = float(sum(vx.values())) / nx + float(sum(vy.values())) / ny
    v_seeds = max(total - v_eval, 0.0)
    parts = {"seeds": v_seeds, "evaluation": v_eval, "problems": _problem_variance(xs, ys, benches, paired, scale)}
    tot = sum(parts.values())
    n_eff = nx if paired else (nx * ny / (nx + ny)) * 2  # the per-seed reading: Var(Δ̂) = σ²/n for n per arm
    return {**parts, "total": total, "evaluation_from": "paired grades" if vd is not None else "each arm's grades",
            "shares": {k: (v / tot if tot > 0 else None) for k, v in parts.items()},
            "per_seed": {"training": v_seeds * n_eff, "evaluation": per_seed_eval,
                         "evaluation_by_benchmark": by_bench},
            "paired": bool(paired), "n": [nx, ny], "interval": iv["interval"], "df": iv["df"]}


def _problem_variance(xs: Mapping, ys: Mapping, benches: Sequence[str], paired: bool, scale: float) -> float:
    """V_P of eq. (3): per benchmark the spread of the per-problem differences of the arms' seed means, less what
    seeds and sampling put into each (q_p), over N_b; averaged over benchmarks as the macro score is."""
    nx, ny, B = len(xs), len(ys), len(benches)
    v_prob = 0.0
    for b in benches:
        X = scale * np.stack([np.asarray(v[b], dtype=np.float64) for v in xs.values()])
        Y = scale * np.stack([np.asarray(v[b], dtype=np.float64) for v in ys.values()])
        if X.shape[1] != Y.shape[1] or X.shape[1] < 2:
            continue
        delta_p = X.mean(0) - Y.mean(0)
        q = ((X - Y).var(0, ddof=1) / nx) if paired else (X.var(0, ddof=1) / nx + Y.var(0, ddof=1) / ny)
        v_prob += max(float(delta_p.var(ddof=1)) - float(q.mean()), 0.0) / X.shape[1] / B ** 2
    return v_prob


# ------------------------------------------------------------------------------------ eq. (4): projections
def projected_half_width(per_seed: Mapping, n: int, factors: Mapping[str, float] | None = None) -> float | None:
    """h(n, f) of eq. (4) from a decomposition's ``per_seed`` part (training σ²_T; evaluation σ²_E per benchmark,
    each divided by its ``factors`` entry, default 1: f_b times the samples of benchmark b)."""
    if n < 2:
        return None
    by = per_seed.get("evaluation_by_benchmark") or {}
    f = factors or {}
    ev = sum(v / float(f.get(b, 1.0)) for b, v in by.items()) if by else float(per_seed.get("evaluation") or 0.0)
    return t975(n - 1) * math.sqrt((float(per_seed["training"]) + ev) / n)


def seeds_for(target: float, per_seed: Mapping, factors: Mapping[str, float] | None = None,
              n_max: int = 500) -> int | None:
    """The smallest n ≥ 2 seeds per arm with h(n, f) ≤ ``target`` (eq. 4); None beyond ``n_max``."""
    for n in range(2, n_max + 1):
        h = projected_half_width(per_seed, n, factors)
        if h is not None and h <= target:
            return n
    return None


def arm_components(arm: Mapping, ev: Mapping | None, benches: Sequence[str], scale: float = 100.0) -> dict:
    """One arm's own parts, for a simulation: the seeds' score variance S², its mean sampling variance v̄ (eq. 2)
    and σ²_T = max(S² − v̄, 0), in ``scale``² units, with the per-problem mean of the arm's seeds per benchmark."""
    keys = [str(k) for k in arm]
    a = {str(k): v for k, v in arm.items()}
    m = np.array([scale * _macro(a[k], benches) for k in keys])
    S2 = float(m.var(ddof=1)) if m.size > 1 else 0.0
    vbar = 0.0
    if ev is not None:
        e = {str(k): v for k, v in ev.items()}
        vbar = float(np.mean([scale ** 2 * eval_variance(e[k], benches) for k in keys]))
    p = {b: np.mean(np.stack([np.asarray(a[k][b], dtype=np.float64) for k in keys]), axis=0) for b in benches}
    return {"S2": S2, "eval": vbar, "training": max(S2 - vbar, 0.0), "p": p, "seeds": len(keys)}


# ------------------------------------------------------------------------------------ coverage
@dataclass(frozen=True)
class EvalDesign:
    """What a simulated study runs: seeds per arm and 0/1 grades per problem on each benchmark."""
    seeds: int
    samples: Mapping[str, int]

    def label(self) -> str:
        counts = sorted(set(self.samples.values()))
        per = ("/".join(str(c) for c in counts)) if len(counts) > 1 else str(counts[0])
        return f"{self.seeds} seeds, {per} samples"


def _true_delta(px, py, sd_x, sd_y, tails, rng, draws=20000):
    """E[m^x] − E[m^y] under the simulation's model (eq. 1 over clip(p + T, 0, 1)), by Monte Carlo with common
    draws of T (exact 0 when the arms are the same)."""
    z = _shifts(rng, draws, tails)
    out = 0.0
    for b in px:
        ex = np.clip(px[b][None, :] + (sd_x * z)[:, None], 0, 1).mean()
        ey = np.clip(py[b][None, :] + (sd_y * z)[:, None], 0, 1).mean()
        out += (ex - ey) / len(px)
    return float(out)


def _shifts(rng, n, tails):
    """n standardised training shifts: N(0, 1), or Student t with ``tails`` df scaled to unit variance."""
    if not tails:
        return rng.standard_normal(n)
    return rng.standard_t(tails, n) / math.sqrt(tails / (tails - 2))


def _simulate_arm(rng, p, sd, design: EvalDesign, z):
    """Seed -> {benchmark: per-problem pass rate} and seed -> {benchmark: v_{s,b}} for one simulated arm."""
    arms, evs = {}, {}
    for s in range(design.seeds):
        arms[s], evs[s] = {}, {}
        for b, pb in p.items():
            n = int(design.samples[b])
            q = np.clip(pb + sd * z[s], 0, 1)
            phat = rng.binomial(n, q) / n
            arms[s][b] = phat
            evs[s][b] = binomial_variance(phat, n)
    return arms, evs


def coverage(px: Mapping[str, np.ndarray], py: Mapping[str, np.ndarray], sd_x: float, sd_y: float,
             design: EvalDesign, procedures: Mapping[str, Callable], studies: int = 1000, seed: int = 0,
             rho: float = 0.0, tails: int | None = None, null: bool = False) -> dict:
    """Coverage of each procedure over ``studies`` simulated studies (module docstring).

    ``px``/``py``: per-benchmark true pass rates of the arms (fractions); ``sd_x``/``sd_y``: the training shifts'
    standard deviations (fractions); ``rho``: their correlation between the arms' same-numbered seeds; ``tails``:
    Student-t df of the shifts (None: normal); ``null``: y := x (Δ = 0). ``procedures``: name ->
    f(x_arm, y_arm, x_eval, y_eval) -> (Δ, lo, hi) or None, arms as :func:`decompose` takes them, in fractions.
    Returns {name: {"coverage", "half_width" (mean, fractions), "studies"}, "true_delta"}."""
    rng = np.random.default_rng(seed)
    if null:
        py, sd_y = px, sd_x
    truth = 0.0 if null else _true_delta(px, py, sd_x, sd_y, tails, np.random.default_rng(seed + 1))
    hits = {k: 0 for k in procedures}
    widths = {k: [] for k in procedures}
    counted = {k: 0 for k in procedures}
    for _ in range(studies):
        zx = _shifts(rng, design.seeds, tails)
        zy = rho * zx + math.sqrt(1 - rho ** 2) * _shifts(rng, design.seeds, tails)
        x, exv = _simulate_arm(rng, px, sd_x, design, zx)
        y, eyv = _simulate_arm(rng, py, sd_y, design, zy)
        for name, proc in procedures.items():
            iv = proc(x, y, exv, eyv)
            if iv is None:
                continue
            counted[name] += 1
            hits[name] += int(iv[1] <= truth <= iv[2])
            widths[name].append((iv[2] - iv[1]) / 2)
    out = {name: {"coverage": hits[name] / counted[name] if counted[name] else None,
                  "half_width": float(np.mean(widths[name])) if widths[name] else None, "studies": counted[name]}
           for name in procedures}
    out["true_delta"] = truth
    return out


# ------------------------------------------------------------------------------------ the report's table
TARGET_HALF_WIDTH = 1.0  # points: the half-width the studies are budgeted for


def variance_row(label: str, model: str, dec: Mapping | None, target: float = TARGET_HALF_WIDTH) -> list[str]:
    """One row of the report's variance table: the comparison, the model, seeds, the half-width, Var(Δ̂) split
    into seeds / evaluation / problems (share of their sum), per-seed σ_T and σ_E, and the seeds per arm that
    would give a half-width ≤ ``target`` at this evaluation and with no evaluation noise (eq. 4)."""
    if not dec:
        return [label, model] + ["—"] * 8
    inside = dec["seeds"] + dec["evaluation"]  # the interval's variance; problems stand beside it
    pct = lambda k: f"{dec[k]:.3f}" + (f" ({100 * dec[k] / inside:.0f}%)" if inside > 0 else "")
    per = dec["per_seed"]
    iv = dec["interval"]
    n_now = seeds_for(target, per)
    n_clean = seeds_for(target, {"training": per["training"], "evaluation": 0.0})
    ev = per.get("evaluation")
    return [label, model, f"{dec['n'][0]}" + ("" if dec["paired"] else f" vs {dec['n'][1]}") +
            (" (paired)" if dec["paired"] else " (Welch)"), f"{(iv[2] - iv[1]) / 2:.2f}",
            pct("seeds"), pct("evaluation"), pct("problems"),
            f"{math.sqrt(per['training']):.2f} / " + ("—" if ev is None else f"{math.sqrt(ev):.2f}"),
            "—" if n_now is None else str(n_now), "—" if n_clean is None else str(n_clean)]


VARIANCE_COLUMNS = ["Comparison", "Model", "Seeds", "95% half-width", "Var: seeds", "Var: evaluation",
                    "Var: problems (beside)", "σ_T / σ_E per seed", f"seeds for ±{TARGET_HALF_WIDTH:g}",
                    f"seeds for ±{TARGET_HALF_WIDTH:g}, no eval noise"]

VARIANCE_NOTE = ("Var(Δ̂) in points², split as in `graft_cli/report/power.py` (docs/studies.md, \"Where the variance "
                 "comes from\"): *seeds* is what the training seeds add, *evaluation* the sampling of the evaluated "
                 "answers (from the paired grade differences where both arms' grades are at hand, else each "
                 "checkpoint's own: an upper bound), *problems* what a new draw of the benchmarks' problems "
                 "would add (not inside the interval: the benchmarks are fixed). Percentages are of the interval's "
                 "own variance, seeds + evaluation (problems beside it, as a percentage of the same). σ_T and σ_E "
                 "are per seed (per seed "
                 "pair when paired). The last two columns: seeds per arm for a 95% half-width ≤ the target at this "
                 "evaluation, and with the evaluation noise removed.")
