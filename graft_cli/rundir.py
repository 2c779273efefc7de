"""The run directory and its files: the one module every writer and reader of a run goes through.

A run directory ``results/runs/<name>/`` holds::

    config.yaml                      the validated config the run was started with
    metrics.jsonl                    one JSON line per (step, policy); validation lines carry validation/*
    rollouts/<policy>/step_N.parquet every response of the step (the stored-trajectory source reads these)
    checkpoints/step_N/              atomic checkpoints (graft_cli/train/checkpoint.py)
    eval/<policy>/step_N/            evaluation results (graft_cli/eval/runner.py)
    best.json, best/<policy>/        the best validation step and its weights

Writes are atomic (a temporary file in the same folder, fsync, ``os.replace``), so a kill never leaves a
torn JSON or parquet file behind; ``metrics.jsonl`` is append-only and its reader stops at a torn last line.
Nothing here unpickles anything.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import shutil

import numpy as np
import yaml

from graft_cli.errors import GraftError

METRICS = "metrics.jsonl"
CONFIG = "config.yaml"
BEST = "best.json"
CHECKPOINTS = "checkpoints"
EVAL = "eval"
REGISTRATION = "registration.json"  # a study folder's registered design (graft_cli/plan/registration.py)


# ------------------------------------------------------------------------------------------ paths
def step_name(step: int) -> str:
    """The folder of a step (a checkpoint, an evaluation): ``step_000012``."""
    return f"step_{int(step):06d}"


def config_path(run_dir: str) -> str:
    return os.path.join(run_dir, CONFIG)


def best_path(run_dir: str) -> str:
    return os.path.join(run_dir, BEST)


def checkpoints_dir(run_dir: str) -> str:
    """``<run>/checkpoints``, the root of the run's atomic checkpoints (graft_cli/train/checkpoint.py)."""
    return os.path.join(run_dir, CHECKPOINTS)


def checkpoint_dir(run_dir: str, step: int, policy: str | None = None) -> str:
    """``<run>/checkpoints/step_N`` (``policy``: its folder in that checkpoint)."""
    d = os.path.join(checkpoints_dir(run_dir), step_name(step))
    return d if policy is None else os.path.join(d, policy)


def eval_step_dir(run_dir: str, policy: str, step: int, root: str = EVAL) -> str:
    """``<run>/eval/<policy>/step_N`` (``root``: ``validation`` where validation samples apart)."""
    return os.path.join(run_dir, root, policy, step_name(step))


# ------------------------------------------------------------------------------------------ atomic writes
def _tmp(path: str) -> str:
    return f"{path}.tmp-{os.getpid()}"


def remove_stale_temporaries(folder: str) -> None:
    """Remove what other processes left under a temporary name in ``folder`` (``<name>.tmp-<pid>``, file or
    folder): a writer killed mid-write leaves it, and only one process writes a run's folder at a time."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for name in names:
        stem, sep, pid = name.rpartition(".tmp-")
        if sep and stem and pid.isdigit() and pid != str(os.getpid()):
            path = os.path.join(folder, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass


def write_failed(e: OSError, path: str) -> OSError:
    """``e`` (a failed write: a full disk, a file-size limit, a read-only folder) as an OSError that names ``path``
    (a failed ``write`` names no file; pyarrow's message is its own)."""
    if e.filename or not e.errno:
        return e
    return OSError(e.errno, os.strerror(e.errno), path)


class _Atomic:
    """``with _Atomic(path) as tmp:`` write ``tmp``; it replaces ``path`` when the block succeeds, and is removed
    when it fails (the error then names ``path``): a failed write leaves the old file, never a torn one or litter."""

    def __init__(self, path: str):
        self.path, self.tmp = path, _tmp(path)

    def __enter__(self) -> str:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        return self.tmp

    def __exit__(self, kind, e, tb) -> bool:
        if e is None:
            os.replace(self.tmp, self.path)
            return False
        try:
            os.remove(self.tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise write_failed(e, self.path) from None
        return False


def atomic_write_text(path: str, text: str) -> None:
    with _Atomic(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o).__name__)


def atomic_write_json(path: str, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, ensure_ascii=False, default=_json_default) + "\n")


def write_jsonl_atomic(path: str, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False, default=_json_default) + "\n" for r in rows))


def write_parquet(path: str, columns: dict) -> None:
    # lazy: pyarrow is heavy
    import pyarrow as pa

    # lazy: pyarrow is heavy
    import pyarrow.parquet as pq

    table = pa.table(columns)
    with _Atomic(path) as tmp:
        pq.write_table(table, tmp)


