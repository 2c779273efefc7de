"""Unit tests of the registries and algorithm modules that the end-to-end tests reach only through a run: the name
registry and its parameter check, the controller contract (and SAF's schedule driven through it), the peer losses
(LUFFY, HACPO, SGT's PPO + NLL), the exchange interface's ``none`` exchange and stored-trajectory GRAFT's
validation. Every expected value is worked by hand in the comments or computed here with plain torch/python."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT

import graft_cli.algorithms.opd  # noqa: F401  (registers the saf_schedule controller)
from graft_cli.algorithms import controllers
from graft_cli.algorithms.controllers import CONTROLLERS, Controller, build_controllers, controller_params
from graft_cli.algorithms.exchange.base import EXCHANGES, Exchange, ExchangeContext, ReceiverFunctions, exchange_params
from graft_cli.algorithms.exchange.graft import options
from graft_cli.algorithms.exchange.graft_stored import StoredGraftExchange, StoredGraftParams
from graft_cli.algorithms.losses import LossInputs, Normaliser, ppo_token_loss
from graft_cli.algorithms.peer_losses import hacpo_peer_loss, luffy_loss, ppo_token_nll_loss
from graft_cli.batch import PolicyStep, Rollouts, TrainBatch
from graft_cli.data.problems import Problem
from graft_cli.errors import GraftError
from graft_cli.registry import Params, Registry, choice, params_class, validate_params
from graft_cli.schema import SourceConfig

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


# ============================================================================================== registry.py
GATES_TEST = Registry("gate")
GATES_TEST.register("floor")(1)
GATES_TEST.register("none")(2)


@dataclass(frozen=True)
class WidgetParams(Params):
    """A test's parameters: one field of each kind the check knows."""

    flag: bool = True
    count: int = 3
    rate: float = 0.5
    label: str = "x"
    cap: float | None = None
    mode: str = choice("fast", "slow")
    gate: str = choice("floor", among=GATES_TEST)
    anything: object = None
    tags: list = field(default_factory=list)


def test_registry_register_get_names_contains():
    """A registered object comes back by name; names are sorted; ``in`` sees registered and lazy names."""
    reg = Registry("widget")
    a, b = object(), object()
    reg.register("b")(b)
    assert reg.register("a")(a) is a  # the decorator returns the object
    reg.lazy("c", "some.module")
    assert reg.get("a") is a and reg.get("b") is b
    assert reg.names() == ["a", "b", "c"]
    assert "a" in reg and "c" in reg and "d" not in reg


def test_registry_unknown_name_refusal_names_kind_key_and_known():
    """An unknown name is a one-line GraftError naming the registry's kind, the key and the known names."""
    reg = Registry("widget")
    reg.register("beta")(1)
    reg.register("alpha")(2)
    with pytest.raises(GraftError) as e:
        reg.get("gamma")
    assert str(e.value) == "unknown widget 'gamma'; known: alpha, beta"


def test_registry_duplicate_refused_same_object_again_allowed():
    """A second object under a taken name is refused; registering the same object again is a no-op."""
    reg = Registry("widget")
    f = object()
    reg.register("x")(f)
    reg.register("x")(f)
    assert reg.get("x") is f
    with pytest.raises(ValueError, match=r"widget 'x' is already registered"):
        reg.register("x")(object())


def test_registry_specs_default_instance_and_type_check():
    """A name registered without a spec gets ``spec_type()``; a spec of another type is refused (TypeError)."""
    reg = Registry("scorer", spec_type=Params)
    reg.register("plain")(object())
    reg.register("tuned", WidgetParams(count=7))(object())
    assert reg.spec("plain") == Params()
    assert reg.spec("tuned").count == 7
    with pytest.raises(TypeError, match=r"scorer 'bad': a spec must be a Params"):
        reg.register("bad", {"count": 3})
    untyped = Registry("thing")  # names carry no spec: any spec is refused
    with pytest.raises(TypeError, match="carry no spec"):
        untyped.register("x", Params())
    with pytest.raises(GraftError, match="unknown scorer 'nope'"):
        reg.spec("nope")


def test_registry_lazy_name_imports_its_module_on_first_get(tmp_path, monkeypatch):
    """A lazy name's module is imported only when the name is first looked up, and registers it then."""
    (tmp_path / "unit_lazy_host.py").write_text(
        "from graft_cli.registry import Registry\nREG = Registry('piece')\nREG.lazy('late', 'unit_lazy_piece')\n")
    (tmp_path / "unit_lazy_piece.py").write_text(
        "from unit_lazy_host import REG\n\n@REG.register('late')\ndef late():\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for m in ("unit_lazy_host", "unit_lazy_piece"):
        monkeypatch.delitem(sys.modules, m, raising=False)
    import unit_lazy_host

    assert "unit_lazy_piece" not in sys.modules and unit_lazy_host.REG.names() == ["late"]
    assert unit_lazy_host.REG.get("late")() == 42
    assert "unit_lazy_piece" in sys.modules


def _installed(tmp_path, dist: str, group: str, entries: dict, monkeypatch) -> None:
    """An installed distribution ``dist`` (its metadata folder on sys.path) declaring ``entries`` in
    entry-point group ``group``."""
    info = tmp_path / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))
    monkeypatch.syspath_prepend(str(tmp_path))


