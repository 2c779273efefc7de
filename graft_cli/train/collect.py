"""How a step's rollouts are collected (registry ``COLLECTORS``; :func:`collector_for` picks one
from the config: ``dynamic`` when ``algo.filter_groups.enable``, else ``single``).

A collector is ``cls(cfg)`` with ``collect(inp: CollectInputs) -> (steps, rows)``: every trained
policy's :class:`~graft_cli.batch.PolicyStep` for this step and its metrics row so far. It draws
prompt batches from ``inp.sampler`` (indices into ``inp.problems``) and samples through
``inp.worker.sample(i, problems, round)`` (policy ``i`` of ``inp.policies``;
:class:`~graft_cli.train.rollout_worker.RolloutWorker` in a run), whose seeds depend on (run seed,
step, policy, round) only, so a resumed run collects exactly what the uninterrupted one would.

- ``single``: one prompt batch, every policy samples it (GRPO, GRAFT: the policies share the
  prompts); the policies sample in parallel threads when the trainer has a pool of them
  (``run.policy_workers``).
- ``dynamic``: DAPO's dynamic sampling (verl ``algorithm.filter_groups``; baselines.md §4): groups
  whose rewards are all equal (the ``acc`` metric: all correct or all wrong) are dropped, and
  further prompt batches are drawn and sampled until every policy holds ``data.prompt_batch``
  informative groups or ``algo.filter_groups.max_num_gen_batches`` rounds have run (0 = no cap);
  surplus groups beyond the batch are discarded (the first ones are kept, as verl does). A policy
  that ends short trains on the groups it has. Each policy keeps its own groups, so the policies no
  longer share prompts: only ``exchange.name: none``. Metrics: ``filter_groups/rounds``,
  ``/evicted_groups``, ``/discarded_surplus_groups``, ``/kept_groups``, ``/prompts_consumed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from graft_cli.batch import PolicyStep, cat_groups
from graft_cli.data.problems import Problem
from graft_cli.data.sampler import PromptSampler
from graft_cli.registry import Registry
from graft_cli.train.parallel import PolicyPool

COLLECTORS: Registry = Registry("rollout collector")
GROUP_METRICS = ("acc",)

class Sampler(Protocol):
    """Who samples for a collector: :class:`~graft_cli.train.rollout_worker.RolloutWorker` in a
    run."""

    def sample(self, i: int, problems: list[Problem], round_: int = 0) -> tuple[PolicyStep, dict]:
        """Policy ``i`` samples ``problems`` in sampling round ``round_``, grades them and takes the
        group advantages: its step and its metrics row so far."""
        ...


@dataclass
class CollectInputs:
    """What a collector draws on: the training problems, the data cursor over them, the trained
    policies' names (in order), the worker policy ``i`` samples and grades a list of problems
    through, and the threads the policies sample on."""

    problems: list[Problem]
    sampler: PromptSampler
    policies: list[str]
    worker: Sampler
    pool: PolicyPool = field(default_factory=lambda: PolicyPool(1))


def informative_groups(rewards: torch.Tensor, metric: str = "acc") -> list[int]:
    """DAPO's filter: the prompt groups whose ``metric`` (``acc``: the binary reward) is not
    constant."""
    if metric not in GROUP_METRICS:
        raise ValueError(f"unknown filter_groups metric {metric!r}; known: {', '.join(GROUP_METRICS)}")
    if rewards.shape[1] < 2:
        return []
    return [q for q in range(rewards.shape[0]) if bool((rewards[q] != rewards[q][0]).any())]


@COLLECTORS.register("single")
class SingleRound:
    def __init__(self, cfg):
        self.cfg = cfg

    def prompts_at(self, inp: CollectInputs, step: int) -> list | None:
        """The problems of 0-based ``step``, known in advance (one batch per step); step sources
        check their data against them before step 1."""
        return [inp.problems[i] for i in inp.sampler.batch_at(step)]

    def collect(self, inp: CollectInputs):
        problems = [inp.problems[i] for i in inp.sampler.next()]
        out = inp.pool.map(lambda i: inp.worker.sample(i, problems, 0), range(len(inp.policies)))  # policies in threads
        return {n: o[0] for n, o in zip(inp.policies, out)}, {n: o[1] for n, o in zip(inp.policies, out)}


@COLLECTORS.register("dynamic")
class DynamicSampling:
    def __init__(self, cfg):
        self.cfg = cfg
        fg = cfg.algo.filter_groups
        self.metric, self.max_rounds = fg.metric, int(fg.max_num_gen_batches)

    def prompts_at(self, inp: CollectInputs, step: int) -> list | None:
        """Unknown in advance: a step draws as many batches as its groups need."""
        return None

    def collect(self, inp: CollectInputs):
        B = self.cfg.data.prompt_batch
        names = list(inp.policies)
        kept = {n: [] for n in names}
        count = {n: 0 for n in names}
        evicted = {n: 0 for n in names}
        times = {n: {"time/rollout": 0.0, "time/reward": 0.0} for n in names}
        rounds = consumed = 0
        while True:
            problems = [inp.problems[i] for i in inp.sampler.next()]
            consumed += len(problems)
            for i, name in enumerate(names):
                if count[name] >= B:
                    continue
                ps, t = inp.worker.sample(i, problems, rounds)
                for k, v in t.items():  # times and counts add up over the rounds
                    times[name][k] = times[name].get(k, 0) + v
                keep = informative_groups(ps.rewards, self.metric)
                evicted[name] += len(problems) - len(keep)
                kept[name].append((ps, keep))
                count[name] += len(keep)
            rounds += 1
            if all(count[n] >= B for n in names) or (self.max_rounds > 0 and rounds >= self.max_rounds):
                break
        steps, rows = {}, {}
        for n in names:
            steps[n] = cat_groups(kept[n], B)
            rows[n] = {**times[n], "filter_groups/rounds": rounds, "filter_groups/evicted_groups": evicted[n],
                       "filter_groups/discarded_surplus_groups": max(count[n] - B, 0),
                       "filter_groups/kept_groups": len(steps[n].problems), "filter_groups/prompts_consumed": consumed}
        return steps, rows


def collector_for(cfg):
    """``algo.filter_groups.enable`` (verl's switch) selects ``dynamic``; otherwise ``single``."""
    return COLLECTORS.get("dynamic" if cfg.algo.filter_groups.enable else "single")(cfg)
