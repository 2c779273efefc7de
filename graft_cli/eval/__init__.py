"""Evaluation: the five benchmarks, five-run pass@1 / pass@k scoring, checkpoint selection.

* :mod:`graft_cli.eval.benchmarks` — benchmark registry and resolution (hub ids, local files, tiny
  sets)
* :mod:`graft_cli.eval.metrics` — pass@1, unbiased pass@k, mean ± std over runs, benchmark average
* :mod:`graft_cli.eval.runner` — ``graft eval`` (a model or a run's checkpoints): the
  :class:`Evaluator` and the entry points
* :mod:`graft_cli.eval.setup` — the settings, seeds, benchmarks, graders and engine an evaluation
  runs with
* :mod:`graft_cli.eval.summary` — ``summary.json`` per folder and policy, the best step
  (``best.json``) and its weights
* :mod:`graft_cli.eval.validation` — validation during training (:class:`ValidationHook`)
* :mod:`graft_cli.eval.tandem_evals` — tandem RLVR's handoff robustness and legibility, pass@k
  curves
* :mod:`graft_cli.eval.complementarity` — ``graft complementarity``: how often one model solves the
  other's all-fail prompts, from training runs' rollout logs or two checkpoints sampled afresh
* :mod:`graft_cli.eval.files` — the file names of an evaluation folder
* ``lm_eval_tasks/`` — lm-evaluation-harness task YAMLs with the same prompt and the math-verify
  scorer
"""
