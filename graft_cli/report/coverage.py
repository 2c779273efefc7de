"""Does a study's interval keep its 95%? Simulated studies from a published study's own variance
components.

The components come from a claims file's ``measured`` section (:func:`components`): each arm's
per-problem pass rates (the mean of its seeds) and its training spread σ_T
(:func:`graft_cli.report.power.arm_components`). Each simulated study draws, per seed, a training
shift and the evaluated answers (binomial at the design's samples per problem;
:func:`graft_cli.report.power.coverage`) and is judged by each procedure of :data:`PROCEDURES`:

- ``bootstrap``: the paired hierarchical percentile bootstrap over seeds and problems
  (:func:`graft_cli.report.stats.hierarchical_bootstrap`), the studies' interval before this one;
- ``welch``: the Welch t-interval over the seeds' macro scores;
- ``paired_t``: the paired t-interval over the seeds' macro scores
  (:func:`graft_cli.report.power.seed_interval`);
- ``floored_t``: the same with SE² floored at the measured evaluation variance (power.py eq. 5), the
  interval of record.

:func:`sequential_coverage` simulates the rule a sequential study uses: judged at looks, stopped by
a variance-driven rule or at the last look, with and without the repeated confidence intervals'
boundaries.

Two truths are simulated: the study's measured Δ (arm x's and arm y's own pass rates and spreads)
and the null (y := x, Δ = 0); training shifts normal or Student t with 4 df (heavier tails than six
seeds can rule out). """

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from graft_cli.report.power import (
    EvalDesign,
    _shifts,
    _simulate_arm,
    _true_delta,
    arm_components,
    binomial_variance,
    coverage,
    seed_interval,
)
from graft_cli.report.sequential import boundaries
from graft_cli.report.stats import hierarchical_bootstrap, macro_mean


def _lists(arm: Mapping, benches: Sequence[str]) -> dict:
    return {s: [np.asarray(v[b], dtype=np.float64) for b in benches] for s, v in arm.items()}


def _bootstrap(n_boot: int):
    def proc(x, y, ex, ey):
        benches = list(next(iter(x.values())))
        return hierarchical_bootstrap(_lists(x, benches), _lists(y, benches), n_boot=n_boot, seed=0)
    return proc


def _t(paired: bool):
    def proc(x, y, ex, ey):
        benches = list(next(iter(x.values())))
        mx = {s: macro_mean(v) for s, v in _lists(x, benches).items()}
        my = {s: macro_mean(v) for s, v in _lists(y, benches).items()}
        iv = seed_interval(mx, my, paired)
        return None if iv is None else iv["interval"]
    return proc


def _floored(x, y, ex, ey):
    return _interval_at(x, y, ex, ey, len(x), "floored_t", None)


def procedures(n_boot: int = 400) -> dict:
    """name -> interval procedure over simulated arms (see the module docstring)."""
    return {"bootstrap": _bootstrap(n_boot), "welch": _t(False), "paired_t": _t(True), "floored_t": _floored}


def components(measured: Mapping, run_x: str, run_y: str, policy: str, samples: Mapping[str, int] | None = None,
               scale: float = 100.0) -> dict:
    """Both arms' parts for a simulation from a claims file's ``measured`` section: per-problem pass
    rates, σ_T (fractions) and the benchmarks. A file without ``eval_var`` gets it from the pass
    rates and ``samples`` (0/1 grades per problem per benchmark)."""
    probs = measured["problems"]
    x, y = probs[run_x][policy], probs[run_y][policy]
    benches = sorted(set.intersection(*[set(v) for v in list(x.values()) + list(y.values())]))
    ev_all = measured.get("eval_var") or {}

    def ev(run, arm):
        e = (ev_all.get(run) or {}).get(policy)
        if e:
            return e
        if samples is None:
            return None
        return {s: {b: binomial_variance(np.asarray(v[b]), int(samples[b])) for b in benches} for s, v in arm.items()}

    cx = arm_components(x, ev(run_x, x), benches, scale)
    cy = arm_components(y, ev(run_y, y), benches, scale)
    return {"px": cx["p"], "py": cy["p"], "sd_x": float(np.sqrt(cx["training"])) / scale,
            "sd_y": float(np.sqrt(cy["training"])) / scale, "benchmarks": benches, "arms": (cx, cy)}


