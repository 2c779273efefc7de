"""Docstrings keep their layout: a reflow of prose must not merge the lines of a table, a listing or
a displayed equation. Every docstring of graft_cli is checked line by line:

- a markdown table row (a line opening with ``| ``) closes with ``|``;
- a reStructuredText table border (a line opening with ``===``) holds only ``=`` and spaces;
- an equation number ``(N)`` stands on the line of its equation, not alone on the next.

The check is shown to flag each kind on a planted docstring."""

from __future__ import annotations

import ast
import os
import re

import pytest
from conftest import ROOT

RULES = {
    "table row split": lambda s: s.startswith("| ") and not s.endswith("|"),
    "table border merged": lambda s: s.startswith("===") and bool(set(s) - {"=", " "}),
    "equation number alone": lambda s: re.fullmatch(r"\(\d+[a-z]?\)", s) is not None,
}


def layout_problems(source: str) -> list[tuple[int, str, str]]:
    """(line of the docstring's owner, rule, the line) for every docstring line a rule flags."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(n, clean=False) or ""
            for line in doc.split("\n"):
                s = line.strip()
                out += [(getattr(n, "lineno", 1), rule, s) for rule, bad in RULES.items() if bad(s)]
    return out


@pytest.mark.parametrize("doc,rule", [
    ('"""Rows:\n\n| a | b |\n| 1 | 2\n|"""', "table row split"),
    ('"""Kinds:\n\n=== ========== kind what it is\n"""', "table border merged"),
    ('"""The rule\n\n    y = a x + b\n    (3)\n"""', "equation number alone"),
])
def test_the_check_flags_a_broken_layout(doc, rule):
    assert [r for _, r, _ in layout_problems(doc)] == [rule]


def test_a_sound_layout_passes():
    doc = ('"""Rows:\n\n| a | b |\n|---|---|\n\n=== ====\nkey what\n=== ====\n\n    y = a x + b     (3)\n\n'
           '|x| is fine\n"""')
    assert layout_problems(doc) == []


def test_no_docstring_of_the_package_has_a_broken_layout():
    bad = []
    for d, _, files in os.walk(os.path.join(ROOT, "graft_cli")):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(d, f)
                bad += [(os.path.relpath(path, ROOT), line, rule, s[:60])
                        for line, rule, s in layout_problems(open(path, encoding="utf-8").read())]
    assert bad == []