def check_writable(path: str, key: str) -> None:
    """Before anything is loaded or written: ``path`` (a folder to create or write into) can be written, judged by
    its nearest existing ancestor: a folder, writable, not on a read-only file system (what root's permission
    bypass does not change). Else one line naming ``key``."""

    anc = os.path.abspath(path)
    while not os.path.lexists(anc):
        anc = os.path.dirname(anc)
    why = None
    if not os.path.isdir(anc):
        why = f"{anc} is not a folder"
    elif os.statvfs(anc).f_flag & os.ST_RDONLY:
        why = f"{anc} is on a read-only file system"
    elif not os.access(anc, os.W_OK | os.X_OK):
        why = f"{anc} is not writable"
    if why:
        raise GraftError(f"config key {key!r}: cannot write {path}: {why}")


# ------------------------------------------------------------------------------------------------ reading
def read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_json_or_none(path: str):
    try:
        return read_json(path)
    except (OSError, json.JSONDecodeError):
        return None


def sha256_file(path: str) -> str:
    """Hex sha256 of a file's bytes (read in 1 MiB blocks)."""

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def metrics_path(run_dir: str) -> str:
    return os.path.join(run_dir, METRICS)


def read_metrics(run_dir: str) -> list[dict]:
    """Every line of ``<run>/metrics.jsonl`` (``[]`` when absent), stopping at a torn last line (a kill)."""
    path = run_dir if run_dir.endswith(".jsonl") else metrics_path(run_dir)
    out: list[dict] = []
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return out


def training_rows(rows: list[dict]) -> list[dict]:
    """The training lines of metrics.jsonl (validation lines carry no ``time/step``)."""
    return [r for r in rows if "time/step" in r]


def run_config_raw(run_dir: str) -> dict:
    """``config.yaml`` as a plain mapping (``{}`` when missing or unreadable); YAML only, never a pickle."""

    try:
        with open(os.path.join(run_dir, CONFIG), encoding="utf-8") as f:
            raw = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError):
        return {}
    return raw if isinstance(raw, dict) else {}


def run_policies(run_dir: str) -> list[str]:
    """The trained policies of a run (``role: train``, the default): from config.yaml, else the rollout folders."""
    raw = run_config_raw(run_dir)
    names = [str(p["name"]) for p in raw.get("policies") or []
             if isinstance(p, dict) and "name" in p and p.get("role", "train") == "train"]
    if names:
        return names
    d = os.path.join(run_dir, "rollouts")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def rollout_log_path(run_dir: str, policy: str, step: int) -> str:
    """The rollout log written for 0-based step ``step`` (file names count from 1)."""
    return os.path.join(run_dir, "rollouts", policy, f"step_{step + 1:06d}.parquet")


def exchange_log_path(run_dir: str, policy: str, step: int) -> str:
    """The exchange (admission) log of receiver ``policy`` for 0-based step ``step``."""
    return os.path.join(run_dir, "rollouts", policy, f"exchange_step_{step + 1:06d}.parquet")


# ------------------------------------------------------------------------------------------ metrics log
def clean_value(v):
    """A JSON-safe scalar: numpy/torch scalars unwrapped, nan → null, ±inf → ±1e308."""
    if isinstance(v, (np.floating, np.integer)):
        v = v.item()
    if hasattr(v, "item") and not isinstance(v, (list, dict, str)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


class MetricsLog:
    """Append-only ``metrics.jsonl`` (each write fsynced); ``truncate_after`` drops lines of unfinished steps."""

    def __init__(self, path: str):
        self.path = path

    def truncate_after(self, step: int) -> None:
        if not os.path.exists(self.path):
            return
        keep = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    if json.loads(line)["step"] <= step:
                        keep.append(line)
                except (json.JSONDecodeError, KeyError):
                    break  # a torn last line from a kill
        atomic_write_text(self.path, "".join(keep))

    def write(self, rows: list[dict]) -> None:
        """Append ``rows`` (one step's lines, fsynced). A failed append (a full disk, a file-size limit) is cut
        back off, so the file never ends in a torn line, and raises an OSError naming the file."""
        text = "".join(json.dumps({k: clean_value(v) for k, v in r.items()}) + "\n" for r in rows).encode("utf-8")
        with open(self.path, "ab", buffering=0) as f:
            end = f.seek(0, os.SEEK_END)
            try:
                view = memoryview(text)
                while view:
                    n = f.write(view)
                    if not n:
                        raise OSError(errno.EIO, os.strerror(errno.EIO))
                    view = view[n:]
                os.fsync(f.fileno())
            except OSError as e:
                f.truncate(end)
                raise write_failed(e, self.path) from None


@contextlib.contextmanager
def folder_lock(folder: str, name: str = ".lock"):
    """An exclusive ``flock`` on ``<folder>/<name>`` for the block (the folder is made); POSIX only: elsewhere the
    block runs unlocked."""
    os.makedirs(folder, exist_ok=True)
    try:
        import fcntl  # POSIX only: imported where the lock is taken, so the module loads elsewhere
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(os.path.join(folder, name), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
