"""GRAFT's prompt selection (graft.md §2.2 steps 3–4, Alg. 1) and its variants, as registered rules.

A selection rule (registry ``SELECTIONS``) decides, for one direction source S → receiver R, which
prompts R receives from S: ``rule(ks, ns, s, r, seed, batch_size, eligible) -> (candidates, selected, m)``
with ``ks[i]`` policy i's success counts per prompt and ``ns[i]`` its group size (``m`` is None for
unbalanced rules; ``eligible``: the prompts a designed trigger may graft into R, None for the others).

- ``balanced`` (GRAFT): candidates C_{S→R} = {q : k_R(q) = 0 ∧ 1 ≤ k_S(q) < n}; ``m = min(|C_{S→R}|,
  |C_{R→S}|)``; SelectWithTies by the source's k. **Tie order**: candidates are sorted by
  ``(-k_S(q), q)`` (ties by prompt index); because every candidate tied with the m-th is kept, the
  *set* selected does not depend on the tie order (it is ``{q ∈ C : k_S(q) ≥ k_S(m-th)}``); it is
  returned in prompt order.
- ``unbalanced``: every candidate of the trigger, no balancing (the stored-trajectory rule);
- ``sgt`` ("w/o balanced exchange", SGT's eligibility): k_R = 0 ∧ k_S ≥ 1, all-correct source groups
  included;
- ``all`` (HACPO's pooling): every prompt of the batch, whatever the rewards (the peer's group joins
  the receiver's on every prompt);
- ``family`` (the designed dose of the transfer ladder): every prompt of the receiver's designated
  families (``exchange.params.families``) on which the source's group is mixed, whatever the
  receiver's rewards; pair it with replacement ``replace_or_add`` so a receiver's own group with
  signal is kept;
- ``random`` ("random prompts"): as many prompts as ``balanced`` selects, uniformly without
  replacement over the whole batch, from ``np.random.default_rng([seed, s, r])``.

:func:`plan_exchange` applies a rule to every direction and, with N ≥ 3 policies, the **N-peer
rule** (registry ``N_PEER_RULES``, ``exchange.params.n_peer``) decides how a receiver's prompts are
shared among several sources. The GRAFT paper has two models only and leaves N > 2 to future work;
these rules are this project's, each documented here and worked by hand in tests/test_npeer.py. With
two policies all three are the pair algorithm.

- ``best_source`` (default): every ordered pair is balanced on its own (``m_{SR} = min(|C_{S→R}|,
  |C_{R→S}|)``, SelectWithTies); a receiver prompt offered by several sources takes the source with
  the most successes k_S(q), ties to the lower policy index.
- ``round_robin``: the same pairwise selection; contested prompts (offered by ≥ 2 sources) are dealt
  in prompt order to the offering sources in turn: a cursor runs over the other policies in index
  order, each contested prompt goes to the first offering source at or after the cursor, which then
  moves past it. Uncontested prompts go to their only source.
- ``pooled_donor``: one balance per receiver instead of per pair, so that no model takes in more
  than it gives out: intake I_R = {q : k_R(q) = 0 ∧ some S has 1 ≤ k_S(q) < n_S}, outflow O_R = {q :
  1 ≤ k_R(q) < n_R ∧ some T has k_T(q) = 0}, ``m_R = min(|I_R|, |O_R|)``, SelectWithTies over I_R by
  the best offering source's k, each prompt from that best source (ties to the lower index). Only
  with ``selection: balanced``.
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
    """SGT's eligibility (baselines.md §2.1; graft.md §3 "w/o balanced exchange"): k_R = 0 ∧ k_S ≥
    1, all-correct source groups included."""
    return [q for q, (kr, ks) in enumerate(zip(_ints(k_recv), _ints(k_src))) if kr == 0 and ks >= 1]


def select_with_ties(cands: list[int], k_src, m: int) -> list[int]:
    """Alg. 1 ``SelectWithTies(C, k_S, m)`` (graft.md §2.2 step 4): rank C by the source's success
    count, descending (ties by prompt index), keep the first m and every candidate tied with the
    m-th; m = 0 → ∅. Returned in prompt order."""
    if m <= 0 or not cands:
        return []
    k = _ints(k_src)
    ranked = sorted(cands, key=lambda q: (-k[q], q))
    if m >= len(ranked):
        return sorted(ranked)
    kth = k[ranked[m - 1]]
    return sorted(q for q in ranked if k[q] >= kth)


def balanced_pair(k_a, k_b, n_a: int, n_b: int | None = None) -> dict:
    """Balanced exchange between two policies (graft.md §2.2 steps 3–4): ``m = min(|C_{A→B}|,
    |C_{B→A}|)``, then SelectWithTies in each direction by the source's k. Returns candidates,
    selections and m (``ab`` = A is the source, B the receiver)."""
    n_b = n_a if n_b is None else n_b
    c_ab, c_ba = trigger(k_b, k_a, n_a), trigger(k_a, k_b, n_b)
    m = min(len(c_ab), len(c_ba))
    return {"m": m, "cand_ab": c_ab, "cand_ba": c_ba,
            "sel_ab": select_with_ties(c_ab, k_a, m), "sel_ba": select_with_ties(c_ba, k_b, m)}


@SELECTIONS.register("balanced")
def select_balanced(ks, ns, s: int, r: int, seed: int = 0, batch_size: int = 0, eligible=None):
    cand = trigger(ks[r], ks[s], ns[s])
    m = min(len(cand), len(trigger(ks[s], ks[r], ns[r])))
    return cand, select_with_ties(cand, ks[s], m), m


@SELECTIONS.register("unbalanced")
def select_unbalanced(ks, ns, s: int, r: int, seed: int = 0, batch_size: int = 0, eligible=None):
    cand = trigger(ks[r], ks[s], ns[s])
    return cand, cand, None


@SELECTIONS.register("sgt")
def select_sgt(ks, ns, s: int, r: int, seed: int = 0, batch_size: int = 0, eligible=None):
    cand = trigger_sgt(ks[r], ks[s])
    return cand, cand, None


@SELECTIONS.register("all")
def select_all(ks, ns, s: int, r: int, seed: int = 0, batch_size: int = 0, eligible=None):
    every = list(range(batch_size or len(_ints(ks[r]))))
    return every, every, None


@SELECTIONS.register("family")
def select_family(ks, ns, s: int, r: int, seed: int = 0, batch_size: int = 0, eligible=None):
    """The designed dose: every prompt of the receiver's designated families (``eligible``, the
    prompt indices whose family is in ``exchange.params.families[receiver]``) on which the source's
    group is mixed (1 ≤ k_S < n, so its advantages carry a signal), whatever the receiver's own
    rewards; no balancing. The experimenter sets the dose through the family and the mix."""
    k_s = _ints(ks[s])
    cand = [q for q in sorted(eligible or ()) if 1 <= k_s[q] < ns[s]]
    return cand, cand, None


@SELECTIONS.register("random")
def select_random(ks, ns, s: int, r: int, seed: int = 0, batch_size: int = 0, eligible=None):
    cand, sel, m = select_balanced(ks, ns, s, r)
    if sel:
        rng = np.random.default_rng([seed, s, r])
        sel = sorted(rng.choice(batch_size, size=len(sel), replace=False).tolist())
    return cand, sel, m


@dataclass
class Plan:
    """Who receives which prompt from whom. ``assign[r][q] = s``; per-direction ``(s, r)``
    tables."""

    assign: dict = field(default_factory=dict)  # receiver index -> {prompt -> source index}
    candidates: dict = field(default_factory=dict)  # (s, r) -> list of prompts
    selected: dict = field(default_factory=dict)  # (s, r) -> list of prompts (before source choice)
    m: dict = field(default_factory=dict)  # (s, r) -> m of the pair (None when not balanced)


@dataclass(frozen=True)
class PeerCounts:
    """What an N-peer rule decides from: each policy's success counts per prompt (``ks[i]``) and
    group size (``ns[i]``), the pairwise selection rule (``SELECTIONS``), the seed, the batch size,
    and the (source, receiver) directions that receive."""

    ks: list
    ns: list
    selection: str
    seed: int
    batch: int
    dirs: list
    eligible: list | None = None  # per policy: the prompt indices a designed trigger may graft (``family``)


N_PEER_RULES: Registry = Registry("N-peer rule")  # (PeerCounts, Plan) -> Plan


def _best(srcs: list[int], ks: list, q: int) -> int:
    return min(srcs, key=lambda s: (-int(_ints(ks[s])[q]), s))


def assign_best_source(offers: dict[int, list[int]], ks: list, r: int) -> dict[int, int]:
    """Each offered prompt from the offering source with the most successes, ties to the lower
    index."""
    return {q: _best(srcs, ks, q) for q, srcs in sorted(offers.items())}


def assign_round_robin(offers: dict[int, list[int]], ks: list, r: int) -> dict[int, int]:
    """Contested prompts dealt to the offering sources in turn (module docstring); uncontested ones
    to their only source."""
    others = [s for s in range(len(ks)) if s != r]
    cursor, out = 0, {}
    for q, srcs in sorted(offers.items()):
        if len(srcs) == 1:
            out[q] = srcs[0]
            continue
        for j in range(len(others)):
            s = others[(cursor + j) % len(others)]
            if s in srcs:
                out[q] = s
                cursor = (others.index(s) + 1) % len(others)
                break
    return out


def _pairwise(assign, c: PeerCounts, plan: Plan) -> Plan:
    """Every direction selects with ``c.selection`` on its own; ``assign`` resolves prompts offered
    by several."""
    offers: dict[int, dict[int, list[int]]] = {r: {} for r in plan.assign}
    rule = SELECTIONS.get(c.selection)
    for s, r in c.dirs:
        cand, sel, m = rule(c.ks, c.ns, s, r, c.seed, c.batch, eligible=c.eligible[r] if c.eligible else None)
        plan.candidates[(s, r)], plan.selected[(s, r)], plan.m[(s, r)] = cand, sel, m
        for q in sel:
            offers[r].setdefault(q, []).append(s)
    for r in plan.assign:
        plan.assign[r] = assign({q: sorted(v) for q, v in offers[r].items()}, c.ks, r)
    return plan


@N_PEER_RULES.register("best_source")
def plan_best_source(c: PeerCounts, plan: Plan) -> Plan:
    return _pairwise(assign_best_source, c, plan)


@N_PEER_RULES.register("round_robin")
def plan_round_robin(c: PeerCounts, plan: Plan) -> Plan:
    return _pairwise(assign_round_robin, c, plan)


@N_PEER_RULES.register("pooled_donor")
def plan_pooled_donor(c: PeerCounts, plan: Plan) -> Plan:
    """``pooled_donor`` (module docstring): one balance per receiver against its total outflow."""
    if c.selection != "balanced":
        raise ValueError(f"n_peer pooled_donor balances intake against outflow; it needs selection balanced, "
                         f"not {c.selection!r}")
    ks, ns, dirs = c.ks, c.ns, c.dirs
    N = len(ks)
    K = [_ints(k) for k in ks]
    for s, r in dirs:
        plan.candidates[(s, r)] = trigger(ks[r], ks[s], ns[s])
    for r in sorted({r for _, r in dirs}):
        srcs = [s for s, rr in dirs if rr == r]
        intake = sorted(set().union(*[set(plan.candidates[(s, r)]) for s in srcs]))
        outflow = {q for q in range(len(K[r]))
                   if 1 <= K[r][q] < ns[r] and any(K[t][q] == 0 for t in range(N) if t != r)}
        m = min(len(intake), len(outflow))
        best = {q: _best([s for s in srcs if q in plan.candidates[(s, r)]], ks, q) for q in intake}
        k_best = [K[best[q]][q] if q in best else 0 for q in range(len(K[r]))]
        for q in select_with_ties(intake, k_best, m):
            plan.assign[r][q] = best[q]
        for s in srcs:
            plan.m[(s, r)] = m
            plan.selected[(s, r)] = sorted(q for q, src in plan.assign[r].items() if src == s)
    return plan


def plan_exchange(ks: list, ns: list[int], selection: str = "balanced", seed: int = 0, batch_size: int | None = None,
                  directions: list[tuple[int, int]] | None = None, n_peer: str = "best_source",
                  eligible: list | None = None) -> Plan:
    """The N-policy exchange plan (module docstring, the N-peer rules). ``ks[i]`` are policy i's
    success counts per prompt, ``ns[i]`` its group size. ``directions`` restricts the (source,
    receiver) pairs that receive (default: every ordered pair); balancing still uses both
    directions' candidate counts. ``random`` draws, per direction, as many prompts as ``balanced``
    selects, uniformly without replacement over the whole batch, from ``np.random.default_rng([seed,
    s, r])``."""
    N = len(ks)
    B = batch_size if batch_size is not None else (len(_ints(ks[0])) if N else 0)
    dirs = directions if directions is not None else [(s, r) for r in range(N) for s in range(N) if s != r]
    counts = PeerCounts(ks, ns, selection, seed, B, dirs, eligible)
    return N_PEER_RULES.get(n_peer)(counts, Plan(assign={r: {} for r in range(N)}))


def _share(k_recv, hit_sets: list[set[int]]) -> tuple[float, int, int]:
    fails = [q for q, k in enumerate(_ints(k_recv)) if k == 0]
    hits = sum(1 for q in fails if any(q in h for h in hit_sets))
    return (hits / len(fails) if fails else math.nan), len(fails), hits


def solved_share(k_recv, k_peers: list) -> tuple[float, int, int]:
    """**Complementarity**, the paper's definition (graft.md §2.7): of the receiver's all-fail
    prompts (k_R = 0), the share on which some peer solves at least one response (k ≥ 1): the
    prompts of :func:`trigger_sgt`. Returns ``(share, all_fail, hits)``; the share is nan when the
    receiver has no all-fail prompt."""
    return _share(k_recv, [set(trigger_sgt(k_recv, kp)) for kp in k_peers])


def filled_share(k_recv, k_peers: list, n: int) -> tuple[float, int, int]:
    """**Fillable share**, GRAFT's own reach (Alg. 1's trigger, :func:`trigger`): of the receiver's
    all-fail prompts, the share on which some peer's group of ``n`` is *mixed* (1 ≤ k < n), so that
    a grafted response carries a non-zero advantage. Unlike :func:`solved_share` an all-correct peer
    group does not count. Returns ``(share, all_fail, hits)``; nan when the receiver has no all-fail
    prompt."""
    return _share(k_recv, [set(trigger(k_recv, kp, n)) for kp in k_peers])
