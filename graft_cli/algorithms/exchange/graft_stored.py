"""Stored-trajectory GRAFT (graft.md §5): one receiver trains against a partner's *earlier*
independent GRPO run, read from its rollout logs. Registered as exchange ``graft_stored``: it *is*
the GRAFT exchange (:class:`~graft_cli.algorithms.exchange.graft.GraftExchange`), fed by a
partner-log step source that the trainer owns (graft_cli/train/sources.py: it reads the log of each
step, re-grades it with the trainer's grader and recomputes the partner's advantages). This module
only holds its defaults and its validation, which returns the source the ``exchange.params`` below
describe (config validation adds it to ``cfg.sources``).

``exchange.params``:

- ``partner_run`` (required): the partner's run directory (holding
  ``rollouts/<policy>/step_NNNNNN.parquet``);
- ``partner_policy`` (required): the partner's policy name in that run;
- ``receiver`` (optional): which of the pair's policies trains. When the pair lists several policies
  the others are removed from ``cfg.policies`` at validation (default: the one that is not
  ``partner_policy`` when the pair has two), so ``--pair tiny --method graft_stored
  exchange.params.partner_run=DIR exchange.params.partner_policy=b`` trains ``a`` alone;
- ``reverify`` (default true): re-grade the logged responses with this run's reward (graft.md §5)
  and recompute the partner's advantages from the re-verified rewards (graft.md §8 item 13); false
  keeps the logged rewards and advantages;
- every GRAFT option; ``selection`` defaults to ``unbalanced``: one-way transfer of every candidate
  with 1 ≤ k_partner < n (balanced exchange inactive). ``peer_logprobs`` must be ``rollout``: the
  compatibility denominator is the stored log-probs.

At receiver step t (0-based) the partner's file ``step_{t+1:06d}.parquet`` is read; its ``step``
column must be t and its prompt ids, in prompt order, must equal this step's prompts, else a
one-line GraftError (the two runs need the same data, data seed and batch size; note that the
trainer drops prompts longer than ``rollout.max_prompt_tokens`` under the policies it loads, so a
prompt that only the partner's tokenizer made too long shifts the order and is reported here). """

from __future__ import annotations

import os
from dataclasses import dataclass

from graft_cli.algorithms.exchange.base import EXCHANGES
from graft_cli.algorithms.exchange.graft import GraftExchange, GraftParams, check_loss_for_mode, options
from graft_cli.algorithms.exchange.selection import SELECTIONS
from graft_cli.errors import GraftError
from graft_cli.registry import choice
from graft_cli.schema import SourceConfig


@dataclass(frozen=True)
class StoredGraftParams(GraftParams):
    """``exchange.params`` of ``graft_stored`` (module docstring): GRAFT's, one-way selection by
    default, and the partner's run."""

    selection: str = choice("unbalanced", among=SELECTIONS)
    partner_run: str | None = None  # required
    partner_policy: str | None = None  # required
    receiver: str | None = None  # None: the one trained policy that is not the partner
    reverify: bool = True


@EXCHANGES.register("graft_stored", spec=StoredGraftParams())
class StoredGraftExchange(GraftExchange):
    """GRAFT against a partner's stored GRPO logs (module docstring): GRAFT with stored defaults."""

    PARAMS = StoredGraftParams

    @classmethod
    def _receiver(cls, cfg) -> str:
        """``exchange.params.receiver``, or the one trained policy that is not the partner."""
        p = cfg.exchange.params
        names = [pc.name for pc in cfg.policies if pc.role == "train"]
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
        return recv

    @classmethod
    def resolve(cls, cfg) -> None:
        """The receiver named; the partner not loaded or trained (its steps come from its logs): a
        ``rollout_log`` source in its place."""
        p = cfg.exchange.params
        if not p.get("partner_run") or not p.get("partner_policy"):
            return  # validate names the missing key
        recv = cls._receiver(cfg)
        cfg.policies = [pc for pc in cfg.policies if pc.name == recv or pc.role != "train"]
        cfg.exchange.params["receiver"] = recv
        name = str(p["partner_policy"])
        cfg.sources = [x for x in cfg.sources if x.name != name] + [SourceConfig(
            name=name, kind="rollout_log", run=str(p["partner_run"]), policy=name,
            reverify=bool(StoredGraftParams.read(p).reverify))]

    @classmethod
    def validate(cls, cfg) -> None:
        opts = options(dict(cfg.exchange.params), StoredGraftParams)
        check_loss_for_mode(cfg, opts)
        for k, v in (("partner_run", opts.partner_run), ("partner_policy", opts.partner_policy)):
            if not v:
                raise GraftError(f"config key 'exchange.params.{k}': required by exchange graft_stored")
        if opts.peer_logprobs != "rollout":
            raise GraftError("config key 'exchange.params.peer_logprobs': graft_stored uses the stored rollout "
                             "log-probs; the partner model is not loaded")
        if opts.mode == "hacpo":
            raise GraftError("config key 'exchange.params.mode': hacpo needs a co-trained peer")
        d = os.path.join(str(opts.partner_run), "rollouts", str(opts.partner_policy))
        if not os.path.isdir(d):
            raise GraftError(f"config key 'exchange.params.partner_run': {d} does not exist (need the partner's "
                             f"GRPO run directory with rollout logs of policy {opts.partner_policy!r})")
        cls._receiver(cfg)
