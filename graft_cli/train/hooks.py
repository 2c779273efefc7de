"""After-step hooks of the training driver (:func:`graft_cli.train.run.train`): the contract, and
the narrow view of the trainer a hook gets, in a module of their own so that higher layers (eval's
validation) implement it without importing the loop."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from graft_cli.data.problems import Problem
from graft_cli.data.prompts import PromptSpec
from graft_cli.reward import Grader
from graft_cli.train.policies import Policy


@dataclass(frozen=True)
class StepView:
    """What an after-step hook sees of the trainer after a step: the step just finished (1-based; 0
    before the first), the run's length, the trained policies (current weights, tokenizer, engine),
    the held-out training problems, whether the run is data-parallel, the training prompt and the
    run's grader."""

    step: int
    total_steps: int
    policies: Mapping[str, Policy]
    held_out: list[Problem]
    data_parallel: bool
    spec: PromptSpec
    grader: Grader


class AfterStep:
    """An after-step hook of :func:`train` (the CLI's is validation,
    :class:`graft_cli.eval.validation.ValidationHook`, so this layer imports no eval). ``due`` says
    whether it runs after the trainer's current step: the loop then writes that step's checkpoint
    *before* calling it, so a slow, killed or failing hook never costs training. ``done`` says
    whether its work for the step is already on disk: a run resumed at a step where the hook is due
    and not done runs it first (a kill during validation resumes into validation, not into
    training)."""

    def prepare(self, view: StepView, cfg) -> None:
        """Load and check what the hook will need (e.g. the validation benchmarks), before the run
        directory is touched and before step 1: a missing input is one line now, not a lost run
        later."""

    def due(self, view: StepView, cfg) -> bool:
        return True

    def done(self, view: StepView, cfg, run_dir: str) -> bool:
        return False

    def __call__(self, view: StepView, cfg, run_dir: str, console=None) -> list[dict]:
        raise NotImplementedError
