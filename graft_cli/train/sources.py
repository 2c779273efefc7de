"""Step sources that are not trained policies (registry ``STEP_SOURCES``, config ``sources``).

A source gives, each step, a :class:`~graft_cli.batch.PolicyStep` on the step's prompts that an
exchange can draw from, without a model being loaded or trained. The trainer owns every source: it
builds them at start, grades their responses with its own grader and closes them with itself.

- ``rollout_log``: a partner's earlier run read from its rollout logs (stored-trajectory GRAFT,
  graft.md §5): at step t the file ``rollouts/<policy>/step_{t+1:06d}.parquet`` of the partner run,
  checked against this step's prompts; with ``reverify`` the logged responses are re-graded with
  this run's reward and the partner's advantages recomputed from the re-verified rewards (graft.md
  §8 item 13), else the logged rewards and advantages are kept. Metrics (added to every trained
  policy's row): ``graft/partner_reward``, ``graft/reverify_changed``. ``check`` runs before step 1
  on every step the run will train (light columns only).
"""

from __future__ import annotations

import numpy as np
import torch

from graft_cli.batch import PolicyStep, is_correct
from graft_cli.data.rollout_logs import check_partner_step, read_partner_step
from graft_cli.registry import Registry
from graft_cli.batch import Rollouts
from graft_cli.rundir import rollout_log_path

STEP_SOURCES: Registry = Registry("step source")


@STEP_SOURCES.register("rollout_log")
class RolloutLogSource:
    def __init__(self, sc, grader, adv_fn, algo, data_seed: int | None = None):
        self.name, self.run, self.policy, self.reverify = sc.name, sc.run, sc.policy, bool(sc.reverify)
        self.grader, self.adv_fn, self.algo, self.data_seed = grader, adv_fn, algo, data_seed

    def check(self, steps, problems_at=None) -> None:
        """Before step 1: the partner's log of every step in ``steps`` exists and
        (``problems_at(step)``: the step's prompts, when known in advance) holds that step's prompts
        in order; a missing or mismatched one is one line now, not a stop at that step hours into
        the run."""
        for t in steps:
            check_partner_step(rollout_log_path(self.run, self.policy, t), t,
                               problems_at(t) if problems_at else None, self.data_seed)

    def step(self, problems, step: int) -> tuple[PolicyStep, dict]:
        log = read_partner_step(rollout_log_path(self.run, self.policy, step), step, problems, self.data_seed)
        n, B = log["n"], len(problems)
        logged = torch.tensor(log["reward"], dtype=torch.float32).view(B, n)
        if self.reverify:
            golds = [p.answer for p in problems for _ in range(n)]
            g = self.grader.grade([str(x) for x in log["response"]], golds)
            rewards = torch.tensor(np.asarray(g.rewards, dtype=np.float32)).view(B, n)
            adv = self.adv_fn(rewards, eps=self.algo.adv_eps, norm_by_std=self.algo.norm_by_std)
        else:
            rewards = logged
            adv = torch.tensor(log["advantage"], dtype=torch.float32).view(B, n)
        ro = Rollouts(prompt_ids=[[] for _ in range(B)], response_ids=[list(map(int, t)) for t in log["token_ids"]],
                      texts=[str(x) for x in log["response"]],
                      logprobs=[list(map(float, x)) for x in log["rollout_logprobs"]],
                      truncated=[bool(x) for x in log["truncated"]], n=n)
        ps = PolicyStep(self.name, list(problems), [[] for _ in range(B)], ro, rewards, adv)
        met = {"graft/partner_reward": float(rewards.mean())}
        if self.reverify:
            met["graft/reverify_changed"] = int((is_correct(logged) != is_correct(rewards)).sum())
        return ps, met
