"""Cross-model complementarity (graft.md §2.7, Fig. 1; the paper: Smol solves 47.9% of Qwen's
all-fail prompts, Qwen 18.7% of Smol's, as means over independent GRPO n=8 training).

Definition (per step, graft.md §2.7 [I];
:func:`~graft_cli.algorithms.exchange.selection.solved_share`): among the batch prompts on which
model X has ``k = 0`` (all of its samples fail), the share on which model Y has ``k >= 1`` — "Y
solves X's all-fail prompts". (GRAFT itself can only graft where Y's group is mixed, ``1 <= k < n``:
that narrower share is ``filled_share``, which ``graft tiny build --check`` reports.) Both
directions are reported per step; the mean over training is the mean of the per-step rates over the
steps where X has at least one all-fail prompt (``pooled`` gives the ratio of the summed counts
too).

Two sources:

* **rollout logs** of training runs (``rollouts/<policy>/step_NNNNNN.parquet``): the two policies of
  one run (e.g. an independent GRPO pair run) or one policy from each of two runs. The two logs must
  hold the same prompts per step (same data seed and prompt order); a mismatch is a one-line error.
* **two checkpoints** sampled afresh on a problem file: ``samples`` responses per prompt from each
  model (default 8 at the training rollout temperature 1.0, top-p 1.0), graded with math-verify: one
  "step".

Outputs: ``complementarity.json`` and ``complementarity.png`` (matplotlib, Agg backend).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import NamedTuple

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from graft_cli.batch import is_correct
from graft_cli.algorithms.exchange.selection import solved_share
from graft_cli.console import make_console
from graft_cli.data.problems import load_problems
from graft_cli.data.prompts import PromptSpec
from graft_cli.errors import GraftError
from graft_cli.models.loading import load_model, load_tokenizer, resolve_path
from graft_cli.reward import make_grader
from graft_cli.rollout import ENGINES, SamplingParams
from graft_cli.rollout.graded import sample_and_grade
from graft_cli.rundir import atomic_write_json, run_policies
from graft_cli.schema import RewardConfig

STEP_FILE_RE = re.compile(r"^step_(\d{6,})\.parquet$")


# --------------------------------------------------------------------------------------------- pure
def step_entry(step: int, k_x, k_y, n_x: int, n_y: int) -> dict:
    """One step both ways: :func:`~graft_cli.algorithms.exchange.selection.solved_share` of X's
    all-fail prompts by Y and of Y's by X."""
    if np.shape(k_x) != np.shape(k_y):
        raise ValueError(f"k arrays differ in length: {np.shape(k_x)} vs {np.shape(k_y)}")
    r_yx, f_x, h_yx = solved_share(k_x, [k_y])
    r_xy, f_y, h_xy = solved_share(k_y, [k_x])
    return {"step": int(step), "num_prompts": int(len(k_x)), "n_x": n_x, "n_y": n_y,
            "x_all_fail": f_x, "y_all_fail": f_y, "y_solves_x": r_yx, "x_solves_y": r_xy,
            "y_solves_x_hits": h_yx, "x_solves_y_hits": h_xy}


def aggregate(steps: list[dict]) -> dict:
    """Mean over steps of the per-step rates (steps where the failing side has an all-fail prompt)
    and the pooled ratio of summed counts."""
    out = {"mean": {}, "pooled": {}, "num_steps": len(steps)}
    for key, fail_key in (("y_solves_x", "x_all_fail"), ("x_solves_y", "y_all_fail")):
        hit_key = f"{key}_hits"
        vals = [s[key] for s in steps if s[key] is not None and not math.isnan(s[key])]
        out["mean"][key] = float(np.mean(vals)) if vals else math.nan
        out["mean"][f"{key}_steps"] = len(vals)
        fails = sum(s[fail_key] for s in steps)
        out["pooled"][key] = sum(s[hit_key] for s in steps) / fails if fails else math.nan
    return out


# -------------------------------------------------------------------------------------- rollout logs
def rollout_files(run_dir: str, policy: str) -> dict[int, str]:
    d = os.path.join(run_dir, "rollouts", policy)
    out = {}
    if os.path.isdir(d):
        for f in os.listdir(d):
            m = STEP_FILE_RE.match(f)
            if m:
                out[int(m.group(1))] = os.path.join(d, f)
    return dict(sorted(out.items()))


