"""Counts a reader of graft_cli/ meets: long functions, wide signatures, attribute probes, history in the code.

    python benchmarks/house_counts.py            # the table
    python benchmarks/house_counts.py --list     # and every function / probe / line counted

* **long**: functions over 60 lines (body and signature, decorators excluded) on the training, config and plan
  paths (``graft_cli/train/``, ``graft_cli/plan/``, ``graft_cli/config/`` or ``config.py``,
  ``graft_cli/schema.py``) and anywhere;
* **wide**: functions taking more than 6 parameters (``self``/``cls`` not counted, ``*args``/``**kwargs`` counted);
* **probes**: ``getattr(obj, "name"...)`` / ``hasattr(obj, "name")`` calls with a literal name, except on a module
  imported in that file (``getattr(torch, ...)``) — attributes found by probing instead of declared;
* **history**: lines naming an issue (``issue 27``) or a date (``2026-12-04``) in code, help texts and docstrings
  (a data window such as LiveCodeBench's ``2025-02-01..2025-05-01`` is not history).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "graft_cli")
CORE = ("train/", "plan/", "config/", "config.py", "schema.py")
HISTORY = re.compile(r"\bissues? \d+\b|\b20\d\d-\d\d-\d\d\b", re.I)
DATA_DATES = re.compile(r"\d{4}-\d\d-\d\d\.\.|\.\.\d{4}-\d\d-\d\d|\(\"\d{4}-\d\d-\d\d\"")  # a data window, not history


def _files():
    for d, _, names in sorted(os.walk(ROOT)):
        for n in sorted(names):
            if n.endswith(".py"):
                p = os.path.join(d, n)
                yield os.path.relpath(p, ROOT).replace(os.sep, "/"), p


def _modules(tree) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out |= {a.asname or a.name for a in node.names}
    return out


def count() -> dict:
    long_core, long_any, wide, probes, history = [], [], [], [], []
    for rel, path in _files():
        src = open(path, encoding="utf-8").read()
        tree = ast.parse(src)
        mods = _modules(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                where = f"{rel}:{node.lineno} {node.name}"
                if n > 60:
                    long_any.append((where, n))
                    if rel.startswith(CORE):
                        long_core.append((where, n))
                a = node.args
                params = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
                params += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
                if len(params) > 6:
                    wide.append((where, len(params)))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr",
                                                                                                    "hasattr"):
                if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value,
                                                                                                 str):
                    obj = node.args[0]
                    if isinstance(obj, ast.Name) and obj.id in mods:
                        continue
                    probes.append((f"{rel}:{node.lineno} {node.func.id}({ast.unparse(obj)}, {node.args[1].value!r})",
                                   1))
        for i, line in enumerate(src.splitlines(), 1):
            if HISTORY.search(line) and not DATA_DATES.search(line):
                history.append((f"{rel}:{i} {line.strip()[:100]}", 1))
    return {"functions over 60 lines (train/plan/config)": long_core, "functions over 60 lines (all)": long_any,
            "functions over 6 parameters": wide, "getattr/hasattr probes": probes,
            "lines naming an issue or a date": history}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print every item counted")
    args = ap.parse_args(argv)
    res = count()
    for k, items in res.items():
        print(f"{k:48s} {len(items):5d}")
    if args.list:
        for k, items in res.items():
            print(f"\n## {k}")
            for where, n in sorted(items, key=lambda x: -x[1]):
                print(f"  {where}" + (f"  ({n})" if n > 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
