"""Typed parameters of the registered parts (graft_cli/registry.py ``Params``): each part that takes parameters
declares a frozen dataclass next to it, registered as its spec, whose field defaults are the only place the defaults
are written. Resolution writes every value into the config; an unknown key or a wrong type fails in one line
naming the key; reports read δ from a run's config through the same dataclass."""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import pytest

from graft_cli.algorithms.controllers import CONTROLLERS
from graft_cli.algorithms.correction import ROLLOUT_REJECTIONS
from graft_cli.algorithms.exchange import EXCHANGES
from graft_cli.algorithms.exchange.base import exchange_params
from graft_cli.algorithms.exchange.graft import GraftParams
from graft_cli.algorithms.losses import POLICY_LOSSES, register_loss
from graft_cli.algorithms.signals import LOSS_MASKS, TOKEN_ADVANTAGES
from graft_cli.config import compose, to_yaml
from graft_cli.errors import GraftError
from graft_cli.registry import Params, Registry, choice

REGISTRIES = {"EXCHANGES": EXCHANGES, "POLICY_LOSSES": POLICY_LOSSES, "LOSS_MASKS": LOSS_MASKS,
              "TOKEN_ADVANTAGES": TOKEN_ADVANTAGES, "ROLLOUT_REJECTIONS": ROLLOUT_REJECTIONS,
              "CONTROLLERS": CONTROLLERS}


@pytest.fixture(scope="module")
def partner(tmp_path_factory):
    d = tmp_path_factory.mktemp("partner")
    os.makedirs(d / "rollouts" / "b")
    return str(d)


def _controller(cfg):
    return {k: v for k, v in cfg.algo.controllers[0].items() if k != "name"}


# (registry, name) -> (the method config that uses it, the resolved section holding its parameters, filled?)
# filled: resolution writes every parameter in declaration order (the exchange's and the controllers' sections
# hold what the config gives, as written)
HOMES = {
    ("EXCHANGES", "graft"): (["method=graft"], lambda c: c.exchange.params, False),
    ("EXCHANGES", "graft_stored"): (["method=graft_stored", "exchange.params.partner_run={partner}",
                                     "exchange.params.partner_policy=b"], lambda c: c.exchange.params, False),
    ("POLICY_LOSSES", "luffy"): (["method=graft_luffy"], lambda c: c.algo.loss_params, True),
    ("POLICY_LOSSES", "hacpo_peer"): (["method=graft_hacpo_update"], lambda c: c.algo.loss_params, True),
    ("POLICY_LOSSES", "ppo_token_nll"): (["method=sgt"], lambda c: c.algo.loss_params, True),
    ("LOSS_MASKS", "author"): (["method=tandem"], lambda c: c.algo.loss_mask_params, True),
    ("TOKEN_ADVANTAGES", "opd_fusion"): (["method=grpo_opd"], lambda c: c.algo.token_adv_params, True),
    ("CONTROLLERS", "saf_schedule"): (["method=saf"], _controller, False),
    **{("ROLLOUT_REJECTIONS", r): (["method=grpo", f"algo.rollout_correction.rejection={r}"],
                                   lambda c: c.algo.rollout_correction.params, True)
       for r in ("token", "sequence", "geometric", "icepop")},
}


def _builtin(reg: Registry, name: str) -> bool:
    """Registered by graft_cli itself (not by a test or a plugin)."""
    obj = reg.get(name)
    return getattr(getattr(obj, "fn", obj), "__module__", "").startswith("graft_cli.")


def test_every_part_with_parameters_has_a_home_case():
    """A part registered later with parameters gets its case in HOMES (the defaults check below is by part)."""
    with_params = {(rn, n) for rn, reg in REGISTRIES.items() for n in reg.names()
                   if _builtin(reg, n) and dataclasses.fields(reg.spec(n))}
    assert with_params == set(HOMES)
    for rn, n in with_params:  # each spec is a frozen Params dataclass holding the defaults
        spec = REGISTRIES[rn].spec(n)
        assert isinstance(spec, Params) and type(spec).__dataclass_params__.frozen
        assert spec == type(spec)()


