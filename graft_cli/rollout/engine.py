"""The rollout-engine contract: the :class:`RolloutEngine` base class every engine (transformers,
vLLM, tandem) derives from, with each optional capability declared (and defaulted) here, so the
trainer, the config check and the evaluation read them as plain attributes.

An engine samples ``n`` responses for each prompt and returns :class:`graft_cli.batch.Rollouts`
(prompt-major: the responses of prompt ``i`` are rows ``i*n .. i*n+n-1``): the response token ids,
the decoded text, the per-token log-probabilities of the *processed* sampling distribution (after
temperature, top-k and top-p), and whether each response hit ``max_new_tokens`` without emitting
EOS. """

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from graft_cli.batch import Rollouts
from graft_cli.errors import GraftError
from graft_cli.models.lora import is_lora, merged_state_dict
from graft_cli.registry import Registry, validate_params

ENGINES: Registry = Registry("rollout engine")


@dataclass(frozen=True)
class SamplingParams:
    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 4096
    seed: int = 0
    top_k: int = 0  # the k most likely tokens, before top-p (transformers' and vLLM's order); 0 = off (vLLM: -1)


class RolloutEngine:
    """Base class of the engines (registry ``ENGINES``), built as ``cls(model, tokenizer,
    max_batch=..., **rollout.engine_kwargs)``. A subclass implements :meth:`generate` and declares
    what differs from the defaults:

    - ``options``: its ``rollout.engine_kwargs`` and their defaults (``choices``: option -> allowed
      values, a tuple or a registry); :meth:`check_kwargs` refuses any other key (``open_options``:
      further keys are passed on to the library, which checks them itself) and then calls
      :meth:`check_options` for the rules between them. Config validation runs it before anything
      loads.
    - ``exact_logprobs``: its log-probs are those of the trainer's fp32 forward
      (``algo.old_logprobs: auto`` may keep them as the old log-probs);
    - ``policy_logprobs``: its log-probs are the policy's own (False: a co-generating engine's are
      the writer's, so ``algo.old_logprobs: rollout`` is refused);
    - ``own_weights``: it samples from weights of its own, loaded by :meth:`sync_weights`, on
      resources that can run beside the trainer (an HF engine over a rollout replica of the policy,
      vLLM servers); at ``run.staleness`` >= 1 the next steps' rollouts are then generated while the
      trainer updates (graft_cli/train/rollouts.py). False: the engine shares the trainer's device or
      model, and sampling ahead runs in the trainer's thread, without overlap;
    - ``frozen_kwargs``: options that name a ``role: frozen`` model of the run (the trainer passes
      the loaded model);
    - ``solo_engine`` / ``own_kwargs``: the engine (and the options it drops) that samples a
      checkpoint alone in ``graft eval --run`` (None: this engine itself);
    - :meth:`eval_engine`: what validation during training samples from (default: itself);
    - :meth:`sync_weights`: make the engine sample from the model's current weights (default:
      nothing to copy);
    - :meth:`score`: log-probs of given responses under the weights it samples from (the sync
      check's probe);
    - :meth:`close`: release what it holds (default: nothing);
    - ``ranks_done``: in a data-parallel run, whether every rank has finished decoding (the run's
      process group: ``Dist.all_done``, whose failures read as one line), set by the trainer when it
      builds the engine; an engine that decodes in lock step across ranks asks it (None: a single
      process).
    """

    options: dict = {}
    choices: dict = {}
    open_options: bool = False
    exact_logprobs: bool = False
    policy_logprobs: bool = True
    own_weights: bool = False
    frozen_kwargs: tuple = ()
    solo_engine: str | None = None
    own_kwargs: tuple = ()
    ranks_done: Callable[[bool], bool] | None = None

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Rollouts:
        raise NotImplementedError

    def all_ranks_done(self, done: bool) -> bool:
        """Every rank done with its decode (:attr:`ranks_done`); asked each token by a lock-step
        decode."""
        if self.ranks_done is None:
            raise GraftError("a lock-step decode (an FSDP-sharded model over several ranks) needs the run's process "
                             "group: build the engine with the trainer's policies (train/policies.py)")
        return self.ranks_done(done)

    def sync_weights(self, model) -> None:
        """Make the engine sample from ``model``'s current weights (in-process engines share them:
        nothing to do)."""

    def score(self, prompt_ids: list[list[int]], response_ids: list[list[int]]) -> list[list[float]]:
        """Per-token log-probs (temperature 1) of each response after its prompt under the weights
        the engine samples from: the engine's side of the sync check
        (graft_cli/train/sync_check.py)."""
        raise NotImplementedError(f"the {type(self).__name__} engine cannot score token ids")

    def eval_engine(self) -> RolloutEngine:
        """The engine validation and solo evaluation sample from (a co-generating engine: its senior
        alone)."""
        return self

    def close(self) -> None:
        """Release what the engine holds (temporary folders, a library's workers)."""

    @classmethod
    def check_kwargs(cls, **kwargs) -> dict:
        """``rollout.engine_kwargs`` over :attr:`options`, checked: an unknown key or a wrong type
        raises a one-line GraftError naming the key, options that cannot work together
        (:meth:`check_options`) ``ValueError("rollout.engine_kwargs.<key>: <why>")``. Returns the
        options with their defaults."""
        given = dict(kwargs)
        extra = {} if not cls.open_options else {k: given.pop(k) for k in list(given) if k not in cls.options}
        opts = validate_params(cls.options, given, "rollout.engine_kwargs", f"engine {cls.__name__}", cls.choices)
        cls.check_options(opts)
        return {**opts, **extra}

    @classmethod
    def check_options(cls, opts: dict) -> None:
        """Rules between the engine's options (``ValueError("rollout.engine_kwargs.<key>:
        <why>")``)."""


def full_state_dict(model) -> dict:
    """The model's parameters and buffers as full tensors, for an engine that loads weights outside
    the trainer (gathers FSDP2 DTensors: collective, every rank calls it)."""
    if is_lora(model):  # the engine gets the adapted weights merged, under the base model's names
        return merged_state_dict(model)
    out = {}
    for k, v in model.state_dict().items():
        if hasattr(v, "full_tensor"):
            v = v.full_tensor()
        out[k] = v.detach()
    return out


def solo_engine(name: str, kwargs: dict) -> tuple[str, dict]:
    """The engine (and its options) that samples one model alone for engine ``name``: itself, or for
    a co-generating engine (one that declares ``solo_engine``, e.g. tandem -> hf) that engine with
    the co-generation options (``own_kwargs``) left out. Used by evaluation of a run's
    checkpoints."""
    cls = ENGINES.get(name)
    if cls.solo_engine is None:
        return name, dict(kwargs)
    return cls.solo_engine, {k: v for k, v in kwargs.items() if k not in cls.own_kwargs}
