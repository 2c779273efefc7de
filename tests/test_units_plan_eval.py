"""Unit tests of the launcher options shared by ``graft reproduce`` and ``graft ablate`` (plan/options.py), driven
through click's runner on a command declared here, and of the lm-evaluation-harness scoring hook
(eval/lm_eval_tasks/utils.py): per-problem pass@1 and pass@k against counts worked by hand, its SIGALRM plumbing
and the task YAML's metric names."""

from __future__ import annotations

import math
import os
import signal
import threading

import click
import pytest
import yaml
from click.testing import CliRunner

from graft_cli.eval.lm_eval_tasks import utils as lm_utils
from graft_cli.plan.launch import LaunchOptions
from graft_cli.plan.options import OPTIONS, launch_kwargs, launch_options

TASKS = os.path.dirname(lm_utils.__file__)


# ============================================================================================== options.py
def _command(seen):
    @click.command()
    @launch_options
    def cmd(**launch):
        seen.append(launch_kwargs(**launch))

    return cmd


def test_launch_options_defaults():
    """With no option: the local launcher, no status/cancel/report-only, no Slurm settings."""
    seen = []
    res = CliRunner().invoke(_command(seen), [])
    assert res.exit_code == 0, res.output
    assert seen == [{"launcher": "local", "status": False, "cancel": False, "report_only": False,
                     "launch": LaunchOptions(account=None, partition=None, qos=None, time=None, sbatch=[])}]


def test_launch_options_slurm_values_reach_launch_options():
    """Every Slurm option lands in LaunchOptions (``--time`` as ``time``, repeated ``--sbatch`` in order); the flags
    in the top-level keywords."""
    seen = []
    args = ["--launcher", "slurm", "--status", "--cancel", "--report-only", "--account", "acc", "--partition", "gpu",
            "--qos", "high", "--time", "02:00:00", "--sbatch=--constraint=h200", "--sbatch", "--mem=0"]
    res = CliRunner().invoke(_command(seen), args)
    assert res.exit_code == 0, res.output
    (kw,) = seen
    assert (kw["launcher"], kw["status"], kw["cancel"], kw["report_only"]) == ("slurm", True, True, True)
    launch = kw["launch"]
    assert (launch.account, launch.partition, launch.qos, launch.time) == ("acc", "gpu", "high", "02:00:00")
    assert launch.sbatch == ["--constraint=h200", "--mem=0"] and isinstance(launch.sbatch, list)
    assert (launch.jobs, launch.progress) == (None, True)  # not launcher options: LaunchOptions' own defaults


def test_launch_options_listed_in_declaration_order_in_help():
    """``--help`` lists the options in the order :data:`OPTIONS` declares them."""
    res = CliRunner().invoke(_command([]), ["--help"])
    assert res.exit_code == 0
    flags = ["--launcher", "--status", "--cancel", "--report-only", "--account", "--partition", "--qos", "--time",
             "--sbatch"]
    assert len(OPTIONS) == len(flags)
    pos = [res.output.index(f"  {f} ") for f in flags]
    assert pos == sorted(pos)


def test_launch_kwargs_copies_the_sbatch_tuple():
    """Called directly (click gives a tuple for a multiple option) it returns a fresh list."""
    kw = launch_kwargs("local", False, False, False, None, None, None, None, ("--a",))
    assert kw["launch"].sbatch == ["--a"] and set(kw) == {"launcher", "status", "cancel", "report_only", "launch"}


# ========================================================================================= lm_eval utils.py
def _pass_at_k(n, c, k):
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


class Boxed:
    """A non-string result: graded as its ``str``."""

    def __init__(self, v):
        self.v = v

    def __str__(self):
        return f"so the answer is \\boxed{{{self.v}}}"


