"""``graft tiny rl-check``: does RL move the tiny pair? (The target: GRPO n=8 for <= 80 steps raises
each model's held-out mean pass@1 by >= 3 points over its base.)

The check is a command, not a test, because it takes minutes: it trains one run of the pair with the
chosen method (default GRPO n=8, the tiny pair's default batch), then evaluates each policy's base
model and its last checkpoint on the five held-out synthetic benchmarks with the *same* sampling
seed and settings, and compares.

Two held-out figures are reported per policy:

* ``pooled``: pass@1 over all held-out prompts together (872 problems x ``samples``), the figure the
  target is judged on (with 8 samples its standard error is about 1 point);
* ``average``: the unweighted five-benchmark average ``graft eval`` reports (noisier: three of the
  five sets have 30-40 problems).

Sampling defaults to the training distribution's T = 1.0, top-p 1.0 (the issue's "pass@1 at T = 1.0"
for the base-model targets); ``--temperature 0.6 --top-p 0.95`` gives the paper's eval protocol.
Everything lands in ``<out>/``: the run (``<out>/<method>-s<seed>/``, with its eval folders), the
base models' evals (``<out>/base/<policy>/``) and ``<out>/rl_check.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os

from rich.table import Table

from graft_cli.config import compose
from graft_cli.console import make_console
from graft_cli.data.prompts import PromptSpec
from graft_cli.errors import GraftError
from graft_cli.eval.runner import EvalOptions, evaluate_model, evaluate_run
from graft_cli.eval.validation import ValidationHook
from graft_cli.rundir import atomic_write_json, read_json
from graft_cli.train.run import train as run_train


def pooled_pass1(summary: dict) -> tuple[float, int]:
    """Pass@1 over every problem of every benchmark in an eval ``summary.json`` (each benchmark's
    mean weighted by its number of problems), and the number of problems."""
    total, n = 0.0, 0
    for b in summary["benchmarks"].values():
        k = int(b["num_problems"])
        total += float(b["mean"]) * k
        n += k
    if n == 0:
        raise GraftError("empty evaluation summary")
    return total / n, n


@dataclasses.dataclass
class TinyRLCheckOptions:
    """The options of ``graft tiny rl-check`` (:func:`rl_check`)."""

    steps: int = 80  # training steps
    method: str = "grpo"  # method config (experiments/method/)
    out: str = "results/tiny_rl_check"  # output folder
    seed: int = 0  # training seed
    samples: int = 8  # eval samples per held-out problem
    runs: int = 1  # eval runs
    temperature: float = 1.0  # eval sampling temperature
    top_p: float = 1.0  # eval nucleus top-p
    eval_seed: int = 0  # eval sampling seed (the same for base and final)
    min_gain_points: float = 3.0  # target gain in pooled pass@1 points
    overrides: tuple[str, ...] = ()  # config overrides of the training run
    benchmarks: list[str] | None = None  # held-out benchmarks [default: the tiny pair's five]
    progress: bool = True

    @classmethod
    def from_cli(cls, *, min_gain: float, no_progress: bool, overrides: tuple[str, ...] = (),
                 **opts) -> TinyRLCheckOptions:
        """The options from ``graft tiny rl-check``'s click parameters (``--min-gain`` is
        ``min_gain_points``, ``--no-progress`` the negation of ``progress``)."""
        return cls(min_gain_points=min_gain, progress=not no_progress, overrides=tuple(overrides), **opts)


def rl_check(o: TinyRLCheckOptions) -> dict:
    """Train the tiny pair with ``o.method``, evaluate each policy's last checkpoint and its base
    model with the same sampling, and write and print ``<out>/rl_check.json`` (module docstring)."""
    console = make_console()
    out = o.out
    name = f"{o.method}-s{o.seed}"
    cfg = compose(["pair='tiny'", f"method='{o.method}'", f"run.steps={o.steps}", f"run.out={out}",
                   f"run.name={name}", f"run.seed={o.seed}", *o.overrides])
    run_dir = os.path.join(out, name)
    run_train(cfg, progress=o.progress, after_step=(ValidationHook(),))

    ev = EvalOptions(runs=o.runs, samples=o.samples, temperature=o.temperature, top_p=o.top_p,
                     max_new_tokens=cfg.rollout.max_new_tokens, seed=o.eval_seed, benchmarks=o.benchmarks,
                     progress=o.progress)
    sampling = ev.model_settings()
    settings = {"runs": sampling.runs, **sampling.identity()}
    finals = evaluate_run(dataclasses.replace(ev, run_dir=run_dir, steps="last"))  # policy -> {last step: summary}
    rows = []
    for pol in [p for p in cfg.policies if p.role == "train"]:
        base_dir = os.path.join(out, "base", pol.name)
        evaluate_model(dataclasses.replace(ev, model=pol.model, out=base_dir, pair="tiny", dtype=cfg.run.dtype,
                                           device=cfg.run.device, workers=cfg.reward.num_workers),
                       prompt_spec=PromptSpec.from_config(cfg.prompt))
        base = read_json(os.path.join(base_dir, "summary.json"))
        (last, final), = finals[pol.name].items()
        b_pool, nprob = pooled_pass1(base)
        f_pool, _ = pooled_pass1(final)
        gain = 100 * (f_pool - b_pool)
        rows.append({"policy": pol.name, "model": pol.model, "step": last, "num_problems": nprob,
                     "base_pooled": b_pool, "final_pooled": f_pool, "gain_points": gain,
                     "base_average": base["average"]["mean"], "final_average": final["average"]["mean"],
                     "gain_average_points": 100 * (final["average"]["mean"] - base["average"]["mean"]),
                     "met": gain >= o.min_gain_points})
    result = {"method": o.method, "steps": o.steps, "seed": o.seed, "settings": settings, "run_dir": run_dir,
              "min_gain_points": o.min_gain_points, "policies": rows, "met": all(r["met"] for r in rows)}
    atomic_write_json(os.path.join(out, "rl_check.json"), result)

    t = Table(title=f"held-out pass@1 (%), {o.method} {o.steps} steps, {o.samples} samples x {o.runs} run(s), "
                    f"T={o.temperature} top-p={o.top_p}")
    for c in ("policy", "base (pooled)", f"step {rows[0]['step']} (pooled)", "gain", "base (5-avg)", "final (5-avg)",
              f"gain >= {o.min_gain_points:g}"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["policy"], f"{100 * r['base_pooled']:.2f}", f"{100 * r['final_pooled']:.2f}",
                  f"{r['gain_points']:+.2f}", f"{100 * r['base_average']:.2f}", f"{100 * r['final_average']:.2f}",
                  "yes" if r["met"] else "no")
    console.print(t)
    console.print(f"wrote {os.path.join(out, 'rl_check.json')}")
    print(json.dumps(result, sort_keys=True), flush=True)
    return result
