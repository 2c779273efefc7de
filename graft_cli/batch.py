"""Per-step data structures shared by every layer: ``Rollouts`` (what an engine samples),
``PolicyStep`` and ``TrainBatch``.

``PolicyStep`` is one policy's (or one stored source's) rollouts on the shared prompt batch with
rewards and advantages. ``TrainBatch`` is what a policy is optimised on: one row per response (self,
peer or teacher), with the receiver's token ids, a scalar advantage, a weight, a source tag and a
group id (the prompt's index in the step batch), plus the per-token signals the loss reads:

- ``loss_mask`` (optional, per row a list over response tokens; ``None`` = every response token):
  which tokens carry gradient (tandem RLVR trains on the senior's tokens only); it also sets each
  row's token count in the loss denominators;
- ``token_adv`` (optional, per row a list over response tokens or ``None`` for the row's scalar
  advantage broadcast): per-token advantages (OPD, truncated-IS-weighted advantages);
- ``in_pg`` (per row): whether the row counts in the policy-gradient denominators (Σ|o_j|, N); rows
  with ``False`` are auxiliary (e.g. SGT's NLL rows) and only the losses that use them see them;
- ``extra``: further per-row columns by name (scorer outputs such as ``ref_logprobs``, exchange
  columns).

Exchanges and registered signal functions fill these columns; the trainer only scores, schedules and
optimises them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from graft_cli.data.problems import Problem

CORRECT_ABOVE = 0.5  # a reward above this is a correct response (verifiable rewards are 0 or 1)


def is_correct(reward):
    """Whether a reward (a float, or elementwise an array or tensor of them) marks a correct
    response."""
    return reward > CORRECT_ABOVE


@dataclass
class Rollouts:
    """What a rollout engine returns for ``B`` prompts sampled ``n`` times (prompt-major: the
    responses of prompt ``i`` are rows ``i*n .. i*n+n-1``): response token ids, decoded text, the
    per-token log-probabilities of the *processed* sampling distribution (after temperature, top-k
    and top-p), and whether each response hit ``max_new_tokens`` without emitting EOS."""

    prompt_ids: list[list[int]]  # one per prompt (B)
    response_ids: list[list[int]]  # B*n, prompt-major; includes the EOS token when one was emitted
    texts: list[str]  # B*n, decoded with skip_special_tokens=True
    logprobs: list[list[float]]  # B*n, one per response token (processed distribution)
    truncated: list[bool]  # B*n: hit max_new_tokens without EOS
    n: int = 1
    meta: dict = field(default_factory=dict)  # per-row lists (e.g. "extracted") and "metrics" (engine metrics)
    token_columns: dict = field(default_factory=dict)  # name -> B*n per-token lists (tandem: "author")

    @property
    def num_prompts(self) -> int:
        return len(self.prompt_ids)

    def __len__(self) -> int:
        return len(self.response_ids)


@dataclass
class PolicyStep:
    name: str
    problems: list[Problem]
    prompt_ids: list[list[int]]  # this policy's own encoding of each prompt (B)
    rollouts: Rollouts
    rewards: torch.Tensor  # (B, n) float
    advantages: torch.Tensor  # (B, n) float, computed over the full group
    timed_out: np.ndarray | None = None  # (B*n,) bool: reward grading timed out
    version: int = 0  # the weights it was sampled with: how many updates they had had (train/rollouts.py)

    @property
    def k(self) -> torch.Tensor:
        """Successes per prompt k(q) (:func:`is_correct` responses)."""
        return is_correct(self.rewards).sum(-1)

    @property
    def n(self) -> int:
        return self.rollouts.n


@dataclass
class TrainBatch:
    prompt_ids: list[list[int]] = field(default_factory=list)
    response_ids: list[list[int]] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    source: list[str] = field(default_factory=list)
    group: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    rollout_logprobs: list[list[float] | None] = field(default_factory=list)  # receiver's engine, self rows
    source_logp_mean: list[float] = field(default_factory=list)  # mean source log-prob on source tokens (s)
    texts: list[str] = field(default_factory=list)
    old_logprobs: list[list[float]] | None = None  # filled by the trainer's scoring pass
    in_pg: list[bool] = field(default_factory=list)  # row counts in the policy-gradient denominators
    token_adv: list | None = None  # optional per-row per-token advantages (None entries: scalar broadcast)
    loss_mask: list | None = None  # optional per-row per-token 0/1 mask (None entries: every response token)
    extra: dict = field(default_factory=dict)  # further per-row columns by name

    COLUMNS = ("prompt_ids", "response_ids", "advantages", "weights", "source", "group", "rewards",
               "rollout_logprobs", "source_logp_mean", "texts", "in_pg")
    OPTIONAL = ("old_logprobs", "token_adv", "loss_mask")
    DEFAULTS = {"source_logp_mean": math.nan, "in_pg": True}

    def __len__(self) -> int:
        return len(self.response_ids)

    def append(self, **row) -> None:
        for c in self.COLUMNS:
            getattr(self, c).append(row.pop(c, self.DEFAULTS.get(c)))
        for k, v in row.items():
            self.extra.setdefault(k, [None] * (len(self) - 1)).append(v)
        for col in self.extra.values():
            if len(col) < len(self):
                col.append(None)

    def select(self, idx: list[int]) -> "TrainBatch":
        out = TrainBatch()
        for c in self.COLUMNS:
            col = getattr(self, c)
            setattr(out, c, [col[i] for i in idx])
        for c in self.OPTIONAL:
            col = getattr(self, c)
            setattr(out, c, None if col is None else [col[i] for i in idx])
        out.extra = {k: [v[i] for i in idx] for k, v in self.extra.items()}
        return out

    def extend(self, other: "TrainBatch") -> None:
        n_before = len(self)
        for c in self.COLUMNS:
            getattr(self, c).extend(getattr(other, c))
        for c in self.OPTIONAL:
            mine, theirs = getattr(self, c), getattr(other, c)
            if mine is not None or theirs is not None:
                setattr(self, c, (mine if mine is not None else [None] * n_before)
                        + (theirs if theirs is not None else [None] * len(other)))
        for k in set(self.extra) | set(other.extra):
            self.extra.setdefault(k, [None] * n_before).extend(other.extra.get(k, [None] * len(other)))

    @property
    def is_peer(self) -> list[bool]:
        """Per row: a peer row (another policy's response: ``source`` is not ``"self"``;
        docs/glossary.md)."""
        return [s != "self" for s in self.source]

    def peer_rows(self) -> list[int]:
        """The indices of the peer rows."""
        return [i for i, s in enumerate(self.source) if s != "self"]

    def mask_of(self, i: int) -> list[float]:
        """Row i's loss mask over its response tokens (every token when no mask is set)."""
        m = None if self.loss_mask is None else self.loss_mask[i]
        return [1.0] * len(self.response_ids[i]) if m is None else list(m)


