"""What a selected prompt puts into the receiver's batch (graft.md §2.2 step 5; §3 variants),
registered.

A replacement mode (registry ``REPLACEMENTS``, ``exchange.params.mode``) is ``mode(rc:
ReceiverContext, q, s) -> TrainBatch``: the receiver's rows for prompt ``q`` when it receives from
source index ``s`` (``s is None``: the prompt was not selected; most modes keep the receiver's own
group).

- ``replace`` (GRAFT): the receiver's failed group is removed and the source's *whole* group
  inserted (``source="peer"``), each response keeping the source's own GRPO advantage (computed over
  its full group, never renormalised);
- ``replace_or_add``: ``replace`` where the receiver's group failed (k_R = 0); where it has some
  success its own group stays and the source's group is added beside it (for triggers that graft
  regardless of the receiver's rewards: selection ``family``);
- ``pooled``: receiver group ‖ source group with GRPO advantages over the pool, receiver w = 1;
- ``sft`` (SGT's update): the receiver keeps its own zero-advantage group and gains one uniformly
  drawn correct source response as a row outside the policy gradient (``in_pg`` false) for an NLL
  term (loss ``ppo_token_nll``, λ = ``algo.loss_params.nll_coef``);
- ``hacpo``: the joint group with HACPO's capability-aware advantages (column ``hacpo_c``); source
  responses on prompts that were not selected enter with zero advantage (``hacpo_peer_elsewhere:
  zero``) or not at all; every row has ``n_scored`` (its tokens without the terminal EOS; loss mask
  ``strip_eos``).

``peer_responses: success`` keeps only the correct source responses (advantages still from the full
group). What the correct source responses say is the content rule's (``content``,
:mod:`~graft_cli.algorithms.exchange.content`): the source's own text by default. """

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from graft_cli.algorithms.advantages import grpo_advantages
from graft_cli.algorithms.exchange.content import CONTENTS
from graft_cli.algorithms.exchange.gates import source_mean_logprob
from graft_cli.batch import PolicyStep, TrainBatch, is_correct
from graft_cli.errors import GraftError
from graft_cli.models.retokenize import retokenize
from graft_cli.registry import Params, Registry

@dataclass(frozen=True)
class ModeSpec:
    """A replacement mode's optional ``metrics(rc, assign) -> dict`` (added to the exchange's
    metrics)."""

    metrics: Callable | None = None


REPLACEMENTS: Registry = Registry("replacement mode", ModeSpec)


def pooled_advantages(r_recv, r_src, eps: float = 1e-6, norm_by_std: bool = True) -> tuple[list[float], list[float]]:
    """graft.md §3 "pooled groups": â = (r − mean_pool)/(std_pool + ε) over G_R ‖ G_S (unbiased std,
    as the GRPO estimator)."""

    r = torch.tensor([list(map(float, r_recv)) + list(map(float, r_src))], dtype=torch.float32)
    a = grpo_advantages(r, eps=eps, norm_by_std=norm_by_std)[0].tolist()
    return a[: len(r_recv)], a[len(r_recv):]


def hacpo_capability(p_src: float, p_tgt: float, c_min: float = 0.1, c_max: float = 10.0) -> float:
    """HACPO (baselines.md §1.2): c(src→tgt) = clip(P_src / P_tgt, 0.1, 10), P floored at 1e-8."""
    return float(min(max(max(p_src, 1e-8) / max(p_tgt, 1e-8), c_min), c_max))


def hacpo_baseline(r_self, r_peer, c: float) -> float:
    """HACPO's capability-aware baseline (baselines.md §1.2, eq. 5–6): all rewards equal → b =
    mean(r); else b = mean_i(r_i ω_i), ω = 1 (self), 1/c (peer); binary guard: b > 1 → the mean of
    the learner's own rewards."""
    rs, rp = [float(x) for x in r_self], [float(x) for x in r_peer]
    allr = np.array(rs + rp, dtype=np.float64)
    if allr.size == 0 or np.all(allr == allr[0]):
        return float(allr.mean()) if allr.size else 0.0
    b = float(np.mean(np.array(rs + [x / c for x in rp])))
    if b > 1.0:
        b = float(np.mean(rs)) if rs else b
    return b


