"""The rollout-engine protocol: what every engine (transformers, vLLM, tandem) returns.

An engine samples ``n`` responses for each prompt (prompt-major order: responses of prompt ``i`` are
rows ``i*n .. i*n+n-1``) and returns the response token ids, the decoded text, the per-token
log-probabilities of the *processed* sampling distribution (after temperature and top-p), and whether
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


@dataclass
class Rollouts:
    prompt_ids: list[list[int]]  # one per prompt (B)
    response_ids: list[list[int]]  # B*n, prompt-major; includes the EOS token when one was emitted
    texts: list[str]  # B*n, decoded with skip_special_tokens=True
    logprobs: list[list[float]]  # B*n, one per response token (processed distribution)
    truncated: list[bool]  # B*n: hit max_new_tokens without EOS
    n: int = 1
    meta: dict = field(default_factory=dict)

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
