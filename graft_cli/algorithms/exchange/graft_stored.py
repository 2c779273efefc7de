"""Stored-trajectory GRAFT (graft.md §5): one receiver trains against a partner's *earlier* independent
GRPO run, read from its rollout logs. Registered as exchange ``graft_stored``.

``exchange.params``:

- ``partner_run`` (required): the partner's run directory (holding ``rollouts/<policy>/step_NNNNNN.parquet``
  written by ``Trainer.log_rollouts``: step, prompt_index, prompt_id, sample_index, answer, response,
  token_ids, gen_logprobs, truncated, reward, advantage, extracted, data_seed);
- ``partner_policy`` (required): the partner's policy name in that run;
- ``receiver`` (optional): which of the pair's policies trains. When the pair lists several policies the
  others are removed from ``cfg.policies`` at validation (default: the one that is not
  ``partner_policy`` when the pair has two), so ``--pair tiny --method graft_stored
  exchange.params.partner_run=DIR exchange.params.partner_policy=b`` trains ``a`` alone;
- ``reverify`` (default true): re-grade the logged responses with this run's reward (graft.md §5) and
  recompute the partner's advantages from the re-verified rewards (graft.md §8 item 13); false keeps the
  logged rewards and advantages;
- every GRAFT option (:mod:`graft_cli.algorithms.exchange.graft`); ``selection`` defaults to
  ``unbalanced``: one-way transfer of every candidate with 1 ≤ k_partner < n (balanced exchange inactive).
  ``peer_logprobs`` must be ``sampler``: the compatibility denominator is the stored log-probs.

At receiver step t (0-based) the partner's file ``step_{t+1:06d}.parquet`` is read; its ``step`` column must
be t and its prompt ids, in prompt order, must equal this step's prompts, else a one-line GraftError (the
two runs need the same data, data seed and batch size; note that the trainer drops prompts longer than
``rollout.max_prompt_tokens`` under the policies it loads, so a prompt that only the partner's tokenizer
made too long shifts the order and is reported here). The partner is then an ordinary
:class:`~graft_cli.train.batch.PolicyStep` and the receiver's batch is built exactly as online GRAFT builds
it for the direction partner → receiver.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from graft_cli.algorithms.exchange import EXCHANGES, ExchangeContext
from graft_cli.algorithms.exchange.graft import DEFAULTS, GraftExchange, check_loss_for_mode, options
from graft_cli.errors import GraftError
from graft_cli.rollout.base import Rollouts
from graft_cli.train.batch import PolicyStep

STORED_DEFAULTS = {**DEFAULTS, "selection": "unbalanced"}
STORED_KEYS = ("partner_run", "partner_policy", "receiver", "reverify")
LOG_COLUMNS = ("step", "prompt_index", "prompt_id", "sample_index", "response", "token_ids", "gen_logprobs",
               "truncated", "reward")


def rollout_log_path(run_dir: str, policy: str, step: int) -> str:
    """The log ``Trainer.log_rollouts`` writes for 0-based step ``step``."""
    return os.path.join(run_dir, "rollouts", policy, f"step_{step + 1:06d}.parquet")


def read_partner_step(path: str, step: int, problems, data_seed: int | None = None) -> dict:
    """Load one partner log and check it against this step: the file exists, its ``step`` column equals
    ``step`` and its prompt ids (in prompt order) equal ``problems``' ids. Returns column lists sorted by
    (prompt_index, sample_index) and the group size ``n``."""
    import pandas as pd

    if not os.path.exists(path):
        raise GraftError(f"exchange.params.partner_run: no partner rollout log {path} for step {step + 1} "
                         f"(the partner run must cover every step of this run with run.log_rollouts=true)")
    df = pd.read_parquet(path)
    missing = [c for c in LOG_COLUMNS if c not in df.columns]
    if missing:
        raise GraftError(f"{path}: not a rollout log (missing columns {', '.join(missing)})")
    df = df.sort_values(["prompt_index", "sample_index"], kind="stable").reset_index(drop=True)
    if len(df) == 0 or set(int(x) for x in df["step"]) != {step}:
        raise GraftError(f"{path}: holds step {sorted(set(int(x) for x in df['step']))} but this run is at step "
                         f"{step} (step mismatch)")
    B = len(problems)
    sizes = df.groupby("prompt_index").size()
    n = int(sizes.iloc[0]) if len(sizes) else 0
    ids = [str(x) for x in df.drop_duplicates("prompt_index")["prompt_id"]]
    want = [str(p.id) for p in problems]
    if len(sizes) != B or (sizes != n).any() or ids != want:
        seeds = sorted(set(int(x) for x in df["data_seed"])) if "data_seed" in df.columns else "?"
        first = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
        theirs = ids[first] if first < len(ids) else None
        ours = want[first] if first < len(want) else None
        raise GraftError(f"{path}: prompt order differs from this run at step {step + 1} (prompt {first}: partner "
                         f"{theirs!r} vs {ours!r}; partner data seed {seeds}, this run {data_seed}); use the "
                         f"partner's data, seed and prompt batch")
    return {"n": n, **{c: df[c].tolist() for c in df.columns}}


@EXCHANGES.register("graft_stored")
class StoredGraftExchange(GraftExchange):
    """GRAFT against a partner's stored GRPO logs (module docstring)."""

    EXTRA_KEYS = STORED_KEYS

    def __init__(self, cfg=None):
        self.cfg = cfg
        p = dict(cfg.exchange.params)
        self.opts = options(p, STORED_KEYS, STORED_DEFAULTS)
        self.hacpo_history, self._same_tok = {}, {}
        self.partner_run = p["partner_run"]
        self.partner = p["partner_policy"]
        self.reverify = bool(p.get("reverify", True))
        from graft_cli.algorithms.advantages import ADVANTAGES
        from graft_cli.reward import REWARDS

        self.adv_fn = ADVANTAGES.get(cfg.algo.advantage)
        rc = cfg.reward
        self.grader = REWARDS.get(rc.name)(num_workers=rc.num_workers, timeout_s=rc.timeout_s,
                                           chunk_size=rc.chunk_size) if self.reverify else None

    @classmethod
    def validate(cls, cfg) -> None:
        p = dict(cfg.exchange.params)
        opts = options(p, STORED_KEYS, STORED_DEFAULTS)
        check_loss_for_mode(cfg, opts)
        for k in ("partner_run", "partner_policy"):
            if not p.get(k):
                raise GraftError(f"config key 'exchange.params.{k}': required by exchange graft_stored")
        if opts["peer_logprobs"] != "sampler":
            raise GraftError("config key 'exchange.params.peer_logprobs': graft_stored uses the stored generation "
                             "log-probs (sampler); the partner model is not loaded")
        if opts["mode"] == "hacpo":
            raise GraftError("config key 'exchange.params.mode': hacpo needs a co-trained partner")
        if "reverify" in p and not isinstance(p["reverify"], bool):
            raise GraftError("config key 'exchange.params.reverify': must be true or false")
        d = os.path.join(str(p["partner_run"]), "rollouts", str(p["partner_policy"]))
        if not os.path.isdir(d):
            raise GraftError(f"config key 'exchange.params.partner_run': {d} does not exist (need the partner's "
                             f"GRPO run directory with rollout logs of policy {p['partner_policy']!r})")
        names = [pc.name for pc in cfg.policies]
        recv = p.get("receiver")
        if recv is None:
            others = [nm for nm in names if nm != p["partner_policy"]]
            if len(names) == 1:
                recv = names[0]
            elif len(others) == 1:
                recv = others[0]
            else:
                raise GraftError("config key 'exchange.params.receiver': name the policy to train "
                                 f"(one of {', '.join(names)})")
        if recv not in names:
            raise GraftError(f"config key 'exchange.params.receiver': {recv!r} is not one of {', '.join(names)}")
        cfg.policies = [pc for pc in cfg.policies if pc.name == recv]  # the partner is not loaded or trained
        cfg.exchange.params["receiver"] = recv

    def close(self) -> None:
        close = getattr(self.grader, "close", None)
        if close:
            close()

    def partner_step(self, problems, step: int, data_seed: int | None = None) -> PolicyStep:
        """The partner's logged step as a PolicyStep (rewards re-verified, advantages recomputed)."""
        log = read_partner_step(rollout_log_path(self.partner_run, self.partner, step), step, problems, data_seed)
        n, B = log["n"], len(problems)
        if self.reverify:
            golds = [p.answer for p in problems for _ in range(n)]
            g = self.grader.grade([str(x) for x in log["response"]], golds)
            rewards = torch.tensor(np.asarray(g.rewards, dtype=np.float32)).view(B, n)
            a = self.cfg.algo
            adv = self.adv_fn(rewards, eps=a.adv_eps, norm_by_std=a.norm_by_std)
        else:
            rewards = torch.tensor(log["reward"], dtype=torch.float32).view(B, n)
            adv = torch.tensor(log["advantage"], dtype=torch.float32).view(B, n)
        ro = Rollouts(prompt_ids=[[] for _ in range(B)], response_ids=[list(map(int, t)) for t in log["token_ids"]],
                      texts=[str(x) for x in log["response"]],
                      logprobs=[list(map(float, x)) for x in log["gen_logprobs"]],
                      truncated=[bool(x) for x in log["truncated"]], n=n)
        ps = PolicyStep(self.partner, list(problems), [[] for _ in range(B)], ro, rewards, adv)
        ps.rollouts.meta["logged_rewards"] = torch.tensor(log["reward"], dtype=torch.float32).view(B, n)
        return ps

    def select(self, steps: dict[str, PolicyStep], ctx: ExchangeContext, receivers=None, directions=None):
        if len(steps) != 1:
            raise GraftError(f"exchange graft_stored trains one receiver, got policies {', '.join(steps)}")
        (rname, recv), = steps.items()
        seed = self.cfg.run.seed if self.cfg is not None else None
        part = self.partner_step(recv.problems, ctx.step, seed)
        both = {rname: recv, self.partner: part}
        batches, metrics = super().select(both, ctx, receivers=[rname], directions=[(1, 0)])
        if self.reverify:
            changed = (part.rollouts.meta["logged_rewards"] > 0.5) != (part.rewards > 0.5)
            metrics[rname]["graft/reverify_changed"] = int(changed.sum())
        metrics[rname]["graft/partner_reward"] = float(part.rewards.mean())
        return batches, metrics