@pytest.mark.parametrize("part", sorted(HOMES), ids=[f"{r}:{n}" for r, n in sorted(HOMES)])
def test_defaults_are_what_the_resolved_config_of_its_method_shows(part, partner):
    """The method config that uses each part resolves to the dataclass's defaults: every key the resolved
    section holds has the default's value (the method files give those values or leave them to the default),
    and a filled section holds every parameter, in declaration order."""
    overrides, section, filled = HOMES[part]
    cfg = compose(["pair=tiny", *(o.format(partner=partner) for o in overrides)])
    got = dict(section(cfg))
    want = REGISTRIES[part[0]].spec(part[1]).to_dict()
    if filled:
        assert list(got) == list(want)
    required = {"partner_run", "partner_policy", "receiver"}  # graft_stored: the partner's run, no default
    assert {k: v for k, v in got.items() if k not in required} == {k: want[k] for k in got if k not in required}


def test_a_part_given_no_parameters_resolves_to_its_defaults():
    """Nothing given: the resolved config shows each default (and the config.yaml a run writes, too)."""
    cfg = compose(["pair=tiny", "method=grpo", "algo.loss=hacpo_peer", "algo.rollout_correction.rejection=icepop"])
    assert cfg.algo.loss_params == POLICY_LOSSES.spec("hacpo_peer").to_dict() == {
        "lower_bound": 0.8, "lower_bound_step": 0.025, "schedule": "minibatch", "peer_coef": 1.0}
    assert cfg.algo.rollout_correction.params == {"alpha": 0.5, "beta": 5.0}
    assert "    lower_bound_step: 0.025\n" in to_yaml(cfg)


CASES = [  # (overrides, the key the line names, words it must hold)
    (["method=graft", "exchange.params.delat=0.6"], "exchange.params.delat",
     ("not a parameter of the GRAFT exchange; known: admission, append_eos, cap, content, delta,",)),
    (["method=graft", "exchange.params.delta=high"], "exchange.params.delta", ("must be a number, got 'high'",)),
    (["method=graft", "exchange.params.hacpo_window=2.5"], "exchange.params.hacpo_window",
     ("must be a whole number, got 2.5",)),
    (["method=graft", "exchange.params.cap=maybe"], "exchange.params.cap", ("must be true or false",)),
    (["method=graft", "exchange.params.gate=flor"], "exchange.params.gate", ("must be one of floor, none",)),
    (["method=graft_stored", "exchange.params.partner_run=/x", "exchange.params.partner_policy=b",
      "exchange.params.reverify=often"], "exchange.params.reverify", ("must be true or false",)),
    (["method=graft_luffy", "algo.loss_params.gama=0.2"], "algo.loss_params.gama",
     ("not a parameter of loss 'luffy'; known: gamma",)),
    (["method=sgt", "algo.loss_params.nll_coef=lots"], "algo.loss_params.nll_coef", ("must be a number",)),
    (["method=tandem", "algo.loss_mask_params.junior_wieght=0.5"], "algo.loss_mask_params.junior_wieght",
     ("not a parameter of loss mask 'author'; known: junior_weight",)),
    (["method=grpo_opd", "algo.token_adv_params.teacher_column=5"], "algo.token_adv_params.teacher_column",
     ("must be a string, got 5",)),
    (["method=grpo_opd", "algo.token_adv_params.tanh=1"], "algo.token_adv_params.tanh",
     ("must be true or false, got 1",)),
    (["method=grpo", "algo.rollout_correction.rejection=token", "algo.rollout_correction.params.threshold=high"],
     "algo.rollout_correction.params.threshold", ("must be a number",)),
    (["method=saf", "algo.controllers=[{name: saf_schedule, warmup_steps: 2.5}]"],
     "algo.controllers.0.warmup_steps", ("must be a whole number, got 2.5",)),
]


@pytest.mark.parametrize("overrides,key,words", CASES, ids=[c[1] for c in CASES])
def test_an_unknown_key_or_a_wrong_type_fails_in_one_line_naming_the_key(overrides, key, words):
    with pytest.raises(GraftError) as ei:
        compose(["pair=tiny", *overrides])
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(f"config key '{key}': "), msg
    for w in words:
        assert w in msg, msg


