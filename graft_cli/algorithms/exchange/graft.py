"""GRAFT: balanced cross-model trajectory exchange with a compatibility gate (graft.md §2), its
design variants (graft.md §3) and the N-policy generalisation. Registered as exchange ``graft``.

Per step (graft.md §2.2, Alg. 1), for every ordered pair of policies (source S, receiver R):

The parts are registered and composed from ``exchange.params``: selection rules
(:mod:`~graft_cli.algorithms.exchange.selection`), replacement modes
(:mod:`~graft_cli.algorithms.exchange.replacement`), gates and admission
(:mod:`~graft_cli.algorithms.exchange.gates`); re-tokenization lives in
:mod:`graft_cli.models.retokenize`. The stored-trajectory variant (``graft_stored``) is this
exchange fed by a partner's rollout logs, a step source the trainer owns
(graft_cli/train/sources.py).

1. **Trigger** (:func:`trigger`, Alg. 1 line "C_{A→B}"): prompt q is a candidate for S→R when the
   receiver's whole group fails and the source's group is mixed, ``k_R(q) = 0 ∧ 1 ≤ k_S(q) < n``.
2. **Balanced exchange** (:func:`select_with_ties`, :func:`balanced_pair`; Alg. 1 "SelectWithTies"):
   ``m = min(|C_{S→R}|, |C_{R→S}|)``; each direction ranks its candidates by the *source's* success
   count, descending, and keeps the first m plus every candidate tied with the m-th. ``m = 0`` →
   nothing moves in either direction. **Tie order**: candidates are sorted by ``(-k_S(q), q)`` (ties
   by prompt index, ascending); because every candidate tied with the m-th is kept, the *set*
   selected does not depend on the tie order (it is ``{q ∈ C : k_S(q) ≥ k_S(m-th)}``); it is
   returned in prompt order.
3. **Replacement** (:func:`peer_group_rows`, graft.md §2.2 step 5): the receiver's failed group is
   removed and the source's *whole* group inserted (``source="peer"``, ``group`` = the prompt's
   index), each response keeping the source's own GRPO advantage (computed over its full group,
   before any floor; never renormalised). Groups stay in prompt-batch order in the TrainBatch.
4. **Re-tokenization** (:func:`retokenize`, graft.md §2.2 step 6, §8 item 3; HACPO's contract,
   baselines.md §1.2): the source's response *string* (``Rollouts.texts``, decoded with
   ``skip_special_tokens=True``) is encoded with the receiver's tokenizer, ``tokenizer(text,
   add_special_tokens=False)``, after the receiver's own encoding of the same problem
   (``ctx.receivers.encode(problem, receiver)``).

   **EOS rule.** When the source response ended with EOS (it was not truncated) and ``append_eos``
   is true (default), the receiver's EOS id is appended, so the receiver also learns to stop; a
   truncated source response gets no EOS. The terminal EOS is **excluded from both sides of s**: the
   receiver mean is over the first ``n_scored`` tokens (the re-tokenized text, without the appended
   EOS), the source mean over the generated tokens without the terminal EOS
   (:func:`source_mean_logprob`). The appended EOS still takes part in the loss like any other
   token. A response with no scorable token on either side has ``s = nan`` and is dropped by the
   floor (kept with w = 1 when the gate is off). With ``direct_ids: true`` and byte-identical
   vocabularies (graft.md §8 item 10) the source token ids are used as they are (same EOS
   exclusion).
5. **Compatibility and gate** (:func:`compatibility`, the admission rule ``gate`` and its
   :func:`~graft_cli.algorithms.exchange.gates.floor_gate`; Eq. 6–8), in ``admit`` once the
   trainer has scored every row under the receiver's old policy: ``s = exp(mean_t log
   π_old^R(o^R_t) − mean_t log π_S(o^S_t))`` and ``w = 1[s > δ] · min(s, 1)`` (δ: ``delta``,
   :class:`GraftParams`; strict >). Responses with ``s ≤ δ`` are **dropped** (they leave the loss
   numerator and the token-count denominator). ``δ ≤ 0`` means no floor (every response kept, ``w =
   min(s, 1)``). The source log-probs are its rollout log-probs (``peer_logprobs: rollout``, GRAFT's
   default; exact where the engine's log-probs equal the trainer's fp32 forward, the HF engine in
   fp32) or recomputed by the source policy's trainer forward at the rollout temperature before any
   update (``peer_logprobs: recompute``, via ``ctx.receivers.score``; HACPO's default, as its
   released trainer scores the pool with each source's actor, and the one to use with bf16 weights
   or vLLM, whose log-probs differ).
6. **Objective**: the registered loss (``ppo_token``: token-level PPO ratio against the receiver's
   own old policy for self and grafted tokens, w per response, token-mean over retained responses;
   with no transfer it is GRPO exactly). Peer-last minibatch ordering lives in
   :mod:`graft_cli.algorithms.minibatch` (registered, ``exchange.ordering``): groups holding grafted
   rows are ordered after the receiver's own groups, then the ordered groups are chunked into equal
   prompt counts, so a boundary minibatch may mix own and grafted groups (graft.md §8 item 4).

**N ≥ 2 policies** (:func:`plan_exchange`). Every ordered pair (S, R) has its candidate set;
balancing is per unordered pair, ``m_{SR} = min(|C_{S→R}|, |C_{R→S}|)``, each direction selecting
with ties as above. A receiver prompt offered by several sources takes the group of the source with
the most successes ``k_S(q)``, ties to the lower policy index (config order): the default N-peer
rule ``n_peer: best_source``; ``round_robin`` deals contested prompts to the sources in turn and
``pooled_donor`` balances each receiver's intake against its total outflow instead of per pair
(:mod:`~graft_cli.algorithms.exchange.selection`). With exactly two policies every rule is the pair
algorithm.

**Design variants** (graft.md §3) are ``exchange.params`` keys (:class:`GraftParams`):

- ``gate: floor | none`` — ``none`` is "w/o compatibility gate" (w = 1 for every transferred
  response);
- ``delta`` — the floor δ (0 = "no floor": w = min(s, 1) for all); ``cap: false`` drops the min(·,
  1);
- ``selection``: ``balanced`` (GRAFT) | ``unbalanced`` (trigger 1 ≤ k_S < n, every candidate, no
  balancing: the stored-trajectory rule) | ``sgt`` ("w/o balanced exchange": k_R = 0 ∧ k_S ≥ 1,
  all-correct source groups included with zero advantage; their tokens count) | ``random`` ("random
  prompts": per direction, as many prompts as GRAFT's balanced selection would take, drawn uniformly
  over the batch regardless of rewards);
- ``admission: gate | random`` — "random admission": count the responses with s > δ, sample that
  many uniformly from the transferred responses, give them w = min(s, 1) (no floor), drop the
  others;
- ``mode``: ``replace`` (GRAFT) | ``pooled`` (receiver group ‖ source group, pooled GRPO advantages,
  receiver w = 1) | ``sft`` (SGT's NLL on one uniformly sampled correct source response per selected
  prompt, a row outside the policy gradient; the receiver keeps its own zero-advantage group; loss
  ``ppo_token_nll`` with λ = ``algo.loss_params.nll_coef``) | ``hacpo`` (HACPO update on
  GRAFT-selected prompts: joint group with HACPO's capability-aware advantages; source responses on
  other prompts enter with zero advantage; loss ``hacpo_peer``; every row carries ``n_scored``, its
  tokens without a terminal EOS, for the loss mask ``strip_eos``); the capabilities P_k include this
  step's success rates (``hacpo_capability: current``, HACPO's code) or only the steps before it
  (``lagged``);
- ``peer_responses: all | success`` — "success-only": only correct source responses are inserted
  (advantages still from the full source group);
- loss-level variants: ``algo.loss=ppo_seq`` (sequence ratio), ``luffy``, ``hacpo_peer``,
  ``ppo_token_nll`` (:mod:`graft_cli.algorithms.peer_losses`) with their parameters in
  ``algo.loss_params`` (LUFFY's γ, HACPO's L_0/Δ/schedule/peer coefficient, SGT's λ); ordering via
  ``exchange.ordering``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from graft_cli.algorithms.exchange.base import EXCHANGES, Exchange, ExchangeContext
from graft_cli.algorithms.exchange.content import CONTENTS
from graft_cli.algorithms.exchange.gates import ADMISSIONS, GATES, compatibility, source_mean_logprob
from graft_cli.algorithms.exchange.replacement import REPLACEMENTS, ReceiverContext
from graft_cli.algorithms.exchange.selection import N_PEER_RULES, SELECTIONS, Plan, plan_exchange, solved_share
from graft_cli.batch import PolicyStep, TrainBatch
from graft_cli.data.synthetic import family_of
from graft_cli.errors import GraftError
from graft_cli.models.retokenize import tokenizers_identical
from graft_cli.registry import Params, choice

# ------------------------------------------------------------------------------------------------ options
@dataclass(frozen=True)
class GraftParams(Params):
    """``exchange.params`` of the GRAFT exchange (the variants: module docstring), the one place
    their defaults are written; the choices of ``gate``, ``selection``, ``n_peer``, ``admission``
    and ``mode`` are their registries' names."""

    delta: float = 0.8  # Eq. 8 floor δ (strict >); <= 0: no floor
    gate: str = choice("floor", among=GATES)  # floor | none
    cap: bool = True  # min(s, 1) in w
    selection: str = choice("balanced", among=SELECTIONS)  # balanced | unbalanced | sgt | random | all
    n_peer: str = choice("best_source", among=N_PEER_RULES)  # N >= 3 policies: best_source | round_robin | pooled_donor
    admission: str = choice("gate", among=ADMISSIONS)  # gate | random
    mode: str = choice("replace", among=REPLACEMENTS)  # replace | pooled | sft | hacpo
    peer_responses: str = choice("all", "success")
    append_eos: bool = True  # graft.md §8 item 3
    peer_logprobs: str = choice("rollout", "recompute")  # graft.md §8 item 2
    direct_ids: bool = False  # identical tokenizers: transfer token ids (graft.md §8 item 10)
    hacpo_window: int = 5  # HACPO capability: rolling window of steps
    hacpo_capability: str = choice("current", "lagged")  # current: the window includes this step's rates (HACPO's code)
    hacpo_c_min: float = 0.1
    hacpo_c_max: float = 10.0
    hacpo_peer_elsewhere: str = choice("zero", "drop")  # zero: source responses on other prompts, advantage 0 | drop
    content: str = choice("peer", among=CONTENTS)  # what a grafted correct response says: peer | gold_*_style
    styles: dict = field(default_factory=dict)  # policy -> the style it writes (gold content)
    families: dict = field(default_factory=dict)  # receiver -> its designated families (selection family)