def test_registry_entry_point_names_import_their_object_on_first_get(tmp_path, monkeypatch):
    """A registry with an entry-point group holds the names an installed package declares there; a name's module
    is imported on its first lookup and the object at ``module:attr`` is registered under it."""
    _installed(tmp_path, "unit-plugin", "unit.pieces", {"late": "unit_ep_piece:make.answer"}, monkeypatch)
    (tmp_path / "unit_ep_piece.py").write_text("class make:\n    @staticmethod\n    def answer():\n        return 42\n")
    monkeypatch.delitem(sys.modules, "unit_ep_piece", raising=False)
    reg = Registry("piece", entry_points="unit.pieces")
    reg.register("own")(1)
    assert "late" in reg and reg.names() == ["late", "own"] and "unit_ep_piece" not in sys.modules
    assert reg.get("late")() == 42 and "unit_ep_piece" in sys.modules
    assert Registry("piece").names() == []  # no group: no entry points


def test_pyproject_entry_point_tables_read_as_toml_reads_them(tmp_path):
    """The checkout's reader of pyproject.toml gives each entry-point group as tomllib parses it; a file of
    another project, or none, gives None."""
    import tomllib

    from graft_cli.registry import checkout_entry_points

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        groups = tomllib.load(f)["project"]["entry-points"]
    assert set(groups) >= {"graft.model_sources", "graft.source_builds"}
    for group, table in groups.items():
        assert checkout_entry_points(group) == table
    assert checkout_entry_points("no.such.group") == {}
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\n\n[project.entry-points."g"]\nx = "m:f"\n')
    assert checkout_entry_points("g", str(tmp_path / "pyproject.toml")) is None
    assert checkout_entry_points("g", str(tmp_path / "missing.toml")) is None


def test_model_sources_come_from_the_checkout_where_the_installed_metadata_is_stale(tmp_path, monkeypatch):
    """Run from a source checkout, this package's entry points are its pyproject.toml's, whatever the installed
    metadata of ``graft`` says (an editable install made before the table changed); another package's stay."""
    from graft_cli.registry import declared_entry_points

    _installed(tmp_path, "graft", "graft.model_sources", {"tiny": "gone.module:resolve", "old": "gone:f"},
               monkeypatch)
    (tmp_path / "other").mkdir()
    _installed(tmp_path / "other", "unit-plugin", "graft.model_sources", {"mine": "unit_src:resolve"}, monkeypatch)
    got = declared_entry_points("graft.model_sources")
    assert got == {"tiny": "graft_cli.tiny.build:resolve_tiny", "tiny_code": "graft_cli.tiny.code:resolve_tiny_code",
                   "mine": "unit_src:resolve"}
    assert declared_entry_points("graft.source_builds") == {"tiny": "graft_cli.tiny.build:build_record"}
    from graft_cli.models.loading import MODEL_SOURCES, SOURCE_BUILDS
    from graft_cli.tiny import build as T, code

    assert MODEL_SOURCES.get("tiny") is T.resolve_tiny and MODEL_SOURCES.get("tiny_code") is code.resolve_tiny_code
    assert SOURCE_BUILDS.get("tiny") is T.build_record


def test_model_sources_come_from_the_installed_metadata_outside_a_checkout(tmp_path, monkeypatch):
    """Installed from a wheel (no pyproject.toml beside the package), the names are the installed metadata's."""
    from graft_cli import registry

    monkeypatch.setattr(registry, "checkout_entry_points", lambda group, path=None: None)
    _installed(tmp_path, "graft", "graft.model_sources", {"tiny": "graft_cli.tiny.build:resolve_tiny"}, monkeypatch)
    assert registry.declared_entry_points("graft.model_sources") == {"tiny": "graft_cli.tiny.build:resolve_tiny"}


VP_DEFAULTS = {"lr": 0.1, "on": True, "mode": ("a", "b"), "k": 3, "name": None}
VP_FILLED = {"lr": 0.1, "on": True, "mode": "a", "k": 3, "name": None}


@pytest.mark.parametrize("params,want", [
    (None, {}),
    ({"lr": 2}, {"lr": 2}),
    ({"k": 0.5}, {"k": 0.5}),  # an int default takes any finite number
    ({"mode": "b"}, {"mode": "b"}),
    ({"on": False}, {"on": False}),
    ({"name": "anything", "lr": 1e-3}, {"name": "anything", "lr": 1e-3}),  # a None default takes any value
])
def test_validate_params_accepts_and_fills_defaults(params, want):
    """Accepted parameters are merged over the defaults; a tuple default becomes its first entry."""
    assert validate_params(VP_DEFAULTS, params, "p", "thing") == {**VP_FILLED, **want}


@pytest.mark.parametrize("params,msg", [
    ({"bogus": 1}, "config key 'p.bogus': not a parameter of thing; known: k, lr, mode, name, on"),
    ({"lr": True}, "config key 'p.lr': must be a number, got True"),
    ({"lr": float("nan")}, "config key 'p.lr': must be a number, got nan"),
    ({"k": float("inf")}, "config key 'p.k': must be a number, got inf"),
    ({"lr": "0.1"}, "config key 'p.lr': must be a number, got '0.1'"),
    ({"on": 1}, "config key 'p.on': must be true or false, got 1"),
    ({"mode": "c"}, "config key 'p.mode': must be one of a, b, got 'c'"),
])
def test_validate_params_refusals_name_the_key(params, msg):
    """Each refusal is one line naming ``key.<param>`` and what was wrong (table of cases)."""
    with pytest.raises(GraftError) as e:
        validate_params(VP_DEFAULTS, params, "p", "thing")
    assert str(e.value) == msg


