"""What a run was made with, recorded in its directory (``provenance.json``) and checked before a
plan reuses it.

``provenance.json``::

    {"config_hash": sha256 of the resolved config (the keys a resumed run may change left out),
     "tiny_build": {"hash": sha256 over the tiny roles' model hashes and the task files it trains
     on, "roles": {...}}
                   or null (no tiny model or data),
     "sessions": [{"commit": git HEAD of the code, "dirty": uncommitted changes, "started": UTC
     time,
                   "from_step": the step it resumed from (0: a fresh start)}, ...]}

one session per ``graft train`` that opened the run directory (a resumed run appends one). A plan
reuses a finished run only when its config hash and tiny build hash equal those the plan composes
now (:func:`reuse_problem`), or, where the hash differs, when its ``config.yaml`` read back (older
names read as the current ones) equals the plan's.

A build record is kept for each model source that declares one
(:data:`~graft_cli.models.loading.SOURCE_BUILDS`; the tiny pair's, ``tiny``) under the key
``<source>_build``: the source's record of the ``<source>:<name>`` models of the run's policies and
whether its training data is ``<source>:`` data, or null for a run that names neither. """

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time

from graft_cli import config as C
from graft_cli.errors import GraftError
from graft_cli.models.loading import SOURCE_BUILDS
from graft_cli.rundir import atomic_write_json, config_path, read_json_or_none

PROVENANCE = "provenance.json"

__all__ = ["PROVENANCE", "config_diff", "config_hash", "flat_config", "read_provenance", "record_session",
           "reuse_problem", "source_builds", "source_commit"]


def flat_config(cfg: C.Config) -> dict:
    """The resolved config as ``{"dotted.key": value}``."""
    out: dict = {}

    def walk(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = v
    walk(C.asdict(cfg))
    return out


def _identity_keys(flat: dict, ignore: set) -> dict:
    return {k: v for k, v in flat.items() if k not in ignore}


def config_hash(cfg: C.Config, ignore: set) -> str:
    """sha256 of the canonical JSON of the resolved config less the keys in ``ignore`` (those a run
    may change between sessions without becoming another run: its folder, checkpoint cadence,
    loggers, threads)."""
    body = json.dumps(_identity_keys(flat_config(cfg), ignore), sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def config_diff(a: C.Config, b: C.Config, ignore: set) -> list[str]:
    """The keys (sorted) whose values differ between two resolved configs, ``ignore`` left out."""
    fa, fb = _identity_keys(flat_config(a), ignore), _identity_keys(flat_config(b), ignore)
    return sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))


def source_commit() -> tuple[str | None, bool | None]:
    """(git HEAD, whether the checkout has uncommitted changes) of the code running now; (None,
    None) outside a git checkout."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def git(*args):
        try:
            return subprocess.run(["git", "-C", here, *args], capture_output=True, text=True, check=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    head = git("rev-parse", "HEAD")
    if not head:
        return None, None
    status = git("status", "--porcelain")
    return head, (None if status is None else status != "")


def _built_source(spec: str) -> str | None:
    """The ``<source>`` of a ``<source>:<name>`` model or data name whose source keeps a build
    record (``SOURCE_BUILDS``); None for any other name."""
    source = spec.split(":", 1)[0] if ":" in spec else None
    return source if source in SOURCE_BUILDS else None


def _named_sources(cfg: C.Config) -> dict[str, tuple[list[str], bool]]:
    """Source -> (the ``<source>:<name>`` names the run's policies load from it, whether its
    training data is that source's), for each source with a build record the run names."""
    names: dict[str, set] = {}
    for spec in (str(p.model) for p in cfg.policies):
        if _built_source(spec):
            names.setdefault(_built_source(spec), set()).add(spec.split(":", 1)[1])
    data = _built_source(str(cfg.data.train))
    if data:
        names.setdefault(data, set())
    return {s: (sorted(n), s == data) for s, n in sorted(names.items())}


def source_builds(cfg: C.Config) -> dict[str, dict | None]:
    """``<source>_build`` -> the build record of that source for this run (its record of the names
    the run loads from it, hashed: ``{"hash": ..., **record}``), or None where the run names none of
    it; one key per source with a build record (``SOURCE_BUILDS``)."""
    named = _named_sources(cfg)
    out: dict[str, dict | None] = {}
    for source in SOURCE_BUILDS.names():
        if source not in named:
            out[f"{source}_build"] = None
            continue
        body = SOURCE_BUILDS.get(source)(*named[source])
        out[f"{source}_build"] = {"hash": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest(),
                                  **body}
    return out


def read_provenance(run_dir: str) -> dict | None:
    return read_json_or_none(os.path.join(run_dir, PROVENANCE))


def record_session(cfg: C.Config, run_dir: str, ignore: set, from_step: int) -> dict:
    """Write (or extend) ``<run_dir>/provenance.json`` for this session; returns it."""
    prev = read_provenance(run_dir) or {}
    commit, dirty = source_commit()
    prov = {"config_hash": config_hash(cfg, ignore), **source_builds(cfg),
            "sessions": list(prev.get("sessions") or []) + [
                {"commit": commit, "dirty": dirty, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                 "from_step": int(from_step)}]}
    atomic_write_json(os.path.join(run_dir, PROVENANCE), prov)
    return prov


def reuse_problem(cfg: C.Config, run_dir: str, ignore: set) -> str | None:
    """Why the finished run in ``run_dir`` cannot stand for a run of config ``cfg`` (None: it can):
    no provenance, another config (the first differing key named), or another build of a model
    source it names."""
    prov = read_provenance(run_dir)
    if prov is None:
        return "it has no provenance.json (made by code that did not record one)"
    if prov.get("config_hash") != config_hash(cfg, ignore):
        try:
            on_disk = C.load_yaml(config_path(run_dir)) if os.path.exists(config_path(run_dir)) else None
        except GraftError:  # an unreadable config.yaml: the hashes alone say it differs
            on_disk = None
        keys = config_diff(on_disk, cfg, ignore) if on_disk is not None else []
        if keys or on_disk is None:
            return (f"its config differs in {keys[0]!r}" + (f" (and {len(keys) - 1} more)" if len(keys) > 1 else "")
                    if keys else "its config hash differs from the plan's")
        # its config.yaml reads as this config: the hash was taken over older names of its values
        # (docs/glossary.md)
    for key, now in source_builds(cfg).items():
        was = prov.get(key) or {}
        if was.get("hash") != (now or {}).get("hash"):
            now_roles, was_roles = (now or {}).get("roles") or {}, was.get("roles") or {}
            roles = [r for r in sorted(set(now_roles) | set(was_roles)) if now_roles.get(r) != was_roles.get(r)]
            return (f"it was made with another {key.removesuffix('_build')} build"
                    + (f" (role {roles[0]!r})" if roles else " (task files)"))
    return None
