"""Exchange steps (registry ``EXCHANGES``): how the policies' step data becomes each policy's
TrainBatch. ``none`` is independent GRPO. Cross-model methods (GRAFT, HACPO, SGT, ...) register here.

An exchange is a class with:
- ``validate(cfg)`` (static): check ``cfg.exchange.params``; raise GraftError naming the key;
- ``select(steps, ctx) -> (batches, metrics)``: before scoring, build every policy's TrainBatch;
- ``admit(name, batch, ctx) -> (batch, metrics)``: after the receiver's old log-probs are known
  (``batch.old_logprobs``), weight or drop rows (e.g. GRAFT's compatibility gate);
- ``state_dict()``/``load_state_dict()`` for schedules that carry state across steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graft_cli.registry import Registry
from graft_cli.train.batch import PolicyStep, TrainBatch, self_batch

EXCHANGES: Registry = Registry("exchange")


@dataclass
class ExchangeContext:
    step: int
    seed: int
    params: dict
    tokenizers: dict  # policy name -> tokenizer
    encode_prompt: object  # callable (problem_text, policy_name) -> list[int]
    extra: dict = field(default_factory=dict)


class Exchange:
    def __init__(self, cfg=None):
        self.cfg = cfg

    @staticmethod
    def validate(cfg) -> None:
        if cfg.exchange.params:
            from graft_cli.errors import GraftError

            key = next(iter(cfg.exchange.params))
            raise GraftError(f"config key 'exchange.params.{key}': not used by exchange {cfg.exchange.name!r}")

    def select(self, steps: dict[str, PolicyStep], ctx: ExchangeContext):
        return {name: self_batch(s) for name, s in steps.items()}, {name: {} for name in steps}

    def admit(self, name: str, batch: TrainBatch, ctx: ExchangeContext):
        return batch, {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, st: dict) -> None:
        pass


EXCHANGES.register("none")(Exchange)

from graft_cli.algorithms.exchange import graft, graft_stored  # noqa: E402,F401  (register graft, graft_stored)
