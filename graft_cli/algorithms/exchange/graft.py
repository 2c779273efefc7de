"""GRAFT: balanced cross-model trajectory exchange with a compatibility gate (graft.md §2), its design
variants (graft.md §3) and the N-policy generalisation. Registered as exchange ``graft``.

Per step (graft.md §2.2, Alg. 1), for every ordered pair of policies (source S, receiver R):

1. **Trigger** (:func:`trigger`, Alg. 1 line "C_{A→B}"): prompt q is a candidate for S→R when the
   receiver's whole group fails and the source's group is mixed, ``k_R(q) = 0 ∧ 1 ≤ k_S(q) < n``.
2. **Balanced exchange** (:func:`select_with_ties`, :func:`balanced_pair`; Alg. 1 "SelectWithTies"):
   ``m = min(|C_{S→R}|, |C_{R→S}|)``; each direction ranks its candidates by the *source's* success
   count, descending, and keeps the first m plus every candidate tied with the m-th. ``m = 0`` → nothing
   moves in either direction. **Tie order**: candidates are sorted by ``(-k_S(q), q)`` (ties by prompt
   index, ascending); because every candidate tied with the m-th is kept, the *set* selected does not
   depend on the tie order (it is ``{q ∈ C : k_S(q) ≥ k_S(m-th)}``); it is returned in prompt order.
3. **Replacement** (:func:`peer_group_rows`, graft.md §2.2 step 5): the receiver's failed group is
   removed and the source's *whole* group inserted (``source="peer"``, ``group`` = the prompt's index),
   each response keeping the source's own GRPO advantage (computed over its full group, before any
   floor; never renormalised). Groups stay in prompt-batch order in the TrainBatch.
4. **Re-tokenization** (:func:`retokenize`, graft.md §2.2 step 6, §8 item 3; HACPO's contract,
   baselines.md §1.2): the source's response *string* (``Rollouts.texts``, decoded with
   ``skip_special_tokens=True``) is encoded with the receiver's tokenizer,
   ``tokenizer(text, add_special_tokens=False)``, after the receiver's own encoding of the same problem
   (``ctx.encode_prompt(problem, receiver)``).

   **EOS rule.** When the source response ended with EOS (it was not truncated) and ``append_eos`` is
   true (default), the receiver's EOS id is appended, so the receiver also learns to stop; a truncated
   source response gets no EOS. The terminal EOS is **excluded from both sides of s**: the receiver mean
   is over the first ``n_scored`` tokens (the re-tokenized text, without the appended EOS), the source
   mean over the generated tokens without the terminal EOS (:func:`source_mean_logprob`). The appended
   EOS still takes part in the loss like any other token. A response with no scorable token on either
   side has ``s = nan`` and is dropped by the floor (kept with w = 1 when the gate is off).
   With ``direct_ids: true`` and byte-identical vocabularies (graft.md §8 item 10) the source token ids
   are used as they are (same EOS exclusion).
5. **Compatibility and gate** (:func:`compatibility`, :func:`gate_weights`; Eq. 6–8), in ``admit`` once
   the trainer has scored every row under the receiver's old policy:
   ``s = exp(mean_t log π_old^R(o^R_t) − mean_t log π_S(o^S_t))`` and
   ``w = 1[s > δ] · min(s, 1)`` (δ = 0.8, strict >). Responses with ``s ≤ δ`` are **dropped** (they leave
   the loss numerator and the token-count denominator). ``δ ≤ 0`` means no floor (every response kept,
   ``w = min(s, 1)``). The source log-probs are the sampler's (``peer_logprobs: sampler``, default;
   the trainer's fp32 forward at T = 1 equals the sampler's) or recomputed by the source policy's
   trainer forward before any update (``peer_logprobs: recompute``, via ``ctx.extra["score_logprobs"]``).
6. **Objective**: the registered loss (``ppo_token``: token-level PPO ratio against the receiver's own
   old policy for self and grafted tokens, w per response, token-mean over retained responses; with no
   transfer it is GRPO exactly). Peer-last minibatch ordering lives in
   :func:`graft_cli.train.batch.minibatch_schedule` (``exchange.ordering``): groups holding grafted rows
   are ordered after the receiver's own groups, then the ordered groups are chunked into equal prompt
   counts, so a boundary minibatch may mix own and grafted groups (graft.md §8 item 4).

**N ≥ 2 policies** (:func:`plan_exchange`). Every ordered pair (S, R) has its candidate set; balancing is
per unordered pair, ``m_{SR} = min(|C_{S→R}|, |C_{R→S}|)``, each direction selecting with ties as above.
A receiver prompt offered by several sources takes the group of the source with the most successes
``k_S(q)``, ties to the lower policy index (config order). With exactly two policies this is the pair
algorithm.

**Design variants** (graft.md §3) are ``exchange.params`` keys (see :data:`DEFAULTS`):

- ``gate: floor | none`` — ``none`` is "w/o compatibility gate" (w = 1 for every transferred response);
- ``delta`` — the floor δ (0 = "no floor": w = min(s, 1) for all); ``cap: false`` drops the min(·, 1);
- ``selection``: ``balanced`` (GRAFT) | ``unbalanced`` (trigger 1 ≤ k_S < n, every candidate, no
  balancing: the stored-trajectory rule) | ``sgt`` ("w/o balanced exchange": k_R = 0 ∧ k_S ≥ 1, all-correct
  source groups included with zero advantage; their tokens count) | ``random`` ("random prompts": per
  direction, as many prompts as GRAFT's balanced selection would take, drawn uniformly over the batch
  regardless of rewards);
- ``admission: gate | random`` — "random admission": count the responses with s > δ, sample that many
  uniformly from the transferred responses, give them w = min(s, 1) (no floor), drop the others;
- ``mode``: ``replace`` (GRAFT) | ``pooled`` (receiver group ‖ source group, pooled GRPO advantages,
  receiver w = 1) | ``sft`` (SGT's NLL on one uniformly sampled correct source response per selected
  prompt, λ = ``sft_lambda``; the receiver keeps its own zero-advantage group; loss ``ppo_token_nll``) |
  ``hacpo`` (HACPO update on GRAFT-selected prompts: joint group with HACPO's capability-aware
  advantages; source responses on other prompts enter with zero advantage; loss ``hacpo_peer``);
- ``peer_responses: all | success`` — "success-only": only correct source responses are inserted
  (advantages still from the full source group);
- loss-level variants: ``algo.loss=ppo_seq`` (sequence ratio), ``luffy``, ``hacpo_peer``,
  ``ppo_token_nll`` (:mod:`graft_cli.algorithms.peer_losses`); ordering via ``exchange.ordering``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from graft_cli.algorithms.exchange import EXCHANGES, Exchange, ExchangeContext
from graft_cli.errors import GraftError
from graft_cli.train.batch import PolicyStep, TrainBatch

# ------------------------------------------------------------------------------------------------ options
DEFAULTS: dict = {
    "delta": 0.8,  # Eq. 8 floor δ (strict >); <= 0: no floor
    "gate": "floor",  # floor: w = 1[s>δ]·min(s,1), dropped when s <= δ | none: w = 1 for all
    "cap": True,  # min(s, 1) in w
    "selection": "balanced",  # balanced | unbalanced | sgt | random
    "admission": "gate",  # gate | random
    "mode": "replace",  # replace | pooled | sft | hacpo
    "peer_responses": "all",  # all | success
    "append_eos": True,  # graft.md §8 item 3
    "peer_logprobs": "sampler",  # sampler | recompute (graft.md §8 item 2)
    "direct_ids": False,  # identical tokenizers: transfer token ids (graft.md §8 item 10)
    "sft_lambda": 0.1,  # SGT λ (mode sft)
    "hacpo_window": 5,  # HACPO capability: rolling window of steps
    "hacpo_c_min": 0.1,
    "hacpo_c_max": 10.0,
    "hacpo_peer_lower_bound": 0.8,  # L_0 (loss hacpo_peer)
    "hacpo_peer_lower_bound_step": 0.025,  # L_m = min(1, L_0 + m·step)
    "hacpo_schedule": "minibatch",  # m = minibatch index within the step (code) | step (paper wording)
    "hacpo_peer_coef": 1.0,
    "hacpo_peer_elsewhere": "zero",  # zero: source responses on other prompts, advantage 0 | drop
    "luffy_gamma": 0.1,  # f(x) = x/(x+γ) (loss luffy)
}

CHOICES = {
    "gate": ("floor", "none"),
    "selection": ("balanced", "unbalanced", "sgt", "random"),
    "admission": ("gate", "random"),
    "mode": ("replace", "pooled", "sft", "hacpo"),
    "peer_responses": ("all", "success"),
    "peer_logprobs": ("sampler", "recompute"),
    "hacpo_schedule": ("minibatch", "step"),
    "hacpo_peer_elsewhere": ("zero", "drop"),
}
MODE_LOSSES = {"sft": ("ppo_token_nll",), "hacpo": ("hacpo_peer",)}


def options(params: dict, extra_keys: tuple = (), defaults: dict | None = None) -> dict:
    """``exchange.params`` merged over the defaults, each key and value checked (one-line GraftError)."""
    defaults = DEFAULTS if defaults is None else defaults
    out = dict(defaults)
    for k, v in (params or {}).items():
        key = f"exchange.params.{k}"
        if k not in defaults and k not in extra_keys:
            raise GraftError(f"config key {key!r}: unknown; known: {', '.join(sorted([*defaults, *extra_keys]))}")
        if k in CHOICES and v not in CHOICES[k]:
            raise GraftError(f"config key {key!r}: must be one of {', '.join(CHOICES[k])}, got {v!r}")
        if k in defaults and isinstance(defaults[k], bool) and not isinstance(v, bool):
            raise GraftError(f"config key {key!r}: must be true or false, got {v!r}")
        if k in defaults and isinstance(defaults[k], (int, float)) and not isinstance(defaults[k], bool):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise GraftError(f"config key {key!r}: must be a number, got {v!r}")
        out[k] = v
    if out["hacpo_window"] < 1:
        raise GraftError("config key 'exchange.params.hacpo_window': must be >= 1")
    if not 0 < out["hacpo_c_min"] <= out["hacpo_c_max"]:
        raise GraftError("config key 'exchange.params.hacpo_c_min': need 0 < hacpo_c_min <= hacpo_c_max")
    if out["sft_lambda"] < 0:
        raise GraftError("config key 'exchange.params.sft_lambda': must be >= 0")
    if out["luffy_gamma"] <= 0:
        raise GraftError("config key 'exchange.params.luffy_gamma': must be > 0")
    return out


def check_loss_for_mode(cfg, opts: dict) -> None:
    need = MODE_LOSSES.get(opts["mode"])
    if need and cfg.algo.loss not in need:
        raise GraftError(f"config key 'algo.loss': exchange.params.mode={opts['mode']} needs algo.loss="
                         f"{' or '.join(need)}, got {cfg.algo.loss!r}")


# ------------------------------------------------------------------------------------ pure: selection
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
    for s, r in dirs:
        if selection == "sgt":
            cand = trigger_sgt(ks[r], ks[s])
            sel, m = cand, None
        else:
            cand = trigger(ks[r], ks[s], ns[s])
            rev = trigger(ks[s], ks[r], ns[r])
            if selection == "unbalanced":
                sel, m = cand, None
            else:
                m = min(len(cand), len(rev))
                sel = select_with_ties(cand, ks[s], m)
                if selection == "random":
                    rng = np.random.default_rng([seed, s, r])
                    sel = sorted(rng.choice(B, size=len(sel), replace=False).tolist()) if sel else []
                elif selection != "balanced":
                    raise ValueError(f"unknown selection {selection!r}")
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


# ----------------------------------------------------------------------------- pure: re-tokenization
def retokenize(text: str, tokenizer, ended_with_eos: bool, append_eos: bool = True) -> tuple[list[int], int]:
    """graft.md §2.2 step 6 / §8 item 3 (HACPO's contract): ``tokenizer(text, add_special_tokens=False)``;
    the receiver's EOS is appended when the source ended with EOS and ``append_eos``. Returns
    ``(ids, n_scored)``, ``n_scored`` = tokens that enter s (the appended EOS excluded)."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    n_scored = len(ids)
    eos = getattr(tokenizer, "eos_token_id", None)
    if append_eos and ended_with_eos and eos is not None:
        ids.append(int(eos))
    return ids, n_scored


def source_mean_logprob(logprobs, ended_with_eos: bool) -> float:
    """Denominator of s (Eq. 7): mean generation log-prob over the source tokens, terminal EOS excluded
    (graft.md §8 item 3). nan when no token remains."""
    lp = list(logprobs)
    if ended_with_eos and lp:
        lp = lp[:-1]
    return float(np.mean(lp)) if lp else math.nan


def compatibility(recv_logprobs, n_scored: int, src_mean: float) -> float:
    """Eq. 6–7: s = exp(ℓ̄(π_old^R, o^R) − ℓ̄(π_S, o^S)), ℓ̄ = mean token log-likelihood; the receiver mean is
    over the first ``n_scored`` tokens (appended EOS excluded). nan when either side is empty."""
    lp = list(recv_logprobs)[:n_scored]
    if not lp or src_mean is None or not math.isfinite(src_mean):
        return math.nan
    return float(math.exp(min(float(np.mean(lp)) - src_mean, 700.0)))


def gate_weights(s, delta: float = 0.8, gate: str = "floor", cap: bool = True) -> tuple[list[float], list[bool]]:
    """Eq. 8: w = 1[s > δ] · min(s, 1) (strict >); returns ``(w, keep)``, ``keep = s > δ`` (responses with
    s ≤ δ are dropped). ``delta <= 0``: no floor (all kept, w = min(s, 1); nan s → w = 0).
    ``gate="none"``: w = 1 and everything kept (graft.md §3 "w/o compatibility gate")."""
    w, keep = [], []
    for x in s:
        x = float(x)
        if gate == "none":
            w.append(1.0)
            keep.append(True)
            continue
        ok = True if delta <= 0 else (math.isfinite(x) and x > delta)
        val = (min(x, 1.0) if cap else x) if math.isfinite(x) else 0.0
        w.append(val if ok else 0.0)
        keep.append(ok)
    return w, keep


def random_admission(s, delta: float, rng: np.random.Generator, cap: bool = True) -> tuple[list[float], list[bool]]:
    """graft.md §3 "random admission": A = #{s > δ}; A responses sampled uniformly (without replacement) from
    all transferred responses get w = min(s, 1) without the floor; the others are dropped."""
    s = [float(x) for x in s]
    a = sum(1 for x in s if math.isfinite(x) and x > delta)
    chosen = set(rng.choice(len(s), size=a, replace=False).tolist()) if a else set()
    w = [((min(x, 1.0) if cap else x) if math.isfinite(x) else 0.0) if i in chosen else 0.0 for i, x in enumerate(s)]
    return w, [i in chosen for i in range(len(s))]


def pooled_advantages(r_recv, r_src, eps: float = 1e-6, norm_by_std: bool = True) -> tuple[list[float], list[float]]:
    """graft.md §3 "pooled groups": â = (r − mean_pool)/(std_pool + ε) over G_R ‖ G_S (unbiased std, as
    the GRPO estimator)."""
    from graft_cli.algorithms.advantages import grpo_advantages

    r = torch.tensor([list(map(float, r_recv)) + list(map(float, r_src))], dtype=torch.float32)
    a = grpo_advantages(r, eps=eps, norm_by_std=norm_by_std)[0].tolist()
    return a[: len(r_recv)], a[len(r_recv):]


def hacpo_capability(p_src: float, p_tgt: float, c_min: float = 0.1, c_max: float = 10.0) -> float:
    """HACPO (baselines.md §1.2): c(src→tgt) = clip(P_src / P_tgt, 0.1, 10), P floored at 1e-8."""
    return float(min(max(max(p_src, 1e-8) / max(p_tgt, 1e-8), c_min), c_max))


def hacpo_advantages(r_self, r_peer, c: float, eps: float = 1e-6) -> tuple[list[float], list[float]]:
    """HACPO capability-aware advantage over the joint group (baselines.md §1.2, paper eq. 5–6): all equal →
    b = mean(r); else b = mean_i(r_i ω_i), ω = 1 (self), 1/c (peer); b > 1 → mean of own rewards;
    A = (r − b)/(std_unbiased(all r) + ε)."""
    rs, rp = [float(x) for x in r_self], [float(x) for x in r_peer]
    allr = np.array(rs + rp, dtype=np.float64)
    if allr.size < 2 or np.all(allr == allr[0]):
        return [0.0] * len(rs), [0.0] * len(rp)
    b = float(np.mean(np.array(rs + [x / c for x in rp])))
    if b > 1.0:
        b = float(np.mean(rs)) if rs else b
    sd = float(np.std(allr, ddof=1))
    return [(x - b) / (sd + eps) for x in rs], [(x - b) / (sd + eps) for x in rp]


def tokenizers_identical(t1, t2) -> bool:
    """graft.md §8 item 10: same vocabulary (token → id) and the same EOS id."""
    if t1 is t2:
        return True
    try:
        return t1.get_vocab() == t2.get_vocab() and t1.eos_token_id == t2.eos_token_id
    except Exception:
        return False


def _ints(k) -> list[int]:
    if isinstance(k, torch.Tensor):
        return [int(x) for x in k.tolist()]
    return [int(x) for x in k]


def _pct(a, p) -> float:
    return float(np.percentile(np.asarray(a, dtype=np.float64), p)) if len(a) else math.nan


# ----------------------------------------------------------------------------------- batch building
def peer_group_rows(src: PolicyStep, q: int, recv_prompt_ids: list[int], tokenizer, opts: dict,
                    src_name: str, advantages: list[float] | None = None, same_tokenizer: bool = False,
                    only: list[int] | None = None) -> TrainBatch:
    """The source's group for prompt q as receiver rows (graft.md §2.2 steps 5–6): re-tokenized response,
    the source's own advantage (or ``advantages`` when a variant recomputes them), reward, mean source
    generation log-prob (EOS excluded) and ``extra`` columns ``src_policy``, ``n_scored``,
    ``src_logp_mean``. ``only`` restricts to some sample indices (success-only, SFT)."""
    out = TrainBatch()
    ro, n = src.rollouts, src.n
    for j in (range(n) if only is None else only):
        r = q * n + j
        ended = not bool(ro.truncated[r])
        if same_tokenizer:
            ids = list(ro.response_ids[r])
            n_scored = len(ids) - 1 if ended and ids else len(ids)
        else:
            ids, n_scored = retokenize(ro.texts[r], tokenizer, ended, opts["append_eos"])
        src_mean = source_mean_logprob(ro.logprobs[r], ended)
        adv = float(src.advantages[q, j]) if advantages is None else float(advantages[j])
        out.append(prompt_ids=recv_prompt_ids, response_ids=ids, advantages=adv, weights=1.0, source="peer",
                   group=q, rewards=float(src.rewards[q, j]), sampler_logprobs=None, source_logp_mean=src_mean,
                   texts=ro.texts[r], src_policy=src_name, src_sample=j, n_scored=n_scored, src_logp_mean=src_mean)
    return out


def own_group_rows(step: PolicyStep, q: int, advantages: list[float] | None = None) -> TrainBatch:
    """The receiver's own group for prompt q (as ``self_batch`` builds it)."""
    out = TrainBatch()
    ro, n = step.rollouts, step.n
    for j in range(n):
        r = q * n + j
        adv = float(step.advantages[q, j]) if advantages is None else float(advantages[j])
        out.append(prompt_ids=step.prompt_ids[q], response_ids=ro.response_ids[r], advantages=adv, weights=1.0,
                   source="self", group=q, rewards=float(step.rewards[q, j]), sampler_logprobs=ro.logprobs[r],
                   texts=ro.texts[r])
    return out


@EXCHANGES.register("graft")
class GraftExchange(Exchange):
    """GRAFT (module docstring). ``select`` builds every receiver's batch (selection, replacement,
    re-tokenization, source log-prob means); ``admit`` applies the compatibility gate."""

    EXTRA_KEYS: tuple = ()

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.opts = options(cfg.exchange.params if cfg is not None else {}, self.EXTRA_KEYS)
        self.hacpo_history: dict[str, list[float]] = {}
        self._same_tok: dict = {}

    @classmethod
    def validate(cls, cfg) -> None:
        opts = options(cfg.exchange.params, cls.EXTRA_KEYS)
        check_loss_for_mode(cfg, opts)

    # -- state (HACPO capability history)
    def state_dict(self) -> dict:
        return {"hacpo_history": {k: list(v) for k, v in self.hacpo_history.items()}}

    def load_state_dict(self, st: dict) -> None:
        self.hacpo_history = {k: list(v) for k, v in (st or {}).get("hacpo_history", {}).items()}

    # -- helpers
    def _rng(self, ctx: ExchangeContext, *keys: int) -> np.random.Generator:
        return np.random.default_rng([int(ctx.seed), *keys])

    def _same_tokenizer(self, a: str, b: str, ctx: ExchangeContext) -> bool:
        if not self.opts["direct_ids"]:
            return False
        key = (a, b)
        if key not in self._same_tok:
            ta, tb = ctx.tokenizers.get(a), ctx.tokenizers.get(b)
            self._same_tok[key] = ta is not None and tb is not None and tokenizers_identical(ta, tb)
        return self._same_tok[key]

    def _recompute_source_means(self, batch: TrainBatch, steps: dict[str, PolicyStep], ctx: ExchangeContext) -> None:
        """``peer_logprobs: recompute`` (graft.md §8 item 2): score each transferred response with its source
        policy's trainer forward (θ_old: no policy has been updated yet in this step) through the hook
        ``ctx.extra["score_logprobs"](policy_name, TrainBatch) -> per-token log-probs``."""
        score = ctx.extra.get("score_logprobs")
        if score is None:
            raise GraftError("config key 'exchange.params.peer_logprobs': recompute needs the trainer's scoring "
                             "hook (ctx.extra['score_logprobs']), which this trainer does not provide")
        by_src: dict[str, list[int]] = {}
        for i, (s, sp) in enumerate(zip(batch.source, batch.extra.get("src_policy", []))):
            if s == "peer" and sp is not None:
                by_src.setdefault(sp, []).append(i)
        for sp, rows in by_src.items():
            st = steps[sp]
            sb = TrainBatch()
            for i in rows:
                q, j = batch.group[i], batch.extra["src_sample"][i]
                r = q * st.n + j
                sb.append(prompt_ids=st.prompt_ids[q], response_ids=st.rollouts.response_ids[r], advantages=0.0,
                          weights=1.0, source="self", group=q)
            lps = score(sp, sb)
            for i, lp in zip(rows, lps):
                q, j = batch.group[i], batch.extra["src_sample"][i]
                m = source_mean_logprob(lp, not bool(st.rollouts.truncated[q * st.n + j]))
                batch.source_logp_mean[i] = m
                batch.extra["src_logp_mean"][i] = m

    def _capabilities(self, steps: dict[str, PolicyStep]) -> dict[str, float]:
        """HACPO P_k: mean positive-reward rate of policy k over its last ``hacpo_window`` steps (before this
        one; 1.0 without history), then this step's rate is appended."""
        caps = {}
        for name in steps:
            h = self.hacpo_history.get(name, [])
            caps[name] = float(np.mean(h[-self.opts["hacpo_window"]:])) if h else 1.0
        for name, st in steps.items():
            h = self.hacpo_history.setdefault(name, [])
            h.append(float((st.rewards > 0).float().mean()))
            del h[: -self.opts["hacpo_window"]]
        return caps

    # -- the exchange
    def plan(self, steps: dict[str, PolicyStep], ctx: ExchangeContext, directions=None) -> Plan:
        names = list(steps)
        B = len(steps[names[0]].problems)
        return plan_exchange([steps[nm].k for nm in names], [steps[nm].n for nm in names], self.opts["selection"],
                             ctx.seed, B, directions)

    def select(self, steps: dict[str, PolicyStep], ctx: ExchangeContext, receivers: list[str] | None = None,
               directions=None):
        names = list(steps)
        plan = self.plan(steps, ctx, directions)
        caps = self._capabilities(steps) if self.opts["mode"] == "hacpo" else {}
        batches, metrics = {}, {}
        for r, rname in enumerate(names):
            if receivers is not None and rname not in receivers:
                continue
            batches[rname], metrics[rname] = self.build_receiver(r, names, steps, plan, ctx, caps)
        return batches, metrics

    def build_receiver(self, r: int, names: list[str], steps: dict[str, PolicyStep], plan: Plan,
                       ctx: ExchangeContext, caps: dict) -> tuple[TrainBatch, dict]:
        o = self.opts
        rname = names[r]
        recv = steps[rname]
        tok = ctx.tokenizers[rname]
        assign = plan.assign.get(r, {})
        batch = TrainBatch()
        n_src_tok, n_recv_tok = 0, 0
        cfg_algo = self.cfg.algo if self.cfg is not None else None
        eps = cfg_algo.adv_eps if cfg_algo is not None else 1e-6
        norm_by_std = cfg_algo.norm_by_std if cfg_algo is not None else True
        for q in range(len(recv.problems)):
            s = assign.get(q)
            if s is None:
                batch.extend(own_group_rows(recv, q))
                if o["mode"] == "hacpo" and o["hacpo_peer_elsewhere"] == "zero":
                    for si, sname in enumerate(names):
                        if si == r:
                            continue
                        src = steps[sname]
                        rows = peer_group_rows(src, q, ctx.encode_prompt(recv.problems[q].problem, rname), tok, o,
                                               sname, advantages=[0.0] * src.n,
                                               same_tokenizer=self._same_tokenizer(sname, rname, ctx))
                        rows.extra["hacpo_c"] = [hacpo_capability(caps[sname], caps[rname], o["hacpo_c_min"],
                                                                  o["hacpo_c_max"])] * len(rows)
                        rows.extra["hacpo_step"] = [ctx.step] * len(rows)
                        batch.extend(rows)
                continue
            sname = names[s]
            src = steps[sname]
            prompt = ctx.encode_prompt(recv.problems[q].problem, rname)
            same = self._same_tokenizer(sname, rname, ctx)
            only = None
            if o["peer_responses"] == "success":
                only = [j for j in range(src.n) if float(src.rewards[q, j]) > 0.5]
            if o["mode"] == "replace":
                rows = peer_group_rows(src, q, prompt, tok, o, sname, same_tokenizer=same, only=only)
                batch.extend(rows)
            elif o["mode"] == "pooled":
                a_recv, a_src = pooled_advantages(recv.rewards[q].tolist(), src.rewards[q].tolist(), eps, norm_by_std)
                batch.extend(own_group_rows(recv, q, a_recv))
                rows = peer_group_rows(src, q, prompt, tok, o, sname, advantages=a_src, same_tokenizer=same, only=only)
                batch.extend(rows)
            elif o["mode"] == "sft":
                batch.extend(own_group_rows(recv, q))
                correct = [j for j in range(src.n) if float(src.rewards[q, j]) > 0.5]
                rows = TrainBatch()
                if correct:
                    j = int(self._rng(ctx, r, s, q).choice(correct))
                    rows = peer_group_rows(src, q, prompt, tok, o, sname, advantages=[0.0] * src.n,
                                           same_tokenizer=same, only=[j])
                    rows.extra["nll_coef"] = [float(o["sft_lambda"])] * len(rows)
                    rows.extra["aux"] = [True] * len(rows)
                batch.extend(rows)
            elif o["mode"] == "hacpo":
                c = hacpo_capability(caps[sname], caps[rname], o["hacpo_c_min"], o["hacpo_c_max"])
                a_self, a_peer = hacpo_advantages(recv.rewards[q].tolist(), src.rewards[q].tolist(), c, eps)
                batch.extend(own_group_rows(recv, q, a_self))
                rows = peer_group_rows(src, q, prompt, tok, o, sname, advantages=a_peer, same_tokenizer=same,
                                       only=only)
                rows.extra["hacpo_c"] = [c] * len(rows)
                rows.extra["hacpo_step"] = [ctx.step] * len(rows)
                batch.extend(rows)
            else:  # pragma: no cover - validated
                raise ValueError(o["mode"])
        for i, sp in enumerate(batch.source):
            if sp == "peer" and i < len(batch.extra.get("src_sample", [])) and batch.extra["src_sample"][i] is not None:
                src = steps[batch.extra["src_policy"][i]]
                n_src_tok += len(src.rollouts.response_ids[batch.group[i] * src.n + batch.extra["src_sample"][i]])
                n_recv_tok += len(batch.response_ids[i])
        if o["peer_logprobs"] == "recompute" and any(s == "peer" for s in batch.source):
            self._recompute_source_means(batch, steps, ctx)
        return batch, self.select_metrics(r, names, steps, plan, batch, n_src_tok, n_recv_tok)

    def select_metrics(self, r: int, names: list[str], steps: dict[str, PolicyStep], plan: Plan, batch: TrainBatch,
                       n_src_tok: int, n_recv_tok: int) -> dict:
        """Per receiver (= per direction for a pair): candidates, m, selected prompts, transferred
        responses, complementarity; per source too when there are more than two policies."""
        rname = names[r]
        dirs = [(s, rr) for (s, rr) in plan.candidates if rr == r]
        cand = set().union(*[set(plan.candidates[d]) for d in dirs]) if dirs else set()
        ms = [plan.m[d] for d in dirs if plan.m[d] is not None]
        out = {
            "graft/candidates": len(cand),
            "graft/selected": len(plan.assign.get(r, {})),
            "graft/m": sum(ms) if ms else None,
            "graft/transferred": sum(1 for s in batch.source if s == "peer"),
            "graft/complementarity": complementarity(steps[rname].k, [steps[nm].k for nm in names if nm != rname]),
        }
        if n_src_tok:
            out["graft/retok_length_ratio"] = n_recv_tok / n_src_tok
        if len(names) > 2:
            for (s, rr) in dirs:
                sn = names[s]
                out[f"graft/candidates/{sn}"] = len(plan.candidates[(s, rr)])
                out[f"graft/selected/{sn}"] = sum(1 for v in plan.assign.get(r, {}).values() if v == s)
                out[f"graft/m/{sn}"] = plan.m[(s, rr)]
        return out

    def admit(self, name: str, batch: TrainBatch, ctx: ExchangeContext):
        """Compatibility gate (Eq. 6–8) on the grafted rows, from the receiver's old log-probs
        (``batch.old_logprobs``, one no-grad pass by the trainer) and the source means set at select time.
        Dropped rows leave the batch (loss numerator and denominator)."""
        o = self.opts
        peer = [i for i, s in enumerate(batch.source) if s == "peer"]
        if not peer:
            return batch, {"graft/admitted": 0, "graft/dropped": 0}
        nsc = batch.extra.get("n_scored", [None] * len(batch))
        s = [compatibility(batch.old_logprobs[i], nsc[i] if nsc[i] is not None else len(batch.response_ids[i]),
                           batch.source_logp_mean[i]) for i in peer]
        if o["admission"] == "random":
            names = list(ctx.tokenizers)
            w, keep = random_admission(s, o["delta"], self._rng(ctx, 1 + (names.index(name) if name in names else 0),
                                                                  7), o["cap"])
        else:
            w, keep = gate_weights(s, o["delta"], o["gate"], o["cap"])
        weights = list(batch.weights)
        keep_row = [True] * len(batch)
        for i, wi, ki in zip(peer, w, keep):
            weights[i] = float(wi)
            keep_row[i] = bool(ki)
        batch.weights = weights
        batch.extra["graft_s"] = [None] * len(batch)
        for i, si in zip(peer, s):
            batch.extra["graft_s"][i] = si
        kept = [i for i in range(len(batch)) if keep_row[i]]
        out = batch.select(kept) if len(kept) < len(batch) else batch
        fin = [x for x in s if math.isfinite(x)]
        adm_w = [wi for wi, ki in zip(w, keep) if ki]
        met = {
            "graft/admitted": int(sum(keep)),
            "graft/dropped": int(len(keep) - sum(keep)),
            "graft/s_mean": float(np.mean(fin)) if fin else math.nan,
            "graft/s_p10": _pct(fin, 10),
            "graft/s_p90": _pct(fin, 90),
            "graft/w_mean": float(np.mean(adm_w)) if adm_w else math.nan,
            "graft/frac_admitted": float(sum(keep)) / len(keep),
        }
        return out, met
