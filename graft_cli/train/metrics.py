"""metrics.jsonl (one line per step and policy) and parquet rollout logs, both written safely.

Metric names follow TRL (``reward``, ``reward_std``, ``frac_reward_zero_std``, ``completions/*``,
``clip_ratio/*``, ``entropy``, ``grad_norm``, ``sampling/*``) plus ``time/*`` and method prefixes.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np


def _clean(v):
    if isinstance(v, (np.floating, np.integer)):
        v = v.item()
    if hasattr(v, "item") and not isinstance(v, (list, dict, str)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


class MetricsLog:
    def __init__(self, path: str):
        self.path = path

    def truncate_after(self, step: int) -> None:
        """Keep only lines with ``step <= step`` (resume drops the lines of unfinished steps)."""
        if not os.path.exists(self.path):
            return
        keep = []
        with open(self.path) as f:
            for line in f:
                try:
                    if json.loads(line)["step"] <= step:
                        keep.append(line)
                except (json.JSONDecodeError, KeyError):
                    break  # a torn last line from a kill
        atomic_write_text(self.path, "".join(keep))

    def write(self, rows: list[dict]) -> None:
        with open(self.path, "a") as f:
            for r in rows:
                f.write(json.dumps({k: _clean(v) for k, v in r.items()}) + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_metrics(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def atomic_write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_parquet(path: str, columns: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    pq.write_table(pa.table(columns), tmp)
    os.replace(tmp, path)


def summarize(values, prefix: str) -> dict:
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return {}
    return {f"{prefix}/mean": a.mean(), f"{prefix}/p10": np.percentile(a, 10), f"{prefix}/p90": np.percentile(a, 90)}