def test_params_check_read_and_keyword_registration():
    """``check`` refuses and fills; ``read`` takes a written config's values as they are (keys that are no
    parameter left out); a part registered with keyword defaults gets a Params class made from them."""
    gates = Registry("gate")
    gates.register("floor")(1)
    gates.register("none")(2)

    @dataclasses.dataclass(frozen=True)
    class P(Params):
        floor: float = 0.5
        steps: int = 3
        name: str | None = None
        gate: str = choice("floor", among=gates)
        mode: str = choice("a", "b")

    assert P.check({"steps": 4.0, "name": None}, "k", "p") == P(steps=4.0)
    assert P.check(None, "k", "p").to_dict() == {"floor": 0.5, "steps": 3, "name": None, "gate": "floor", "mode": "a"}
    for given, msg in (({"gate": "x"}, "config key 'k.gate': must be one of floor, none, got 'x'"),
                       ({"mode": "c"}, "config key 'k.mode': must be one of a, b, got 'c'"),
                       ({"name": 3}, "config key 'k.name': must be a string, got 3"),
                       ({"floor": float("nan")}, "config key 'k.floor': must be a number, got nan"),
                       ({"zzz": 1}, "config key 'k.zzz': not a parameter of p; known: floor, gate, mode, name, steps")):
        with pytest.raises(GraftError) as ei:
            P.check(given, "k", "p")
        assert str(ei.value) == msg
    assert P.read({"floor": 0.6, "older_key": 1}) == P(floor=0.6)

    def loss(inp):
        return None

    spec = register_loss("test_params_kw_loss", scale=2.0, kind=("x", "y"))(loss)
    assert POLICY_LOSSES.spec("test_params_kw_loss").to_dict() == {"scale": 2.0, "kind": "x"}
    assert spec.validate({"scale": 3}) == {"scale": 3, "kind": "x"}
    with pytest.raises(TypeError, match="not both"):
        register_loss("test_params_both", params=P, scale=1.0)


# -------------------------------------------------------------------------------------------- reports
def _run(tmp_path, name: str, overrides: list[str]) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "config.yaml").write_text(to_yaml(compose(["pair=tiny", *overrides])))
    return str(d)


def test_reports_read_delta_from_the_runs_resolved_config(tmp_path):
    """δ = 0.6 in a run's config.yaml is the δ the gate report and the compatibility plot draw; a config written
    without δ reads the registered default; gate none has no floor, and a run without GRAFT has none (one reader,
    gate_floor)."""
    from graft_cli.report.mechanism import _run_delta
    from graft_cli.report.plots import _delta_of

    d06 = _run(tmp_path, "g06", ["method=graft", "exchange.params.delta=0.6"])
    assert _run_delta([{"name": "graft", "dir": d06}], "graft") == 0.6
    assert _delta_of(SimpleNamespace(path=d06)) == 0.6
    assert exchange_params({"name": "graft", "params": {"delta": 0.6}}) == GraftParams(delta=0.6)

    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.yaml").write_text("method: graft\nexchange: {name: graft, params: {gate: floor}}\n")
    assert _run_delta([{"name": "graft", "dir": str(bare)}], "graft") == GraftParams.delta
    assert _delta_of(SimpleNamespace(path=str(bare))) == GraftParams.delta

    nogate = _run(tmp_path, "nogate", ["method=graft_nogate"])
    assert _run_delta([{"name": "graft_nogate", "dir": nogate}], "graft_nogate") is None  # no gate, no floor
    assert _delta_of(SimpleNamespace(path=nogate)) is None
    grpo = _run(tmp_path, "grpo", ["method=grpo"])
    assert _run_delta([{"name": "grpo", "dir": grpo}], "grpo") is None and _delta_of(SimpleNamespace(path=grpo)) is None


def test_the_delta_sweep_reads_each_method_configs_delta():
    """Table 7's δ rows come from the method configs (graft.yaml's δ is the registered default)."""
    from graft_cli.report.runs import SWEEP, method_delta

    assert [method_delta(m) for m in SWEEP] == [0.0, 0.7, GraftParams.delta, 0.9]
    assert method_delta("grpo") is None and method_delta("no_such_method") is None
