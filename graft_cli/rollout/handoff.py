"""Who writes the next token of a co-generated (tandem) response: handoff schedules as pure tensor
functions (registry ``HANDOFFS``, ``rollout.engine_kwargs.schedule``; tandem.md §2.2, §2.10.4,
§2.11).

Every sequence of a batch carries a :class:`HandoffState`: ``senior`` (bool: the senior writes the
next token), ``since`` (tokens since the last redraw), ``draws`` (how many uniform draws the
sequence has used) and ``count`` (boundary tokens seen). A schedule is ``fn(state, tok, ctx) ->
state``: called once after each emitted token ``tok`` (whichever model emitted it), it gives the
author of the following token. All sequences move at once: no Python loop over sequences.

Randomness: each sequence has its own row of uniform draws ``ctx.uniforms[b, :]``, made up front
from a generator seeded by (sampling seed, row) (:func:`row_uniforms`); redraw ``k`` of sequence
``b`` reads ``uniforms[b, k]``. The draws therefore depend on the seed and the row only, never on
the other rows or the batch size, and a resumed run redraws exactly what the uninterrupted one did.

- ``word`` (the paper's default): ``senior ~ Bernoulli(p)`` at the start; after each token, ``since
  += 1`` and, if ``tok ∈ B`` (a token that opens a word: its string starts with the tokenizer's
  leading-space marker, :func:`word_boundary_ids`) or ``since >= max_gap_tokens`` (32), a redraw
  ``senior ~ Bernoulli(p)`` and ``since = 0``. A redraw may keep the author; the redraw comes
  *after* the word-opening token, so the new author may continue that word.
- ``bernoulli``: a redraw after every token (per-token Bernoulli(p)).
- ``alternating``: the senior writes first, the author toggles after every token.
- ``sentence``: the senior writes first, the author toggles after every token that ends a reasoning
  step (its string ends with ``delimiter``, default ``"\\n\\n"``; :func:`suffix_boundary_ids`): the
  senior writes while the count of boundary tokens so far is even (the vLLM fork's ``sentence``
  strategy; the handoff evaluation's strict alternation).
- ``chunk``: the senior writes first, the author toggles every ``chunk_size`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from graft_cli.registry import Registry

@dataclass(frozen=True)
class ScheduleSpec:
    """A handoff schedule's shape: ``random_start``, the first author is a Bernoulli(p) draw (else
    the senior); ``boundary``, the boundary set it reads (``word`` openings, ``suffix`` = step ends,
    None)."""

    random_start: bool = False
    boundary: str | None = None


HANDOFFS: Registry = Registry("handoff schedule", ScheduleSpec)
LEADING_SPACE_MARKERS = ("\u0120", "\u2581")  # byte-level BPE 'Ġ', SentencePiece '▁'


@dataclass
class HandoffState:
    senior: torch.Tensor  # (B,) bool: the senior writes the next token
    since: torch.Tensor  # (B,) long: tokens since the last redraw
    draws: torch.Tensor  # (B,) long: uniform draws used so far
    count: torch.Tensor  # (B,) long: boundary tokens seen so far


@dataclass
class HandoffContext:
    uniforms: torch.Tensor  # (B, D) float in [0, 1): each row's draws, in order
    boundary: torch.Tensor  # (V,) bool: boundary token ids of the schedule
    p_senior: float = 0.5
    max_gap_tokens: int = 32
    chunk_size: int = 32


def row_uniforms(seed: int, rows: list[int], num: int, device="cpu") -> torch.Tensor:
    """``(len(rows), num)`` uniforms; row ``r``'s come from a generator seeded by ``(seed, r)``
    only."""
    out = torch.empty((len(rows), num), dtype=torch.float64)
    for i, r in enumerate(rows):
        g = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(r) * 7_919 + 99_991) % (2**63 - 1))
        out[i] = torch.rand(num, generator=g, dtype=torch.float64)
    return out.to(device)


def _draw(state: HandoffState, ctx: HandoffContext, where: torch.Tensor) -> HandoffState:
    """Redraw ``senior ~ Bernoulli(p)`` on the rows ``where``; their ``since`` restarts at 0."""
    D = ctx.uniforms.shape[1]
    u = ctx.uniforms.gather(1, state.draws.clamp(max=D - 1)[:, None]).squeeze(1)
    senior = torch.where(where, u < ctx.p_senior, state.senior)
    return HandoffState(senior, torch.where(where, torch.zeros_like(state.since), state.since),
                        state.draws + where.long(), state.count)


def initial_state(schedule: str, ctx: HandoffContext, batch: int, device="cpu") -> HandoffState:
    """The author of each sequence's first token: a Bernoulli(p) draw for the random schedules, the
    senior for the deterministic ones (``alternating``, ``sentence``, ``chunk``)."""
    z = torch.zeros(batch, dtype=torch.long, device=device)
    st = HandoffState(torch.ones(batch, dtype=torch.bool, device=device), z, z.clone(), z.clone())
    if HANDOFFS.spec(schedule).random_start:
        st = _draw(st, ctx, torch.ones(batch, dtype=torch.bool, device=device))
    return st


def _register(name: str, random_start: bool, boundary: str | None = None):
    """Register schedule ``name`` with its :class:`ScheduleSpec`."""
    return HANDOFFS.register(name, ScheduleSpec(random_start, boundary))


@_register("word", random_start=True, boundary="word")
def word_handoff(state: HandoffState, tok: torch.Tensor, ctx: HandoffContext) -> HandoffState:
    """since += 1; redraw when tok ∈ B or since >= max_gap_tokens (tandem.md §2.2)."""
    st = HandoffState(state.senior, state.since + 1, state.draws, state.count + ctx.boundary[tok].long())
    return _draw(st, ctx, ctx.boundary[tok] | (st.since >= ctx.max_gap_tokens))


@_register("bernoulli", random_start=True)
def bernoulli_handoff(state: HandoffState, tok: torch.Tensor, ctx: HandoffContext) -> HandoffState:
    """A Bernoulli(p) redraw after every token."""
    return _draw(state, ctx, torch.ones_like(state.senior))


@_register("alternating", random_start=False)
def alternating_handoff(state: HandoffState, tok: torch.Tensor, ctx: HandoffContext) -> HandoffState:
    """The author toggles after every token."""
    return HandoffState(~state.senior, torch.zeros_like(state.since), state.draws, state.count)


@_register("sentence", random_start=False, boundary="suffix")
def sentence_handoff(state: HandoffState, tok: torch.Tensor, ctx: HandoffContext) -> HandoffState:
    """The senior writes while the count of boundary tokens (ending with the delimiter) is even."""
    count = state.count + ctx.boundary[tok].long()
    return HandoffState(count % 2 == 0, state.since + 1, state.draws, count)


@_register("chunk", random_start=False)
def chunk_handoff(state: HandoffState, tok: torch.Tensor, ctx: HandoffContext) -> HandoffState:
    """The author toggles every ``chunk_size`` tokens."""
    since = state.since + 1
    flip = since >= ctx.chunk_size
    return HandoffState(state.senior ^ flip, torch.where(flip, torch.zeros_like(since), since), state.draws,
                        state.count)


# ------------------------------------------------------------------------------------ boundary sets
def token_strings(tokenizer) -> list[str]:
    """Each id's surface string as the vocabulary stores it (``convert_ids_to_tokens``; '' for
    unknown ids)."""
    n = max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1)
    toks = tokenizer.convert_ids_to_tokens(list(range(n)))
    return [t if isinstance(t, str) else "" for t in toks]


def word_boundary_ids(tokenizer) -> torch.Tensor:
    """B of the ``word`` schedule: the ids whose vocabulary string starts with a leading-space
    marker (``Ġ`` for byte-level BPE, ``▁`` for SentencePiece; on Qwen3 53,021 of ~151k ids), or,
    for a tokenizer with neither (a character vocabulary), whose decoded string starts with a space.
    Special tokens are never boundaries. Computed once per engine from the vocabulary."""
    strings = token_strings(tokenizer)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    marked = [i for i, s in enumerate(strings) if s[:1] in LEADING_SPACE_MARKERS]
    if marked:
        ids = marked
    else:
        texts = tokenizer.batch_decode([[i] for i in range(len(strings))])
        ids = [i for i, t in enumerate(texts) if t.startswith(" ")]
    out = torch.zeros(len(strings), dtype=torch.bool)
    out[[i for i in ids if i not in special]] = True
    return out


def suffix_boundary_ids(tokenizer, delimiter: str = "\n\n") -> torch.Tensor:
    """B of the ``sentence`` schedule: ids whose decoded string ends with ``delimiter``."""
    n = len(token_strings(tokenizer))
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    texts = tokenizer.batch_decode([[i] for i in range(n)])
    out = torch.zeros(n, dtype=torch.bool)
    out[[i for i, t in enumerate(texts) if i not in special and t.endswith(delimiter)]] = True
    return out


def boundary_for(schedule: str, tokenizer, delimiter: str = "\n\n") -> torch.Tensor:
    """The boundary set schedule ``schedule`` declares (word openings, step ends, or none)."""
    kind = HANDOFFS.spec(schedule).boundary
    if kind == "word":
        return word_boundary_ids(tokenizer)
    if kind == "suffix":
        return suffix_boundary_ids(tokenizer, delimiter)
    return torch.zeros(len(token_strings(tokenizer)), dtype=torch.bool)
