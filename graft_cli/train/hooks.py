"""After-step hooks of the training driver (:func:`graft_cli.train.run.train`): the contract, in a module of its
own so that higher layers (eval's validation) implement it without importing the loop."""

from __future__ import annotations


class AfterStep:
    """An after-step hook of :func:`train` (the CLI's is validation, :class:`graft_cli.eval.validation.ValidationHook`,
    so this layer imports no eval). ``due`` says whether it runs after the trainer's current step: the loop then
    writes that step's checkpoint *before* calling it, so a slow, killed or failing hook never costs training.
    ``done`` says whether its work for the step is already on disk: a run resumed at a step where the hook is
    due and not done runs it first (a kill during validation resumes into validation, not into training)."""

    def prepare(self, trainer, cfg) -> None:
        """Load and check what the hook will need (e.g. the validation benchmarks), before the run directory is
        touched and before step 1: a missing input is one line now, not a lost run later."""

    def due(self, trainer, cfg) -> bool:
        return True

    def done(self, trainer, cfg, run_dir: str) -> bool:
        return False

    def __call__(self, trainer, cfg, run_dir: str, console=None) -> list[dict]:
        raise NotImplementedError