MODE_LOSSES = {"sft": ("ppo_token_nll",), "hacpo": ("hacpo_peer",)}


def options(params: dict | None, kind: type[GraftParams] = GraftParams) -> GraftParams:
    """``exchange.params`` checked against ``kind`` (:meth:`Params.check`) with every default filled
    in, then the rules between them (one-line GraftError): the object of ``kind``."""
    out = kind.check(params, "exchange.params", "the GRAFT exchange")
    if out.hacpo_window < 1:
        raise GraftError("config key 'exchange.params.hacpo_window': must be >= 1")
    if out.n_peer == "pooled_donor" and out.selection != "balanced":
        raise GraftError("config key 'exchange.params.n_peer': pooled_donor balances each receiver's intake against "
                         f"its outflow and needs selection balanced, got {out.selection!r}")
    if not 0 < out.hacpo_c_min <= out.hacpo_c_max:
        raise GraftError("config key 'exchange.params.hacpo_c_min': need 0 < hacpo_c_min <= hacpo_c_max")
    for key in ("styles", "families"):
        if not isinstance(getattr(out, key), Mapping):
            raise GraftError(f"config key 'exchange.params.{key}': must be a mapping of policy names, "
                             f"got {getattr(out, key)!r}")
    if out.content != "peer" and out.gate != "none":
        raise GraftError(f"config key 'exchange.params.content': {out.content} rows have no source log-probs, so "
                         f"the gate's s is undefined and the floor would drop them all; set exchange.params.gate=none")
    if out.content != "peer" and not out.styles:
        raise GraftError(f"config key 'exchange.params.styles': content {out.content} needs each policy's style "
                         f"(the tiny pair: {{a: prose, b: steps}})")
    if out.selection == "family" and not out.families:
        raise GraftError("config key 'exchange.params.families': selection family needs each receiver's families "
                         "(e.g. {a: [two], b: [lin]})")
    return out


