"""GRAFT's prompt selection (graft.md §2.2 steps 3–4, Alg. 1) and its variants, as registered rules.

A selection rule (registry ``SELECTIONS``) decides, for one direction source S → receiver R, which prompts
R receives from S: ``rule(ks, ns, s, r, seed, batch_size) -> (candidates, selected, m)`` with ``ks[i]`` policy
i's success counts per prompt and ``ns[i]`` its group size (``m`` is None for unbalanced rules).

- ``balanced`` (GRAFT): candidates C_{S→R} = {q : k_R(q) = 0 ∧ 1 ≤ k_S(q) < n}; ``m = min(|C_{S→R}|, |C_{R→S}|)``;
  SelectWithTies by the source's k. **Tie order**: candidates are sorted by ``(-k_S(q), q)`` (ties by prompt
  index); because every candidate tied with the m-th is kept, the *set* selected does not depend on the tie
  order (it is ``{q ∈ C : k_S(q) ≥ k_S(m-th)}``); it is returned in prompt order.
- ``unbalanced``: every candidate of the trigger, no balancing (the stored-trajectory rule);
- ``sgt`` ("w/o balanced exchange", SGT's eligibility): k_R = 0 ∧ k_S ≥ 1, all-correct source groups included;
- ``all`` (HACPO's pooling): every prompt of the batch, whatever the rewards (the peer's group joins the
  receiver's on every prompt);
- ``random`` ("random prompts"): as many prompts as ``balanced`` selects, uniformly without replacement over
  the whole batch, from ``np.random.default_rng([seed, s, r])``.

:func:`plan_exchange` applies a rule to every direction and resolves a receiver prompt offered by several
sources (N ≥ 2 policies): the source with the most successes k_S(q), ties to the lower policy index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from graft_cli.registry import Registry

SELECTIONS: Registry = Registry("selection rule")


def _ints(k) -> list[int]:
    if isinstance(k, torch.Tensor):
        return [int(x) for x in k.tolist()]
    return [int(x) for x in k]


def trigger(k_recv, k_src, n_src: int) -> list[int]:
    """Alg. 1 trigger C_{S→R} = {q : k_R(q) = 0 ∧ 1 ≤ k_S(q) < n} (graft.md §2.2 step 3)."""
    return [q for q, (kr, ks) in enumerate(zip(_ints(k_recv), _ints(k_src))) if kr == 0 and 1 <= ks < n_src]


def trigger_sgt(k_recv, k_src) -> list[int]:
    """SGT's eligibility (baselines.md §2.1; graft.md §3 "w/o balanced exchange"): k_R = 0 ∧ k_S ≥ 1,
    all-correct source groups included."""
    return [q for q, (kr, ks) in enumerate(zip(_ints(k_recv), _ints(k_src))) if kr == 0 and ks >= 1]


def select_with_ties(cands: list[int], k_src, m: int) -> list[int]:
    """Alg. 1 ``SelectWithTies(C, k_S, m)`` (graft.md §2.2 step 4): rank C by the source's success count,
    descending (ties by prompt index), keep the first m and every candidate tied with the m-th; m = 0 → ∅.
    Returned in prompt order."""
    if m <= 0 or not cands:
        return []
    k = _ints(k_src)
    ranked = sorted(cands, key=lambda q: (-k[q], q))
    if m >= len(ranked):
        return sorted(ranked)
    kth = k[ranked[m - 1]]
    return sorted(q for q in ranked if k[q] >= kth)


def balanced_pair(k_a, k_b, n_a: int, n_b: int | None = None) -> dict:
    """Balanced exchange between two policies (graft.md §2.2 steps 3–4): ``m = min(|C_{A→B}|, |C_{B→A}|)``,
    then SelectWithTies in each direction by the source's k. Returns candidates, selections and m
    (``ab`` = A is the source, B the receiver)."""
    n_b = n_a if n_b is None else n_b
    c_ab, c_ba = trigger(k_b, k_a, n_a), trigger(k_a, k_b, n_b)
    m = min(len(c_ab), len(c_ba))
    return {"m": m, "cand_ab": c_ab, "cand_ba": c_ba,
            "sel_ab": select_with_ties(c_ab, k_a, m), "sel_ba": select_with_ties(c_ba, k_b, m)}


@SELECTIONS.register("balanced")
def select_balanced(ks, ns, s: int, r: int, seed: int = 0, batch_size: int = 0):
    cand = trigger(ks[r], ks[s], ns[s])
    m = min(len(cand), len(trigger(ks[s], ks[r], ns[r])))
    return cand, select_with_ties(cand, ks[s], m), m


@SELECTIONS.register("unbalanced")
def select_unbalanced(ks, ns, s: int, r: int, seed: int = 0, batch_size: int = 0):
    cand = trigger(ks[r], ks[s], ns[s])
    return cand, cand, None


@SELECTIONS.register("sgt")
def select_sgt(ks, ns, s: int, r: int, seed: int = 0, batch_size: int = 0):
    cand = trigger_sgt(ks[r], ks[s])
    return cand, cand, None


@SELECTIONS.register("all")
def select_all(ks, ns, s: int, r: int, seed: int = 0, batch_size: int = 0):
    every = list(range(batch_size or len(_ints(ks[r]))))
    return every, every, None


@SELECTIONS.register("random")
def select_random(ks, ns, s: int, r: int, seed: int = 0, batch_size: int = 0):
    cand, sel, m = select_balanced(ks, ns, s, r)
    if sel:
        rng = np.random.default_rng([seed, s, r])
        sel = sorted(rng.choice(batch_size, size=len(sel), replace=False).tolist())
    return cand, sel, m


@dataclass
class Plan:
    """Who receives which prompt from whom. ``assign[r][q] = s``; per-direction ``(s, r)`` tables."""

    assign: dict = field(default_factory=dict)  # receiver index -> {prompt -> source index}
    candidates: dict = field(default_factory=dict)  # (s, r) -> list of prompts
    selected: dict = field(default_factory=dict)  # (s, r) -> list of prompts (before source choice)
    m: dict = field(default_factory=dict)  # (s, r) -> m of the pair (None when not balanced)


def plan_exchange(ks: list, ns: list[int], selection: str = "balanced", seed: int = 0, batch_size: int | None = None,
                  directions: list[tuple[int, int]] | None = None) -> Plan:
    """The N-policy exchange plan (module docstring, "N ≥ 2 policies"). ``ks[i]`` are policy i's success
    counts per prompt, ``ns[i]`` its group size. ``directions`` restricts the (source, receiver) pairs that
    receive (default: every ordered pair); balancing still uses both directions' candidate counts.
    ``random`` draws, per direction, as many prompts as ``balanced`` selects, uniformly without
    replacement over the whole batch, from ``np.random.default_rng([seed, s, r])``."""
    N = len(ks)
    B = batch_size if batch_size is not None else (len(_ints(ks[0])) if N else 0)
    dirs = directions if directions is not None else [(s, r) for r in range(N) for s in range(N) if s != r]
    plan = Plan(assign={r: {} for r in range(N)})
    offers: dict[int, dict[int, list[int]]] = {r: {} for r in range(N)}
    rule = SELECTIONS.get(selection)
    for s, r in dirs:
        cand, sel, m = rule(ks, ns, s, r, seed, B)
        plan.candidates[(s, r)], plan.selected[(s, r)], plan.m[(s, r)] = cand, sel, m
        for q in sel:
            offers[r].setdefault(q, []).append(s)
    for r in range(N):
        for q, srcs in sorted(offers[r].items()):
            plan.assign[r][q] = min(srcs, key=lambda s: (-int(_ints(ks[s])[q]), s))
    return plan


def complementarity(k_recv, k_peers: list) -> float:
    """graft.md §2.7: among prompts where the receiver has k = 0, the share where a peer has k ≥ 1
    (nan when the receiver has no all-fail prompt)."""
    kr = _ints(k_recv)
    fails = [q for q, k in enumerate(kr) if k == 0]
    if not fails:
        return math.nan
    hit = sum(1 for q in fails if any(_ints(kp)[q] >= 1 for kp in k_peers))
    return hit / len(fails)