def test_validate_params_choices_registry_and_open_keys():
    """``choices`` may be a registry (its names are the choices); ``open_keys`` pass through and are listed as known."""
    reg = Registry("gate")
    reg.register("floor")(1)
    reg.register("none")(2)
    out = validate_params({"gate": "floor"}, {"gate": "none", "extra": [1]}, "x", "o", choices={"gate": reg},
                          open_keys=("extra",))
    assert out == {"gate": "none", "extra": [1]}
    with pytest.raises(GraftError, match=r"^config key 'x.gate': must be one of floor, none, got 'nah'$"):
        validate_params({"gate": "floor"}, {"gate": "nah"}, "x", "o", choices={"gate": reg})
    with pytest.raises(GraftError, match=r"known: extra, gate$"):
        validate_params({"gate": "floor"}, {"typo": 1}, "x", "o", open_keys=("extra",))
    with pytest.raises(GraftError, match=r"not a parameter of o; known: none$"):
        validate_params({}, {"typo": 1}, "x", "o")


def test_params_defaults_check_and_to_dict():
    """A Params dataclass: its defaults in declaration order; ``check`` fills them under the given values."""
    assert WidgetParams.defaults() == {"flag": True, "count": 3, "rate": 0.5, "label": "x", "cap": None,
                                       "mode": "fast", "gate": "floor", "anything": None, "tags": []}
    assert WidgetParams.check(None, "w", "widget") == WidgetParams()
    p = WidgetParams.check({"count": 4.0, "cap": None, "rate": 2, "mode": "slow", "gate": "none", "anything": [1]},
                           "w", "widget")
    assert p.to_dict() == {"flag": True, "count": 4, "rate": 2, "label": "x", "cap": None, "mode": "slow",
                           "gate": "none", "anything": [1], "tags": []}
    assert list(p.to_dict()) == list(WidgetParams.defaults())
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.count = 5


@pytest.mark.parametrize("given,msg", [
    ({"count": 2.5}, "config key 'w.count': must be a whole number, got 2.5"),
    ({"count": True}, "config key 'w.count': must be a number, got True"),
    ({"count": None}, "config key 'w.count': must be a number, got None"),  # not optional
    ({"rate": float("nan")}, "config key 'w.rate': must be a number, got nan"),
    ({"cap": "big"}, "config key 'w.cap': must be a number, got 'big'"),  # optional: None or a number
    ({"flag": "yes"}, "config key 'w.flag': must be true or false, got 'yes'"),
    ({"label": 3}, "config key 'w.label': must be a string, got 3"),
    ({"mode": "medium"}, "config key 'w.mode': must be one of fast, slow, got 'medium'"),
    ({"gate": "nah"}, "config key 'w.gate': must be one of floor, none, got 'nah'"),
    ({"gate": ["floor"]}, "config key 'w.gate': must be one of floor, none, got ['floor']"),  # unhashable
    ({"nope": 1}, "config key 'w.nope': not a parameter of widget; known: anything, cap, count, flag, gate, label, "
                  "mode, rate, tags"),
])
def test_params_check_refusals_name_the_key(given, msg):
    """Each value of the wrong type or outside its choices is a one-line GraftError naming ``key.<param>``."""
    with pytest.raises(GraftError) as e:
        WidgetParams.check(given, "w", "widget")
    assert str(e.value) == msg


def test_params_read_takes_written_values_leaves_out_old_keys():
    """``read``: a run's written values over the defaults, keys that are no parameter dropped, nothing re-checked."""
    assert WidgetParams.read({"count": 9, "retired_key": 1}) == WidgetParams(count=9)
    assert WidgetParams.read(None) == WidgetParams()


def test_params_class_from_a_mapping_of_defaults():
    """``params_class``: a tuple default is a choice, a bool a flag, a number any finite number, a list copied per
    instance; ``choices`` names a registry; the class is named after the owner."""
    src = {"gamma": 0.1, "on": True, "mode": ("a", "b"), "xs": [1], "n": 3, "gate": "floor"}
    cls = params_class("my-loss", src, choices={"gate": GATES_TEST})
    assert cls.__name__ == "MyLossParams" and issubclass(cls, Params)
    assert cls.defaults() == {"gamma": 0.1, "on": True, "mode": "a", "xs": [1], "n": 3, "gate": "floor"}
    assert cls().xs is not src["xs"] and cls().xs is not cls().xs
    assert cls.check({"n": 0.5, "mode": "b", "xs": "any"}, "k", "o").to_dict()["n"] == 0.5
    for given, msg in (({"on": 0}, "must be true or false"), ({"mode": "c"}, "must be one of a, b"),
                       ({"gate": "x"}, "must be one of floor, none"), ({"gamma": "1"}, "must be a number")):
        with pytest.raises(GraftError, match=msg):
            cls.check(given, "k", "o")


# ========================================================================================= controllers.py
class Ramp(Controller):
    """A test controller: coefficient ``ramp`` = start + (end − start)·step/total_steps; counts observed steps."""

    DEFAULTS = {"start": 0.0, "end": 1.0, "shape": ("linear", "flat")}

    @classmethod
    def check(cls, params, key):
        if params.start > params.end:
            raise GraftError(f"config key '{key}': ramp needs start <= end")

    def __init__(self, params=None, total_steps=0):
        super().__init__(params, total_steps)
        self.seen = 0

    def coefs(self, step):
        p = self.params
        if p.shape == "flat":
            return {"ramp": p.start}
        return {"ramp": p.start + (p.end - p.start) * step / self.total_steps}

    def observe(self, step, rows):
        self.seen += 1
        return {"ramp/seen": self.seen}


@pytest.fixture
def ramp_registry(monkeypatch):
    reg = Registry("controller")
    reg.register("ramp")(Ramp)
    reg.register("base")(Controller)
    monkeypatch.setattr(controllers, "CONTROLLERS", reg)
    return reg


