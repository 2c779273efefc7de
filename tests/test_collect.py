"""How a step's rollouts are collected (graft_cli/train/collect.py): the collector's explicit inputs, the single
round every policy shares, and the prompts a step will draw, known in advance."""

from __future__ import annotations

import torch

from graft_cli.batch import PolicyStep, Rollouts
from graft_cli.data.problems import Problem
from graft_cli.data.sampler import PromptSampler
from graft_cli.train.collect import COLLECTORS, CollectInputs, collector_for
from graft_cli.train.parallel import PolicyPool


def _inputs(pool=None, n_problems=12, batch=3):
    calls = []
    problems = [Problem(f"p{i}", f"{i}+1", str(i + 1)) for i in range(n_problems)]

    def sample(i, probs, round_):
        calls.append((i, [p.id for p in probs], round_))
        n = 2
        ro = Rollouts([[1]] * len(probs), [[2]] * (n * len(probs)), ["x"] * (n * len(probs)),
                      [[-0.1]] * (n * len(probs)), [False] * (n * len(probs)), n=n)
        rew = torch.zeros(len(probs), n)
        return PolicyStep("ab"[i], probs, [[1]] * len(probs), ro, rew, rew.clone()), {"time/rollout": float(i)}

    inp = CollectInputs(problems, PromptSampler(n_problems, batch, seed=3), ["a", "b"], sample,
                        **({"pool": pool} if pool else {}))
    return inp, calls


def test_single_round_gives_every_policy_the_same_prompts_and_advances_the_cursor_once():
    from graft_cli.config import compose

    single = collector_for(compose([]))
    assert isinstance(single, COLLECTORS.get("single"))
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
    single = COLLECTORS.get("single")(None)
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
