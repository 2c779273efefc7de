"""The `graft` command line. Each subcommand composes a Hydra config (experiments/) and calls one
function; errors in user input are one line on stderr and exit code 2. Each command imports what it
uses inside its own function, so that `graft --help` and every command load only what they need
(torch, transformers and the trainer take seconds to import)."""

from __future__ import annotations

import errno
import functools
import glob
import os
import sys

import click

from graft_cli.errors import GraftError
from graft_cli.plan.options import launch_options


def one_line_errors(fn):
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except GraftError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(getattr(e, "exit_code", 2))
        except OSError as e:  # a full, read-only or unwritable disk: one line (writes are atomic, nothing is torn)
            if e.errno not in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EPERM, errno.EFBIG,
                               errno.ENOTDIR):
                raise
            click.echo(f"error: {e.filename or ''}{': ' if e.filename else ''}{e.strerror}; files written before "
                       f"are intact (a run resumes from its last complete checkpoint)", err=True)
            sys.exit(2)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="graft")
@click.option("--verbose", is_flag=True, help="keep the libraries' own progress bars and warnings (transformers, ...)")
def main(verbose):
    """graft: cross-model RLVR (GRAFT, GRPO and baselines) for LLMs on math.

    \b
    Quick start (embedded tiny pair, CPU):
      graft tiny build --check
      graft train --pair tiny --method grpo --steps 20
    """
    from graft_cli.console import quiet_libraries

    quiet_libraries(verbose)


# `graft train`'s options that set a run.* key of the config
_RUN_KEYS = {"steps": "run.steps", "out": "run.out", "seed": "run.seed", "name": "run.name"}


def _train_overrides(pair: str, method: str, overrides, **run) -> list[str]:
    """The config overrides of ``graft train``: pair and method, each ``run`` option given
    (:data:`_RUN_KEYS`), then the user's own ``overrides``."""
    ov = [f"pair='{pair}'", f"method='{method}'"]
    ov += [f"{key}={run[opt]}" for opt, key in _RUN_KEYS.items() if run.get(opt) is not None]
    return ov + list(overrides)


@main.command(context_settings={"ignore_unknown_options": False})
@click.option("--pair", default="tiny", show_default=True, help="pair config: tiny, 1, 2 or 3 (experiments/pair/)")
@click.option("--method", default="grpo", show_default=True, help="method config (experiments/method/)")
@click.option("--steps", type=int, default=None, help="number of training steps (default: run.epochs epochs)")
@click.option("--out", default=None, help="parent folder of run directories (default: results/runs)")
@click.option("--seed", type=int, default=None, help="training seed (data order, sampling)")
@click.option("--name", default=None, help="run name (default: <pair>-<method>-s<seed>)")
@click.option("--no-progress", is_flag=True, help="no progress bar")
@click.option("--dry-run", is_flag=True,
              help="compose and validate the config, resolve the reward and the evaluation benchmarks, print what "
                   "would run; load no model or data set, write nothing")
@click.argument("overrides", nargs=-1)
@one_line_errors
def train(no_progress, dry_run, overrides, **run):
    """Train a pair (or more) of policies with a method; resumes from the last checkpoint.

    \b
    Examples:
      graft train --pair tiny --method grpo --steps 20 --out results/runs optim.lr=5e-5
      graft train --pair saf_qwen3_4b_code --method saf --dry-run
    """
    from graft_cli.config import compose

    cfg = compose(_train_overrides(overrides=overrides, **run))
    if dry_run:
        _dry_run(cfg)
        return
    from graft_cli.eval.validation import ValidationHook
    from graft_cli.train.run import train as run_train

    run_dir = run_train(cfg, progress=not no_progress, after_step=(ValidationHook(),))
    from graft_cli.train.dist import launched_main  # lazy: torch is slow to import

    if launched_main():  # data-parallel runs: rank 0 writes summary.png (and says it)
        _print_summary(run_dir)