def gate_floor(params) -> float | None:
    """The compatibility floor δ that an exchange's parameters apply (Eq. 8): ``delta`` under
    GRAFT's gate (0.0: no floor, every response kept), None with ``gate: none`` or for an exchange
    without the gate. The one reader of δ for reports and plots."""
    if not isinstance(params, GraftParams) or params.gate == "none":
        return None
    return float(params.delta)


def designated(families: Mapping, name: str) -> set[str]:
    """Receiver ``name``'s designated families (``exchange.params.families``: a name or a list)."""
    got = families.get(name) or ()
    return {got} if isinstance(got, str) else {str(f) for f in got}


def check_loss_for_mode(cfg, opts: GraftParams) -> None:
    need = MODE_LOSSES.get(opts.mode)
    if need and cfg.algo.loss not in need:
        raise GraftError(f"config key 'algo.loss': exchange.params.mode={opts.mode} needs algo.loss="
                         f"{' or '.join(need)}, got {cfg.algo.loss!r}")


def family_metrics(log: dict) -> dict:
    """Per prompt family of the grafted rows (the admission log's columns): ``graft/family/<f>/``
    ``offered`` (grafted rows), ``admitted``, ``dropped`` and ``reward`` (the mean reward of the
    admitted ones, None when none was); nothing where no row has a family."""
    out: dict = {}
    fams = log.get("family") or []
    for f in sorted({f for f in fams if f is not None}):
        rows = [i for i, x in enumerate(fams) if x == f]
        adm = [i for i in rows if log["admitted"][i]]
        rew = [log["reward"][i] for i in adm if log["reward"][i] is not None]
        out[f"graft/family/{f}/offered"] = len(rows)
        out[f"graft/family/{f}/admitted"] = len(adm)
        out[f"graft/family/{f}/dropped"] = len(rows) - len(adm)
        out[f"graft/family/{f}/reward"] = float(np.mean(rew)) if rew else None
    return out


