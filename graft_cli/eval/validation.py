"""Validation during training (``eval.every``): each policy sampled on the validation benchmarks at
the step's weights, its summary written, the best step re-selected and its weights kept; the
:class:`ValidationHook` the trainer runs after each step."""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass

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
from graft_cli.train.hooks import AfterStep, StepView


# --------------------------------------------------------------------------- validation in training
class _ValidationState:
    def __init__(self):
        self.benches = None
        self.warned = False

    def load(self, cfg, view: StepView) -> list:
        """The validation benchmarks, loaded once (before step 1 by
        :meth:`ValidationHook.prepare`)."""
        if self.benches is None:
            self.benches = run_benches(cfg, list(cfg.eval.benchmarks), None, cfg.eval.data_dir, view.held_out)
        return self.benches


def validation_due(step: int, total_steps: int, every: int) -> bool:
    return every > 0 and (step % every == 0 or step == total_steps)


class ValidationHook(AfterStep):
    """The training loop's after-step hook for validation (``train(...,
    after_step=(ValidationHook(),))``); holds the loaded benchmarks across steps. Due at every
    ``eval.every``-th step and the last; done when every policy's
    ``<root>/<policy>/step_N/summary.json`` is on disk (the evaluator writes it last; root
    :func:`validation_root`)."""

    def __init__(self):
        self.state = _ValidationState()

    def prepare(self, view: StepView, cfg) -> None:
        """The validation benchmarks, loaded before step 1 (a set that cannot be loaded stops the
        run before it trains, in one line naming it, instead of at the first validation)."""
        if cfg.eval.every > 0 and not view.data_parallel:
            self.state.load(cfg, view)

    def due(self, view: StepView, cfg) -> bool:
        return validation_due(view.step, view.total_steps, cfg.eval.every)

    def done(self, view: StepView, cfg, run_dir: str) -> bool:
        root = validation_root(cfg)
        return all(os.path.exists(os.path.join(eval_step_dir(run_dir, name, view.step, root), "summary.json"))
                   for name in view.policies)

    def __call__(self, view: StepView, cfg, run_dir: str, console=None) -> list[dict]:
        return validate_in_training(view, cfg, run_dir, console, self.state)


def validate_in_training(view: StepView, cfg, run_dir: str, console=None,
                         state: _ValidationState | None = None) -> list[dict]:
    """Called by the training loop after each step: when ``eval.every`` > 0 and the step is a
    multiple of it (or the last step), score each policy's current weights with the eval protocol
    (``eval.runs`` runs, default 1; ``eval.samples`` at
    ``eval.temperature``/``eval.top_p``/``eval.top_k``) into ``<run>/<root>/<policy>/step_NNNNNN/``
    (root ``eval``, or ``validation`` where the final evaluation samples otherwise:
    :func:`validation_root`), update ``best.json`` (:func:`run_selection`) and, with
    ``eval.save_best``, keep a new best policy's weights at ``<run>/best/<policy>/``. Returns
    ``validation/*`` metrics rows (one per policy; ``validation/selection``: the step's selection
    score when it is not the pass@1 average) for metrics.jsonl; ``[]`` when no validation is due.
    Sampling uses its own seeded generator, so training is unaffected."""
    ec = cfg.eval
    if not validation_due(view.step, view.total_steps, ec.every):
        return []
    st = state if state is not None else _ValidationState()
    if view.data_parallel:
        if not st.warned:  # sharded models would need every rank in lock-step: evaluate afterwards instead
            st.warned = True

            warnings.warn("eval.every is ignored in data-parallel training; run `graft eval --run DIR` on the "
                          "checkpoints instead", stacklevel=2)
        return []

    st.load(cfg, view)
    spec = eval_prompt_spec(cfg)
    if spec == PromptSpec.from_config(cfg.prompt):
        spec = view.spec  # the training prompt (no eval.prompt_* setting)
    settings = validation_settings(cfg)
    root, sel = validation_root(cfg), run_selection(cfg)
    rows = []
    graders = run_graders(cfg, given={reward_kind(cfg): view.grader})  # the other kind's grader, if needed
    try:
        rows = _validate_policies(view, cfg, run_dir, console, st, _Protocol(spec, settings, root, sel, graders))
    finally:
        graders.close()
    if console is not None:
        console.print("validation step {}: {}".format(
            view.step, " ".join(f"{r['policy']}={100 * r['validation/score']:.2f}" for r in rows)))
    return rows


@dataclass
class _Protocol:
    """How a validation samples and scores: the prompt, the sampling settings, the output root, the
    checkpoint selection, the graders."""

    spec: PromptSpec
    settings: EvalSettings
    root: str
    sel: Selection
    graders: object


def _validate_policies(view: StepView, cfg, run_dir, console, st: _ValidationState, pr: _Protocol) -> list[dict]:
    ec, sel = cfg.eval, pr.sel
    rows = []
    for name, pol in view.policies.items():
        t0 = time.perf_counter()
        out_dir = eval_step_dir(run_dir, name, view.step, pr.root)
        engine = pol.engine.eval_engine()  # tandem: the senior alone
        ev = Evaluator(engine, pol.tokenizer, pr.spec, pr.settings, pr.graders,
                       context_len=context_length(pol.model), console=console)
        ev.evaluate(out_dir, st.benches)
        summary = write_summary(out_dir, {"model": "in-training", "policy": name, "step": view.step})
        row = {"step": view.step, "policy": name, "validation/score": summary["average"]["mean"]}
        for b, v in summary["benchmarks"].items():
            row[f"validation/{b}"] = v["mean"]
        if not sel.default:
            runs = selection_runs(summary, sel.metric, sel.benchmarks)
            row["validation/selection"] = float(np.mean(runs)) if runs else None
        best = update_best(run_dir, selection=sel)
        b = best["policies"].get(name)
        if ec.save_best and b is not None and b["step"] == view.step:
            save_best_weights(run_dir, name, view.step, pol.model, pol.tokenizer)
            best = update_best(run_dir, selection=sel)
        row["validation/best_step"] = best["policies"].get(name, {}).get("step")
        row["time/validation"] = time.perf_counter() - t0
        rows.append(row)
    return rows


__all__ = ["EvalSettings", "Evaluator", "evaluate_model", "evaluate_run", "validate_in_training", "ValidationHook",
           "update_best", "write_policy_summary", "select_best", "run_seed", "summarize_dir", "eval_prompt_spec",
           "final_settings", "validation_settings", "validation_root", "run_selection", "Selection",
           "selection_runs"]
