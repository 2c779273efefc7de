"""How a step's rollouts are collected (graft_cli/train/rollouts.py): the collector's explicit inputs, the single
round every policy shares, and the prompts a step will draw, known in advance."""

from __future__ import annotations

import torch

from graft_cli.batch import PolicyStep, Rollouts
from graft_cli.data.problems import Problem
from graft_cli.data.sampler import PromptSampler
from graft_cli.train.rollouts import CollectInputs, SingleRound, collector_for
from graft_cli.train.parallel import PolicyPool


class _Worker:
    """A scripted rollout worker: every call recorded as (policy index, problem ids, round)."""

    def __init__(self):
        self.calls = []

    def sample(self, i, probs, round_=0):
        self.calls.append((i, [p.id for p in probs], round_))
        n = 2
        ro = Rollouts([[1]] * len(probs), [[2]] * (n * len(probs)), ["x"] * (n * len(probs)),
                      [[-0.1]] * (n * len(probs)), [False] * (n * len(probs)), n=n)
        rew = torch.zeros(len(probs), n)
        return PolicyStep("ab"[i], probs, [[1]] * len(probs), ro, rew, rew.clone()), {"time/rollout": float(i)}


def _inputs(pool=None, n_problems=12, batch=3):
    problems = [Problem(f"p{i}", f"{i}+1", str(i + 1)) for i in range(n_problems)]
    worker = _Worker()
    inp = CollectInputs(problems, PromptSampler(n_problems, batch, seed=3), ["a", "b"], worker,
                        **({"pool": pool} if pool else {}))
    return inp, worker.calls


def test_single_round_gives_every_policy_the_same_prompts_and_advances_the_cursor_once():
    from graft_cli.config import compose

    single = collector_for(compose([]))
    assert isinstance(single, SingleRound)
    inp, calls = _inputs()
    planned = [p.id for p in single.prompts_at(inp, 0)]
    steps, rows = single.collect(inp)
    assert inp.sampler.step == 1
    assert [c[0] for c in calls] == [0, 1] and calls[0][1] == calls[1][1] == planned  # known in advance
    assert all(r == 0 for _, _, r in calls)  # one sampling round
    assert [p.id for p in steps["a"].problems] == [p.id for p in steps["b"].problems] == planned
    assert rows == {"a": {"time/rollout": 0.0}, "b": {"time/rollout": 1.0}}
    # the next step's prompts are the cursor's next batch
    nxt = [p.id for p in single.prompts_at(inp, 1)]
    single.collect(inp)
    assert calls[2][1] == nxt and calls[2][1] != planned


def test_single_round_on_policy_threads_keeps_policy_order():
    single = SingleRound(None)
    pool = PolicyPool(2)
    try:
        inp, calls = _inputs(pool)
        steps, rows = single.collect(inp)
    finally:
        pool.close()
    assert list(steps) == ["a", "b"] and steps["a"].name == "a" and steps["b"].name == "b"
    assert sorted(c[0] for c in calls) == [0, 1]


def test_dynamic_sampling_does_not_know_its_prompts_in_advance():
    from graft_cli.config import compose

    dyn = collector_for(compose(["method=grpo_dapo"]))
    inp, _ = _inputs()
    assert dyn.prompts_at(inp, 0) is None


def test_rollout_worker_seeds_follow_the_step_it_is_bound_to_the_policy_and_the_round():
    """RolloutWorker.sample: policy i's engine samples with the seed of (run seed, the worker's step, i, round), the
    grades become rewards and group advantages; ``at(step)`` is a worker of another step, the first unchanged."""
    from types import SimpleNamespace

    from graft_cli.algorithms.advantages import ADVANTAGES
    from graft_cli.config import compose
    from graft_cli.data.prompts import PromptSpec
    from graft_cli.train import dist as D
    from graft_cli.train.policies import Policy
    from graft_cli.train.rollouts import RolloutWorker, sampling_seed

    seeds = []

    class Engine:
        def generate(self, prompts, params):
            seeds.append(params.seed)
            m = params.n * len(prompts)
            return Rollouts(prompts, [[2]] * m, ["x"] * m, [[-0.1]] * m, [False] * m, n=params.n)

    class Grader:
        def grade(self, texts, golds):
            rewards = [float(i % 2) for i in range(len(texts))]
            return SimpleNamespace(rewards=rewards, timed_out=[False] * len(texts), extracted=[None] * len(texts),
                                   counts=lambda: {"graded": len(texts)})

    cfg = compose(["rollout.n=2", "run.seed=7"])
    problems = [Problem(f"p{i}", f"{i}+1", str(i + 1)) for i in range(3)]
    cache = {p.problem: [1, i] for i, p in enumerate(problems)}  # the prompts' ids, as encoded once
    pols = {n: Policy(n, None, None, None, Engine(), dict(cache)) for n in ("a", "b")}
    worker = RolloutWorker(pols, PromptSpec.from_config(cfg.prompt), Grader(), ADVANTAGES.get(cfg.algo.advantage),
                           cfg, D.Dist())
    at5 = worker.at(5)
    st, row = at5.sample(1, problems, 2)
    assert worker.step == 0 and at5.step == 5
    assert seeds == [(sampling_seed(7, 5, 1) + 2 * 15_485_867) % (2**31 - 1)]
    assert st.name == "b" and st.prompt_ids == [[1, 0], [1, 1], [1, 2]]
    assert st.rewards.tolist() == [[0.0, 1.0]] * 3 and st.advantages[0, 1] > 0 > st.advantages[0, 0]
    assert row["graded"] == 6 and {"time/rollout", "time/reward"} <= set(row)
    worker.sample(0, problems)
    assert seeds[-1] == sampling_seed(7, 0, 0)