def _pct(a, p) -> float:
    return float(np.percentile(np.asarray(a, dtype=np.float64), p)) if len(a) else math.nan


@EXCHANGES.register("graft", spec=GraftParams())
class GraftExchange(Exchange):
    """GRAFT (module docstring). ``select`` builds every receiver's batch (selection, replacement,
    re-tokenization, source log-prob means); ``admit`` applies the compatibility gate."""

    PARAMS: type[GraftParams] = GraftParams  # its registered spec's class

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.opts = options(cfg.exchange.params if cfg is not None else {}, self.PARAMS)  # a GraftParams
        self.hacpo_history: dict[str, list[float]] = {}
        self._same_tok: dict = {}
        self._admission: dict[str, dict] = {}  # receiver -> the last admit's transferred rows (admission_log)

    def admission_log(self, name: str) -> dict | None:
        """Receiver ``name``'s transferred rows of the last :meth:`admit`, dropped ones included:
        ``prompt_index``, ``source``, ``source_sample``, ``s`` (Eq. 7; None when undefined),
        ``weight``, ``admitted``, ``reward``."""
        return self._admission.pop(name, None)

    @classmethod
    def validate(cls, cfg) -> None:
        opts = options(cfg.exchange.params, cls.PARAMS)
        check_loss_for_mode(cfg, opts)

    def step_text(self, row: dict) -> str:
        """The step line's words for a receiver's row: the prompt groups it took from its peers
        (``graft/selected``) and the grafted responses the gate admitted (``graft/admitted``)."""
        if row.get("graft/selected") is None:
            return ""
        return f"peer groups {row['graft/selected']} admitted {row.get('graft/admitted', 0)}"

    # -- state (HACPO capability history)
    def state_dict(self) -> dict:
        return {"hacpo_history": {k: list(v) for k, v in self.hacpo_history.items()}}

    def load_state_dict(self, st: dict) -> None:
        self.hacpo_history = {k: list(v) for k, v in (st or {}).get("hacpo_history", {}).items()}

    # -- helpers
    def _rng(self, ctx: ExchangeContext, *keys: int) -> np.random.Generator:
        return np.random.default_rng([int(ctx.seed), *keys])

    def _same_tokenizer(self, a: str, b: str, ctx: ExchangeContext) -> bool:
        if not self.opts.direct_ids:
            return False
        key = (a, b)
        if key not in self._same_tok:
            ta, tb = ctx.tokenizers.get(a), ctx.tokenizers.get(b)
            self._same_tok[key] = ta is not None and tb is not None and tokenizers_identical(ta, tb)
        return self._same_tok[key]

    def _recompute_source_means(self, batch: TrainBatch, steps: dict[str, PolicyStep], ctx: ExchangeContext) -> None:
        """``peer_logprobs: recompute`` (graft.md §8 item 2): score each transferred response with
        its source policy's trainer forward (θ_old: no policy has been updated yet in this step)
        through ``ctx.receivers.score(policy_name, TrainBatch) -> per-token log-probs``."""
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
            lps = ctx.receivers.score(sp, sb)
            for i, lp in zip(rows, lps):
                q, j = batch.group[i], batch.extra["src_sample"][i]
                m = source_mean_logprob(lp, not bool(st.rollouts.truncated[q * st.n + j]))
                batch.source_logp_mean[i] = m

    def _capabilities(self, steps: dict[str, PolicyStep]) -> dict[str, float]:
        """HACPO P_k (baselines.md §1.2): the mean of policy k's positive-reward rates (each floored
        at 1e-8) over its last ``hacpo_window`` steps. ``hacpo_capability: current`` (HACPO's
        ``CapabilityTracker.update`` before the advantages and the loss): this step's rate joins the
        window first, so the window holds this step and the ones before it; ``lagged``: the window
        before this step (1.0 without history), then this step's rate is appended."""
        w = self.opts.hacpo_window
        lagged = self.opts.hacpo_capability == "lagged"
        caps = {}
        if lagged:
            for name in steps:
                h = self.hacpo_history.get(name, [])
                caps[name] = float(np.mean(h[-w:])) if h else 1.0
        for name, st in steps.items():
            h = self.hacpo_history.setdefault(name, [])
            h.append(max(float((st.rewards > 0).float().mean()), 1e-8))
            del h[:-w]
            if not lagged:
                caps[name] = float(np.mean(h))
        return caps

    # -- the exchange
    def plan(self, steps: dict[str, PolicyStep], ctx: ExchangeContext, directions=None) -> Plan:
        names = list(steps)
        B = len(steps[names[0]].problems)
        eligible = None
        if self.opts.families:
            fams = [family_of(p.problem) for p in steps[names[0]].problems]
            eligible = [{q for q, f in enumerate(fams) if f in designated(self.opts.families, nm)} for nm in names]
        return plan_exchange([steps[nm].k for nm in names], [steps[nm].n for nm in names], self.opts.selection,
                             ctx.seed, B, directions, self.opts.n_peer, eligible)

    def select(self, steps: dict[str, PolicyStep], ctx: ExchangeContext):
        """Every receiver's batch; the receivers are ``ctx.receiver_names`` (the trained policies;
        default every step's policy). Steps of stored sources only give (directions source →
        receiver)."""
        names = list(steps)
        receiving = [nm for nm in names if ctx.receiver_names is None or nm in ctx.receiver_names]
        directions = None
        if len(receiving) < len(names):
            directions = [(s, r) for r, rn in enumerate(names) if rn in receiving for s in range(len(names)) if s != r]
        plan = self.plan(steps, ctx, directions)
        caps = self._capabilities(steps) if self.opts.mode == "hacpo" else {}
        batches, metrics = {}, {}
        for r, rname in enumerate(names):
            if rname in receiving:
                batches[rname], metrics[rname] = self.build_receiver(r, names, steps, plan, ctx, caps)
        return batches, metrics

    def build_receiver(self, r: int, names: list[str], steps: dict[str, PolicyStep], plan: Plan,
                       ctx: ExchangeContext, caps: dict) -> tuple[TrainBatch, dict]:
        rname = names[r]
        recv = steps[rname]
        algo = self.cfg.algo if self.cfg is not None else None
        rc = ReceiverContext(r=r, names=names, steps=steps, opts=self.opts, tokenizer=ctx.tokenizers[rname],
                             encode_prompt=lambda text: ctx.receivers.encode(text, rname),
                             same_tokenizer=lambda sname: self._same_tokenizer(sname, rname, ctx),
                             rng=lambda *keys: self._rng(ctx, *keys), caps=caps, step=ctx.step,
                             eps=algo.adv_eps if algo is not None else 1e-6,
                             norm_by_std=algo.norm_by_std if algo is not None else True)
        mode = REPLACEMENTS.get(self.opts.mode)
        assign = plan.assign.get(r, {})
        batch = TrainBatch()
        for q in range(len(recv.problems)):
            batch.extend(mode(rc, q, assign.get(q)))
        n_src_tok, n_recv_tok = 0, 0
        for i, sp in enumerate(batch.source):
            if sp == "peer" and i < len(batch.extra.get("src_sample", [])) and batch.extra["src_sample"][i] is not None:
                src = steps[batch.extra["src_policy"][i]]
                n_src_tok += len(src.rollouts.response_ids[batch.group[i] * src.n + batch.extra["src_sample"][i]])
                n_recv_tok += len(batch.response_ids[i])
        if self.opts.peer_logprobs == "recompute" and any(s == "peer" for s in batch.source):
            self._recompute_source_means(batch, steps, ctx)
        fams = {}  # the tiny task's family of each grafted row's prompt (None elsewhere): the mechanism's split
        batch.extra["family"] = [fams.setdefault(g, family_of(recv.problems[g].problem)) if sp == "peer" else None
                                 for sp, g in zip(batch.source, batch.group)]
        met = self.select_metrics(r, names, steps, plan, batch, n_src_tok, n_recv_tok)
        mode_metrics = REPLACEMENTS.spec(self.opts.mode).metrics
        if mode_metrics is not None:
            met.update(mode_metrics(rc, assign))
        return batch, met

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
            "graft/complementarity": solved_share(steps[rname].k, [steps[nm].k for nm in names if nm != rname])[0],
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
        (``batch.old_logprobs``, one no-grad pass by the trainer) and the source means set at select
        time. Dropped rows leave the batch (loss numerator and denominator)."""
        o = self.opts
        peer = [i for i, s in enumerate(batch.source) if s == "peer"]
        names = list(ctx.tokenizers)
        per_source = {f"graft/admitted/{sn}": 0 for sn in names if sn != name} if len(names) > 2 else {}
        if not peer:
            return batch, {"graft/admitted": 0, "graft/dropped": 0, "graft/grafted_share": 0.0, **per_source}
        nsc = batch.extra.get("n_scored", [None] * len(batch))
        s = [compatibility(batch.old_logprobs[i], nsc[i] if nsc[i] is not None else len(batch.response_ids[i]),
                           batch.source_logp_mean[i]) for i in peer]
        idx = 1 + (names.index(name) if name in names else 0)
        w, keep = ADMISSIONS.get(o.admission)(s, o, lambda: self._rng(ctx, idx, 7))
        weights = list(batch.weights)
        keep_row = [True] * len(batch)
        for i, wi, ki in zip(peer, w, keep):
            weights[i] = float(wi)
            keep_row[i] = bool(ki)
        graft_s = [None] * len(batch)
        for i, si in zip(peer, s):
            graft_s[i] = si
        batch = dataclasses.replace(batch, weights=weights, extra={**batch.extra, "graft_s": graft_s})
        srcs = batch.extra.get("src_policy", [None] * len(batch))
        samples = batch.extra.get("src_sample", [None] * len(batch))
        self._admission[name] = {  # every transferred row, kept or dropped (admission_log)
            "prompt_index": [int(batch.group[i]) for i in peer],
            "source": [str(srcs[i]) for i in peer],
            "source_sample": [-1 if samples[i] is None else int(samples[i]) for i in peer],
            "s": [float(x) if math.isfinite(x) else None for x in s],
            "weight": [float(x) for x in w],
            "admitted": [bool(k) for k in keep],
            "reward": [None if i >= len(batch.rewards) or batch.rewards[i] is None else float(batch.rewards[i])
                       for i in peer],
            "family": [batch.extra.get("family", [None] * len(batch))[i] for i in peer],
            "content": [batch.extra.get("content", [None] * len(batch))[i] for i in peer],
        }
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
            "graft/grafted_share": float(sum(keep)) / max(len(out), 1),  # of the receiver's batch rows
        }
        met.update(family_metrics(self._admission[name]))
        for key in per_source:  # per source: the transfer matrix of the report (row: source, column: receiver)
            sn = key.rsplit("/", 1)[1]
            met[key] = int(sum(1 for i, ki in zip(peer, keep) if ki and srcs[i] == sn))
        return out, met
