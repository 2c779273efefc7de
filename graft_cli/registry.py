"""Name -> function registries (verl `core_algos` style).

Every algorithmic piece (advantage estimator, policy loss, exchange step, reward, engine) is
registered under a string name and looked up from the config, so the training loop never branches on
a method name.

A registry may also hold the names of a Python entry-point group (``Registry(kind,
entry_points="graft.model_sources")``): a package declares ``name = "module:attr"`` in its metadata
(``[project.entry-points."<group>"]`` of its pyproject.toml) and the object is imported on the
name's first lookup, so a lower layer looks up pieces that a higher layer provides without naming
it (:func:`declared_entry_points`). """

from __future__ import annotations

import importlib
import math
import os
import re
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from typing import Callable, Generic, TypeVar

from graft_cli.errors import GraftError

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> function (or class). A name may carry a **spec**: a dataclass the registry's users
    declare (the parameters of a loss or a signal as a :class:`Params` holding their defaults, a
    scorer's needs, a handoff schedule's shape), read with :meth:`spec` instead of attributes set on
    the function. ``entry_points``: a Python entry-point group whose names the registry holds too,
    each imported on its first lookup (:func:`declared_entry_points`)."""

    def __init__(self, kind: str, spec_type: type | None = None, entry_points: str | None = None):
        self.kind = kind
        self.spec_type = spec_type  # the spec of every name (None: names carry none)
        self.entry_points = entry_points
        self._items: dict[str, T] = {}
        self._specs: dict[str, object] = {}
        # name -> where it is, imported on its first lookup: a module that registers it, or
        # "module:attr" (the object)
        self._lazy: dict[str, str] = {}
        self._declared = entry_points is None  # whether the group's names are in _lazy yet

    def lazy(self, name: str, module: str) -> None:
        """``name`` is registered by ``module``, imported the first time the name is looked up (a
        piece whose module imports this registry's own module, e.g. the code reward: no import
        circle, no cost until used); ``"module:attr"``: the object at ``attr`` is registered."""
        self._lazy[name] = module

    def _declare(self) -> None:
        if not self._declared:
            self._declared = True
            for name, target in declared_entry_points(self.entry_points).items():
                self._lazy.setdefault(name, target)

    def _load(self, name: str) -> None:
        self._declare()
        if name not in self._items and name in self._lazy:
            target = self._lazy[name]
            obj = importlib.import_module(target.split(":")[0])
            if ":" in target:
                for part in target.split(":", 1)[1].strip().split("."):
                    obj = getattr(obj, part)
                self.register(name)(obj)

    def register(self, name: str, spec=None) -> Callable[[T], T]:
        """Register under ``name``, with its ``spec`` (an instance of :attr:`spec_type`; its
        defaults when None)."""
        if spec is None and self.spec_type is not None:
            spec = self.spec_type()
        if spec is not None and self.spec_type is None:
            raise TypeError(f"{self.kind} {name!r}: this registry's names carry no spec")
        if spec is not None and not isinstance(spec, self.spec_type):
            raise TypeError(f"{self.kind} {name!r}: a spec must be a {self.spec_type.__name__}")

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
        self._declare()
        return sorted(set(self._items) | set(self._lazy))

    def __contains__(self, name: str) -> bool:
        self._declare()
        return name in self._items or name in self._lazy


DISTRIBUTION = "graft"  # this package's distribution name (pyproject.toml [project] name)


def declared_entry_points(group: str) -> dict[str, str]:
    """Name -> ``"module:attr"`` of entry-point group ``group``: the installed distributions'
    entry points, with this package's own read from the pyproject.toml of the source checkout it is
    imported from, when it is (an editable or path install keeps the metadata of its last ``pip
    install``, which a changed table does not update; a checkout on ``PYTHONPATH`` has none)."""
    # lazy: importlib.metadata takes ~30 ms to import; only a registry with an entry-point group
    # reads it
    from importlib.metadata import entry_points

    own = checkout_entry_points(group)
    out = {ep.name: ep.value for ep in entry_points(group=group)
           if own is None or ep.dist is None or ep.dist.name != DISTRIBUTION}
    out.update(own or {})
    return out


def checkout_entry_points(group: str, path: str | None = None) -> dict[str, str] | None:
    """Name -> ``"module:attr"`` of ``[project.entry-points."<group>"]`` in ``path`` (default: the
    pyproject.toml beside this package's folder); None where that file is missing or declares
    another project. Reads the one form those tables take, ``name = "module:attr"`` lines."""
    path = path or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pyproject.toml")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    tables: dict[str, dict[str, str]] = {}
    table = None
    for line in lines:
        text = line.split("#", 1)[0].strip()
        if text.startswith("["):
            table = tables.setdefault(text.strip("[] "), {})
        elif table is not None and "=" in text:
            key, value = (x.strip() for x in text.split("=", 1))
            table[key.strip('"')] = value.strip('"')
    if tables.get("project", {}).get("name") != DISTRIBUTION:
        return None
    return tables.get(f'project.entry-points."{group}"', {})


def choice(default, *others, among: Registry | None = None):
    """A :class:`Params` field that takes one of a fixed set of values, ``default`` first:
    ``default`` and ``others`` (``choice("all", "success")``), or the names of registry ``among``
    (``choice("floor", among=GATES)``)."""
    return field(default=default, metadata={"choices": among if among is not None else (default, *others)})


@dataclass(frozen=True)
class Params:
    """The parameters of a registered function: a frozen dataclass declared next to it, one field
    per parameter. The field's default is the parameter's default (the one place it is written), its
    annotation the type a value must have (``bool``; ``int``: a whole number; ``float``: a finite
    number; ``str``; ``X | None``; anything else is taken as given) and :func:`choice` a parameter
    with a fixed set of values.

    A registry whose names take parameters is ``Registry(kind, Params)``; each name is registered
    with an instance holding its defaults (``register(name, spec=XParams())``, read back with
    ``registry.spec(name)``). Config resolution turns the config's mapping into the typed object
    (:meth:`check`) and writes :meth:`to_dict` back, so a run's ``config.yaml`` shows every
    value."""

    @classmethod
    def defaults(cls) -> dict:
        """Parameter -> default, in declaration order."""
        return {f.name: f.default if f.default is not MISSING else f.default_factory() for f in fields(cls)}

    @classmethod
    def check(cls, given: dict | None, key: str, owner: str) -> Params:
        """``given`` over the defaults, each key and value checked (unknown keys, types, choices): a
        GraftError of one line naming ``key.<parameter>`` on the first failure."""
        return cls(**_checked(cls, given, key, owner)[0])

    @classmethod
    def read(cls, written: dict | None) -> Params:
        """The values a run's config holds (checked when the run wrote it) over the defaults; keys
        that are no parameter are left out."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (written or {}).items() if k in names})

    def to_dict(self) -> dict:
        """Parameter -> value, in declaration order (what a resolved config holds)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


_HINTS: dict = {}


def _hint(cls: type, name: str) -> tuple[object, bool]:
    """(type, optional) of parameter ``name`` of ``cls``: ``float | None`` is ``(float, True)``."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    hint = _HINTS[cls].get(name, object)
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else object), True
    return hint, False


