"""The rollout-engine protocol: what every engine (transformers, vLLM, tandem) returns.

An engine samples ``n`` responses for each prompt (prompt-major order: responses of prompt ``i`` are
rows ``i*n .. i*n+n-1``) and returns the response token ids, the decoded text, the per-token
log-probabilities of the *processed* sampling distribution (after temperature, top-k and top-p), and whether
each response hit ``max_new_tokens`` without emitting EOS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from graft_cli.registry import Registry

ENGINES: Registry = Registry("rollout engine")


@dataclass(frozen=True)
class SamplingParams:
    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 4096
    seed: int = 0
    top_k: int = 0  # the k most likely tokens, before top-p (transformers' and vLLM's order); 0 = off (vLLM: -1)


@dataclass
class Rollouts:
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


class RolloutEngine(Protocol):
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts: ...

    def sync_weights(self, model) -> None:
        """Make the engine sample from ``model``'s current weights (a no-op for in-process HF)."""
        ...

    # optional: ``eval_engine()`` -> the engine validation and solo evaluation sample from (default: itself;
    # the tandem engine returns its senior alone); ``frozen_kwargs``: engine options that name a frozen model


def solo_engine(name: str, kwargs: dict) -> tuple[str, dict]:
    """The engine (and its options) that samples one model alone for engine ``name``: itself, or for a
    co-generating engine (one that declares ``solo_engine``, e.g. tandem -> hf) that engine with the
    co-generation options (``own_kwargs``) left out. Used by evaluation of a run's checkpoints."""
    cls = ENGINES.get(name)
    solo = getattr(cls, "solo_engine", None)
    if solo is None:
        return name, dict(kwargs)
    return solo, {k: v for k, v in kwargs.items() if k not in getattr(cls, "own_kwargs", ())}