@pytest.mark.parametrize("results,c", [
    ([["\\boxed{4}", "\\boxed{5}", "no box at all", "2 + 2 = \\boxed{4}"]], 2),  # lm-eval's [[r1, ..., rk]]
    (["\\boxed{4}", "\\boxed{3}", "\\boxed{7}"], 1),  # a flat list
    ([[Boxed(4), Boxed(4)]], 2),  # non-strings graded as their text
    ([["\\boxed{5}"] * 8], 0),
])
def test_process_results_counts_correct_samples(results, c):
    """pass@1 is the share of correct samples, pass@k the unbiased pass@k with k = the number of samples."""
    n = len(results[0]) if isinstance(results[0], list) else len(results)
    out = lm_utils.process_results({"answer": 4}, results)  # a numeric gold is compared as text
    assert out == {"pass_at_1": pytest.approx(c / n), "pass_at_k": pytest.approx(_pass_at_k(n, c, n))}


def test_process_results_no_samples():
    """No samples: both metrics 0 (never a division by zero)."""
    assert lm_utils.process_results({"answer": "1"}, []) == {"pass_at_1": 0.0, "pass_at_k": 0.0}
    assert lm_utils.process_results({"answer": "1"}, [[]]) == {"pass_at_1": 0.0, "pass_at_k": 0.0}


def test_grade_outside_the_main_thread_uses_no_alarm():
    """In a worker thread (no SIGALRM there) grading still works, without touching the signal handler."""
    before = signal.getsignal(signal.SIGALRM)
    out = {}
    th = threading.Thread(target=lambda: out.update(r=[lm_utils._grade("\\boxed{12}", "12"),
                                                       lm_utils._grade("\\boxed{13}", "12")]))
    th.start()
    th.join()
    assert out["r"] == [1.0, 0.0] and signal.getsignal(signal.SIGALRM) is before


def test_grade_alarm_raises_timeout_and_restores_the_handler(monkeypatch):
    """In the main thread an alarm during grading raises TimeoutError out of the grade; the previous SIGALRM handler
    is back and no alarm is left pending, whether grading timed out or not."""
    before = signal.getsignal(signal.SIGALRM)
    armed = []

    def fires(response, gold):
        armed.append(signal.alarm(0))  # seconds left on the alarm _grade set (cancelled here), then fire it now
        signal.raise_signal(signal.SIGALRM)
        return 1.0, None

    monkeypatch.setattr(lm_utils, "grade_one", fires)
    with pytest.raises(TimeoutError):
        lm_utils._grade("x", "y")
    assert len(armed) == 1 and 0 < armed[0] <= lm_utils.TIMEOUT_S  # an alarm of TIMEOUT_S was pending
    assert signal.getsignal(signal.SIGALRM) is before and signal.alarm(0) == 0
    monkeypatch.setattr(lm_utils, "grade_one", lambda response, gold: (1.0, "7"))
    assert lm_utils._grade("x", "7") == 1.0
    assert signal.getsignal(signal.SIGALRM) is before and signal.alarm(0) == 0


def test_task_yaml_metrics_are_what_process_results_returns():
    """The shared task YAML names ``utils.process_results``, keeps as many samples as it repeats, and lists as metrics
    exactly the keys process_results returns."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: ("function", loader.construct_scalar(node)))
    cfg = yaml.load(open(os.path.join(TASKS, "_graft_math_yaml")), Loader=Loader)
    assert cfg["process_results"] == ("function", "utils.process_results")
    (flt,) = cfg["filter_list"][0]["filter"]
    assert flt == {"function": "take_first_k", "k": cfg["repeats"]}
    keys = set(lm_utils.process_results({"answer": "1"}, [["\\boxed{1}"]]))
    assert {m["metric"] for m in cfg["metric_list"]} == keys
    files = [yaml.safe_load(open(os.path.join(TASKS, f))) for f in sorted(os.listdir(TASKS)) if f.endswith(".yaml")]
    tasks = [f for f in files if "group" not in f]
    (group,) = [f for f in files if "group" in f]
    assert len(tasks) == 5 and all(t["include"] == "_graft_math_yaml" for t in tasks)
    assert sorted(group["task"]) == sorted(t["task"] for t in tasks)  # the group is the five tasks
    assert {m["metric"] for m in group["aggregate_metric_list"]} <= keys