def parse_run_spec(spec: str) -> tuple[str, str | None]:
    """``DIR`` or ``DIR:POLICY``."""
    if os.path.isdir(spec):
        return spec.rstrip("/"), None
    if ":" in spec:
        d, pol = spec.rsplit(":", 1)
        if os.path.isdir(d):
            return d.rstrip("/"), pol
    raise GraftError(f"{spec}: not a run directory (expected DIR or DIR:POLICY)")


def resolve_sides(specs: list[str]) -> list[tuple[str, str]]:
    """One run with two policies, or two runs with one policy each (``DIR:POLICY`` where
    ambiguous)."""
    parsed = [parse_run_spec(s) for s in specs]
    if len(parsed) == 1:
        d, pol = parsed[0]
        pols = run_policies(d)
        if pol is not None or len(pols) != 2:
            raise GraftError(f"{d}: one run needs exactly two policies to compare (has: {', '.join(pols) or 'none'}); "
                             f"or give two runs")
        return [(d, pols[0]), (d, pols[1])]
    if len(parsed) != 2:
        raise GraftError(f"--runs takes one run (two policies) or two runs, got {len(parsed)}")
    out = []
    for d, pol in parsed:
        pols = run_policies(d)
        if pol is None:
            if len(pols) != 1:
                raise GraftError(f"{d}: has policies {', '.join(pols) or 'none'}; name one as {d}:POLICY")
            pol = pols[0]
        elif pol not in pols:
            raise GraftError(f"{d}: no policy {pol!r}; policies: {', '.join(pols) or 'none'}")
        out.append((d, pol))
    if out[0] == out[1]:
        raise GraftError(f"{out[0][0]}:{out[0][1]} is given twice")
    return out


class LoggedStep(NamedTuple):
    """One rollout-log file: its prompt ids in batch order, ``k`` (correct responses) per prompt and
    ``n`` (responses per prompt)."""

    ids: list[str]
    k: np.ndarray
    n: int


def k_of_step(path: str) -> LoggedStep:
    """The prompt ids, ``k`` per prompt and ``n`` of one rollout-log file."""
    # lazy: pandas is heavy
    import pandas as pd

    df = pd.read_parquet(path, columns=["prompt_index", "prompt_id", "reward"])
    g = df.groupby("prompt_index", sort=True)
    ids = g["prompt_id"].first().astype(str).tolist()
    k = g["reward"].apply(lambda r: int(is_correct(r).sum())).to_numpy()
    n = int(g.size().max()) if len(df) else 0
    return LoggedStep(ids, k, n)


def from_runs(specs: list[str]) -> dict:
    """Per-step cross-solve rates from rollout logs (see the module docstring)."""
    (dx, px), (dy, py) = resolve_sides(specs)
    fx, fy = rollout_files(dx, px), rollout_files(dy, py)
    if not fx:
        raise GraftError(f"{dx}: no rollout logs for policy {px!r} (rollouts/{px}/step_*.parquet)")
    if not fy:
        raise GraftError(f"{dy}: no rollout logs for policy {py!r} (rollouts/{py}/step_*.parquet)")
    common = sorted(set(fx) & set(fy))
    if not common:
        raise GraftError(f"{dx}:{px} and {dy}:{py} share no logged step")
    steps = []
    for s in common:
        x, y = k_of_step(fx[s]), k_of_step(fy[s])
        if x.ids != y.ids:
            i = next((j for j, (a, b) in enumerate(zip(x.ids, y.ids)) if a != b), min(len(x.ids), len(y.ids)))
            a = x.ids[i] if i < len(x.ids) else "<none>"
            b = y.ids[i] if i < len(y.ids) else "<none>"
            raise GraftError(f"step {s}: prompt ids differ between {px} and {py} (at batch position {i}: {a!r} vs "
                             f"{b!r}); the runs must share the data seed and prompt order")
        steps.append(step_entry(s, x.k, y.k, x.n, y.n))
    lx, ly = _labels((dx, px), (dy, py))
    return {"source": "rollouts", "x": {"label": lx, "run": dx, "policy": px},
            "y": {"label": ly, "run": dy, "policy": py}, "steps": steps, **aggregate(steps)}