def _dry_run(cfg) -> None:
    """``graft train --dry-run``: the composed config's key settings, after the checks a run makes
    before it loads anything (the config's validation, the reward's name and options, a local
    training file's existence, every evaluation benchmark's name or file), one ``key: value`` line
    each."""

    from graft_cli.eval.benchmarks import resolve_benchmarks
    from graft_cli.reward import make_grader

    rc, d = cfg.reward, cfg.data
    make_grader(rc, num_workers=0).close()  # the reward's name and options checked; no worker started

    if not d.train.startswith("tiny:") and (glob.has_magic(d.train) or d.train.startswith(("/", "./", "../"))
                                            or d.train.endswith((".jsonl", ".json", ".parquet"))):
        if not (glob.glob(d.train) if glob.has_magic(d.train) else os.path.exists(d.train)):
            raise GraftError(f"config key 'data.train': {d.train}: file not found")
    pair = "tiny" if str(d.train).startswith("tiny:") else cfg.pair
    e = cfg.eval
    benches = {}
    for label, names in (("eval.benchmarks", e.benchmarks), ("eval.final.benchmarks", e.final.benchmarks)):
        if names:
            try:
                benches[label] = resolve_benchmarks(list(names), None, pair, e.data_dir, e.lcb_window)
            except GraftError as err:
                raise GraftError(f"config key {label!r}: {err}") from None
    steps = cfg.run.steps if cfg.run.steps is not None else f"{cfg.run.epochs} epochs"
    r, a = cfg.rollout, cfg.algo
    lines = [("method / pair", f"{cfg.method} / {cfg.pair}"),
             ("models", ", ".join(f"{p.name}={p.model}" + (f" ({p.role})" if p.role != "train" else "")
                                  for p in cfg.policies)),
             ("data.train", d.train + (f" fields {dict(d.fields)}" if d.fields else "") +
              (f" where {dict(d.where)}" if d.where else "")),
             ("batch", f"{d.prompt_batch} prompts x n = {r.n}, mini-batch {a.minibatch_prompts} prompts, "
                       f"{a.ppo_epochs} epoch(s)"),
             ("rollout", f"max {r.max_new_tokens} new tokens (prompts <= {r.max_prompt_tokens}), T {r.temperature}, "
                         f"top-p {r.top_p}, engine {r.engine}"),
             ("algo", f"advantage {a.advantage}, loss {a.loss} ({a.agg}), clip {a.clip_low}/{a.clip_high}, "
                      f"token advantages {list(a.token_advantages) or 'none'}, controllers "
                      f"{[c['name'] for c in a.controllers] or 'none'}"),
             ("optim", f"lr {cfg.optim.lr}"), ("steps", str(steps)),
             ("reward", f"{rc.name} ({rc.num_workers} workers, {rc.timeout_s} s per answer)")]
    for label, srcs in benches.items():
        lines.append((label, ", ".join(f"{b.name} [{b.kind}: {b.source or 'package data'}]" for b in srcs)))
    lines.append(("eval", f"every {e.every} steps" if e.every else "no validation during training"))
    if rc.name == "code":
        from graft_cli.reward.sandbox import Sandbox

        sb = Sandbox(0)
        try:
            feats = sb.features()
        finally:
            sb.close()
        lines.append(("code sandbox here", ", ".join(f"{k}={'on' if v else 'off'}" for k, v in sorted(feats.items()))))
    for k, v in lines:
        click.echo(f"{k}: {v}")
    click.echo("config valid; nothing loaded or written (--dry-run)")


def _print_summary(run_dir: str) -> None:
    """What the run did (reward first -> last, exchange counts, clipping of grafted tokens) and its
    picture."""
    from graft_cli.console import make_console
    from graft_cli.report.run_summary import run_summary, run_variant, summary_markdown, summary_plot

    console = make_console(stderr=True)
    summary = run_summary(run_dir)
    if not summary:
        return
    variant = run_variant(run_dir)
    if variant:
        console.print(f"variant (as graft report files this run): {variant}", soft_wrap=True, highlight=False,
                      markup=False)
    console.print(summary_markdown(summary), soft_wrap=True, highlight=False, markup=False)
    png = summary_plot(run_dir)
    if png:
        console.print(f"summary plot: {png}", soft_wrap=True)


@main.group()
def tiny():
    """The embedded tiny pair (two small heterogeneous models built on CPU)."""


@tiny.command("build")
@click.option("--check", is_flag=True, help="measure pass@1, all-fail rate and complementarity; last line is JSON")
@click.option("--cache-dir", default=None,
              help="where to save the models (default: $GRAFT_CACHE or ~/.cache/graft/tiny)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--force", is_flag=True, help="rebuild even if the cache holds a complete build")
