"""One parameter check for every registered part, at config time: a typo in a name or a parameter
of any registry's part (controllers, exchanges, token advantages, loss masks, losses, rewards, engines, advantage
estimators, IS corrections, minibatch orderings, handoff schedules) fails in `compose`, which the CLI runs before
anything loads or is written, with one line naming the key; choice lists are the registries' names."""

from __future__ import annotations

import os

import pytest

from graft_cli.config import compose
from graft_cli.errors import GraftError

SAF = "{name: saf_schedule, warmup_steps: 2, kl_delta: 0.2, anneal_steps: 2"
CASES = [  # (registry, overrides, the key the line names, words it must hold)
    ("CONTROLLERS", ["method=saf", f"algo.controllers=[{SAF}, warmup_step: 5}}]"], "algo.controllers.0.warmup_step",
     ("not a parameter of controller saf_schedule", "warmup_steps")),
    ("CONTROLLERS", ["method=saf", f"algo.controllers=[{SAF}, warmup: yes please}}]"], "algo.controllers.0.warmup",
     ("true or false",)),
    ("CONTROLLERS", ["method=saf", f"algo.controllers=[{SAF}, anneal_min: 2.0}}]"], "algo.controllers.0",
     ("0 <= anneal_min <= 1",)),
    ("CONTROLLERS", ["method=saf", f"algo.controllers=[{SAF}, anneal_total_steps: -3}}]"],
     "algo.controllers.0.anneal_total_steps", (">= 0",)),
    ("CONTROLLERS", ["algo.controllers=[{name: saf_schedul}]"], "algo.controllers.0.name",
     ("unknown controller", "saf_schedule")),
    ("EXCHANGES", ["method=graft", "exchange.params.dleta=0.8"], "exchange.params.dleta", ("delta",)),
    ("EXCHANGES", ["method=graft", "exchange.params.gate=nope"], "exchange.params.gate", ("must be one of",)),
    ("EXCHANGES", ["method=graft", "exchange.params.delta=high"], "exchange.params.delta", ("a number",)),
    ("EXCHANGES", ["exchange.name=grfat"], "exchange.name", ("unknown exchange", "graft")),
    ("TOKEN_ADVANTAGES", ["method=saf", "algo.token_adv_params.tpok=3"], "algo.token_adv_params.tpok", ("topk",)),
    ("TOKEN_ADVANTAGES", ["algo.token_advantages=[opd_fuson]"], "algo.token_advantages.0", ("opd_fusion",)),
    ("LOSS_MASKS", ["algo.loss_mask=al"], "algo.loss_mask", ("unknown",)),
    ("POLICY_LOSSES", ["algo.loss_params.clip=0.3"], "algo.loss_params.clip", ("not a parameter of loss",)),
    ("POLICY_LOSSES", ["algo.loss=ppo_tokn"], "algo.loss", ("ppo_token",)),
    ("REWARDS", ["reward.name=math_verfy"], "reward.name", ("unknown reward", "math_verify", "code")),
    ("ENGINES", ["rollout.engine_kwargs.cahce=static"], "rollout.engine_kwargs.cahce", ("cache",)),
    ("ENGINES", ["rollout.engine_kwargs.ignore_eos=maybe"], "rollout.engine_kwargs.ignore_eos", ("true or false",)),
    ("ENGINES", ["rollout.engin=hf"], "rollout.engin", ()),
    ("HANDOFFS", ["method=tandem", "rollout.engine_kwargs.schedule=wrod"], "rollout.engine_kwargs.schedule",
     ("must be one of", "word", "sentence")),
    ("ADVANTAGES", ["algo.advantage=grop"], "algo.advantage", ("grpo",)),
    ("IS_CORRECTIONS", ["algo.is_correction=tokn"], "algo.is_correction", ("token",)),
    ("MINIBATCH_ORDERINGS", ["exchange.ordering=shufle"], "exchange.ordering", ("unknown",)),
]


@pytest.mark.parametrize("registry,overrides,key,words", CASES,
                         ids=[f"{c[0]}:{' '.join(c[1])[-40:]}" for c in CASES])
def test_a_typo_in_any_registered_part_fails_at_config_time(registry, overrides, key, words):
    with pytest.raises(GraftError) as ei:
        compose(overrides)
    msg = str(ei.value)
    assert "\n" not in msg and f"'{key}" in msg, msg
    for w in words:
        assert w in msg, msg


def test_every_registry_with_parts_is_covered():
    """A registry added later with parts a config names gets its case here (the list above is by registry)."""
    assert {c[0] for c in CASES} >= {"CONTROLLERS", "EXCHANGES", "TOKEN_ADVANTAGES", "LOSS_MASKS", "POLICY_LOSSES",
                                     "REWARDS", "ENGINES", "HANDOFFS", "ADVANTAGES", "IS_CORRECTIONS",
                                     "MINIBATCH_ORDERINGS"}


def test_the_valid_values_pass():
    """The same parts with their right spelling compose (so each case above fails for its typo alone), and the
    values given are the values composed."""
    cfg = compose(["method=saf", f"algo.controllers=[{SAF}, warmup_steps: 5, anneal_total_steps: 0}}]"])
    assert (cfg.algo.controllers[0]["warmup_steps"], cfg.algo.controllers[0]["anneal_total_steps"]) == (5, 0)
    cfg = compose(["method=graft", "exchange.params.delta=0.7", "exchange.params.gate=none"])
    assert (cfg.exchange.params["delta"], cfg.exchange.params["gate"]) == (0.7, "none")
    cfg = compose(["method=tandem", "rollout.engine_kwargs.schedule=sentence"])
    assert cfg.rollout.engine_kwargs["schedule"] == "sentence"
    cfg = compose(["reward.name=code", "rollout.engine_kwargs.cache=dynamic"])
    assert (cfg.reward.name, cfg.rollout.engine_kwargs["cache"]) == ("code", "dynamic")


def test_the_cli_refuses_a_controller_typo_before_loading_or_writing(tmp_path):
    """`graft train` with a SAF knob misspelt: exit 2, one line naming the key, nothing written, and the model
    (a path that does not exist) never looked at — before, the typo surfaced after every model had loaded."""
    from click.testing import CliRunner

    from graft_cli.cli import main

    out = tmp_path / "runs"
    res = CliRunner().invoke(main, ["train", "--method", "saf", "--steps", "1", "--out", str(out), "--no-progress",
                                    f"policies=[{{name: a, model: '{tmp_path / 'never_loaded'}'}}]",
                                    f"algo.controllers=[{SAF}, kl_detla: 0.1}}]"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.output
    assert "config key 'algo.controllers.0.kl_detla'" in res.stderr and "never_loaded" not in res.stderr
    assert not os.path.exists(out)
