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

import json
import math
import os

import numpy as np

METRICS = "metrics.jsonl"
CONFIG = "config.yaml"


# ------------------------------------------------------------------------------------------ atomic writes
def _tmp(path: str) -> str:
    return f"{path}.tmp-{os.getpid()}"


def atomic_write_text(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = _tmp(path)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = _tmp(path)
    pq.write_table(pa.table(columns), tmp)
    os.replace(tmp, path)


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
    import hashlib

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
    import yaml

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
        with open(self.path, "a", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps({k: clean_value(v) for k, v in r.items()}) + "\n")
            f.flush()
            os.fsync(f.fileno())