def hacpo_advantages(r_self, r_peer, c: float, eps: float = 1e-6) -> tuple[list[float], list[float]]:
    """HACPO capability-aware advantage over the joint group (baselines.md §1.2, paper eq. 5–6): all
    equal → b = mean(r); else b = mean_i(r_i ω_i), ω = 1 (self), 1/c (peer); b > 1 → mean of own
    rewards; A = (r − b)/(std_unbiased(all r) + ε)."""
    rs, rp = [float(x) for x in r_self], [float(x) for x in r_peer]
    allr = np.array(rs + rp, dtype=np.float64)
    if allr.size < 2 or np.all(allr == allr[0]):
        return [0.0] * len(rs), [0.0] * len(rp)
    b = hacpo_baseline(rs, rp, c)
    sd = float(np.std(allr, ddof=1))
    return [(x - b) / (sd + eps) for x in rs], [(x - b) / (sd + eps) for x in rp]


def peer_group_rows(src: PolicyStep, q: int, recv_prompt_ids: list[int], tokenizer, opts: Params,
                    src_name: str, advantages: list[float] | None = None, same_tokenizer: bool = False,
                    only: list[int] | None = None, correct_text: str | None = None) -> TrainBatch:
    """The source's group for prompt q as receiver rows (graft.md §2.2 steps 5–6): re-tokenized
    response, the source's own advantage (or ``advantages`` when a variant recomputes them), reward,
    mean source log-prob (``peer_logprobs``; EOS excluded) and ``extra`` columns ``src_policy``,
    ``n_scored``, ``content`` (and the ``source_logp_mean`` field). ``only`` restricts to some
    sample indices (success-only, SFT); ``opts``: the exchange's GraftParams (``opts.append_eos``).
    ``correct_text`` (a content rule's text, :mod:`~graft_cli.algorithms.exchange.content`) stands in
    for every correct response: re-tokenized, ended (the receiver's EOS appended with
    ``append_eos``), no source log-probs (NaN mean), ``content`` ``"gold"``; reward and advantage
    stay the source's."""
    out = TrainBatch()
    ro, n = src.rollouts, src.n
    for j in (range(n) if only is None else only):
        r = q * n + j
        reward = float(src.rewards[q, j])
        adv = float(src.advantages[q, j]) if advantages is None else float(advantages[j])
        if correct_text is not None and is_correct(reward):
            ids, n_scored = retokenize(correct_text, tokenizer, True, opts.append_eos, False)
            out.append(prompt_ids=recv_prompt_ids, response_ids=ids, advantages=adv, weights=1.0, source="peer",
                       group=q, rewards=reward, rollout_logprobs=None, source_logp_mean=float("nan"),
                       texts=correct_text, src_policy=src_name, src_sample=j, n_scored=n_scored, content="gold")
            continue
        ended = not bool(ro.truncated[r])
        terminal_only = ended and len(ro.response_ids[r]) == 1  # an EOS-only response: its EOS is its action
        if same_tokenizer:
            ids = list(ro.response_ids[r])
            n_scored = len(ids) - 1 if ended and len(ids) > 1 else len(ids)
        else:
            ids, n_scored = retokenize(ro.texts[r], tokenizer, ended, opts.append_eos, terminal_only)
        src_mean = source_mean_logprob(ro.logprobs[r], ended)
        out.append(prompt_ids=recv_prompt_ids, response_ids=ids, advantages=adv, weights=1.0, source="peer",
                   group=q, rewards=reward, rollout_logprobs=None, source_logp_mean=src_mean,
                   texts=ro.texts[r], src_policy=src_name, src_sample=j, n_scored=n_scored, content="peer")
    return out