@click.option("--recipe", default=None, help="v6 (default: writing styles, weak families, final-step slips that "
              "leave RL room, first-fit packing), v5 (v6 with greedy packing and b's longer SFT), v4 (v5 with a's "
              "weak family weaker), v3 (no slips) or v2 (one style, blind families); docs/tiny_pair.md "
              "[default: $GRAFT_TINY_RECIPE or v6]")
@click.option("--prompts", type=click.IntRange(8, 8192), default=1024, show_default=True,
              help="with --check: training prompts sampled (x 8) for the measurements")
@click.option("--code", is_flag=True, help="the tiny code models instead (tiny_code:junior, tiny_code:teacher: the "
              "code arm of tiny_saf); with --check: pass@1 and group shapes on the held-out code problems")
@click.option("--roles", default=None, help="comma-separated roles to build (a, b, c, teacher, junior; e.g. a,b: the "
              "pair, which GRAFT studies load); default: all five. Not with --check (it measures all five)")
@one_line_errors
def tiny_build(check, cache_dir, seed, force, recipe, prompts, code, roles):
    """Build (or reuse) the tiny pair, teacher and junior (--code: the tiny code models).

    \b
    Example:
      graft tiny build --check
      graft tiny build --roles a,b
      graft tiny build --code --check
    """
    if roles and (check or code):
        raise click.UsageError("--roles: not with --check or --code (those build and measure every role)")
    if code:
        from graft_cli.tiny.code import code_main

        code_main(check=check, cache_dir=cache_dir, seed=seed, force=force)
        return
    from graft_cli.tiny.check import tiny_main

    tiny_main(check=check, cache_dir=cache_dir, seed=seed, force=force, recipe=recipe, num_prompts=prompts,
              roles=tuple(r.strip() for r in roles.split(",") if r.strip()) if roles else None)


@tiny.command("rl-check")
@click.option("--steps", type=int, default=80, show_default=True, help="training steps")
@click.option("--method", default="grpo", show_default=True, help="method config (experiments/method/)")
@click.option("--out", default="results/tiny_rl_check", show_default=True, help="output folder")
@click.option("--seed", type=int, default=0, show_default=True, help="training seed")
@click.option("--samples", type=int, default=8, show_default=True, help="eval samples per held-out problem")
@click.option("--runs", type=int, default=1, show_default=True, help="eval runs")
@click.option("--temperature", type=float, default=1.0, show_default=True, help="eval sampling temperature")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="eval nucleus top-p")
@click.option("--eval-seed", type=int, default=0, show_default=True,
              help="eval sampling seed (same for base and final)")
@click.option("--min-gain", type=float, default=3.0, show_default=True, help="target gain in pass@1 points")
@click.option("--no-progress", is_flag=True, help="no progress bar")
@click.argument("overrides", nargs=-1)
@one_line_errors
def tiny_rl_check(**opts):
    """Train the tiny pair (GRPO n=8 by default), then compare each policy's held-out pass@1 with
    its base model's, same sampling seed; writes OUT/rl_check.json (last printed line is that JSON).

    \b
    Example:
      graft tiny rl-check --steps 80
    """
    from graft_cli.plan.tiny_rl import TinyRLCheckOptions, rl_check

    rl_check(TinyRLCheckOptions.from_cli(**opts))


@main.command("eval")
@click.option("--run", "run_dir", default=None, help="run directory: evaluate its checkpoints, every policy")
@click.option("--model", default=None, help="evaluate one model: a folder, a hub id or tiny:<role>")
@click.option("--steps", default=None,
              help="with --run: all (complete checkpoints + kept best weights; default), last, best, or e.g. 10,20")
@click.option("--policy", default=None, help="with --run: only these policies (comma-separated)")
@click.option("--data", default=None, help="one problem file (JSONL/parquet) or hub id instead of the benchmarks")
@click.option("--benchmarks", default=None,
              help="comma-separated names (math500,aime24,aime25,amc23,minerva; olympiad,aime26,amc23_25; "
                   "hmmt25_feb,hmmt25_nov; code: humaneval (offline), humanevalplus, mbppplus, livecodebench, "
                   "humaneval_plus and mbpp_plus (EvalPlus's release files, offline: HUMANEVAL_OVERRIDE_PATH / "
                   "MBPP_OVERRIDE_PATH or --eval-dir)), "
                   "NAME=FILE or files [default: --run: its eval.final.benchmarks, else "
                   "eval.benchmarks; else the five; tiny pair: its five synthetic sets]")
