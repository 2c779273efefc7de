"""One place that makes rich consoles for every command.

``emoji=False``: rich would otherwise render ``:a:`` in ``tiny:a: avg=...`` as an emoji (🅰), and model
names, paths and hub ids are full of colons."""

from __future__ import annotations

from rich.console import Console


def make_console(**kwargs) -> Console:
    kwargs.setdefault("emoji", False)
    return Console(**kwargs)