def _labels(x: tuple[str, str], y: tuple[str, str]) -> tuple[str, str]:
    if x[1] != y[1]:
        return x[1], y[1]
    return f"{os.path.basename(x[0])}:{x[1]}", f"{os.path.basename(y[0])}:{y[1]}"


# ---------------------------------------------------------------------------------------- checkpoints
@dataclasses.dataclass
class ComplementarityOptions:
    """The options of ``graft complementarity`` (:func:`complementarity_main`): ``sources`` are run
    directories (``runs``: one run, its two policies, or two runs, ``DIR`` or ``DIR:POLICY`` each)
    or two models (``models``: folders, hub ids or ``tiny:<role>``, sampled afresh on ``data``; the
    sampling options are theirs)."""

    sources: list[str] = dataclasses.field(default_factory=list)
    runs: bool = False
    models: bool = False
    data: str | None = None  # --models: the problem file to sample on
    samples: int = 8  # --models: samples per prompt
    temperature: float = 1.0  # training rollouts: 1.0
    top_p: float = 1.0
    max_new_tokens: int = 4096
    limit: int | None = None  # --models: only the first N problems
    seed: int = 0  # --models: sampling seed
    device: str = "auto"
    dtype: str = "float32"
    chat_template: str = "auto"  # auto | none | required
    workers: int = 2  # grading worker processes
    reward: str = "math_verify"  # the registered reward that grades --models' samples (as a run's reward.name)
    out: str | None = None  # [default: <run>/complementarity for one run, else results/complementarity/...]
    progress: bool = True

    @classmethod
    def from_cli(cls, *, from_runs: bool, from_models: bool, sources: tuple[str, ...], no_progress: bool,
                 **opts) -> ComplementarityOptions:
        """The options from ``graft complementarity``'s click parameters (``--runs`` / ``--models``
        are the flags ``from_runs`` / ``from_models``, ``--no-progress`` the negation of
        ``progress``)."""
        return cls(sources=list(sources), runs=from_runs, models=from_models, progress=not no_progress, **opts)


def sample_k(model_path: str, problems, o: ComplementarityOptions, grader, bar=None, task=None) -> np.ndarray:
    """``k`` (correct responses of ``o.samples``) per problem of one model sampled with ``o``'s
    settings; ``bar`` (a rich progress) advances ``task`` by each chunk's problems."""
    path = resolve_path(model_path)
    tok = load_tokenizer(path)
    model = load_model(path, o.dtype, o.device)
    engine = ENGINES.get("hf")(model, tok)
    spec = PromptSpec(chat_template=o.chat_template)
    ks = []
    chunk = 32
    for c, start in enumerate(range(0, len(problems), chunk)):
        part = problems[start:start + chunk]
        params = SamplingParams(n=o.samples, temperature=o.temperature, top_p=o.top_p,
                                max_new_tokens=o.max_new_tokens, seed=(o.seed * 7919 + c) % (2**31 - 1))
        ks.extend(sample_and_grade(engine, [spec.encode(p.problem, tok) for p in part], [p.answer for p in part],
                                   params, grader).k.tolist())
        if bar is not None:
            bar.advance(task, len(part))
    return np.asarray(ks)