@click.option("--eval-dir", default=None,
              help="folder with <benchmark>.jsonl files [default: $GRAFT_EVAL_DIR, else hub ids]")
@click.option("--pair", default=None, help="with --model: 'tiny' uses the tiny pair's synthetic benchmarks")
@click.option("--runs", type=int, default=None,
              help="independent eval runs (a seed each) [default: 5; --run: its eval.final.runs, else 5]")
@click.option("--bench-runs", default=None,
              help="more (or fewer) runs for some benchmarks, e.g. aime24=5,aime25=5,amc23=5: each run adds "
                   "--samples samples per problem [default: --runs for every benchmark; --run: its "
                   "eval.final.bench_runs]")
@click.option("--samples", type=int, default=None,
              help="samples per problem [default: 8; --run: its eval.final.samples, else eval.samples]")
@click.option("--temperature", type=float, default=None,
              help="sampling temperature [default: 0.6; --run: its eval.final / eval settings]")
@click.option("--top-p", type=float, default=None, help="nucleus top-p [default: 0.95; --run: as --temperature]")
@click.option("--top-k", type=int, default=None,
              help="sample among the k most likely tokens, before top-p; 0 = off [default: 0; --run: as --temperature]")
@click.option("--max-new-tokens", type=int, default=None,
              help="response length limit [default: the run's rollout.max_new_tokens; 4096 with --model]")
@click.option("--seed", type=int, default=None,
              help="base sampling seed; run k samples with a seed derived from it [default: 0]")
@click.option("--out", default=None, help="with --model: output folder [default: results/eval/<model>]")
@click.option("--dtype", default="float32", show_default=True, help="with --model: float32, bfloat16 or float16")
@click.option("--device", default=None, help="auto, cpu, cuda, ... [default: the run's run.device; auto]")
@click.option("--chat-template", type=click.Choice(["auto", "none", "required"]), default="auto", show_default=True,
              help="with --model: wrap prompts in the tokenizer's chat template when it has one (required: refuse a "
              "tokenizer without one)")
@click.option("--workers", type=int, default=None, help="grading worker processes per kind (math, code) [default: 2]")
@click.option("--lcb-window", default=None,
              help="livecodebench: contest dates START..END (ISO, either may be empty) [default: "
                   "2025-02-01..2025-05-01, the problems release_v6 added; --run: its eval.lcb_window]")
@click.option("--force", is_flag=True, help="start output folders made with other settings over")
@click.option("--tandem/--no-tandem", default=None,
              help="with --run: also handoff robustness and legibility with a junior [default: the run's eval.tandem]")
@click.option("--junior", default=None,
              help="with --run --tandem: the junior [default: the run's tandem junior, eval.junior or tandem.junior]")
@click.option("--no-progress", is_flag=True, help="no progress bar")
@one_line_errors
def eval_cmd(**opts):
    """Evaluate a run's checkpoints or one model: 5 runs x 8 samples at T=0.6, top-p 0.95 on
    MATH500, AIME24, AIME25, AMC23 and Minerva; pass@1 mean ± std over runs, unbiased pass@k,
    per-sample JSONL. Resumable: finished (benchmark, run) files are kept.

    \b
    Writes <run>/eval/<policy>/step_NNNNNN/{<bench>_run<k>.jsonl, summary.json},
    <run>/eval/<policy>/summary.json and <run>/best.json (--model: into --out; best.json by the run's
    eval.select_metric, from <run>/validation/ when its validation samples otherwise). With --tandem also
    step_NNNNNN/handoff/ (senior and junior alternating at eval.handoff_delimiter), step_NNNNNN/legibility/
    (the junior's cross-entropy on the solo answers) and <run>/eval/<policy>/pass_at_k.png.

    \b
    Examples:
      graft eval --run results/runs/tiny-graft-s0
      graft eval --model results/runs/1-graft-s0/best/smol --eval-dir data/eval --max-new-tokens 4096
      graft eval --model tiny:a --data problems.jsonl --runs 2 --samples 4
      graft eval --run results/runs/tiny-tandem-s0 --tandem --runs 1
      graft eval --model Qwen/Qwen3-4B --benchmarks humaneval,humanevalplus,mbppplus,livecodebench --temperature 1
    """
    from graft_cli.eval.runner import EvalOptions, eval_main

    eval_main(EvalOptions.from_cli(**opts))


