"""The exchange interface (registry ``EXCHANGES``): how the policies' step data becomes each
policy's TrainBatch. ``none`` is independent GRPO. Cross-model methods (GRAFT, HACPO, SGT, ...)
register here.

An exchange is a class with:
- ``resolve(cfg)`` (class method): write into the config what the exchange implies (policies it does
  not train, sources it reads, parameters it infers); idempotent; nothing by default;
- ``validate(cfg)`` (class method): check ``cfg.exchange.params`` without changing anything; raise
  GraftError naming the key;
- ``select(steps, ctx) -> (batches, metrics)``: before scoring, build the TrainBatch of every
  receiver (``ctx.receiver_names``: the trained policies; ``steps`` may also hold stored sources'
  steps), encoding prompts and scoring rows through ``ctx.receivers`` (:class:`Receivers`);
- ``admit(name, batch, ctx) -> (batch, metrics)``: after the receiver's old log-probs are known
  (``batch.old_logprobs``), weight or drop rows (e.g. GRAFT's compatibility gate) in a new batch,
  the given one unchanged;
- ``state_dict()``/``load_state_dict()`` for schedules that carry state across steps;
- ``admission_log(name) -> columns | None``: per transferred row of receiver ``name``'s last
  ``admit`` (kept or dropped), columns for the trainer's exchange log
  (``rollouts/<name>/exchange_step_N.parquet``); ``None``: no log;
- ``step_text(row) -> str``: what the run's one-line step summary says of the exchange for one
  policy's metrics row (read from the metrics the exchange wrote into it); ``""``: nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from graft_cli.batch import PolicyStep, TrainBatch, self_batch
from graft_cli.errors import GraftError
from graft_cli.registry import Params, Registry

EXCHANGES: Registry = Registry("exchange", Params)  # spec: its exchange.params, a Params holding their defaults


ScoreFn = Callable[[str, TrainBatch], list]  # (policy name, rows) -> per-row token log-probs under its weights


class Receivers(Protocol):
    """What an exchange may ask of the trained policies: a policy's prompt encoding and its trainer
    forward on rows (:class:`graft_cli.train.policy_stages.PolicyReceivers` in a run)."""

    def encode(self, text: str, name: str) -> list[int]:
        """Problem ``text`` as policy ``name``'s prompt token ids."""
        ...

    def score(self, name: str, batch: TrainBatch) -> list:
        """Per-row token log-probs of ``batch`` under policy ``name``'s current weights (no
        grad)."""
        ...


@dataclass
class ReceiverFunctions:
    """:class:`Receivers` made of two functions, for callers without a trainer (tests, benchmarks);
    without ``score_fn`` a call to :meth:`score` stops with one line."""

    encode_fn: Callable[[str, str], list]  # (problem text, policy name) -> prompt token ids
    score_fn: ScoreFn | None = None

    def encode(self, text: str, name: str) -> list[int]:
        return self.encode_fn(text, name)

    def score(self, name: str, batch: TrainBatch) -> list:
        if self.score_fn is None:
            raise GraftError("scoring rows under a policy's weights (Receivers.score) is not available to this "
                             "caller")
        return self.score_fn(name, batch)


@dataclass
class ExchangeContext:
    """What an exchange sees of the trainer in one step."""

    step: int
    seed: int
    tokenizers: dict  # policy name -> tokenizer
    receivers: Receivers  # the trained policies' prompt encoding and scoring
    receiver_names: list | None = None  # the policies that train (None: every policy in ``steps``)


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
        names = [n for n in steps if ctx.receiver_names is None or n in ctx.receiver_names]
        return {n: self_batch(steps[n]) for n in names}, {n: {} for n in names}

    def admit(self, name: str, batch: TrainBatch, ctx: ExchangeContext):
        return batch, {}

    def admission_log(self, name: str) -> dict | None:
        return None

    def step_text(self, row: dict) -> str:
        return ""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, st: dict) -> None:
        pass


EXCHANGES.register("none")(Exchange)


def exchange_params(section) -> Params | None:
    """The typed ``exchange.params`` of a config's ``exchange`` section as a run wrote it (a
    mapping, such as a run's ``config.yaml`` read back, or the config's own section): the values it
    holds over the defaults registered for its exchange (:meth:`Params.read`). None when the section
    names no registered exchange."""
    get = section.get if isinstance(section, dict) else lambda k: getattr(section, k, None)
    name = get("name") if section is not None else None
    if not isinstance(name, str) or name not in EXCHANGES:
        return None
    return type(EXCHANGES.spec(name)).read(get("params"))