def own_group_rows(step: PolicyStep, q: int, advantages: list[float] | None = None) -> TrainBatch:
    """The receiver's own group for prompt q (as ``self_batch`` builds it)."""
    out = TrainBatch()
    ro, n = step.rollouts, step.n
    for j in range(n):
        r = q * n + j
        adv = float(step.advantages[q, j]) if advantages is None else float(advantages[j])
        out.append(prompt_ids=step.prompt_ids[q], response_ids=ro.response_ids[r], advantages=adv, weights=1.0,
                   source="self", group=q, rewards=float(step.rewards[q, j]), rollout_logprobs=ro.logprobs[r],
                   texts=ro.texts[r])
    return out


@dataclass
class ReceiverContext:
    """What a replacement mode needs to build receiver ``r``'s rows."""

    r: int
    names: list  # policy (and source) names, in plan order
    steps: dict  # name -> PolicyStep
    opts: Params  # the exchange's checked options: its GraftParams (graft.py, which imports this module)
    tokenizer: object  # the receiver's tokenizer
    encode_prompt: Callable  # problem text -> the receiver's prompt ids
    same_tokenizer: Callable  # source name -> bool (direct id transfer)
    rng: Callable  # (*keys) -> np.random.Generator seeded by the step
    caps: dict = field(default_factory=dict)  # HACPO capabilities by name
    step: int = 0
    eps: float = 1e-6
    norm_by_std: bool = True

    @property
    def name(self) -> str:
        return self.names[self.r]

    @property
    def recv(self) -> PolicyStep:
        return self.steps[self.name]

    def peer_rows(self, s: int, q: int, advantages=None, only=None) -> TrainBatch:
        """Source ``s``'s rows for prompt ``q``, its correct responses' text set by the content
        rule (``opts.content``)."""
        sname = self.names[s]
        problem = self.recv.problems[q].problem
        text = CONTENTS.get(self.opts.content)(problem, self.name, sname, self.opts.styles)
        return peer_group_rows(self.steps[sname], q, self.encode_prompt(problem), self.tokenizer, self.opts, sname,
                               advantages=advantages, same_tokenizer=self.same_tokenizer(sname), only=only,
                               correct_text=text)

    def success_only(self, s: int, q: int):
        if self.opts.peer_responses != "success":
            return None
        src = self.steps[self.names[s]]
        return [j for j in range(src.n) if is_correct(float(src.rewards[q, j]))]


@REPLACEMENTS.register("replace")
def replace_group(rc: ReceiverContext, q: int, s: int | None) -> TrainBatch:
    if s is None:
        return own_group_rows(rc.recv, q)
    return rc.peer_rows(s, q, only=rc.success_only(s, q))


@REPLACEMENTS.register("replace_or_add")
def replace_or_add(rc: ReceiverContext, q: int, s: int | None) -> TrainBatch:
    """``replace`` where the receiver's group failed (k_R = 0); where it solved some (k_R ≥ 1) its
    own group stays, with its own advantages, and the source's group is added beside it. Under
    GRAFT's trigger (k_R = 0) it is ``replace``; a trigger that grafts regardless of the receiver's
    rewards (selection ``family``) keeps the receiver's own signal."""
    if s is None:
        return own_group_rows(rc.recv, q)
    rows = rc.peer_rows(s, q, only=rc.success_only(s, q))
    if int(rc.recv.k[q]) == 0:
        return rows
    out = own_group_rows(rc.recv, q)
    out.extend(rows)
    return out


@REPLACEMENTS.register("pooled")
def pooled_group(rc: ReceiverContext, q: int, s: int | None) -> TrainBatch:
    if s is None:
        return own_group_rows(rc.recv, q)
    src = rc.steps[rc.names[s]]
    a_recv, a_src = pooled_advantages(rc.recv.rewards[q].tolist(), src.rewards[q].tolist(), rc.eps, rc.norm_by_std)
    out = own_group_rows(rc.recv, q, a_recv)
    out.extend(rc.peer_rows(s, q, advantages=a_src, only=rc.success_only(s, q)))
    return out


@REPLACEMENTS.register("sft")
def sft_rows(rc: ReceiverContext, q: int, s: int | None) -> TrainBatch:
    out = own_group_rows(rc.recv, q)
    if s is None:
        return out
    src = rc.steps[rc.names[s]]
    correct = [j for j in range(src.n) if is_correct(float(src.rewards[q, j]))]
    if correct:
        j = int(rc.rng(rc.r, s, q).choice(correct))
        rows = rc.peer_rows(s, q, advantages=[0.0] * src.n, only=[j])
        rows.in_pg = [False] * len(rows)
        out.extend(rows)
    return out


