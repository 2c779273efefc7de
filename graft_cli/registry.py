"""Name -> function registries (verl `core_algos` style).

Every algorithmic piece (advantage estimator, policy loss, exchange step, reward, engine) is registered
under a string name and looked up from the config, so the training loop never branches on a method name.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from typing import Callable, Generic, TypeVar

from graft_cli.errors import GraftError

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> function (or class). A name may carry a **spec**: a dataclass the registry's users declare (the
    parameters' defaults of a signal, a scorer's needs, a handoff schedule's shape), read with :meth:`spec`
    instead of attributes set on the function."""

    def __init__(self, kind: str, spec_type: type | None = None):
        self.kind = kind
        self.spec_type = spec_type  # the spec of every name (None: names carry none)
        self._items: dict[str, T] = {}
        self._specs: dict[str, object] = {}
        self._lazy: dict[str, str] = {}  # name -> module that registers it when imported (on first get)

    def lazy(self, name: str, module: str) -> None:
        """``name`` is registered by ``module``, imported the first time the name is looked up (a piece whose module
        imports this registry's own module, e.g. the code reward: no import circle, no cost until used)."""
        self._lazy[name] = module

    def _load(self, name: str) -> None:
        if name not in self._items and name in self._lazy:
            importlib.import_module(self._lazy[name])

    def register(self, name: str, spec=None) -> Callable[[T], T]:
        """Register under ``name``, with its ``spec`` (an instance of :attr:`spec_type`; its defaults when
        None)."""
        if spec is None and self.spec_type is not None:
            spec = self.spec_type()
        if spec is not None and (self.spec_type is None or not isinstance(spec, self.spec_type)):
            raise TypeError(f"{self.kind} {name!r}: a spec must be a {getattr(self.spec_type, '__name__', None)}")

        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            if spec is not None:
                self._specs[name] = spec
            return obj

        return deco

    def spec(self, name: str):
        """The spec ``name`` was registered with (:attr:`spec_type`)."""
        self.get(name)
        return self._specs[name]

    def get(self, name: str) -> T:
        self._load(name)
        if name not in self._items:
            raise GraftError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(set(self._items) | set(self._lazy))

    def __contains__(self, name: str) -> bool:
        return name in self._items or name in self._lazy


def validate_params(defaults: dict, params: dict | None, key: str, owner: str, choices: dict | None = None,
                    open_keys: tuple = ()) -> dict:
    """``params`` merged over ``defaults`` with each key and value checked (one-line GraftError naming
    ``key.<name>``): unknown keys, booleans, finite numbers, and choices (a tuple default: its first entry is the
    default, its entries the allowed values; ``choices``: name -> the allowed values, a tuple or a
    :class:`Registry`, whose names are the choices). ``open_keys``: further keys taken as given (no default).
    The one parameter check of every registered part (losses, token signals, controllers, exchanges, engines),
    run by config validation before anything loads."""
    out = dict(defaults)
    for k, v in (params or {}).items():
        if k not in defaults:
            if k in open_keys:
                out[k] = v
                continue
            known = ", ".join(sorted([*defaults, *open_keys])) or "none"
            raise GraftError(f"config key '{key}.{k}': not a parameter of {owner}; known: {known}")
        allowed = (choices or {}).get(k)
        if allowed is not None and v not in allowed:
            names = allowed.names() if isinstance(allowed, Registry) else allowed
            raise GraftError(f"config key '{key}.{k}': must be one of {', '.join(map(str, names))}, got {v!r}")
        d = defaults[k]
        if isinstance(d, bool) and not isinstance(v, bool):
            raise GraftError(f"config key '{key}.{k}': must be true or false, got {v!r}")
        if isinstance(d, (int, float)) and not isinstance(d, bool):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise GraftError(f"config key '{key}.{k}': must be a number, got {v!r}")
        if isinstance(d, tuple) and v not in d:
            raise GraftError(f"config key '{key}.{k}': must be one of {', '.join(map(str, d))}, got {v!r}")
        out[k] = v
    return {k: (v[0] if isinstance(v, tuple) else v) for k, v in out.items()}


@dataclass(frozen=True)
class ParamSpec:
    """The spec of a registered function that takes parameters: their defaults (checked by
    :func:`validate_params`; a tuple default is a choice, its first entry the default)."""

    defaults: dict = field(default_factory=dict)


def register_with_defaults(registry: Registry, name: str, defaults: dict | None = None, **more):
    """Register ``fn`` in ``registry`` (whose specs are :class:`ParamSpec`) under ``name`` with its parameters'
    defaults (``defaults`` and keywords)."""
    return registry.register(name, ParamSpec({**(defaults or {}), **more}))
