"""Grading: the rewards a run is trained and evaluated with, and the registry ``REWARDS`` that names
them.

A registered reward is a factory taking the ``reward:`` section's options by keyword and returning a
:class:`Grader`; :func:`make_grader` builds the one a section names. The modules of the package:

* :mod:`graft_cli.reward.answers`: the math answer rule (the last boxed answer, equivalent to the
  gold under math-verify), one answer in this process;
* :mod:`graft_cli.reward.pool`: grading in worker processes with a hard timeout per answer
  (:class:`MathVerifyGrader`, the :class:`Grades` every grader returns); the code grader reuses its
  pool;
* the code reward (``reward.name=code``, imported when asked for):
  :mod:`graft_cli.reward.code_grader` (the grader, its workers), :mod:`graft_cli.reward.programs`
  (the program of a response, the test spec of a gold), :mod:`graft_cli.reward.harness` (what runs
  in the sandbox), :mod:`graft_cli.reward.verdicts` (a run's verdict),
  :mod:`graft_cli.reward.convert` (assert-kind tests turned into call-kind ones);
* the sandbox a code answer runs in: :mod:`graft_cli.reward.sandbox` (one supervised run),
  :mod:`graft_cli.reward.supervise` (the supervisor's side of a run: input, capped output, deadline),
  :mod:`graft_cli.reward.confine` (the kernel's confinement primitives) and
  :mod:`graft_cli.reward.seccomp` (the system-call filter).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
from typing import Protocol

import numpy as np

from graft_cli.errors import GraftError
from graft_cli.registry import Registry
from graft_cli.reward.answers import last_boxed
from graft_cli.reward.pool import Grades, MathVerifyGrader

# a registered reward is a factory taking the ``reward:`` section's options by keyword (make_grader
# passes each factory only those its signature names, or all to one with ``**kwargs``) and returning
# a :class:`Grader`
REWARDS: Registry = Registry("reward")


class Grader(Protocol):
    """What a registered reward returns. ``start`` readies its workers (the trainer calls it before
    step 1, so a reward that cannot run on the machine stops the run there) and returns the grader;
    ``grade`` scores responses against their golds; ``close`` stops what ``start`` started."""

    def start(self, wait: bool = True) -> Grader: ...

    def grade(self, responses: list[str], golds: list) -> Grades: ...

    def close(self) -> None: ...


@REWARDS.register("math_verify")
def make_math_verify(num_workers: int = 2, timeout_s: float = 5.0, chunk_size: int = 64, sci_notation: bool = True,
                     memory_mb: int = 4096) -> MathVerifyGrader:
    """Binary math-verify reward on the last boxed answer, graded in worker processes (each capped
    at ``memory_mb`` MiB of address space; 0 = no cap)."""
    return MathVerifyGrader(num_workers=num_workers, timeout_s=timeout_s, chunk_size=chunk_size,
                            sci_notation=sci_notation, memory_mb=memory_mb)


class CoinFlipGrader:
    """A benchmark-only reward: 1.0 for about a share ``p`` of the responses, decided by a hash of
    (response, gold), so random-weight models (``run.model_init: random``) still give mixed groups.
    At ``p`` = 0.5 a group of 8 is all-fail 1 time in 256, so GRAFT's exchange has nothing to graft;
    ``p`` = 0.2 (``reward.coinflip_p``) leaves (0.8)^8 ~ 17% of groups all-fail with a peer group
    that has a success ~83% of the time, and the exchange runs. Never a measure of anything."""

    def __init__(self, p: float = 0.5, **_):
        self.p = float(p)

    def start(self, wait: bool = True) -> CoinFlipGrader:
        """Nothing to start (no worker processes)."""
        return self

    def grade(self, responses: list[str], golds: list[str]) -> Grades:
        r = np.array([float(int(hashlib.sha256(f"{a}\x00{g}".encode()).hexdigest()[:8], 16) / 2**32 < self.p)
                      for a, g in zip(responses, golds)], dtype=np.float32)
        return Grades(r, np.zeros(len(r), dtype=bool), [last_boxed(a) for a in responses], ["ok"] * len(r))

    def close(self) -> None:
        pass


@REWARDS.register("coinflip")
def make_coinflip(coinflip_p: float = 0.5) -> CoinFlipGrader:
    """Benchmark-only: a hashed coin flip per response, 1 with probability ``reward.coinflip_p``
    (:class:`CoinFlipGrader`)."""
    if not 0.0 <= coinflip_p <= 1.0:
        raise GraftError(f"reward.coinflip_p={coinflip_p}: must be in [0, 1]")
    return CoinFlipGrader(coinflip_p)


REWARDS.lazy("code", "graft_cli.reward.code_grader")  # the sandboxed test-execution reward, imported when asked for


def started(grader: Grader) -> Grader:
    """``grader`` with its workers started and ready (a code sandbox that refuses this machine
    raises here, in one line); closed again if starting fails."""
    try:
        return grader.start()
    except BaseException:
        grader.close()
        raise


def make_grader(rc=None, **overrides):
    """The grader a ``reward:`` section names (``rc``: a :class:`graft_cli.config.RewardConfig`;
    registry ``REWARDS``), built with that section's options; ``overrides`` replace some (an
    evaluation's worker count). ``rc=None``: the default reward (math-verify, its defaults being
    ``RewardConfig``'s). The one way the trainer, ``graft eval``, the analyses and the tiny pair's
    check build a grader, so a run is graded by its own reward wherever it is graded. The section
    holds every reward's options; a factory gets those its signature names (all of them if it takes
    ``**kwargs``), so ``reward.coinflip_p`` never reaches math-verify."""
    name = "math_verify" if rc is None else rc.name
    factory = REWARDS.get(name)
    opts = {} if rc is None else {f.name: getattr(rc, f.name) for f in dataclasses.fields(rc) if f.name != "name"}
    opts.update(overrides)
    params = inspect.signature(factory).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        opts = {k: v for k, v in opts.items() if k in params}
    return factory(**opts)