def _refuse_empty(rows: TrainBatch, q: int, who: str) -> None:
    """HACPO's released trajectory code refuses a response with no token to score
    (``materialize_rollout_records``: no generated token; ``build_training_view``: a text that
    encodes to no learner token): its mean log-prob, and so its ratio, does not exist. An EOS-only
    response is not empty (its EOS is scored)."""
    for k, t in zip(rows.extra["n_scored"], rows.texts):
        if int(k) <= 0:
            raise GraftError(f"HACPO: a response of {who} to prompt {q} has no token to score in the receiver's "
                             f"tokens (text {t!r}); its mean log-prob and ratio do not exist (HACPO's released "
                             f"code refuses such a response too)")


def _hacpo_rows(rc: ReceiverContext, s: int, q: int, advantages, only=None) -> TrainBatch:
    sname = rc.names[s]
    o = rc.opts
    rows = rc.peer_rows(s, q, advantages=advantages, only=only)
    _refuse_empty(rows, q, f"policy {sname!r}")
    rows.extra["hacpo_c"] = [hacpo_capability(rc.caps[sname], rc.caps[rc.name], o.hacpo_c_min,
                                              o.hacpo_c_max)] * len(rows)
    return rows


def _hacpo_own_rows(rc: ReceiverContext, q: int, advantages=None) -> TrainBatch:
    """The receiver's own rows with ``n_scored``: the response without the terminal EOS it ended
    with (HACPO's trajectory contract strips it from every row; an EOS-only response keeps its one
    action)."""
    out = own_group_rows(rc.recv, q, advantages)
    ro, n = rc.recv.rollouts, rc.recv.n
    out.extra["n_scored"] = [len(ro.response_ids[q * n + j]) - (not bool(ro.truncated[q * n + j])
                                                                and len(ro.response_ids[q * n + j]) > 1)
                             for j in range(n)]
    _refuse_empty(out, q, f"policy {rc.name!r}")
    return out


def hacpo_metrics(rc: ReceiverContext, assign: dict) -> dict:
    """``hacpo/*``: every policy's capability P_k, the receiver's mean c(src→tgt) and mean baseline
    b over the prompts it pooled."""
    o = rc.opts
    out = {f"hacpo/capability/{n}": p for n, p in rc.caps.items()}
    cs, bs = [], []
    for q, s in sorted(assign.items()):
        sname = rc.names[s]
        c = hacpo_capability(rc.caps[sname], rc.caps[rc.name], o.hacpo_c_min, o.hacpo_c_max)
        cs.append(c)
        bs.append(hacpo_baseline(rc.recv.rewards[q].tolist(), rc.steps[sname].rewards[q].tolist(), c))
    if cs:
        out["hacpo/c"] = float(np.mean(cs))
        out["hacpo/baseline"] = float(np.mean(bs))
    return out


@REPLACEMENTS.register("hacpo", ModeSpec(metrics=hacpo_metrics))
def hacpo_group(rc: ReceiverContext, q: int, s: int | None) -> TrainBatch:
    o = rc.opts
    if s is None:
        out = _hacpo_own_rows(rc, q)
        if o.hacpo_peer_elsewhere == "zero":
            for si, sname in enumerate(rc.names):
                if si != rc.r:
                    out.extend(_hacpo_rows(rc, si, q, [0.0] * rc.steps[sname].n))
        return out
    src = rc.steps[rc.names[s]]
    c = hacpo_capability(rc.caps[rc.names[s]], rc.caps[rc.name], o.hacpo_c_min, o.hacpo_c_max)
    a_self, a_peer = hacpo_advantages(rc.recv.rewards[q].tolist(), src.rewards[q].tolist(), c, rc.eps)
    out = _hacpo_own_rows(rc, q, a_self)
    out.extend(_hacpo_rows(rc, s, q, a_peer, only=rc.success_only(s, q)))
    return out