@main.command("export")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", required=True, help="folder to write <policy>/ Hugging Face folders into")
@click.option("--step", type=int, default=None, help="checkpoint step [default: the newest that verifies]")
@click.option("--policy", "policies", multiple=True, help="only this policy (repeatable) [default: every policy]")
@click.option("--merge", is_flag=True,
              help="LoRA policies: the adapter merged into its base (a plain model folder) [default: the PEFT adapter "
                   "folder]")
@one_line_errors
def export_cmd(run_dir, out, step, policies, merge):
    """Export a run's checkpoint as Hugging Face model folders (from_pretrained / vLLM / lm-eval
    load them); a LoRA policy as its PEFT adapter folder, or merged with --merge."""
    from graft_cli.train.checkpoint import export

    for name, path in export(run_dir, out, step, list(policies) or None, merge=merge).items():
        click.echo(f"{name}: {path}")


@main.command("complementarity")
@click.option("--runs", "from_runs", is_flag=True,
              help="SOURCES are run directories: one run (its two policies) or two runs (DIR or DIR:POLICY each)")
@click.option("--models", "from_models", is_flag=True, help="SOURCES are two models (folders, hub ids or tiny:<role>)")
@click.argument("sources", nargs=-1, required=True)
@click.option("--data", default=None, help="with --models: problem file to sample on")
@click.option("--samples", type=int, default=8, show_default=True, help="with --models: samples per prompt")
@click.option("--temperature", type=float, default=1.0, show_default=True,
              help="with --models (training rollouts: 1.0)")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="with --models")
@click.option("--max-new-tokens", type=int, default=4096, show_default=True, help="with --models")
@click.option("--limit", type=int, default=None, help="with --models: only the first N problems")
@click.option("--seed", type=int, default=0, show_default=True, help="with --models: sampling seed")
@click.option("--device", default="auto", show_default=True, help="with --models")
@click.option("--workers", type=int, default=2, show_default=True, help="grading worker processes")
@click.option("--reward", default="math_verify", show_default=True,
              help="with --models: the registered reward that grades the samples (as a run's reward.name)")
@click.option("--out", default=None,
              help="output folder [default: <run>/complementarity for one run, else results/complementarity/...]")
@click.option("--no-progress", is_flag=True, help="no progress bar")
@one_line_errors
def complementarity_cmd(**opts):
    """Per-step cross-solve rates: the share of X's all-fail prompts (k = 0) on which Y has k >= 1,
    both directions, and their mean over training (graft.md §2.7). Writes complementarity.json and
    .png.

    \b
    Examples:
      graft complementarity --runs results/runs/tiny-grpo-s0
      graft complementarity --runs results/runs/1-grpo-s0:smol results/runs/1b-grpo-s0:qwen
      graft complementarity --models tiny:a tiny:b --data problems.jsonl --samples 8
    """
    from graft_cli.eval.complementarity import ComplementarityOptions, complementarity_main

    complementarity_main(ComplementarityOptions.from_cli(**opts))


@main.command("ablate")
@click.option("--sweep", required=True, help="sweep name: experiments/sweep/<NAME>.yaml (gate, floor, ordering, "
                                             "threshold, designs, baselines) or a path")
@click.option("--pair", default="tiny", show_default=True, help="pair config: tiny, 1, 2 or 3")
@click.option("--dry-run", is_flag=True, help="list the runs (new, partial or finished); run nothing")
@click.option("--out", default=None, help="folder of the run directories [default: results/ablate]")
@click.option("--steps", type=int, default=None, help="training steps of every run [default: the pair's]")
@click.option("--seeds", multiple=True, help="seeds, e.g. --seeds 0,1,2 [default: the sweep's]")
@click.option("--jobs", type=int, default=None, help="runs trained at the same time [default: the sweep's, 1]")
@click.option("--no-progress", is_flag=True, help="no progress bars")
@launch_options
@one_line_errors
def ablate_cmd(**opts):
    """Run an ablation sweep: each run is trained (skipped when finished, resumed when partial) and
    evaluated (skipped when done). Per-pair steps/eval settings: experiments/sweep/_pairs.yaml.

    \b
    Writes <out>/<pair>-<run>-s<seed>/ per run, <out>/plan_<sweep>.{md,json}.

    \b
    Examples:
      graft ablate --sweep gate --dry-run
      graft ablate --sweep threshold --pair tiny --steps 20 --seeds 0,1
    """
    from graft_cli.plan.commands import AblateOptions, ablate_main

    ablate_main(AblateOptions.from_cli(**opts))