def coverage_table(comp: Mapping, designs: Sequence[EvalDesign], studies: int = 1000, seed: int = 0,
                   n_boot: int = 400, tails: Sequence[int | None] = (None, 4),
                   only: Sequence[str] | None = None) -> list[dict]:
    """One row per (design, truth, tails): each procedure's coverage and mean half-width (points);
    ``only``: the procedures to run (default all of :func:`procedures`)."""
    rows = []
    procs = {k: v for k, v in procedures(n_boot).items() if only is None or k in only}
    for d in designs:
        for null in (False, True):
            for tl in tails:
                res = coverage(comp["px"], comp["py"], comp["sd_x"], comp["sd_y"], d, procs, studies=studies,
                               seed=seed, tails=tl, null=null)
                rows.append({"design": d.label(), "seeds": d.seeds, "truth": "Δ = 0" if null else "measured Δ",
                             "true_delta": 100 * res["true_delta"], "shifts": "normal" if tl is None else f"t{tl}",
                             **{name: {"coverage": res[name]["coverage"],
                                       "half_width": None if res[name]["half_width"] is None
                                       else 100 * res[name]["half_width"]} for name in procs}})
    return rows


def _interval_at(x, y, ex, ey, n: int, rule: str, boundary: float | None):
    """The paired interval (fractions) of the first ``n`` simulated seeds: ``paired_t`` or
    ``floored_t`` (SE² floored at the seeds' mean sampling variance of Δ̂, eq. 5 of power.py), at a
    sequential ``boundary`` when given."""
    keys = list(x)[:n]
    benches = list(next(iter(x.values())))
    mx = {s: macro_mean(_lists({s: x[s]}, benches)[s]) for s in keys}
    my = {s: macro_mean(_lists({s: y[s]}, benches)[s]) for s in keys}
    floor = None
    if rule == "floored_t":  # arms sampled independently here: V_E = mean_s (v^x_s + v^y_s) / n (eq. 2)
        B = len(benches)
        floor = float(np.mean([sum(ex[s][b] + ey[s][b] for b in benches) / B ** 2 for s in keys])) / n
    iv = seed_interval(mx, my, True, floor=floor, boundary=boundary)
    return None if iv is None else iv["interval"]


def sequential_coverage(comp: Mapping, looks: Sequence[int], samples: Mapping[str, int], studies: int = 1000,
                        seed: int = 0, target: float | None = None, tails: int | None = None, null: bool = False,
                        spending: str = "obrien_fleming") -> dict:
    """Coverage of the rule a sequential study actually uses, from simulated studies of
    ``looks[-1]`` seeds judged at each look on their first n_k seeds. The stop: with ``target``
    (points), the first look whose paired-t half-width is ≤ target (a variance-driven extension, as
    results/tiny's), else the last look. Per procedure the share of studies whose interval at the
    stopping look covers the true Δ, its mean half-width (points), and the share that cover at every
    look (simultaneous coverage): ``naive`` (the paired t at the stopping look, as if the design had
    been fixed), ``floored`` (the floored t, the same), ``rci`` (the floored t at the look's
    boundary, report/ sequential.py) and ``rci_paired`` (the paired t at the boundary)."""
    rng = np.random.default_rng(seed)
    px, py, sd_x, sd_y = comp["px"], comp["py"], comp["sd_x"], comp["sd_y"]
    if null:
        py, sd_y = px, sd_x
    truth = 0.0 if null else _true_delta(px, py, sd_x, sd_y, tails, np.random.default_rng(seed + 1))
    c = boundaries(list(looks), 0.05, spending)
    procs = {"naive": ("paired_t", False), "floored": ("floored_t", False), "rci": ("floored_t", True),
             "rci_paired": ("paired_t", True)}
    hits = {k: 0 for k in procs}
    every = {k: 0 for k in procs}
    widths: dict = {k: [] for k in procs}
    stops = {n: 0 for n in looks}
    design = EvalDesign(int(looks[-1]), samples)
    for _ in range(studies):
        zx = _shifts(rng, design.seeds, tails)
        zy = _shifts(rng, design.seeds, tails)
        x, ex = _simulate_arm(rng, px, sd_x, design, zx)
        y, ey = _simulate_arm(rng, py, sd_y, design, zy)
        stop = len(looks) - 1
        if target is not None:
            for k, n in enumerate(looks):
                iv = _interval_at(x, y, ex, ey, n, "paired_t", None)
                if iv is not None and 100 * (iv[2] - iv[1]) / 2 <= target:
                    stop = k
                    break
        stops[looks[stop]] += 1
        for name, (rule, seq) in procs.items():
            ivs = [_interval_at(x, y, ex, ey, n, rule, c[k] if seq else None) for k, n in enumerate(looks)]
            iv = ivs[stop]
            hits[name] += int(iv[1] <= truth <= iv[2])
            every[name] += int(all(v[1] <= truth <= v[2] for v in ivs))
            widths[name].append(100 * (iv[2] - iv[1]) / 2)
    return {"true_delta": 100 * truth, "stops": stops, "boundaries": c,
            **{k: {"coverage": hits[k] / studies, "simultaneous": every[k] / studies,
                   "half_width": float(np.mean(widths[k]))} for k in procs}}
