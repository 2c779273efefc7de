"""GRAFT's compatibility score, gate and admission (graft.md §2.2 steps 7–8, Eq. 6–8; §3 variants),
registered.

- :func:`compatibility`: s = exp(ℓ̄(π_old^R, o^R) − ℓ̄(π_S, o^S)), ℓ̄ = mean token log-likelihood
  (terminal EOS excluded on both sides, graft.md §8 item 3);
- admission rules (registry ``ADMISSIONS``, ``exchange.params.admission``), what the exchange's
  ``admit`` calls: ``gate`` applies the gate named by ``exchange.params.gate``; ``random`` ("random
  admission") admits as many responses as the floor would, drawn uniformly;
- gates (registry ``GATES``, ``exchange.params.gate``), what the ``gate`` rule calls: ``floor`` w =
  1[s > δ]·min(s, 1) (strict >; responses with s ≤ δ dropped; δ ≤ 0: no floor), ``none`` w = 1 for
  all ("w/o compatibility gate").

An admission rule is ``admit(s, opts, rng_factory) -> (w, keep)`` (``opts``: the exchange's
:class:`~graft_cli.algorithms.exchange.graft.GraftParams`); a gate is ``gate(s, delta, cap) -> (w,
keep)``. """

from __future__ import annotations

import math

import numpy as np

from graft_cli.registry import Params, Registry

GATES: Registry = Registry("gate")
ADMISSIONS: Registry = Registry("admission rule")


def source_mean_logprob(logprobs, ended_with_eos: bool) -> float:
    """Denominator of s (Eq. 7): mean source log-prob (``peer_logprobs``) over the source tokens,
    terminal EOS excluded (graft.md §8 item 3), except in an EOS-only response, whose one action is
    its EOS (HACPO's released ``materialize_rollout_records`` keeps it: the mean is that token's
    log-prob). nan for an empty response."""
    lp = list(logprobs)
    if ended_with_eos and len(lp) > 1:
        lp = lp[:-1]
    return float(np.mean(lp)) if lp else math.nan


def compatibility(recv_logprobs, n_scored: int, src_mean: float) -> float:
    """Eq. 6–7: s = exp(ℓ̄(π_old^R, o^R) − ℓ̄(π_S, o^S)), ℓ̄ = mean token log-likelihood; the
    receiver mean is over the first ``n_scored`` tokens (appended EOS excluded). nan when either
    side is empty."""
    lp = list(recv_logprobs)[:n_scored]
    if not lp or src_mean is None or not math.isfinite(src_mean):
        return math.nan
    return float(math.exp(min(float(np.mean(lp)) - src_mean, 700.0)))


def _capped(x: float, cap: bool) -> float:
    return (min(x, 1.0) if cap else x) if math.isfinite(x) else 0.0


@ADMISSIONS.register("gate")
def admit_by_gate(s, opts: Params, rng_factory) -> tuple[list[float], list[bool]]:
    """The gate ``opts.gate`` (:func:`floor_gate` or :func:`no_gate`) on the scores ``s``, with the
    floor δ ``opts.delta`` and the cap ``opts.cap``."""
    return GATES.get(opts.gate)(list(s), opts.delta, opts.cap)


@ADMISSIONS.register("random")
def admit_at_random(s, opts: Params, rng_factory) -> tuple[list[float], list[bool]]:
    """:func:`random_admission` with the floor δ ``opts.delta``, drawn from ``rng_factory()``."""
    return random_admission(s, opts.delta, rng_factory(), opts.cap)


def random_admission(s, delta: float, rng: np.random.Generator, cap: bool = True) -> tuple[list[float], list[bool]]:
    """graft.md §3 "random admission": A = #{s > δ}; A responses sampled uniformly (without
    replacement) from all transferred responses get w = min(s, 1) without the floor; the others are
    dropped."""
    s = [float(x) for x in s]
    a = sum(1 for x in s if math.isfinite(x) and x > delta)
    chosen = set(rng.choice(len(s), size=a, replace=False).tolist()) if a else set()
    w = [_capped(x, cap) if i in chosen else 0.0 for i, x in enumerate(s)]
    return w, [i in chosen for i in range(len(s))]


@GATES.register("floor")
def floor_gate(s, delta: float, cap: bool) -> tuple[list[float], list[bool]]:
    """Eq. 8: w = 1[s > δ]·min(s, 1), keep = s > δ; δ ≤ 0: no floor (all kept, w = min(s, 1); nan s
    → w = 0)."""
    keep = [True if delta <= 0 else (math.isfinite(float(x)) and float(x) > delta) for x in s]
    return [_capped(float(x), cap) if k else 0.0 for x, k in zip(s, keep)], keep


@GATES.register("none")
def no_gate(s, delta: float, cap: bool) -> tuple[list[float], list[bool]]:
    """graft.md §3 "w/o compatibility gate": w = 1, everything kept."""
    return [1.0] * len(s), [True] * len(s)
