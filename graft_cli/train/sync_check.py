"""Proof that a rollout engine samples from the weights being trained (``run.sync_check``).

The commonest silent failure of a trainer with a separate rollout engine is a sync that did not
happen: the engine keeps sampling from the base model or a stale adapter, the run goes on with wrong
importance ratios and no error. After each sync (``every``; ``first``: the first only; ``off``), a
fixed **probe** — a few training prompts, each with its reference answer as the response, chosen
before step 1 — is scored by the engine (:meth:`graft_cli.rollout.engine.RolloutEngine.score`) and
by the trainer's forward. The probe gap is

    gap = mean over the probe's response tokens t of | log p_engine(o_t | ·) - log p_trainer(o_t |
    ·) |

in nats per token, both at temperature 1. A gap above ``run.sync_tolerance`` (default by
``run.dtype``: :data:`TOLERANCE`) stops the run in one line naming the policy, the engine and the
gap; every check's gap is the metric ``sync/gap`` (its cost ``time/sync_check``). """

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from graft_cli.errors import GraftError
from graft_cli.models.logprobs import pack, response_logprobs

# nats per token: float32 engines agree with the trainer to rounding (the HF engine: exactly); bf16
# kernels differ
TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 5e-2}


@dataclass(frozen=True)
class Probe:
    """The token ids the engine and the trainer score: ``prompts[i]`` followed by
    ``responses[i]``."""

    prompts: tuple
    responses: tuple


def make_probe(prompt_ids: list[list[int]], answers: list[str], tokenizer) -> Probe:
    """A probe of these prompts, each answered by its reference answer (``\\boxed{answer}`` and
    EOS)."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    responses = [tokenizer.encode(f" \\boxed{{{a}}}", add_special_tokens=False) + eos for a in answers]
    return Probe(tuple(tuple(p) for p in prompt_ids), tuple(tuple(r) for r in responses))


@torch.no_grad()
def trainer_logprobs(model, pad_id: int, probe: Probe) -> list[list[float]]:
    """Per-token log-probs of the probe's responses under ``model`` at temperature 1 (eval mode,
    restored)."""
    was = model.training
    model.eval()
    try:
        dev = next(model.parameters()).device
        prompts, responses = [list(p) for p in probe.prompts], [list(r) for r in probe.responses]
        ids, att, resp = pack(prompts, responses, pad_id, dev)
        lp, _ = response_logprobs(model, ids, att, resp)
    finally:
        model.train(was)
    return [lp[i, len(p) - 1: len(p) - 1 + len(r)].tolist() for i, (p, r) in enumerate(zip(prompts, responses))]


def probe_gap(engine_lp: list[list[float]], trainer_lp: list[list[float]]) -> float:
    """Mean absolute difference over every response token (module docstring); a length mismatch is a
    broken engine (infinite gap)."""
    diffs = []
    for e, t in zip(engine_lp, trainer_lp, strict=True):
        if len(e) != len(t):
            return float("inf")
        diffs += [abs(a - b) for a, b in zip(e, t)]
    return sum(diffs) / max(len(diffs), 1)


def tolerance(dtype: str, given: float | None) -> float:
    return float(given) if given is not None else TOLERANCE[dtype]


def check(name: str, engine, model, pad_id: int, probe: Probe, tol: float, engine_name: str, step: int) -> dict:
    """The probe gap of policy ``name`` after the sync of ``step``; over ``tol``: one line, the run
    stops."""
    return check_against(name, engine, trainer_logprobs(model, pad_id, probe), probe, tol, engine_name, step)


def check_against(name: str, engine, trainer_lp: list[list[float]], probe: Probe, tol: float, engine_name: str,
                  step: int) -> dict:
    """:func:`check` against trainer log-probs taken earlier (when the engine was given the weights
    they came from: a rollout replica loaded later, train/rollouts.py)."""
    gap = probe_gap(engine.score([list(p) for p in probe.prompts], [list(r) for r in probe.responses]), trainer_lp)
    if not gap <= tol:
        raise GraftError(f"policy {name!r}: the {engine_name} engine does not sample from the trained weights after "
                         f"the weight sync of step {step}: its log-probs of the sync probe differ from the trainer's "
                         f"by {gap:.3g} nats/token (run.sync_tolerance {tol:g}; run.sync_check)")
    return {"sync/gap": gap}


class SyncCheck:
    """``run.sync_check`` for a run's policies: ``probe(name, ...)`` once per policy before step 1,
    then ``self(name, policy, step)`` after each of its weight syncs returns the metrics
    (``sync/gap``) or stops the run. ``enabled`` False (data-parallel processes) or an engine that
    cannot score token ids (a warning) turn it off."""

    def __init__(self, mode: str, tol: float, engine_name: str, warn, enabled: bool = True):
        self.mode, self.tol, self.engine_name, self.warn = mode, tol, engine_name, warn
        self.on = enabled and mode != "off"
        self.probes: dict[str, Probe] = {}
        self.checked: set = set()

    def probe(self, name: str, prompt_ids: list[list[int]], answers: list[str], tokenizer) -> None:
        self.probes[name] = make_probe(prompt_ids, answers, tokenizer)

    def __call__(self, name: str, policy, step: int) -> dict:
        return self.compare(name, policy.engine, self.expected(name, policy), step)

    def expected(self, name: str, policy) -> tuple[list, float] | None:
        """The trainer's log-probs of ``name``'s probe under ``policy.model`` now, and their cost in
        seconds; None when no check is due (off, or ``first`` after the first)."""
        if not self.on or (self.mode == "first" and name in self.checked):
            return None
        self.checked.add(name)
        t0 = time.perf_counter()
        lp = trainer_logprobs(policy.model, policy.tokenizer.pad_token_id, self.probes[name])
        return lp, time.perf_counter() - t0

    def compare(self, name: str, engine, expected: tuple[list, float] | None, step: int) -> dict:
        """The probe gap of ``engine`` against the trainer's log-probs ``expected``
        (:meth:`expected`, taken when the weights the engine was given were the trainer's) after the
        sync of ``step``; over the tolerance: one line, the run stops."""
        if expected is None or not self.on:
            return {}
        t0 = time.perf_counter()
        try:
            m = check_against(name, engine, expected[0], self.probes[name], self.tol, self.engine_name, step)
        except NotImplementedError as e:
            self.warn(f"run.sync_check: off: {e}")
            self.on = False
            return {}
        return {**m, "time/sync_check": time.perf_counter() - t0 + expected[1]}
