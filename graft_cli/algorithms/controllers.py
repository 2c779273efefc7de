"""Stateful controllers (registry ``CONTROLLERS``, ``algo.controllers``): objects that carry state
across steps and set coefficients of the next step (SAF's warm-up and anneal, HACPO's capability
window, dynamic sampling counters, a KL coefficient schedule).

A controller declares its parameters in ``PARAMS``, a frozen :class:`~graft_cli.registry.Params`
dataclass (the one place their defaults are written; registered as the name's spec), or as a mapping
of defaults in ``DEFAULTS`` (:func:`~graft_cli.registry.params_class`). Config validation checks
every entry against them, before anything loads; ``check(params)`` adds the rules between them. A
controller is built as ``cls(params, total_steps: int)`` (``params`` = the checked entry without
``name``, defaults filled in: the object of its Params class, read as ``self.params.<name>``). It
has:

- ``coefs(step) -> dict``: coefficients for step ``step`` (0-based), merged over every controller
  and handed to the token-advantage functions (``SignalContext.coefs``) and the loss
  (``LossInputs.coefs``);
- ``observe(step, rows) -> dict``: sees the step's metrics rows (one per policy) after the update
  and returns metrics to add to every row (prefix them with the controller's name);
- ``state_dict()`` / ``load_state_dict(st)``: JSON-able state, saved in every checkpoint and
  restored on resume, so a resumed run continues the schedule exactly.
"""

from __future__ import annotations

from graft_cli.errors import GraftError
from graft_cli.registry import Params, Registry, params_class

CONTROLLERS: Registry = Registry("controller", Params)  # spec: its parameters' defaults


_MADE: dict[type, type[Params]] = {}  # a controller class declaring DEFAULTS -> the Params class made of them


class Controller:
    """Base class: no parameters, no coefficients, no state."""

    PARAMS: type | None = None  # its parameters, a Params dataclass
    DEFAULTS: dict = {}  # without PARAMS: parameter -> default (a tuple: the allowed values, the first the default)

    def __init__(self, params: Params | None = None, total_steps: int = 0):
        kind = self.params_type()
        if params is not None and not isinstance(params, kind):
            raise TypeError(f"controller {type(self).__name__}: parameters must be a {kind.__name__}, "
                            f"got {type(params).__name__}")
        self.params = params if params is not None else kind()
        self.total_steps = total_steps

    @classmethod
    def params_type(cls) -> type[Params]:
        """:attr:`PARAMS`, or the Params class made of :attr:`DEFAULTS` (one per controller
        class)."""
        if cls.PARAMS is not None:
            return cls.PARAMS
        if cls not in _MADE:
            _MADE[cls] = params_class(cls.__name__, cls.DEFAULTS)
        return _MADE[cls]

    @classmethod
    def validate(cls, params: dict | None, key: str = "algo.controllers", name: str | None = None) -> Params:
        """``params`` over :attr:`PARAMS` (or :attr:`DEFAULTS`), each checked (one-line GraftError
        naming ``key.<param>``), then :meth:`check`; returns them with the defaults filled in, the
        object of :meth:`params_type`."""
        out = cls.params_type().check(params, key, f"controller {name or cls.__name__}")
        cls.check(out, key)
        return out

    @classmethod
    def check(cls, params: Params, key: str) -> None:
        """Rules between the parameters (raise GraftError naming ``key``)."""

    def coefs(self, step: int) -> dict:
        return {}

    def observe(self, step: int, rows: list[dict]) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, st: dict) -> None:
        pass


def controller_params(i: int, spec) -> tuple[str, type, Params]:
    """Entry ``i`` of ``algo.controllers`` (``{name: ..., **params}``) → (name, class, checked
    parameters); config validation runs it on every entry, so a typo fails before anything loads."""
    spec = dict(spec) if isinstance(spec, dict) else {}
    name = spec.pop("name", None)
    if not name:
        raise GraftError(f"config key 'algo.controllers.{i}': needs a name; known: {', '.join(CONTROLLERS.names())}")
    cls = CONTROLLERS.get(str(name))
    return str(name), cls, cls.validate(spec, f"algo.controllers.{i}", str(name))


def build_controllers(specs: list, total_steps: int) -> list[tuple[str, Controller]]:
    """``algo.controllers`` entries (``{name: ..., **params}``) → (name, controller) pairs, in
    config order."""
    out = []
    for i, spec in enumerate(specs or []):
        name, cls, params = controller_params(i, spec)
        out.append((name, cls(params, total_steps)))
    return out
