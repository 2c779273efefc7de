"""Validation during training (``eval.every``): each policy sampled on the validation benchmarks at the step's
weights, its summary written, the best step re-selected and its weights kept; the :class:`ValidationHook` the trainer
runs after each step."""

from __future__ import annotations

import os
import time
import warnings

import numpy as np

from graft_cli.data.prompts import PromptSpec
from graft_cli.eval.runner import Evaluator, context_length, evaluate_model, evaluate_run
from graft_cli.eval.setup import (
    EvalSettings,
    eval_prompt_spec,
    final_settings,
    reward_kind,
    run_benches,
    run_graders,
    run_seed,
    run_selection,
    validation_root,
    validation_settings,
)
from graft_cli.eval.summary import (
    Selection,
    save_best_weights,
    select_best,
    selection_runs,
    summarize_dir,
    update_best,
    write_policy_summary,
    write_summary,
)
from graft_cli.rundir import eval_step_dir
from graft_cli.train.hooks import AfterStep


# --------------------------------------------------------------------------- validation in training
class _ValidationState:
    def __init__(self):
        self.benches = None
        self.warned = False

    def load(self, cfg, trainer) -> list:
        """The validation benchmarks, loaded once (before step 1 by :meth:`ValidationHook.prepare`)."""
        if self.benches is None:
            self.benches = run_benches(cfg, list(cfg.eval.benchmarks), None, cfg.eval.data_dir,
                                       getattr(trainer, "held_out", None))
        return self.benches


def validation_due(step: int, total_steps: int, every: int) -> bool:
    return every > 0 and (step % every == 0 or step == total_steps)


class ValidationHook(AfterStep):
    """The training loop's after-step hook for validation (``train(..., after_step=(ValidationHook(),))``);
    holds the loaded benchmarks across steps. Due at every ``eval.every``-th step and the last; done when every
    policy's ``<root>/<policy>/step_N/summary.json`` is on disk (the evaluator writes it last; root
    :func:`validation_root`)."""

    def __init__(self):
        self.state = _ValidationState()

    def prepare(self, trainer, cfg) -> None:
        """The validation benchmarks, loaded before step 1 (a set that cannot be loaded stops the run before it
        trains, in one line naming it, instead of at the first validation)."""
        dist = getattr(trainer, "dist", None)
        if cfg.eval.every > 0 and not (dist is not None and dist.enabled):
            self.state.load(cfg, trainer)

    def due(self, trainer, cfg) -> bool:
        return validation_due(trainer.step, trainer.total_steps, cfg.eval.every)

    def done(self, trainer, cfg, run_dir: str) -> bool:
        root = validation_root(cfg)
        return all(os.path.exists(os.path.join(eval_step_dir(run_dir, name, trainer.step, root), "summary.json"))
                   for name in trainer.policies)

    def __call__(self, trainer, cfg, run_dir: str, console=None) -> list[dict]:
        return validate_in_training(trainer, cfg, run_dir, console, self.state)


def validate_in_training(trainer, cfg, run_dir: str, console=None, state: _ValidationState | None = None) -> list[dict]:
    """Called by the training loop after each step: when ``eval.every`` > 0 and the step is a multiple of
    it (or the last step), score each policy's current weights with the eval protocol (``eval.runs``
    runs, default 1; ``eval.samples`` at ``eval.temperature``/``eval.top_p``/``eval.top_k``) into
    ``<run>/<root>/<policy>/step_NNNNNN/`` (root ``eval``, or ``validation`` where the final evaluation samples
    otherwise: :func:`validation_root`), update ``best.json`` (:func:`run_selection`) and, with ``eval.save_best``,
    keep a new best policy's weights at ``<run>/best/<policy>/``. Returns ``validation/*`` metrics rows (one per
    policy; ``validation/selection``: the step's selection score when it is not the pass@1 average) for
    metrics.jsonl; ``[]`` when no validation is due. Sampling uses its own seeded generator, so training is
    unaffected."""
    ec = cfg.eval
    if not validation_due(trainer.step, trainer.total_steps, ec.every):
        return []
    st = state if state is not None else _ValidationState()
    dist = getattr(trainer, "dist", None)
    if dist is not None and getattr(dist, "enabled", False):
        if not st.warned:  # sharded models would need every rank in lock-step: evaluate afterwards instead
            st.warned = True

            warnings.warn("eval.every is ignored in data-parallel training; run `graft eval --run DIR` on the "
                          "checkpoints instead", stacklevel=2)
        return []

    st.load(cfg, trainer)
    spec = eval_prompt_spec(cfg)
    if spec == PromptSpec.from_config(cfg.prompt):
        spec = trainer.spec  # the training prompt (no eval.prompt_* setting)
    settings = validation_settings(cfg)
    root, sel = validation_root(cfg), run_selection(cfg)
    rows = []
    graders = run_graders(cfg, given={reward_kind(cfg): trainer.grader})  # the other kind's grader, if needed
    try:
        rows = _validate_policies(trainer, cfg, run_dir, console, st, spec, settings, root, sel, graders)
    finally:
        graders.close()
    if console is not None:
        console.print("validation step {}: {}".format(
            trainer.step, " ".join(f"{r['policy']}={100 * r['validation/score']:.2f}" for r in rows)))
    return rows


def _validate_policies(trainer, cfg, run_dir, console, st, spec, settings, root, sel, graders) -> list[dict]:
    ec = cfg.eval
    rows = []
    for name, pol in trainer.policies.items():
        t0 = time.perf_counter()
        out_dir = eval_step_dir(run_dir, name, trainer.step, root)
        engine = pol.engine.eval_engine()  # tandem: the senior alone
        ev = Evaluator(engine, pol.tokenizer, spec, settings, graders,
                       context_len=context_length(pol.model), console=console)
        ev.evaluate(out_dir, st.benches)
        summary = write_summary(out_dir, {"model": "in-training", "policy": name, "step": trainer.step})
        row = {"step": trainer.step, "policy": name, "validation/score": summary["average"]["mean"]}
        for b, v in summary["benchmarks"].items():
            row[f"validation/{b}"] = v["mean"]
        if not sel.default:
            runs = selection_runs(summary, sel.metric, sel.benchmarks)
            row["validation/selection"] = float(np.mean(runs)) if runs else None
        best = update_best(run_dir, selection=sel)
        b = best["policies"].get(name)
        if ec.save_best and b is not None and b["step"] == trainer.step:
            save_best_weights(run_dir, name, trainer.step, pol.model, pol.tokenizer)
            best = update_best(run_dir, selection=sel)
        row["validation/best_step"] = best["policies"].get(name, {}).get("step")
        row["time/validation"] = time.perf_counter() - t0
        rows.append(row)
    return rows


__all__ = ["EvalSettings", "Evaluator", "evaluate_model", "evaluate_run", "validate_in_training", "ValidationHook",
           "update_best", "write_policy_summary", "select_best", "run_seed", "summarize_dir", "eval_prompt_spec",
           "final_settings", "validation_settings", "validation_root", "run_selection", "Selection",
           "selection_runs"]
