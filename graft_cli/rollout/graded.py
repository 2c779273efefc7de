"""Sample, grade, count: the one way graft measures a model on prompts outside training.

:func:`sample_and_grade` samples ``params.n`` responses per prompt with any rollout engine and
grades them with any grader (``grade(texts, golds) -> Grades``); :attr:`Graded.k` is the per-prompt
number of correct responses, the ``k`` of graft.md §2.2 (a response is correct when its reward
exceeds 0.5). Used by ``graft eval`` (the Evaluator), ``graft complementarity --models`` and ``graft
tiny build --check``; training counts ``k`` from its own batch
(:attr:`graft_cli.batch.PolicyStep.k`). """

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graft_cli.batch import Rollouts, is_correct
from graft_cli.rollout.engine import SamplingParams


@dataclass
class Graded:
    """One call's rollouts (prompt-major, ``n`` per prompt) and their grades (``rewards``,
    ``extracted``, ``timed_out`` per response)."""

    rollouts: Rollouts
    grades: object
    n: int

    @property
    def rewards(self) -> list[float]:
        return [float(x) for x in self.grades.rewards]

    @property
    def k(self) -> np.ndarray:
        """Correct responses per prompt (:func:`~graft_cli.batch.is_correct`), shape
        ``(prompts,)``."""
        return is_correct(np.asarray(self.rewards).reshape(-1, self.n)).sum(1)


def sample_and_grade(engine, prompt_ids: list[list[int]], golds: list, params: SamplingParams, grader) -> Graded:
    """Sample ``params.n`` responses for each prompt and grade each against its prompt's gold
    answer."""
    ro = engine.generate(prompt_ids, params)
    return Graded(ro, grader.grade(ro.texts, [g for g in golds for _ in range(params.n)]), params.n)
