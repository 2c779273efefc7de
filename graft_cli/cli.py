"""The `graft` command line. Each subcommand composes a Hydra config (experiments/) and calls one
function; errors in user input are one line on stderr and exit code 2."""

from __future__ import annotations

import functools
import sys

import click

from graft_cli.errors import GraftError


def one_line_errors(fn):
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except GraftError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="graft")
def main():
    """graft: cross-model RLVR (GRAFT, GRPO and baselines) for LLMs on math.

    \b
    Quick start (embedded tiny pair, CPU):
      graft tiny build --check
      graft train --pair tiny --method grpo --steps 20
    """


def _train_overrides(pair, method, steps, out, seed, name, overrides):
    ov = [f"pair='{pair}'", f"method='{method}'"]
    if steps is not None:
        ov.append(f"run.steps={steps}")
    if out is not None:
        ov.append(f"run.out={out}")
    if seed is not None:
        ov.append(f"run.seed={seed}")
    if name is not None:
        ov.append(f"run.name={name}")
    return ov + list(overrides)


@main.command(context_settings={"ignore_unknown_options": False})
@click.option("--pair", default="tiny", show_default=True, help="pair config: tiny, 1, 2 or 3 (experiments/pair/)")
@click.option("--method", default="grpo", show_default=True, help="method config (experiments/method/)")
@click.option("--steps", type=int, default=None, help="number of training steps (default: run.epochs epochs)")
@click.option("--out", default=None, help="parent folder of run directories (default: results/runs)")
@click.option("--seed", type=int, default=None, help="training seed (data order, sampling)")
@click.option("--name", default=None, help="run name (default: <pair>-<method>-s<seed>)")
@click.option("--no-progress", is_flag=True, help="no progress bar")
@click.argument("overrides", nargs=-1)
@one_line_errors
def train(pair, method, steps, out, seed, name, no_progress, overrides):
    """Train a pair (or more) of policies with a method; resumes from the last checkpoint.

    \b
    Example:
      graft train --pair tiny --method grpo --steps 20 --out results/runs optim.lr=5e-5
    """
    from graft_cli.config import compose
    from graft_cli.train.loop import train as run_train

    cfg = compose(_train_overrides(pair, method, steps, out, seed, name, overrides))
    run_train(cfg, progress=not no_progress)


@main.group()
def tiny():
    """The embedded tiny pair (two small heterogeneous models built on CPU)."""


@tiny.command("build")
@click.option("--check", is_flag=True, help="measure pass@1, all-fail rate and complementarity; last line is JSON")
@click.option("--cache-dir", default=None, help="where to save the models (default: $GRAFT_CACHE or ~/.cache/graft/tiny)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--force", is_flag=True, help="rebuild even if the cache holds a complete build")
@one_line_errors
def tiny_build(check, cache_dir, seed, force):
    """Build (or reuse) the tiny pair, teacher and junior.

    \b
    Example:
      graft tiny build --check
    """
    from graft_cli.models.tiny import tiny_main

    tiny_main(check=check, cache_dir=cache_dir, seed=seed, force=force)


def _not_yet(name: str, issue: str):
    @main.command(name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def cmd(args):
        click.echo(f"graft {name}: not built yet ({issue})", err=True)
        sys.exit(2)

    cmd.__doc__ = f"(not built yet: {issue})"
    return cmd


_not_yet("complementarity", "evaluation/complementarity issue")
_not_yet("eval", "evaluation issue")
_not_yet("ablate", "evaluation/ablation issue")
_not_yet("report", "reporting issue")
_not_yet("reproduce", "miniature reproduction issue")


if __name__ == "__main__":
    main()