def test_controller_base_has_no_parameters_coefficients_or_state():
    """The base controller: no coefficients, no metrics, empty state; any parameter is refused naming its key."""
    c = Controller(None, total_steps=5)
    assert (c.coefs(0), c.observe(0, [{"policy": "a"}]), c.state_dict()) == ({}, {}, {})
    assert Controller.validate(None).to_dict() == {} and isinstance(c.params, Controller.params_type())
    with pytest.raises(GraftError, match=r"^config key 'algo.controllers.x': not a parameter of controller Controller"):
        Controller.validate({"x": 1})


def test_build_controllers_checks_fills_defaults_keeps_order(ramp_registry):
    """Entries become (name, controller) in config order with defaults filled; the config entries are not mutated."""
    specs = [{"name": "ramp", "end": 2.0}, {"name": "base"}]
    built = build_controllers(specs, total_steps=4)
    assert [n for n, _ in built] == ["ramp", "base"]
    ramp = built[0][1]
    assert ramp.params.to_dict() == {"start": 0.0, "end": 2.0, "shape": "linear"} and ramp.total_steps == 4
    assert isinstance(ramp.params, Ramp.params_type()) and ramp.params.end == 2.0
    with pytest.raises(TypeError, match="parameters must be a RampParams, got dict"):
        Ramp({"end": 2.0}, 4)  # a mapping is checked into the Params object first (Controller.validate)
    # ramp = 0 + 2·step/4
    assert [ramp.coefs(s)["ramp"] for s in range(5)] == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert ramp.observe(0, []) == {"ramp/seen": 1} and ramp.observe(1, []) == {"ramp/seen": 2}
    assert specs[0] == {"name": "ramp", "end": 2.0}
    assert build_controllers(None, 3) == []


@pytest.mark.parametrize("spec,msg", [
    ({"end": 1.0}, r"^config key 'algo.controllers.1': needs a name; known: base, ramp$"),
    ("ramp", r"^config key 'algo.controllers.1': needs a name"),  # not a mapping
    ({"name": "rmap"}, r"^unknown controller 'rmap'; known: base, ramp$"),
    ({"name": "ramp", "stop": 1.0}, r"^config key 'algo.controllers.1.stop': not a parameter of controller ramp"),
    ({"name": "ramp", "shape": "cubic"}, r"^config key 'algo.controllers.1.shape': must be one of linear, flat"),
    ({"name": "ramp", "start": 2.0}, r"^config key 'algo.controllers.1': ramp needs start <= end$"),
])
def test_controller_params_refusals_name_the_entry(ramp_registry, spec, msg):
    """Each bad entry of ``algo.controllers`` is a one-line GraftError naming its index (and parameter)."""
    with pytest.raises(GraftError, match=msg):
        controller_params(1, spec)


def test_saf_schedule_through_build_controllers_by_hand():
    """SAF's warm-up, KL-triggered stop and anneal, built from a config entry, step by step against hand values."""
    (name, saf), = build_controllers([{"name": "saf_schedule", "warmup_steps": 4, "kl_delta": 0.5,
                                       "anneal_min": 0.2}], total_steps=10)
    assert name == "saf_schedule" and CONTROLLERS.get("saf_schedule") is type(saf)

    def row(kl):
        return [{"policy": "a", "kl_seq_mean": kl}]

    # step 0 (s = 1): warm-up scale s/N_w = 1/4; no anneal before the warm-up ends
    assert saf.coefs(0) == {"saf/scale": 0.25, "saf/anneal": 1.0}
    assert saf.coefs(0) == {"saf/scale": 0.25, "saf/anneal": 1.0}  # coefs is pure: asking twice changes nothing
    m = saf.observe(0, row(2.0))
    assert (m["saf/warmup_scale"], m["saf/warmup_done"], m["saf/kl0"]) == (0.25, 0.0, None)
    # step 1 (s = 2): KL_0 = 2.0 (the first observed); drop (2 − 2)/2 = 0 < δ → scale 2/4
    assert saf.coefs(1)["saf/scale"] == 0.5
    assert saf.observe(1, row(0.9))["saf/kl0"] == 2.0
    # step 2 (s = 3): drop (2 − 0.9)/2 = 0.55 ≥ δ = 0.5 → warm-up stops, scale frozen at 3/4; the anneal starts
    # with R = max(1, S − s*) = 10 − 3 = 7, t = 0: anneal = 0.2 + 0.8·(1 − 0/7) = 1
    assert saf.coefs(2) == {"saf/scale": 0.75, "saf/anneal": 1.0}
    m = saf.observe(2, row(0.1))
    assert (m["saf/warmup_done"], m["saf/warmup_end_step"]) == (1.0, 3)
    state = saf.state_dict()
    # t = 1, 2: 0.2 + 0.8·6/7, 0.2 + 0.8·5/7; the scale stays frozen whatever the KL does
    want = [0.2 + 0.8 * 6 / 7, 0.2 + 0.8 * 5 / 7]
    got = []
    for s in (3, 4):
        c = saf.coefs(s)
        assert c["saf/scale"] == 0.75
        got.append(c["saf/anneal"])
        saf.observe(s, row(5.0))
    assert got == pytest.approx(want, abs=1e-12)
    # a controller restored from the state saved after step 2 continues the schedule exactly
    (_, again), = build_controllers([{"name": "saf_schedule", "warmup_steps": 4, "kl_delta": 0.5,
                                      "anneal_min": 0.2}], total_steps=10)
    again.load_state_dict(state)
    assert again.coefs(3) == {"saf/scale": 0.75, "saf/anneal": pytest.approx(want[0], abs=1e-12)}


