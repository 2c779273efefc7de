"""Docstrings keep their layout: a reflow of prose must not merge the lines of a table, a listing or
a displayed equation. Every docstring of graft_cli is checked line by line:

- a markdown table row (a line opening with ``| ``) closes with ``|``;
- a reStructuredText table border (a line opening with ``===``) holds only ``=`` and spaces;
- an equation number ``(N)`` stands on the line of its equation, not alone on the next
  (benchmarks/house_counts.py ``layout_problems``, whose count is "broken layout lines").

The check is shown to flag each kind on a planted docstring."""

from __future__ import annotations

import os
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from house_counts import layout_problems  # noqa: E402  (the counts' own rules: one home)


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
