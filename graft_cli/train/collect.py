"""How a step's rollouts are collected (registry ``COLLECTORS``; :func:`collector_for` picks one from the config:
``dynamic`` when ``algo.filter_groups.enable``, else ``single``).

A collector is ``cls(cfg)`` with ``collect(trainer) -> (steps, rows)``: every trained policy's
:class:`~graft_cli.batch.PolicyStep` for this step and its metrics row so far. It draws prompt batches from
the trainer's data cursor and samples through ``trainer.rollout_policy(i, policy, problems, round)``, whose
seeds depend on (run seed, step, policy, round) only, so a resumed run collects exactly what the
uninterrupted one would.

- ``single``: one prompt batch, every policy samples it (GRPO, GRAFT: the policies share the prompts); the
  policies sample in parallel threads when the trainer has a pool of them (``run.policy_workers``).
- ``dynamic``: DAPO's dynamic sampling (verl ``algorithm.filter_groups``; baselines.md §4): groups whose
  rewards are all equal (the ``acc`` metric: all correct or all wrong) are dropped, and further prompt
  batches are drawn and sampled until every policy holds ``data.prompt_batch`` informative groups or
  ``algo.filter_groups.max_num_gen_batches`` rounds have run (0 = no cap); surplus groups beyond the batch are
  discarded (the first ones are kept, as verl does). A policy that ends short trains on the groups it has.
  Each policy keeps its own groups, so the policies no longer share prompts: only ``exchange.name: none``.
  Metrics: ``filter_groups/rounds``, ``/evicted_groups``, ``/discarded_surplus_groups``, ``/kept_groups``,
  ``/prompts_consumed``.
"""

from __future__ import annotations

import torch

from graft_cli.batch import cat_groups
from graft_cli.registry import Registry

COLLECTORS: Registry = Registry("rollout collector")
GROUP_METRICS = ("acc",)


def informative_groups(rewards: torch.Tensor, metric: str = "acc") -> list[int]:
    """DAPO's filter: the prompt groups whose ``metric`` (``acc``: the binary reward) is not constant."""
    if metric not in GROUP_METRICS:
        raise ValueError(f"unknown filter_groups metric {metric!r}; known: {', '.join(GROUP_METRICS)}")
    if rewards.shape[1] < 2:
        return []
    return [q for q in range(rewards.shape[0]) if bool((rewards[q] != rewards[q][0]).any())]


@COLLECTORS.register("single")
class SingleRound:
    def __init__(self, cfg):
        self.cfg = cfg

    def prompts_at(self, trainer, step: int) -> list:
        """The problems of 0-based ``step``, known in advance (one batch per step); step sources check their data
        against them before step 1."""
        return [trainer.problems[i] for i in trainer.sampler.batch_at(step)]

    def collect(self, trainer):
        idx = trainer.sampler.next()
        problems = [trainer.problems[i] for i in idx]
        items = list(trainer.policies.items())
        pool = getattr(trainer, "pool", None)  # policies in parallel threads (train/parallel.py)
        run = lambda i: trainer.rollout_policy(i, items[i][1], problems)
        out = pool.map(run, range(len(items))) if pool is not None else [run(i) for i in range(len(items))]
        return {n: o[0] for (n, _), o in zip(items, out)}, {n: o[1] for (n, _), o in zip(items, out)}


@COLLECTORS.register("dynamic")
class DynamicSampling:
    def __init__(self, cfg):
        self.cfg = cfg
        fg = cfg.algo.filter_groups
        self.metric, self.max_rounds = fg.metric, int(fg.max_num_gen_batches)

    def collect(self, trainer):
        B = self.cfg.data.prompt_batch
        names = list(trainer.policies)
        kept = {n: [] for n in names}
        count = {n: 0 for n in names}
        evicted = {n: 0 for n in names}
        times = {n: {"time/rollout": 0.0, "time/reward": 0.0} for n in names}
        rounds = consumed = 0
        while True:
            idx = trainer.sampler.next()
            problems = [trainer.problems[i] for i in idx]
            consumed += len(problems)
            for i, (name, pol) in enumerate(trainer.policies.items()):
                if count[name] >= B:
                    continue
                ps, t = trainer.rollout_policy(i, pol, problems, rounds)
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
