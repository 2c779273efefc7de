"""Name -> function registries (verl `core_algos` style).

Every algorithmic piece (advantage estimator, policy loss, exchange step, reward, engine) is registered
under a string name and looked up from the config, so the training loop never branches on a method name.
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

from graft_cli.errors import GraftError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        if name not in self._items:
            raise GraftError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._items))}")
        return self._items[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items