def from_models(o: ComplementarityOptions, console=None) -> dict:
    """Sample ``o.samples`` responses per prompt of ``o.data`` from each of the two models
    ``o.sources``, graded by the registered ``o.reward`` (5 s per answer); one "step"."""

    models = o.sources
    if len(models) != 2:
        raise GraftError(f"--models takes two models, got {len(models)}")
    if o.samples < 1:
        raise GraftError("--samples must be >= 1")
    problems = load_problems(o.data)
    if o.limit:
        problems = problems[:o.limit]
    grader = make_grader(RewardConfig(name=o.reward, timeout_s=5.0), num_workers=o.workers)
    ks = []
    try:
        with Progress(TextColumn("[bold]sample[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, disable=not o.progress) as bar:
            for m in models:
                task = bar.add_task(m, total=len(problems))
                ks.append(sample_k(m, problems, o, grader, bar, task))
    finally:
        grader.close()
    steps = [step_entry(0, ks[0], ks[1], o.samples, o.samples)]
    lx, ly = (models[0], models[1]) if models[0] != models[1] else ("A:" + models[0], "B:" + models[1])
    return {"source": "models", "data": o.data, "samples": o.samples, "temperature": o.temperature,
            "top_p": o.top_p, "max_new_tokens": o.max_new_tokens, "x": {"label": lx, "model": models[0]},
            "y": {"label": ly, "model": models[1]}, "steps": steps, **aggregate(steps),
            "k": {"x": ks[0].tolist(), "y": ks[1].tolist()}}


# ----------------------------------------------------------------------------------------- outputs
def plot(result: dict, path: str, ax=None) -> str | None:
    """Per-step cross-solve rates in both directions with their means (a bar chart for one step)."""
    # lazy: matplotlib is only needed for plots
    import matplotlib

    matplotlib.use("Agg")
    # lazy: matplotlib is only needed for plots
    import matplotlib.pyplot as plt

    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(7, 4))
    lx, ly = result["x"]["label"], result["y"]["label"]
    names = {"y_solves_x": f"{ly} solves {lx}'s all-fail", "x_solves_y": f"{lx} solves {ly}'s all-fail"}
    steps = result["steps"]
    if len(steps) == 1:
        vals = [100 * _nan0(steps[0][k]) for k in names]
        ax.bar(list(names.values()), vals, color=["tab:blue", "tab:orange"])
        ax.set_ylabel("% of all-fail prompts")
    else:
        xs = [s["step"] for s in steps]
        for (key, label), color in zip(names.items(), ("tab:blue", "tab:orange")):
            ax.plot(xs, [100 * s[key] if s[key] is not None else np.nan for s in steps], color=color, label=label)
            m = result["mean"][key]
            if m is not None and not math.isnan(m):
                ax.axhline(100 * m, color=color, ls="--", lw=1, label=f"mean {100 * m:.1f}%")
        ax.set_xlabel("step")
        ax.set_ylabel("% of all-fail prompts solved by peer")
        ax.legend(fontsize=8)
    ax.set_title("Cross-model complementarity")
    ax.set_ylim(0, 100)
    if own:
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return path


def _nan0(x):
    return 0.0 if x is None or (isinstance(x, float) and math.isnan(x)) else x


def write_outputs(result: dict, out_dir: str) -> tuple[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    jpath = os.path.join(out_dir, "complementarity.json")
    atomic_write_json(jpath, _json_safe(result))
    ppath = plot(result, os.path.join(out_dir, "complementarity.png"))
    return jpath, ppath


def _json_safe(o):
    if isinstance(o, float) and math.isnan(o):
        return None
    if isinstance(o, dict):
        return {k: _json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_json_safe(v) for v in o]
    if isinstance(o, (np.integer, np.floating)):
        return _json_safe(o.item())
    return o


def complementarity_main(o: ComplementarityOptions, console=None) -> dict:
    """The ``graft complementarity`` command: cross-solve rates from rollout logs (``o.runs``,
    :func:`from_runs`) or from two models sampled afresh (``o.models``, :func:`from_models`),
    written to ``o.out``."""
    console = console or make_console(stderr=True)
    out = o.out
    if o.runs == o.models:
        raise GraftError("give --runs DIR [DIR] or --models A B --data FILE")
    if o.runs:
        if o.data:
            raise GraftError("--data goes with --models (rollout logs already hold the prompts)")
        result = from_runs(list(o.sources))
        if out is None:
            ds = {result["x"]["run"], result["y"]["run"]}
            out = os.path.join(next(iter(ds)), "complementarity") if len(ds) == 1 else os.path.join(
                "results", "complementarity", f"{os.path.basename(result['x']['run'])}-vs-"
                                              f"{os.path.basename(result['y']['run'])}")
    else:
        if not o.data:
            raise GraftError("--models needs --data FILE (the prompts to sample on)")
        result = from_models(o, console=console)
        if out is None:
            out = os.path.join("results", "complementarity", "models")
    jpath, ppath = write_outputs(result, out)
    lx, ly = result["x"]["label"], result["y"]["label"]
    m = result["mean"]
    console.print(f"{ly} solves {lx}'s all-fail prompts: {_pct(m['y_solves_x'])} (mean over {m['y_solves_x_steps']} "
                  f"steps); {lx} solves {ly}'s: {_pct(m['x_solves_y'])} (mean over {m['x_solves_y_steps']} steps)")
    console.print(f"complementarity: {jpath} and {ppath}")
    return result


def _pct(x) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"