def test_saf_schedule_without_warmup_anneals_over_the_run():
    """``warmup: false``: scale 1 from step 1 and the anneal spans the run's steps (R = total_steps = 4)."""
    (_, saf), = build_controllers([{"name": "saf_schedule", "warmup": False}], total_steps=4)
    got = []
    for s in range(6):
        got.append(saf.coefs(s))
        saf.observe(s, [{"policy": "a", "kl_seq_mean": 1.0}])
    # anneal(t) = max(0, 1 − t/4) with anneal_min 0: 1, .75, .5, .25, 0, 0
    assert [c["saf/scale"] for c in got] == [1.0] * 6
    assert [c["saf/anneal"] for c in got] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0, 0.0], abs=1e-12)


def test_saf_schedule_parameter_rules():
    """SAF's rules between parameters are refused at config time, naming the entry."""
    with pytest.raises(GraftError, match=r"^config key 'algo.controllers.0': saf_schedule needs warmup_steps >= 0"):
        controller_params(0, {"name": "saf_schedule", "anneal_min": 1.5})
    with pytest.raises(GraftError, match=r"^config key 'algo.controllers.2.anneal_total_steps'"):
        controller_params(2, {"name": "saf_schedule", "anneal_total_steps": -1})


# ========================================================================================= peer_losses.py
def test_luffy_by_hand_and_peer_gradient():
    """LUFFY: self tokens clipped PPO, peer tokens −π/(π+γ)·Â (no clip, never counted clipped); value and gradient."""
    # row 0 self: ρ = [1.5, 0.9], Â = 1 → −min(1.5, 1.28) = −1.28, −0.9
    # row 1 peer: π = [0.5, 0.25] (logp = log π, old irrelevant), Â = 2, γ = 0.5 → f = [0.5, 1/3]
    #   → −1.0, −2/3; weight 2 → −2.0, −4/3
    # token-mean over 4 tokens (the padded third column masked): (−1.28 − 0.9 − 2 − 4/3)/4
    logp = t([[math.log(1.5), math.log(0.9), 0.0], [math.log(0.5), math.log(0.25), 0.0]]).requires_grad_(True)
    old = t([[0.0, 0.0, 0.0], [-7.0, 3.0, 0.0]])
    adv = t([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    mask = t([[1, 1, 0], [1, 1, 0]])
    inp = LossInputs.of(logp, old, adv, mask, t([1.0, 2.0]), torch.tensor([False, True]),
                        norm=Normaliser(num_tokens=4.0, num_seqs=2.0))
    loss, st = luffy_loss(inp, gamma=0.5)
    assert loss.item() == pytest.approx((-1.28 - 0.9 - 2.0 - 4 / 3) / 4, abs=1e-9)
    # the peer row's ratio against "old" would be e^7.3 and e^−3.4: still no clip counted on peer tokens
    assert (float(st["clip_high"]), float(st["clip_peer"]), float(st["tokens_peer"])) == (1.0, 0.0, 2.0)
    loss.backward()
    # d/dlogp of −w·Â·π/(π+γ) = −w·Â·γπ/(π+γ)², over 4 tokens
    for j, p in enumerate((0.5, 0.25)):
        assert float(logp.grad[1, j]) == pytest.approx(-2 * 2 * 0.5 * p / (p + 0.5) ** 2 / 4, abs=1e-9)
    # self token 0 is clipped (no gradient), token 1 is not: −Â·ρ/4
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.9 / 4, 0.0], abs=1e-9)
    with pytest.raises(ValueError, match="gamma must be > 0"):
        luffy_loss(LossInputs.of(logp, old, adv, mask, t([1.0, 1.0]), torch.tensor([False, True]),
                                 norm=Normaliser(4.0, 2.0)), gamma=0.0)


def test_a_loss_reads_its_params_object_and_refuses_a_mapping():
    """``LossInputs.params`` is the loss's Params object (the loss reads ``inp.params.gamma``): the object given is
    the value used, None is the defaults, and a plain mapping (or another loss's Params) stops with a TypeError."""
    from graft_cli.algorithms.losses import compute_loss
    from graft_cli.algorithms.peer_losses import HacpoPeerParams, LuffyParams

    logp = t([[math.log(0.5), math.log(0.25)]])
    adv, mask = t([[2.0, 2.0]]), t([[1, 1]])

    def inp(params=None):
        return LossInputs.of(logp, logp, adv, mask, t([1.0]), torch.tensor([True]), norm=Normaliser(2.0, 1.0),
                             params=params)

    # peer row, π = [0.5, 0.25], Â = 2: token-mean of −(π/(π+γ))·Â; γ = 0.5 → −(0.5 + 1/3); γ = 0.1 (the default)
    # → −(5/6 + 5/7)
    assert float(luffy_loss(inp(LuffyParams(gamma=0.5)))[0]) == pytest.approx(-(0.5 + 1 / 3), abs=1e-12)
    assert float(compute_loss(luffy_loss, inp(LuffyParams(gamma=0.5)))[0]) == pytest.approx(-(0.5 + 1 / 3), abs=1e-12)
    assert float(luffy_loss(inp())[0]) == pytest.approx(-(5 / 6 + 5 / 7), abs=1e-12)
    for bad, name in (({"gamma": 0.5}, "dict"), (HacpoPeerParams(), "HacpoPeerParams")):
        with pytest.raises(TypeError, match=f"^loss 'luffy': parameters must be a LuffyParams, got {name}$"):
            luffy_loss(inp(bad))
        with pytest.raises(TypeError, match="must be a LuffyParams"):
            compute_loss(luffy_loss, inp(bad))