def self_batch(step: PolicyStep) -> TrainBatch:
    """The plain GRPO batch: every response of the policy's own groups."""
    b = TrainBatch()
    ro, n = step.rollouts, step.n
    for i in range(len(step.problems)):
        for j in range(n):
            r = i * n + j
            b.append(prompt_ids=step.prompt_ids[i], response_ids=ro.response_ids[r],
                     advantages=float(step.advantages[i, j]), weights=1.0, source="self", group=i,
                     rewards=float(step.rewards[i, j]), rollout_logprobs=ro.logprobs[r], texts=ro.texts[r],
                     **{k: v[r] for k, v in ro.token_columns.items()})  # engine columns (tandem: author)
    return b


def micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Greedy split of row indices (kept in order) so that each micro-batch's padded size
    (rows x longest row) stays within ``token_budget`` (at least one row per micro-batch)."""
    out, cur, longest = [], [], 0
    for i, n in enumerate(lengths):
        new_longest = max(longest, n)
        if cur and new_longest * (len(cur) + 1) > token_budget:
            out.append(cur)
            cur, new_longest = [], n
        cur.append(i)
        longest = new_longest
    if cur:
        out.append(cur)
    return out


def prefix_cost(prompt_keys: list, prompt_lens: list[int], response_lens: list[int], rows: list[int]) -> int:
    """Padded tokens of one shared-prompt micro-batch: ``distinct prompts x longest prompt + rows x
    (longest response - 1)``, the prompt pass and the response pass of
    :func:`graft_cli.models.logprobs.shared_prefix_hidden`."""
    u = len({prompt_keys[i] for i in rows})
    return u * max(prompt_lens[i] for i in rows) + len(rows) * max(max(response_lens[i] for i in rows) - 1, 0)


def prefix_micro_batches(prompt_keys: list, prompt_lens: list[int], response_lens: list[int],
                         token_budget: int) -> list[list[int]]:
    """Micro-batches of row indices for the shared-prompt forward (``optim.shared_prefix``): each
    micro-batch runs its distinct prompts once. Two row orders are split greedily (a row joins the
    current micro-batch while :func:`prefix_cost` stays within ``token_budget``; at least one row
    each), and the plan with fewer padded tokens in all is kept (ties: the first):

    1. group-major: a prompt's rows together (each prompt runs once), prompt groups in order of
       their longest response, rows within a group by response length — best when a group's
       responses are of like length;
    2. by response length across groups (a prompt runs once per micro-batch it has rows in) — best
       when the lengths within a group spread, as padding to the group's longest response would cost
       more than the prompts saved."""
    groups: dict = {}
    for i, k in enumerate(prompt_keys):
        groups.setdefault(k, []).append(i)
    group_major = [i for rows in sorted(groups.values(), key=lambda rows: max(response_lens[i] for i in rows))
                   for i in sorted(rows, key=lambda i: response_lens[i])]
    by_length = sorted(range(len(prompt_keys)), key=lambda i: response_lens[i])

    def greedy(order: list[int]) -> tuple[int, list[list[int]]]:
        out: list[list[int]] = []
        total = cost = 0
        keys: set = set()
        plong = rlong = 0
        for i in order:  # prefix_cost of out[-1] + [i], kept incrementally
            k, p, r = prompt_keys[i], max(plong, prompt_lens[i]), max(rlong, response_lens[i])
            new = (len(keys) + (k not in keys)) * p + (len(out[-1]) + 1 if out else 1) * max(r - 1, 0)
            if out and new <= token_budget:
                out[-1].append(i)
            else:
                total += cost
                out.append([i])
                keys, p, r = set(), prompt_lens[i], response_lens[i]
                new = p + max(r - 1, 0)
            keys.add(k)
            plong, rlong, cost = p, r, new
        return total + cost, out

    return min(greedy(group_major), greedy(by_length), key=lambda plan: plan[0])[1]


def plan_micro_batches(prompts: list[list[int]], responses: list[list[int]], token_budget: int,
                       shared_prefix: bool = False, sort: bool = True) -> list[list[int]]:
    """Row indices split into forward micro-batches within ``token_budget`` padded tokens: rows of
    one prompt together (``shared_prefix``, :func:`prefix_micro_batches`), else length-sorted
    (``sort``: each micro-batch pads to a length close to its rows'), else in order
    (:func:`micro_batches`)."""
    if shared_prefix:
        return prefix_micro_batches([tuple(p) for p in prompts], [len(p) for p in prompts],
                                    [len(r) for r in responses], token_budget)
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    order = sorted(range(len(lengths)), key=lambda i: lengths[i]) if sort else list(range(len(lengths)))
    return [[order[i] for i in m] for m in micro_batches([lengths[i] for i in order], token_budget)]


def cat_groups(parts: list[tuple[PolicyStep, list[int]]], limit: int | None = None) -> PolicyStep:
    """Concatenate chosen prompt groups of several PolicySteps of one policy (rounds of dynamic
    sampling), in order, keeping at most ``limit`` groups: problems, prompt ids, rollouts, rewards,
    advantages."""
    chosen = [(st, q) for st, qs in parts for q in qs][: limit if limit is not None else None]
    first = parts[0][0]
    n = first.n
    rows = [(st, q * n + j) for st, q in chosen for j in range(n)]
    ro = Rollouts(prompt_ids=[st.rollouts.prompt_ids[q] for st, q in chosen],
                  response_ids=[st.rollouts.response_ids[r] for st, r in rows],
                  texts=[st.rollouts.texts[r] for st, r in rows],
                  logprobs=[st.rollouts.logprobs[r] for st, r in rows],
                  truncated=[st.rollouts.truncated[r] for st, r in rows], n=n)
    for key in first.rollouts.meta:
        if key != "metrics":
            ro.meta[key] = [st.rollouts.meta[key][r] for st, r in rows]
    for key in first.rollouts.token_columns:
        ro.token_columns[key] = [st.rollouts.token_columns[key][r] for st, r in rows]
    empty = torch.zeros((0, n), dtype=first.rewards.dtype)
    rewards = torch.stack([st.rewards[q] for st, q in chosen]) if chosen else empty
    adv = torch.stack([st.advantages[q] for st, q in chosen]) if chosen else empty.clone()
    timed = None
    if first.timed_out is not None:
        timed = np.asarray([bool(st.timed_out[r]) for st, r in rows], dtype=bool)
    return PolicyStep(first.name, [st.problems[q] for st, q in chosen], [st.prompt_ids[q] for st, q in chosen], ro,
                      rewards, adv, timed)
