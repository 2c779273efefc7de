"""A run is graded by its own reward wherever it is graded: the trainer, validation during training
and `graft eval --run` all build their grader with ``reward.make_grader(cfg.reward)``, so a run whose reward is not
math-verify is validated and evaluated with that reward (before, `graft eval --run` graded it with math-verify).

The reward here is registered by the test: 1.0 for a response of even length, 0.0 for an odd one, and it marks what
it extracted, so every grade in the files can be checked against the response beside it."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import make_random_model, train_overrides

from graft_cli.config import compose
from graft_cli.schema import CodeRewardConfig, RewardConfig
from graft_cli.errors import GraftError
from graft_cli.reward import REWARDS, make_grader
from graft_cli.reward.pool import Grades

MARK = "parity-reward"


class ParityGrader:
    made: list[dict] = []  # the options each grader was built with

    def __init__(self, **opts):
        ParityGrader.made.append(opts)

    def start(self, wait=True):
        return self

    def grade(self, responses, golds):
        r = np.array([float(len(a) % 2 == 0) for a in responses], dtype=np.float32)
        return Grades(r, np.zeros(len(r), dtype=bool), [MARK] * len(r), ["ok"] * len(r))

    def close(self):
        pass


if "test_parity" not in REWARDS:
    REWARDS.register("test_parity")(ParityGrader)


def test_make_grader_builds_the_named_reward_with_the_sections_options():
    ParityGrader.made.clear()
    g = make_grader(RewardConfig(name="test_parity", timeout_s=7.5, chunk_size=3), num_workers=0)
    assert isinstance(g, ParityGrader)
    assert ParityGrader.made == [{"num_workers": 0, "timeout_s": 7.5, "chunk_size": 3, "sci_notation": True,
                                  "memory_mb": 4096, "coinflip_p": 0.5, "code": CodeRewardConfig()}]
    assert type(make_grader(RewardConfig())).__name__ == "MathVerifyGrader"
    with pytest.raises(GraftError, match="test_parity"):  # an unknown name lists the registered ones
        make_grader(RewardConfig(name="test_parityy"))


def test_make_grader_passes_a_factory_only_the_options_its_signature_names():
    made = []

    def named(timeout_s: float = 1.0, coinflip_p: float = 0.5):  # no **kwargs: gets these two and nothing else
        made.append({"timeout_s": timeout_s, "coinflip_p": coinflip_p})
        return ParityGrader()

    if "test_named" not in REWARDS:
        REWARDS.register("test_named")(named)
    make_grader(RewardConfig(name="test_named", timeout_s=7.5, coinflip_p=0.2, memory_mb=0), num_workers=0)
    assert made == [{"timeout_s": 7.5, "coinflip_p": 0.2}]  # num_workers (override), memory_mb, ... not passed
    # the shipped factories name their own options: math-verify is built from a section that sets coinflip_p
    g = make_grader(RewardConfig(coinflip_p=0.2, timeout_s=2.5, num_workers=0))
    assert type(g).__name__ == "MathVerifyGrader" and g.timeout_s == 2.5
    g.close()
    assert make_grader(RewardConfig(name="coinflip", coinflip_p=0.2, num_workers=3)).p == 0.2


def test_a_run_with_another_reward_validates_and_evaluates_with_it(problems_file, tmp_path):
    from graft_cli.eval.validation import ValidationHook
    from graft_cli.eval.runner import EvalOptions, evaluate_run
    from graft_cli.rundir import read_jsonl
    from graft_cli.train.run import train

    model = make_random_model(str(tmp_path / "m"), "qwen3", 5)
    cfg = compose(train_overrides({"a": model}, problems_file, str(tmp_path / "runs"),
                                  ["run.steps=1", "run.name=t", "rollout.max_new_tokens=12", "data.prompt_batch=2",
                                   "rollout.n=2", "run.log_rollouts=false", "data.holdout=4", "eval.every=1",
                                   "eval.samples=2", "eval.max_new_tokens=12", "eval.benchmarks=[heldout]",
                                   "eval.final.runs=1", "eval.final.samples=1", "run.device=cpu",
                                   "reward.name=test_parity", "reward.timeout_s=7.5", "reward.num_workers=0"]))
    ParityGrader.made.clear()
    run = train(cfg, progress=False, after_step=(ValidationHook(),))
    assert len(ParityGrader.made) == 1  # the trainer's; validation grades with it
    ParityGrader.made.clear()
    evaluate_run(EvalOptions(run_dir=run, steps="last", workers=0, progress=False))
    assert [m["timeout_s"] for m in ParityGrader.made] == [7.5] and ParityGrader.made[0]["num_workers"] == 0
    for folder, samples in (("validation", 2), ("eval", 1)):  # the final evaluation samples apart (eval.final)
        rows = read_jsonl(os.path.join(run, folder, "a", "step_000001", "heldout_run1.jsonl"))
        assert len(rows) == 4 * samples
        for r in rows:  # math-verify would have extracted a boxed answer (or None), and graded it
            assert r["extracted"] == MARK and r["grade"] == float(len(r["response"]) % 2 == 0), (folder, r)


class _RefusingGrader:
    """A reward that cannot run on this machine: ``start`` raises as the code sandbox does as root without the
    uid drop; ``close`` is recorded."""

    closed = 0

    def __init__(self, **_):
        pass

    def start(self, wait=True):
        raise GraftError("test reward: refused on this machine")

    def grade(self, responses, golds):
        raise AssertionError("a refused reward never grades")

    def close(self):
        _RefusingGrader.closed += 1


if "test_refusing" not in REWARDS:
    REWARDS.register("test_refusing")(_RefusingGrader)


def test_a_reward_that_cannot_start_stops_the_run_before_step_1(problems_file, tmp_path):
    from graft_cli.train.run import train

    model = make_random_model(str(tmp_path / "m"), "qwen3", 5)
    out = tmp_path / "runs"
    cfg = compose(train_overrides({"a": model}, problems_file, str(out),
                                  ["run.steps=2", "run.name=t", "reward.name=test_refusing", "run.device=cpu"]))
    _RefusingGrader.closed = 0
    with pytest.raises(GraftError, match="test reward: refused on this machine"):
        train(cfg, progress=False)
    assert _RefusingGrader.closed == 1  # started() closes what it could not start
    run = out / "t"
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())  # no step was trained
    metrics = run / "metrics.jsonl"
    assert not metrics.exists() or "time/step" not in metrics.read_text()
