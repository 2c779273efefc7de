"""The commands' options objects built from the command line: each click command hands its options to one typed
dataclass (``from_cli`` maps the names click gives), and click's defaults are the dataclass's own."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from graft_cli.eval import complementarity
from graft_cli.eval.complementarity import ComplementarityOptions
from graft_cli.cli import main
from graft_cli.eval import runner
from graft_cli.eval.runner import EvalOptions
from graft_cli.plan import commands, tiny_rl
from graft_cli.plan.commands import LAUNCH_OPTIONS, AblateOptions, ReproduceOptions
from graft_cli.plan.launch import LaunchOptions
from graft_cli.plan.options import launch_kwargs
from graft_cli.plan.tiny_rl import TinyRLCheckOptions


@pytest.fixture
def seen(monkeypatch):
    """The options object each command's entry point receives (the entry points replaced by a recorder)."""
    got = []
    for module, name in ((runner, "eval_main"), (complementarity, "complementarity_main"),
                         (commands, "ablate_main"), (commands, "reproduce_main"), (tiny_rl, "rl_check")):
        monkeypatch.setattr(module, name, lambda o, console=None: got.append(o))
    return got


def _run(args, seen):
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    (o,) = seen
    return o


def test_click_defaults_are_the_dataclass_defaults(seen):
    assert _run(["eval"], seen) == EvalOptions()
    seen.clear()
    assert _run(["complementarity", "--runs", "r"], seen) == ComplementarityOptions(sources=["r"], runs=True)
    seen.clear()
    assert _run(["tiny", "rl-check"], seen) == TinyRLCheckOptions()
    seen.clear()
    assert _run(["ablate", "--sweep", "gate"], seen) == AblateOptions(sweep="gate", launch=LaunchOptions())
    seen.clear()
    assert _run(["reproduce"], seen) == ReproduceOptions(launch=LaunchOptions())


def test_eval_options_map_click_names(seen):
    o = _run(["eval", "--model", "tiny:a", "--policy", "a,b", "--no-progress", "--bench-runs", "aime24=5",
              "--top-k", "20", "--no-tandem", "--chat-template", "none"], seen)
    assert (o.model, o.policies, o.progress, o.bench_runs) == ("tiny:a", "a,b", False, "aime24=5")
    assert (o.top_k, o.tandem, o.chat_template, o.run_dir) == (20, False, "none", None)


def test_complementarity_options_map_click_names(seen):
    o = _run(["complementarity", "--models", "tiny:a", "tiny:b", "--data", "p.jsonl", "--samples", "4",
              "--reward", "code", "--no-progress"], seen)
    assert o == ComplementarityOptions(sources=["tiny:a", "tiny:b"], models=True, data="p.jsonl", samples=4,
                                       reward="code", progress=False)


def test_tiny_rl_check_options_map_click_names(seen):
    o = _run(["tiny", "rl-check", "--min-gain", "1.5", "--top-p", "0.9", "--no-progress", "algo.x=1", "run.y=2"],
             seen)
    assert o == TinyRLCheckOptions(min_gain_points=1.5, top_p=0.9, progress=False, overrides=("algo.x=1", "run.y=2"))


def test_plan_options_map_click_names_and_launcher_options(seen):
    o = _run(["ablate", "--sweep", "gate", "--seeds", "0,1", "--seeds", "2", "--no-progress", "--launcher", "slurm",
              "--status", "--account", "acc", "--time", "01:00:00", "--sbatch=--mem=0"], seen)
    assert o == AblateOptions(sweep="gate", seeds=["0,1", "2"], progress=False, launcher="slurm", status=True,
                              launch=LaunchOptions(account="acc", time="01:00:00", sbatch=["--mem=0"]))
    seen.clear()
    o = _run(["reproduce", "--pair", "tiny_dose", "--no-report", "--register", "--jobs", "2", "--report-only"], seen)
    assert o == ReproduceOptions(pair="tiny_dose", report=False, register=True, jobs=2, report_only=True,
                                 launch=LaunchOptions())


def test_launch_option_names_are_launch_kwargs_parameters():
    kw = launch_kwargs(**dict.fromkeys(LAUNCH_OPTIONS, None) | {"sbatch_lines": ()})
    assert set(kw) == {"launcher", "status", "cancel", "report_only", "launch"}


def test_plan_launch_options_fill_jobs_progress_and_a_console():
    given = LaunchOptions(partition="gpu")
    lo = ReproduceOptions(jobs=3, progress=False, launch=given).launch_options()
    assert (lo.partition, lo.jobs, lo.progress) == ("gpu", 3, False) and lo.console is not None
    assert given.jobs is None  # the options' own LaunchOptions is left as given
