"""The exchange interface (registry ``EXCHANGES``): how the policies' step data becomes each policy's
TrainBatch. ``none`` is independent GRPO. Cross-model methods (GRAFT, HACPO, SGT, ...) register here.

An exchange is a class with:
- ``resolve(cfg)`` (class method): write into the config what the exchange implies (policies it does not train,
  sources it reads, parameters it infers); idempotent; nothing by default;
- ``validate(cfg)`` (class method): check ``cfg.exchange.params`` without changing anything; raise GraftError
  naming the key;
- ``select(steps, ctx) -> (batches, metrics)``: before scoring, build the TrainBatch of every receiver
  (``ctx.receivers``: the trained policies; ``steps`` may also hold stored sources' steps);
- ``admit(name, batch, ctx) -> (batch, metrics)``: after the receiver's old log-probs are known
  (``batch.old_logprobs``), weight or drop rows (e.g. GRAFT's compatibility gate);
- ``state_dict()``/``load_state_dict()`` for schedules that carry state across steps;
- ``admission_log(name) -> columns | None``: per transferred row of receiver ``name``'s last ``admit`` (kept or
  dropped), columns for the trainer's exchange log (``rollouts/<name>/exchange_step_N.parquet``); ``None``: no log.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from graft_cli.batch import PolicyStep, TrainBatch, self_batch
from graft_cli.errors import GraftError
from graft_cli.registry import Registry

EXCHANGES: Registry = Registry("exchange")


ScoreFn = Callable[[str, TrainBatch], list]  # (policy name, rows) -> per-row token log-probs under its weights


@dataclass
class ExchangeContext:
    """What an exchange sees of the trainer in one step."""

    step: int
    seed: int
    params: dict
    tokenizers: dict  # policy name -> tokenizer
    encode_prompt: Callable[[str, str], list]  # (problem text, policy name) -> prompt token ids
    score_logprobs: ScoreFn | None = None  # a policy's trainer forward on rows (no grad); None: not available
    receivers: list | None = None  # the policies that train (None: every policy in ``steps``)


class Exchange:
    def __init__(self, cfg=None):
        self.cfg = cfg

    @classmethod
    def resolve(cls, cfg) -> None:
        pass

    @classmethod
    def validate(cls, cfg) -> None:
        if cfg.exchange.params:
            key = next(iter(cfg.exchange.params))
            raise GraftError(f"config key 'exchange.params.{key}': not used by exchange {cfg.exchange.name!r}")

    def select(self, steps: dict[str, PolicyStep], ctx: ExchangeContext):
        names = [n for n in steps if ctx.receivers is None or n in ctx.receivers]
        return {n: self_batch(steps[n]) for n in names}, {n: {} for n in names}

    def admit(self, name: str, batch: TrainBatch, ctx: ExchangeContext):
        return batch, {}

    def admission_log(self, name: str) -> dict | None:
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, st: dict) -> None:
        pass


EXCHANGES.register("none")(Exchange)
