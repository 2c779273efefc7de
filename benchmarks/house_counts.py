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
  (a data window such as LiveCodeBench's ``2025-02-01..2025-05-01`` is not history);
* **wide lines**: lines over 100 characters (share of all lines; verl's ``core_algos.py``: 3.9%);
* **tuple assignments**: assignments whose target unpacks 3 or more names (``a, b, c = ...``);
* **call-backs**: a Trainer (``train/loop.py``) method handed down as a value — passed to a constructor or a
  function, or called from a lambda handed down — so that a lower stage calls back up into the trainer;
* **untyped params**: dataclass fields named ``*params`` typed as a bare ``dict`` (the config schema's, the
  algorithms' contexts);
* **shared names**: module file names (``__init__.py`` aside) that two or more modules of graft_cli share;
* **long files**: modules over 600 lines;
* **untested**: modules no test file imports (by dotted name, ``from graft_cli.x import y`` or its ``graft_cli.x.y``);
* **benchmarks on tests**: benchmark scripts importing from ``tests/`` or putting it on ``sys.path``;
* **broken layout**: docstring lines a prose reflow broke (:func:`layout_problems`: a markdown table row split
  over lines, a reStructuredText table border merged with text, an equation number alone on its line);
* **readers of δ**: reads of a ``.delta`` attribute outside ``algorithms/exchange/`` (the gate floor is read
  through ``gate_floor``);
* **async decisions**: comparisons of ``.staleness`` with a number outside ``schema.py`` (whether a run samples
  ahead is ``samples_ahead``);
* **exchange.params parses**: call sites that turn ``exchange.params`` into its Params object
  (``exchange_params(...)``, the GRAFT exchange's ``options(...)``);
* **small registries**: registries (``X = Registry(...)``) with at most two names registered in the package.

``--root DIR`` counts another checkout (before → after comparisons).

``--step METHOD`` also runs one training step of ``METHOD`` on the tiny pair in this process and reports the
**modules a step crosses**: the graft_cli modules with a function called while ``Trainer.train_step`` runs (a
profile hook on every thread), the rollouts, the exchange and each policy's stages included. It counts the
graft_cli this interpreter imports: ``PYTHONPATH=<checkout> python benchmarks/house_counts.py --step graft`` for
another tree.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.join(REPO, "graft_cli")
CORE = ("train/", "plan/", "config/", "config.py", "schema.py")
HISTORY = re.compile(r"\bissues? \d+\b|\b20\d\d-\d\d-\d\d\b", re.I)
DATA_DATES = re.compile(r"\d{4}-\d\d-\d\d\.\.|\.\.\d{4}-\d\d-\d\d|\(\"\d{4}-\d\d-\d\d\"")  # a data window, not history


def _files(root: str | None = None):
    root = root or ROOT
    for d, _, names in sorted(os.walk(root)):
        for n in sorted(names):
            if n.endswith(".py"):
                p = os.path.join(d, n)
                yield os.path.relpath(p, root).replace(os.sep, "/"), p


def _modules(tree) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out |= {a.asname or a.name for a in node.names}
    return out


def _callbacks(tree) -> list:
    """Trainer methods handed down as values (``CollectInputs(..., self.sample)``, ``encode=self.encode_for``) or called
    from a lambda that is handed down (``pool.map(lambda w: self.train_one(w), ...)``)."""
    out = []
    for cls in ast.walk(tree):
        if not (isinstance(cls, ast.ClassDef) and cls.name == "Trainer"):
            continue
        methods = {f.name for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}

        def own(node, methods=methods):
            return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                    and node.attr in methods)

        for call in ast.walk(cls):
            if not isinstance(call, ast.Call):
                continue
            for arg in list(call.args) + [k.value for k in call.keywords]:
                if own(arg):
                    out.append((f"{cls.lineno}:{arg.lineno} self.{arg.attr}", 1))
                elif isinstance(arg, ast.Lambda):
                    out += [(f"{cls.lineno}:{n.lineno} lambda: self.{n.func.attr}", 1) for n in ast.walk(arg.body)
                            if isinstance(n, ast.Call) and own(n.func)]
    return out


def _untyped_params(tree, rel: str) -> list:
    out = []
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef):
            for st in cls.body:
                if (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
                        and st.target.id.endswith("params") and "dict" in ast.unparse(st.annotation).lower()
                        and "Params" not in ast.unparse(st.annotation)):
                    out.append((f"{rel}:{st.lineno} {cls.name}.{st.target.id}: {ast.unparse(st.annotation)}", 1))
    return out


def _imported_by_tests(repo: str) -> set[str]:
    names = set()
    tdir = os.path.join(repo, "tests")
    for d, _, fs in os.walk(tdir):
        for f in fs:
            if f.endswith(".py"):
                for node in ast.walk(ast.parse(open(os.path.join(d, f), encoding="utf-8").read())):
                    if isinstance(node, ast.Import):
                        names |= {a.name for a in node.names}
                    elif isinstance(node, ast.ImportFrom) and node.module:
                        names.add(node.module)
                        names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


LAYOUT_RULES = {
    "table row split": lambda s: s.startswith("| ") and not s.endswith("|"),
    "table border merged": lambda s: s.startswith("===") and bool(set(s) - {"=", " "}),
    "equation number alone": lambda s: re.fullmatch(r"\(\d+[a-z]?\)", s) is not None,
}


def layout_problems(source: str) -> list[tuple[int, str, str]]:
    """(line of the docstring's owner, rule, the line) for every docstring line a layout rule flags."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(n, clean=False) or ""
            for line in doc.split("\n"):
                s = line.strip()
                out += [(getattr(n, "lineno", 1), rule, s) for rule, bad in LAYOUT_RULES.items() if bad(s)]
    return out


def _design_counts(rel: str, src: str, tree) -> dict[str, list]:
    """This module's broken layout lines, δ reads, async decisions, exchange.params parses and
    registries (name -> names registered here)."""
    out: dict = {"layout": [(f"{rel}:{ln} {rule}: {s[:60]}", 1) for ln, rule, s in layout_problems(src)],
                 "delta": [], "async": [], "parses": []}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr == "delta" and isinstance(node.ctx, ast.Load)
                and not rel.startswith("algorithms/exchange/")):
            out["delta"].append((f"{rel}:{node.lineno} {ast.unparse(node)}", 1))
        elif isinstance(node, ast.Compare) and rel != "schema.py" and any(
                isinstance(x, ast.Attribute) and x.attr == "staleness" for x in [node.left, *node.comparators]) \
                and any(isinstance(x, ast.Constant) for x in [node.left, *node.comparators]):
            out["async"].append((f"{rel}:{node.lineno} {ast.unparse(node)}", 1))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                node.func.id == "exchange_params" or (node.func.id == "options" and rel.startswith("algorithms/"))):
            out["parses"].append((f"{rel}:{node.lineno} {ast.unparse(node)[:70]}", 1))
    return out


_REGISTRY_PROBE = """
import importlib, json, pkgutil
import graft_cli
from graft_cli.registry import Registry
for m in pkgutil.walk_packages(graft_cli.__path__, "graft_cli."):
    try:
        importlib.import_module(m.name)
    except Exception:
        pass
out = {}
for name, mod in list(__import__("sys").modules.items()):
    if name.startswith("graft_cli"):
        for attr, val in vars(mod).items():
            if isinstance(val, Registry) and attr.isupper():
                for lazy in list(getattr(val, "_lazy", {})):
                    try:
                        val._load(lazy)
                    except Exception:
                        pass
                out[f"{name.removeprefix('graft_cli.')}.{attr}"] = sorted(val.names())
print(json.dumps(out))
"""


def _registries(repo: str) -> list:
    """(registry, its names) for each registry of the package with at most two names, every module
    imported (in a child process with ``repo`` first on the path, so another checkout counts its
    own)."""
    env = {**os.environ, "PYTHONPATH": repo}
    res = subprocess.run([sys.executable, "-c", _REGISTRY_PROBE], capture_output=True, text=True, env=env,
                         cwd=repo)
    if res.returncode != 0:
        return [(f"(the probe failed: {res.stderr.strip().splitlines()[-1][:80]})", 0)] if res.stderr else []
    regs: dict = {}
    for key, names in json.loads(res.stdout.strip().splitlines()[-1]).items():
        regs.setdefault(key.rsplit(".", 1)[1], (key, names))  # a registry re-exported elsewhere counts once
    return [(f"{key} ({', '.join(names) or 'none'})", len(names)) for key, names in sorted(regs.values())
            if len(names) <= 2]


def count(repo: str | None = None) -> dict:
    repo = repo or REPO
    root = os.path.join(repo, "graft_cli")
    long_core, long_any, wide, probes, history = [], [], [], [], []
    wide_lines, tuples, callbacks, untyped, long_files, untested, on_tests = [], [], [], [], [], [], []
    n_lines, by_name = 0, {}
    design: dict = {"layout": [], "delta": [], "async": [], "parses": []}
    tested = _imported_by_tests(repo)
    for rel, path in _files(root):
        src = open(path, encoding="utf-8").read()
        tree = ast.parse(src)
        mods = _modules(tree)
        lines = src.splitlines()
        n_lines += len(lines)
        if len(lines) > 600:
            long_files.append((rel, len(lines)))
        base = os.path.basename(rel)
        if base != "__init__.py":
            by_name.setdefault(base, []).append(rel)
            dotted = "graft_cli." + rel[:-3].replace("/", ".")
            if dotted not in tested:
                untested.append((rel, 1))
        if rel == "train/loop.py":
            callbacks = _callbacks(tree)
        untyped += _untyped_params(tree, rel)
        for k, v in _design_counts(rel, src, tree).items():
            design[k] += v
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
            elif isinstance(node, (ast.Assign, ast.For)) and any(
                    isinstance(t, ast.Tuple) and len(t.elts) >= 3
                    for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
                tuples.append((f"{rel}:{node.lineno}", 1))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr",
                                                                                                    "hasattr"):
                if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value,
                                                                                                 str):
                    obj = node.args[0]
                    if isinstance(obj, ast.Name) and obj.id in mods:
                        continue
                    probes.append((f"{rel}:{node.lineno} {node.func.id}({ast.unparse(obj)}, {node.args[1].value!r})",
                                   1))
        for i, line in enumerate(lines, 1):
            if HISTORY.search(line) and not DATA_DATES.search(line):
                history.append((f"{rel}:{i} {line.strip()[:100]}", 1))
            if len(line) > 100:
                wide_lines.append((f"{rel}:{i}", 1))
    shared = [(f"{b}: {', '.join(rels)}", len(rels)) for b, rels in sorted(by_name.items()) if len(rels) > 1]
    bdir = os.path.join(repo, "benchmarks")
    for f in sorted(os.listdir(bdir)) if os.path.isdir(bdir) else []:
        if f.endswith(".py"):
            for node in ast.walk(ast.parse(open(os.path.join(bdir, f), encoding="utf-8").read())):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tests":
                    on_tests.append((f"benchmarks/{f}:{node.lineno} from {node.module}", 1))
                elif (isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.path.insert"
                      and "'tests'" in ast.unparse(node)):
                    on_tests.append((f"benchmarks/{f}:{node.lineno} tests/ on sys.path", 1))
    share = 100.0 * len(wide_lines) / max(n_lines, 1)
    return {"functions over 60 lines (train/plan/config)": long_core, "functions over 6 parameters": wide,
            "functions over 60 lines (all)": long_any, "getattr/hasattr probes": probes,
            "lines naming an issue or a date": history,
            f"lines over 100 characters ({share:.1f}% of {n_lines})": wide_lines,
            "tuple assignments of 3+ names": tuples, "call-backs into the Trainer": callbacks,
            "untyped params dicts": untyped, "file names shared by modules": shared,
            "modules over 600 lines": long_files, "modules no test imports": untested,
            "benchmarks importing tests/": on_tests, "broken layout lines in docstrings": design["layout"],
            "readers of δ outside the exchange": design["delta"], "places deciding async": design["async"],
            "exchange.params parses (call sites)": design["parses"],
            "registries with <= 2 names": _registries(repo)}


def step_modules(method: str, out: str) -> list[tuple[str, int]]:
    """The graft_cli modules with a function called during one ``Trainer.train_step`` of ``graft train --pair tiny
    --method <method> --steps 1`` (run here, its run directory under ``out``), each with how many calls."""
    import threading
    from collections import Counter

    from graft_cli.cli import main as graft
    from graft_cli.train.loop import Trainer

    target, inside, calls = Trainer.train_step.__code__, [0], Counter()

    def hook(frame, event, arg):
        if event == "call":
            if frame.f_code is target:
                inside[0] += 1
            if inside[0]:
                name = frame.f_globals.get("__name__", "")
                if name.startswith("graft_cli"):
                    calls[name] += 1
        elif event == "return" and frame.f_code is target:
            inside[0] -= 1

    sys.setprofile(hook)
    threading.setprofile(hook)
    try:
        graft(["train", "--pair", "tiny", "--method", method, "--steps", "1", "--seed", "0", "--out", out,
               "--no-progress", "run.save_every=100"], standalone_mode=False)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return sorted(calls.items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print every item counted")
    ap.add_argument("--root", default=None, help="the checkout to count (default: this one)")
    ap.add_argument("--step", default=None, metavar="METHOD", help="also count the modules one step of METHOD "
                    "crosses on the tiny pair (runs it here)")
    ap.add_argument("--step-out", default="/tmp/house_counts_step", help="the step's run directory (--step)")
    args = ap.parse_args(argv)
    res = count(args.root)
    if args.step:
        import shutil

        shutil.rmtree(args.step_out, ignore_errors=True)
        res[f"modules a {args.step} step crosses"] = [(m.removeprefix("graft_cli."), n)
                                                      for m, n in step_modules(args.step, args.step_out)]
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
