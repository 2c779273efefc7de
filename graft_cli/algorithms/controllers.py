"""Stateful controllers (registry ``CONTROLLERS``, ``algo.controllers``): objects that carry state across
steps and set coefficients of the next step (SAF's warm-up and anneal, HACPO's capability window, dynamic
sampling counters, a KL coefficient schedule).

A controller is built as ``cls(params: dict, total_steps: int)`` (``params`` = the config entry without
``name``) and has:

- ``coefs(step) -> dict``: coefficients for step ``step`` (0-based), merged over every controller and handed
  to the token-advantage functions (``SignalContext.coefs``) and the loss (``LossInputs.coefs``);
- ``observe(step, rows) -> dict``: sees the step's metrics rows (one per policy) after the update and
  returns metrics to add to every row (prefix them with the controller's name);
- ``state_dict()`` / ``load_state_dict(st)``: JSON-able state, saved in every checkpoint and restored on
  resume, so a resumed run continues the schedule exactly.
"""

from __future__ import annotations

from graft_cli.errors import GraftError
from graft_cli.registry import Registry

CONTROLLERS: Registry = Registry("controller")


class Controller:
    """Base class: no coefficients, no state."""

    def __init__(self, params: dict | None = None, total_steps: int = 0):
        self.params = dict(params or {})
        self.total_steps = total_steps

    def coefs(self, step: int) -> dict:
        return {}

    def observe(self, step: int, rows: list[dict]) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, st: dict) -> None:
        pass


def build_controllers(specs: list, total_steps: int) -> list[tuple[str, Controller]]:
    """``algo.controllers`` entries (``{name: ..., **params}``) → (name, controller) pairs, in config order."""
    out = []
    for i, spec in enumerate(specs or []):
        spec = dict(spec)
        name = spec.pop("name", None)
        if not name:
            known = ", ".join(CONTROLLERS.names())
            raise GraftError(f"config key 'algo.controllers.{i}': needs a name; known: {known}")
        out.append((str(name), CONTROLLERS.get(str(name))(spec, total_steps)))
    return out
