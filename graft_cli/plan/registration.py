"""Pre-registration of a study: its design frozen in ``registration.json`` before its first run.

``graft reproduce --pair P --register --out DIR`` writes ``DIR/registration.json`` and runs nothing::

    {"plan": name, "source": plan file, "plan_hash": sha256 of the design below,
     "design": {name, pair, steps, overrides, eval, claims, analysis,
                runs: {key: {name, method, seed, overrides, eval, partner, pair}}},
     "arms": {run name: {"method", "seeds"}}, "claims": the plan's claims section, "analysis":
     {"interval": rule name, "alpha", "sequential": {"spending", "looks"} or null, "reading": text},
     "registered": UTC time, "commit": the code's git HEAD, "dirty": uncommitted changes,
     "resolved": {"configs": {run key: sha256 of its resolved config}, "tiny_build": {run key: hash}},
     "analysis_code": {"commit": git HEAD, "modules": {module: sha256 of its source}}}

The design is the plan as expanded (each run's method, seed, overrides and evaluation; the plan's
claims and ``analysis``), not its YAML text: comments may change, the design may not. ``resolved``
holds what the design does not show: each run's resolved config as ``graft train`` composes it
(method configs' contents, the pair's, every default; hashed as a run's ``provenance.json`` does,
:func:`graft_cli.train.provenance.config_hash`) and its tiny build hash, so that a method config
edited after registration is a change of design too. ``analysis_code`` is the version of the code
that judges the claims (the claims module of ``claims.kind`` and the report modules it imports):
a report made by other code says so. A study then
runs with ``--registration FILE`` (or finds ``<out>/registration.json``): the plan must hash to the
registered design or nothing runs and no claim is judged; the first differing key is named
(:func:`differences`).

``analysis`` (a plan key; docs/studies.md, "Registration"):

- ``interval``: the interval rule of the claims (``paired_t``: the paired t-interval over seeds;
  ``floored_t``: the same with its variance floored at the measured evaluation variance,
  graft_cli/report/power.py).
- ``alpha``: two-sided error rate (0.05).
- ``sequential``: a group-sequential design, ``{spending: obrien_fleming | pocock, looks: [n_1, ...,
  n_K]}`` (seed counts per arm at which the claims may be judged, n_K the plan's seeds): the claims
  at look k use the repeated confidence interval with look k's boundary (Lan-DeMets alpha spending),
  so that judging at any look, or extending to a later one, keeps the error rate at ``alpha``
  (graft_cli/report/sequential.py).
- ``reading``: the pre-registered reading of the outcomes, in words.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import ast
import importlib.util

from graft_cli.config import compose
from graft_cli.errors import GraftError
from graft_cli.plan.spec import Plan
from graft_cli.rundir import REGISTRATION, atomic_write_json, read_json_or_none
from graft_cli.train.provenance import config_hash, source_builds, source_commit
from graft_cli.train.run import RESUME_MAY_DIFFER


__all__ = ["REGISTRATION", "analysis_code", "analysis_changes", "check_registration", "design", "differences",
           "load_registration", "plan_hash", "register", "registration_record", "resolved"]


def design(plan: Plan) -> dict:
    """The plan as expanded: what a registration freezes."""
    runs = {r.key: {"name": r.name, "method": r.method, "seed": r.seed, "overrides": list(r.overrides),
                    "eval": {k: (list(v) if isinstance(v, tuple) else v) for k, v in r.eval_over},
                    "partner": list(r.partner) if r.partner else None, "pair": r.pair} for r in plan.runs}
    ev = {k: getattr(plan.eval, k) for k in plan.eval.__dataclass_fields__}
    return {"name": plan.name, "pair": plan.pair, "steps": plan.steps, "overrides": list(plan.overrides),
            "eval": ev, "claims": plan.claims, "analysis": plan.analysis, "runs": runs}


def plan_hash(plan: Plan) -> str:
    return hashlib.sha256(json.dumps(design(plan), sort_keys=True, default=str).encode()).hexdigest()


def _flat(d, prefix=""):
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
    elif isinstance(d, list) and d and all(isinstance(x, dict) for x in d):
        for i, v in enumerate(d):
            out.update(_flat(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = d
    return out


def differences(registered: dict, now: dict) -> list[str]:
    """Dotted keys (sorted) where two designs differ: ``runs.graft-s12`` (a run added or removed),
    ``runs.graft-s3.overrides``, ``analysis.interval``, ..."""
    a, b = _flat(json.loads(json.dumps(registered, default=str))), _flat(json.loads(json.dumps(now, default=str)))
    keys = sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))
    runs_a, runs_b = set((registered.get("runs") or {})), set((now.get("runs") or {}))
    whole = {f"runs.{k}" for k in runs_a ^ runs_b}
    return sorted(whole | {k for k in keys if not any(k.startswith(w + ".") for w in whole)})


def resolved(plan: Plan, out: str) -> dict:
    """Each run's resolved config hash and tiny build hash, as the plan composes them into ``out``
    (the keys a run may change between sessions left out, as a run's provenance does)."""
    configs, builds = {}, {}
    for r in plan.runs:
        cfg = compose(plan.compose_overrides(r, out))
        configs[r.key] = config_hash(cfg, RESUME_MAY_DIFFER)
        tb = source_builds(cfg).get("tiny_build")
        builds[r.key] = tb["hash"] if tb else None
    return {"configs": configs, "tiny_build": builds}


def _report_imports(module: str) -> list[str]:
    spec = importlib.util.find_spec(module)
    tree = ast.parse(open(spec.origin, encoding="utf-8").read())
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("graft_cli.report"):
            out.append(n.module)
    return out


def analysis_code(module: str | None) -> dict:
    """The version of the code that judges a study's claims: the git HEAD and the sha256 of the
    claims ``module`` and of every ``graft_cli.report`` module it imports, transitively."""
    mods: dict = {}
    todo = [module] if module else []
    while todo:
        m = todo.pop()
        if m in mods:
            continue
        spec = importlib.util.find_spec(m)
        if spec is None or not spec.origin:
            continue
        with open(spec.origin, "rb") as f:
            mods[m] = hashlib.sha256(f.read()).hexdigest()
        todo += _report_imports(m)
    return {"commit": source_commit()[0], "modules": dict(sorted(mods.items()))}


def analysis_changes(reg: dict, module: str | None) -> list[str]:
    """The analysis modules whose source differs from the registration's (added, removed or
    changed); empty when they are the registered ones or the registration records none."""
    was = (reg.get("analysis_code") or {}).get("modules")
    if not was:
        return []
    now = analysis_code(module)["modules"]
    return sorted(m for m in set(was) | set(now) if was.get(m) != now.get(m))


def registration_record(plan: Plan, out: str = "", claims_module: str | None = None) -> dict:
    arms: dict = {}
    for r in plan.runs:
        arm = arms.setdefault(r.name, {"method": r.method, "seeds": []})
        arm["seeds"].append(r.seed)
    commit, dirty = source_commit()
    return {"plan": plan.name, "source": os.path.relpath(plan.source) if plan.source else "",
            "plan_hash": plan_hash(plan), "design": design(plan), "arms": arms, "claims": plan.claims,
            "analysis": plan.analysis, "registered": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "commit": commit, "dirty": dirty, "resolved": resolved(plan, out),
            "analysis_code": analysis_code(claims_module)}


def load_registration(path: str) -> dict:
    reg = read_json_or_none(path)
    if not isinstance(reg, dict) or not isinstance(reg.get("design"), dict) or "plan_hash" not in reg:
        raise GraftError(f"{path}: not a registration (graft reproduce --register writes one)")
    return reg


def check_registration(plan: Plan, reg: dict, where: str, out: str | None = None) -> None:
    """Raise one line naming the first key where the plan differs from the registered design, or,
    for a registration that holds them and a plan folder ``out``, the first run whose resolved
    config or tiny build differs from the registered one."""
    if reg.get("plan_hash") == plan_hash(plan):
        if out is None or not isinstance(reg.get("resolved"), dict):
            return
        now = resolved(plan, out)
        for part, what in (("configs", "resolved config"), ("tiny_build", "tiny build")):
            was = reg["resolved"].get(part) or {}
            for key in sorted(set(was) | set(now[part])):
                if was.get(key) != now[part].get(key):
                    raise GraftError(f"{where}: plan {plan.name}: run {key}'s {what} differs from its registration "
                                     f"(a method or pair config, a default or the tiny build changed): a registered "
                                     f"design does not change; register a new study")
        return
    diff = differences(reg["design"], design(plan))
    raise GraftError(f"{where}: plan {plan.name} differs from its registration in "
                     + (f"{diff[0]!r}" + (f" (and {len(diff) - 1} more)" if len(diff) > 1 else "") if diff
                        else "its hash") + ": a registered design does not change; register a new study")


def register(plan: Plan, out: str, claims_module: str | None = None) -> tuple[str, bool]:
    """Write ``<out>/registration.json``; returns (path, written). A registration already there is
    never replaced: the same design leaves it as it is (written False), another design is
    refused."""
    path = os.path.join(out, REGISTRATION)
    if os.path.exists(path):
        check_registration(plan, load_registration(path), path, out)
        return path, False
    record = registration_record(plan, out, claims_module)  # composed before anything is written
    os.makedirs(out, exist_ok=True)
    atomic_write_json(path, record)
    return path, True