def _allowed(v, allowed) -> bool:
    try:
        return v in allowed
    except TypeError:  # an unhashable value against a registry's names
        return False


def _checked(cls: type, given: dict | None, key: str, owner: str, open_keys: tuple = ()) -> tuple[dict, dict]:
    """(parameter -> value over the defaults, the ``open_keys`` given) with every given key and
    value checked (:meth:`Params.check`)."""
    fs = {f.name: f for f in fields(cls)}
    out, extra = cls.defaults(), {}
    for k, v in (given or {}).items():
        f = fs.get(k)
        if f is None:
            if k in open_keys:
                extra[k] = v
                continue
            known = ", ".join(sorted([*fs, *open_keys])) or "none"
            raise GraftError(f"config key '{key}.{k}': not a parameter of {owner}; known: {known}")
        allowed = f.metadata.get("choices")
        if allowed is not None:
            if not _allowed(v, allowed):
                names = allowed.names() if isinstance(allowed, Registry) else allowed
                raise GraftError(f"config key '{key}.{k}': must be one of {', '.join(map(str, names))}, got {v!r}")
        else:
            t, optional = _hint(cls, k)
            if v is None and optional:
                pass
            elif t is bool and not isinstance(v, bool):
                raise GraftError(f"config key '{key}.{k}': must be true or false, got {v!r}")
            elif t in (int, float):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise GraftError(f"config key '{key}.{k}': must be a number, got {v!r}")
                if t is int and v != int(v):
                    raise GraftError(f"config key '{key}.{k}': must be a whole number, got {v!r}")
            elif t is str and not isinstance(v, str):
                raise GraftError(f"config key '{key}.{k}': must be a string, got {v!r}")
        out[k] = v
    return out, extra


def params_class(name: str, defaults: dict, choices: dict | None = None) -> type[Params]:
    """A :class:`Params` class made from a mapping of defaults (a part registered with keyword
    defaults, a plugin's): a tuple default is a choice (its first entry the default), a bool one a
    flag, a number one any finite number; ``choices`` maps a parameter to its allowed values (a
    tuple or a :class:`Registry`)."""
    specs = []
    for k, d in defaults.items():
        among = (choices or {}).get(k)
        if isinstance(d, tuple):
            specs.append((k, object, choice(*d)))
        elif among is not None:
            specs.append((k, object, field(default=d, metadata={"choices": among})))
        elif isinstance(d, (list, dict, set)):
            specs.append((k, object, field(default_factory=lambda d=d: type(d)(d))))
        else:
            hint = bool if isinstance(d, bool) else float if isinstance(d, (int, float)) else object
            specs.append((k, hint, field(default=d)))
    title = "".join(p[:1].upper() + p[1:] for p in re.split(r"[^0-9A-Za-z]+", name) if p)
    return make_dataclass(f"{title}Params", specs, bases=(Params,), frozen=True)


def validate_params(defaults: dict, params: dict | None, key: str, owner: str, choices: dict | None = None,
                    open_keys: tuple = ()) -> dict:
    """``params`` merged over ``defaults`` (a mapping, :func:`params_class`) with each key and value
    checked as :meth:`Params.check` does; ``open_keys``: further keys taken as given (no default).
    Returns a plain mapping. The check of the parts whose parameters are a mapping on a class
    (engine options, controllers)."""
    values, extra = _checked(params_class(owner, defaults, choices), params, key, owner, open_keys)
    return {**values, **extra}
