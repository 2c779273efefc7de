"""The rollout worker: policy ``i`` samples a list of problems, its responses are graded and the
group advantages taken (:meth:`RolloutWorker.sample`, the ``sample`` a collector calls,
train/collect.py).

A worker is bound to one 0-based step (:meth:`RolloutWorker.at`): sampling seeds depend on (run
seed, step, policy, round) only, never on RNG state, so a resumed run samples exactly what the
uninterrupted one would, and a collection launched ahead of its step (train/ahead.py) samples what
it would have sampled at its step."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from graft_cli import config as C
from graft_cli import faults
from graft_cli.batch import PolicyStep
from graft_cli.data.problems import Problem
from graft_cli.data.prompts import PromptSpec
from graft_cli.rollout import SamplingParams
from graft_cli.train import dist as D
from graft_cli.train.policies import Policy, encode_prompt

if TYPE_CHECKING:
    from graft_cli.reward import Grader


def sampling_seed(run_seed: int, step: int, policy_index: int) -> int:
    """One seed per (run, step, policy): sampling never depends on RNG state, so resume is exact."""
    return (run_seed * 1_000_003 + step * 7919 + policy_index * 104_729) % (2**31 - 1)


@dataclass(frozen=True)
class RolloutWorker:
    """What sampling reads: the trained policies (their engines and prompt encodings, in order:
    policy ``i`` is the ``i``-th), the prompt format, the grader, the advantage function, the config
    (``rollout``, ``algo``, ``run.seed``), the data-parallel group and the step the seeds are drawn
    for."""

    policies: dict[str, Policy]
    spec: PromptSpec
    grader: Grader  # a LockedGrader where policies are graded from several threads (train/parallel.py)
    adv_fn: Callable[..., torch.Tensor]  # an ADVANTAGES entry: (rewards, eps=, norm_by_std=) -> advantages
    cfg: C.Config
    dist: D.Dist
    step: int = 0

    def at(self, step: int) -> RolloutWorker:
        """This worker for 0-based ``step``."""
        return dataclasses.replace(self, step=step)

    def sample(self, i: int, problems: list[Problem], round_: int = 0) -> tuple[PolicyStep, dict]:
        """Policy ``i`` samples ``problems`` (sampling round ``round_`` of the worker's step),
        grades them and takes the group advantages; the step and its metrics (seconds of rollout and
        reward, the grader's counts, the engine's metrics)."""
        cfg, r, step, dist = self.cfg, self.cfg.rollout, self.step, self.dist
        pol = self.policies[list(self.policies)[i]]
        t0 = time.perf_counter()
        prompt_ids = [encode_prompt(pol, p.problem, self.spec) for p in problems]
        lo, hi = dist.rollout_slice(len(problems))  # data-parallel: this rollout group's prompts
        group = dist.rank // dist.rollout_tp
        seed = sampling_seed(cfg.run.seed, step, i) + group * 1_000_033 + round_ * 15_485_867
        params = SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens,
                                seed=seed % (2**31 - 1))
        ro = pol.engine.generate(prompt_ids[lo:hi], params)
        faults.point("rollout", step + 1)
        t1 = time.perf_counter()
        golds = [p.answer for p in problems[lo:hi] for _ in range(r.n)]
        grades = self.grader.grade(ro.texts, golds)
        faults.point("reward", step + 1)
        if dist.enabled:
            ro, grades = D.concat_rollouts(dist.gather_rollout_groups((ro, grades)))
        t2 = time.perf_counter()
        rewards = torch.tensor(grades.rewards, dtype=torch.float32).view(len(problems), r.n)
        adv = self.adv_fn(rewards, eps=cfg.algo.adv_eps, norm_by_std=cfg.algo.norm_by_std)
        ps = PolicyStep(pol.name, problems, prompt_ids, ro, rewards, adv, np.asarray(grades.timed_out))
        ps.rollouts.meta["extracted"] = grades.extracted
        return ps, {"time/rollout": t1 - t0, "time/reward": t2 - t1, **grades.counts(), **ro.meta.get("metrics", {})}


__all__ = ["RolloutWorker", "sampling_seed"]