def _hacpo_inputs(mb_index=2, step=0):
    # T = 3; row 0 self (2 tokens), rows 1, 2 peer
    logp = t([[-1.0, -2.0, 0.0], [-0.5, -0.7, -3.0], [-2.0, -2.0, 0.0]]).requires_grad_(True)
    old = t([[-1.0, -2.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    adv = t([[0.5, 0.5, 0.5], [2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]])
    mask = t([[1, 1, 0], [1, 1, 1], [1, 1, 0]])
    extra = {"n_scored": [None, 2, None], "source_logp_mean": [None, -1.0, -1.0], "hacpo_c": [None, 3.0, None]}
    return logp, LossInputs.of(logp, old, adv, mask, t([1.0, 1.0, 2.0]), torch.tensor([False, True, True]),
                               norm=Normaliser(num_tokens=7.0, num_seqs=3.0), extra=extra, clip_low=3e-4,
                               clip_high=4e-4, mb_index=mb_index, step=step)


def test_hacpo_peer_clamps_both_ends_by_hand():
    """HACPO: ŝ = clamp(s_x, L_m, 1) at both ends, ·c·Â·peer_coef, the weight per row; value, stats and gradient."""
    # L_m = min(1, 0.8 + m·0.05) at m = 2 → 0.9
    # row 0 self: s = exp(mean(0, 0)) = 1 → −Â = −0.5 per token, 2 tokens
    # row 1 peer: mean over the 2 scored tokens (−0.5, −0.7) = −0.6; −0.6 − (−1) = 0.4 → s_x = e^0.4 = 1.49 > 1 → ŝ = 1;
    #   c = 3, Â = 2, peer_coef 0.5 → objective 3 → −3 on each of its 3 loss tokens
    # row 2 peer: n_scored missing (every token): mean −2; −2 − (−1) = −1 → s_x = e^−1 = 0.37 < 0.9 → ŝ = 0.9;
    #   c = 1 (missing), Â = −1 → objective −0.405 → +0.405 per token, weight 2 → 0.81, 2 tokens
    # token-mean over 7: (−1.0 − 9.0 + 1.62)/7
    logp, inp = _hacpo_inputs()
    loss, st = hacpo_peer_loss(inp, lower_bound=0.8, lower_bound_step=0.05, peer_coef=0.5)
    assert loss.item() == pytest.approx((-1.0 - 9.0 + 1.62) / 7, abs=1e-6)
    assert float(st["tokens"]) == 7 and float(st["tokens_peer"]) == 5
    assert (float(st["clip_high"]), float(st["clip_low"]), float(st["clip_peer"])) == (3.0, 2.0, 5.0)
    assert float(st["hacpo/L_m/sum"]) == pytest.approx(1.8) and float(st["hacpo/L_m/n"]) == 2
    loss.backward()
    # both peer rows sit on a clamp bound: no gradient through ŝ; the self row: −Â·s/7 per token (GSPO token form)
    assert logp.grad[1:].abs().max().item() == 0.0
    assert logp.grad[0].tolist() == pytest.approx([-0.5 / 7, -0.5 / 7, 0.0], abs=1e-9)


def test_hacpo_peer_step_schedule_and_missing_source_mean():
    """``schedule: step`` takes m from the training step, not the minibatch; a peer row without a source mean fails."""
    # step 8, Δ = 0.025: L = 0.8 + 0.2 = 1.0 → row 2's ŝ = 1 → objective 1·1·1·(−1)·0.5 = −0.5 → +0.5 per token,
    # weight 2 → +1, 2 tokens; rows 0 and 1 as in the test above: (−1.0 − 9.0 + 2.0)/7
    _, inp = _hacpo_inputs(mb_index=0, step=8)
    loss, st = hacpo_peer_loss(inp, schedule="step", peer_coef=0.5)
    assert loss.item() == pytest.approx((-1.0 - 9.0 + 2.0) / 7, abs=1e-6)
    assert float(st["hacpo/L_m/sum"]) == pytest.approx(2.0)
    _, inp = _hacpo_inputs()
    inp.columns["source_logp_mean"] = [None, -1.0, None]
    with pytest.raises(ValueError, match="column source_logp_mean"):
        hacpo_peer_loss(inp)


def test_ppo_token_nll_by_hand_weights_leave_the_nll_alone():
    """SGT's update: clipped PPO over the PG rows (their own denominator) + λ·mean token NLL over the aux rows."""
    # row 0 (PG): ρ = [1.5, 0.5], Â = 1 → −min(1.5, 1.28) = −1.28, −min(0.5, 0.8) = −0.5 → −1.78 / 2 tokens = −0.89
    # rows 1, 2 (aux): NLL = mean(0.2, 0.4, 0.6) = 0.4 and mean(1, 3) = 2; λ = 0.5, 2 aux rows → 0.5·2.4/2 = 0.6
    # the weights (3 on the aux rows) scale the PPO term only
    logp = t([[math.log(1.5), math.log(0.5), 0.0], [-0.2, -0.4, -0.6], [-1.0, -3.0, 0.0]])
    old, adv = torch.zeros(3, 3, dtype=D), t([[1.0] * 3, [5.0] * 3, [-5.0] * 3])
    mask = t([[1, 1, 0], [1, 1, 1], [1, 1, 0]])
    inp = LossInputs.of(logp, old, adv, mask, t([1.0, 3.0, 3.0]), torch.tensor([False, True, True]),
                        norm=Normaliser.of_rows([2, 3, 2], [True, False, False]),
                        in_pg=torch.tensor([True, False, False]))
    loss, st = ppo_token_nll_loss(inp, nll_coef=0.5)
    assert loss.item() == pytest.approx(-0.89 + 0.6, abs=1e-9)
    assert (float(st["tokens"]), float(st["clip_high"]), float(st["clip_low"])) == (2.0, 1.0, 0.0)
    assert (float(st["nll_sum"]), float(st["nll_rows"])) == pytest.approx((2.4, 2.0))


def test_ppo_token_nll_without_aux_rows_is_ppo_token():
    """With every row in the policy gradient the SGT loss equals the plain PPO token loss."""
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 4, generator=g, dtype=D)
    old = logp + 0.3 * torch.randn(3, 4, generator=g, dtype=D)
    adv = torch.randn(3, 1, generator=g, dtype=D).expand(3, 4)
    mask = t([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])

    def inp():
        return LossInputs.of(logp, old, adv, mask, t([1.0, 0.5, 2.0]), torch.tensor([False, True, False]),
                             norm=Normaliser(9.0, 3.0))

    a, sa = ppo_token_nll_loss(inp())
    b, sb = ppo_token_loss(inp())
    assert float(a) == pytest.approx(float(b), abs=1e-12)
    assert float(sa["nll_rows"]) == 0 and float(sa["tokens"]) == float(sb["tokens"]) == 9


# ======================================================================================= exchange/base.py
def _step(name, adv, rew, n=2):
    probs = [Problem(id=f"p{i}", problem=f"q{i}", answer="1") for i in range(len(adv))]
    B = len(adv)
    ro = Rollouts(prompt_ids=[[10 + i] for i in range(B)], response_ids=[[20 + r, 1] for r in range(B * n)],
                  texts=[f"{name}{r}" for r in range(B * n)], logprobs=[[-0.1 * r, -0.2] for r in range(B * n)],
                  truncated=[False] * (B * n), n=n)
    return PolicyStep(name=name, problems=probs, prompt_ids=ro.prompt_ids, rollouts=ro,
                      rewards=torch.tensor(rew, dtype=torch.float32), advantages=torch.tensor(adv, dtype=torch.float32))


def _ctx(receiver_names=None):
    return ExchangeContext(step=0, seed=0, tokenizers={},
                           receivers=ReceiverFunctions(lambda text, name: []), receiver_names=receiver_names)


def test_none_exchange_builds_each_receivers_own_batch():
    """Exchange ``none``: each receiver's batch is its own groups, row by row; other policies get none."""
    assert EXCHANGES.get("none") is Exchange
    steps = {"a": _step("a", [[1.0, -1.0], [0.0, 0.0]], [[1.0, 0.0], [0.0, 0.0]]),
             "b": _step("b", [[0.5, -0.5], [2.0, -2.0]], [[1.0, 0.0], [1.0, 0.0]])}
    batches, metrics = Exchange().select(steps, _ctx(receiver_names=["b"]))
    assert list(batches) == ["b"] and metrics == {"b": {}}
    b = batches["b"]
    assert isinstance(b, TrainBatch) and len(b) == 4
    assert b.advantages == [0.5, -0.5, 2.0, -2.0]
    assert b.rewards == [1.0, 0.0, 1.0, 0.0]
    assert (b.source, b.group, b.weights) == (["self"] * 4, [0, 0, 1, 1], [1.0] * 4)
    assert b.prompt_ids == [[10], [10], [11], [11]] and b.response_ids == [[20, 1], [21, 1], [22, 1], [23, 1]]
    assert b.texts == ["b0", "b1", "b2", "b3"]
    batches, _ = Exchange().select(steps, _ctx())
    assert sorted(batches) == ["a", "b"] and batches["a"].advantages == [1.0, -1.0, 0.0, 0.0]


def test_none_exchange_admits_everything_and_keeps_no_state():
    """``admit`` keeps every row (weights untouched) with no metrics; no admission log, empty state."""
    ex = Exchange()
    st = _step("a", [[1.0, -1.0]], [[1.0, 0.0]])
    batch, _ = ex.select({"a": st}, _ctx())
    batch = batch["a"]
    out, met = ex.admit("a", batch, _ctx())
    assert met == {} and len(out) == 2 and out.weights == [1.0, 1.0] and out.advantages == [1.0, -1.0]
    assert len(batch) == 2 and batch.weights == [1.0, 1.0]  # the given batch unchanged
    assert ex.admission_log("a") is None and ex.state_dict() == {}
    ex.load_state_dict({"anything": 1})
    assert ex.state_dict() == {}


def test_receiver_functions_encode_and_score_or_refuse():
    """ReceiverFunctions: ``encode`` calls the given function; ``score`` calls its function, or without one stops
    with one line."""
    calls = []
    rf = ReceiverFunctions(lambda text, name: [len(text), len(name)],
                           lambda name, batch: calls.append((name, len(batch))) or [[-1.0]])
    assert rf.encode("abc", "policy") == [3, 6]
    assert rf.score("b", TrainBatch()) == [[-1.0]] and calls == [("b", 0)]
    with pytest.raises(GraftError, match=r"^scoring rows under a policy's weights .* not available"):
        ReceiverFunctions(lambda text, name: []).score("a", TrainBatch())
    ctx = _ctx()
    assert ctx.receiver_names is None and ctx.receivers.encode("q", "a") == []


def test_exchange_params_reads_a_written_section():
    """``exchange_params``: a written ``exchange`` section (mapping or object) as its exchange's typed parameters over
    the defaults, keys that are no parameter left out; None for a section naming no registered exchange."""
    p = exchange_params({"name": "graft_stored", "params": {"delta": 0.5, "partner_policy": "b", "old_key": 1}})
    assert p == StoredGraftParams(delta=0.5, partner_policy="b")
    assert exchange_params(SimpleNamespace(name="graft_stored", params=None)) == StoredGraftParams()
    assert exchange_params({"name": "nope", "params": {}}) is None
    assert exchange_params({"params": {}}) is None and exchange_params(None) is None


def test_none_exchange_validate_refuses_any_parameter():
    """``none`` uses no parameters: the first one given is refused, naming it and the exchange."""
    Exchange.validate(SimpleNamespace(exchange=SimpleNamespace(name="none", params={})))
    cfg = SimpleNamespace(exchange=SimpleNamespace(name="none", params={"delta": 0.8, "gate": "floor"}))
    with pytest.raises(GraftError) as e:
        Exchange.validate(cfg)
    assert str(e.value) == "config key 'exchange.params.delta': not used by exchange 'none'"


# ============================================================================== exchange/graft_stored.py
def _stored_cfg(params, names=("a", "b"), loss="ppo_token"):
    pols = [SimpleNamespace(name=n, role="train") for n in names] + [SimpleNamespace(name="ref", role="frozen")]
    return SimpleNamespace(exchange=SimpleNamespace(name="graft_stored", params=dict(params)), policies=pols,
                           sources=[], algo=SimpleNamespace(loss=loss))


@pytest.fixture
def partner(tmp_path):
    (tmp_path / "rollouts" / "b").mkdir(parents=True)
    return str(tmp_path)


def test_graft_stored_is_registered_with_unbalanced_default():
    """``graft_stored`` is GRAFT with ``selection: unbalanced`` by default (one-way transfer); a given value wins."""
    assert EXCHANGES.get("graft_stored") is StoredGraftExchange
    assert EXCHANGES.spec("graft_stored") == StoredGraftParams() and StoredGraftParams().selection == "unbalanced"
    ex = StoredGraftExchange(_stored_cfg({"partner_run": "/x", "partner_policy": "b"}))
    assert isinstance(ex.opts, StoredGraftParams)
    assert ex.opts.selection == "unbalanced" and ex.opts.partner_policy == "b"
    assert ex.opts.reverify is True and ex.opts.receiver is None
    assert options({"partner_run": "/x", "selection": "balanced"}, StoredGraftParams).selection == "balanced"


def test_graft_stored_resolve_swaps_partner_for_a_log_source(partner):
    """Resolve keeps the receiver (and frozen models), names it, and puts a rollout_log source for the partner."""
    cfg = _stored_cfg({"partner_run": partner, "partner_policy": "b", "reverify": False})
    cfg.sources = [SourceConfig(name="b", kind="rollout_log", run="/old", policy="b")]
    StoredGraftExchange.resolve(cfg)
    StoredGraftExchange.resolve(cfg)  # idempotent
    assert [p.name for p in cfg.policies] == ["a", "ref"]
    assert cfg.exchange.params["receiver"] == "a"
    assert cfg.sources == [SourceConfig(name="b", kind="rollout_log", run=partner, policy="b", reverify=False)]
    StoredGraftExchange.validate(cfg)  # the resolved config is valid


def test_graft_stored_resolve_waits_for_the_required_keys():
    """Without partner_run/partner_policy resolve changes nothing (validation names the missing key)."""
    cfg = _stored_cfg({"partner_policy": "b"})
    StoredGraftExchange.resolve(cfg)
    assert [p.name for p in cfg.policies] == ["a", "b", "ref"] and cfg.sources == []


@pytest.mark.parametrize("params,loss,msg", [
    ({}, "ppo_token", r"'exchange.params.partner_run': required by exchange graft_stored"),
    ({"partner_run": "P"}, "ppo_token", r"'exchange.params.partner_policy': required by exchange graft_stored"),
    ({"partner_run": "P", "partner_policy": "b", "peer_logprobs": "recompute"}, "ppo_token",
     r"'exchange.params.peer_logprobs': graft_stored uses the stored rollout log-probs"),
    ({"partner_run": "P", "partner_policy": "b", "mode": "hacpo"}, "hacpo_peer",
     r"'exchange.params.mode': hacpo needs a co-trained"),
    ({"partner_run": "P", "partner_policy": "b", "mode": "sft"}, "ppo_token", r"'algo.loss': .*ppo_token_nll"),
    ({"partner_run": "P", "partner_policy": "b", "reverify": "yes"}, "ppo_token",
     r"'exchange.params.reverify': must be true or false"),
    ({"partner_run": "P/missing", "partner_policy": "b"}, "ppo_token",
     r"'exchange.params.partner_run': .*missing/rollouts/b does not exist"),
    ({"partner_run": "P", "partner_policy": "b", "receiver": "zz"}, "ppo_token",
     r"'exchange.params.receiver': 'zz' is not one of a, b"),
    ({"partner_run": "P", "partner_policy": "b", "dleta": 0.8}, "ppo_token", r"'exchange.params.dleta': not a param"),
])
def test_graft_stored_validate_refusals(partner, params, loss, msg):
    """Each bad ``exchange.params`` of graft_stored is a one-line GraftError naming the key (table of cases)."""
    params = {k: (v.replace("P", partner, 1) if k == "partner_run" else v) for k, v in params.items()}
    with pytest.raises(GraftError, match=msg):
        StoredGraftExchange.validate(_stored_cfg(params, loss=loss))


def test_graft_stored_receiver_must_be_named_among_several(partner):
    """With three trained policies the receiver is not implied: validation asks for it, listing the candidates."""
    cfg = _stored_cfg({"partner_run": partner, "partner_policy": "b"}, names=("a", "b", "c"))
    with pytest.raises(GraftError, match=r"'exchange.params.receiver': name the policy to train \(one of a, b, c\)"):
        StoredGraftExchange.validate(cfg)
    cfg.exchange.params["receiver"] = "c"
    StoredGraftExchange.validate(cfg)
    StoredGraftExchange.resolve(cfg)
    assert [p.name for p in cfg.policies] == ["c", "ref"]
    # one trained policy that is the partner's name too: it is the receiver (the only candidate)
    one = _stored_cfg({"partner_run": partner, "partner_policy": "b"}, names=("b",))
    assert StoredGraftExchange._receiver(one) == "b"