@main.command("report")
@click.argument("dirs", nargs=-1, required=True)
@click.option("--out", default=None, help="output folder [default: results/report]")
@click.option("--devices", type=int, default=None,
              help="devices charged per run in the GPU-hour accounting [default: 4 for paper pairs, else 1]")
@click.option("--clip-steps", type=int, default=48, show_default=True,
              help="Table 9 averages clipped fractions over steps 1..N")
@click.option("--no-plots", is_flag=True, help="tables only")
@one_line_errors
def report_cmd(dirs, out, devices, clip_steps, no_plots):
    """Tables shaped like the paper's (Table 1 main results, 2/7/8 ablations, 9 clipped fractions, 5
    compute, 4 repeats, 6 stored trajectories, complementarity) in markdown and LaTeX, with the
    paper's numbers side by side for paper pairs, and PNG plots. DIRS are run directories or folders
    holding them (and `graft eval --model` folders).

    \b
    Writes <out>/report.md, tables.tex, report.json and plots/*.png.

    \b
    Example:
      graft report results/runs --out results/report
    """
    from graft_cli.report.tables import report_main

    report_main(list(dirs), out=out, devices=devices, clip_steps=clip_steps, plots=not no_plots)


@main.command("reproduce")
@click.option("--pair", default="tiny", show_default=True, help="reproduction plan: experiments/reproduce/<PAIR>.yaml")
@click.option("--out", default=None, help="output folder [default: results/reproduce_<pair>]")
@click.option("--dry-run", is_flag=True, help="list the runs in order (partners first) and their status; run nothing")
@click.option("--jobs", type=int, default=None, help="runs trained at the same time [default: the plan's]")
@click.option("--steps", type=int, default=None, help="training steps of every run [default: the plan's]")
@click.option("--no-report", is_flag=True, help="train and evaluate only")
@click.option("--no-progress", is_flag=True, help="no progress bars")
@click.option("--register", is_flag=True, help="write <out>/registration.json (the plan's design, hash, analysis "
                                               "rule) and run nothing: commit it before the first run")
@click.option("--registration", default=None,
              help="a registration file the plan must equal before anything runs or is judged [default: "
                   "<out>/registration.json when there is one]")
@launch_options
@one_line_errors
def reproduce_cmd(**opts):
    """Run a reproduction plan, experiments/reproduce/<PAIR>.yaml: train and evaluate each run, then
    `graft report` on the output folder. The miniatures on the tiny pair (tiny, tiny_full, tiny3,
    tiny_saf, tiny_tandem; each plan's file says its runs and seeds) add the paper's claims judged
    from the measured numbers (95% t-intervals over seeds and where their variance comes from). The
    papers' own tables (graft_table1, graft_ablations, graft_table6, saf_table, tandem_table:
    docs/cluster.md) name each run's GPUs and hours. Resumable: finished runs and evaluations are
    skipped. --dry-run lists the runs with their resources and the plan's GPU-hours.

    \b
    Writes <out>/<pair>-<run>-s<seed>/ per run, <out>/plan_<name>.{md,json}, <out>/report/report.md (with the
    claims section), claims.json, tables.tex, plots/.

    \b
    Examples:
      graft reproduce --pair tiny --out results/reproduce_tiny
      graft reproduce --pair graft_table1 --dry-run
      graft reproduce --pair tiny_dose --register --out results/tiny_dose
      graft reproduce --pair tiny_dose --registration results/tiny_dose/registration.json
      graft reproduce --pair graft_table1 --launcher slurm --partition gpu --out /shared/graft_table1
      graft reproduce --pair graft_table1 --launcher slurm --out /shared/graft_table1 --status
    """
    from graft_cli.plan.commands import ReproduceOptions, reproduce_main

    reproduce_main(ReproduceOptions.from_cli(**opts))


if __name__ == "__main__":
    main()
