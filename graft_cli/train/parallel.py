"""Stepping several policies at once on a multi-core CPU (``run.policy_workers``).

The policies of a GRPO or GRAFT step are independent except at the exchange: each samples, is
graded, scores its batch and updates on its own. Small models use extra intra-op threads poorly (a
1.8M-parameter forward on 2 threads is ~1.3x faster than on one), so on CPU the step runs the
policies' independent phases in parallel threads instead, each thread's torch ops on ``threads //
workers`` intra-op threads. The phases are the collector's rollout + grading (one policy per thread)
and each receiver's scoring + admission + update.

Identical results: every random draw of a policy's phase comes from a generator of its own (sampling
seeds per (run, step, policy); the minibatch shuffle per (step, policy)), the grader serialises
calls behind a lock (its worker pipes are shared), and results are gathered by policy name, so 1 and
N workers give the same samples, metrics and weights as running the policies one after the other on
the threads each worker gets (``run.threads = threads // workers``; float reductions depend on the
intra-op thread count, as always in torch) (tests/test_parallel.py).

``policy_workers``: 1 runs the policies one after the other; 0 (auto) uses ``min(#policies,
threads)`` workers on CPU without data parallelism and 1 otherwise (CUDA kernels of one device
serialise anyway, and sharded training needs every rank in lock-step). """

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor


def resolve_workers(requested: int, num_policies: int, threads: int, device_type: str, distributed: bool) -> int:
    """The number of policy threads for ``run.policy_workers`` = ``requested`` (see the module
    docstring)."""
    if num_policies < 2 or distributed:
        return 1
    if requested > 0:
        return min(requested, num_policies)
    if device_type != "cpu":
        return 1
    return max(1, min(num_policies, threads))


class PolicyPool:
    """``map(fn, items)`` -> ``[fn(item) ...]`` in item order, on ``workers`` threads (inline when
    1)."""

    def __init__(self, workers: int):
        self.workers = max(1, int(workers))
        self._ex = ThreadPoolExecutor(self.workers, thread_name_prefix="graft-policy") if self.workers > 1 else None

    def map(self, fn, items) -> list:
        items = list(items)
        if self._ex is None or len(items) < 2:
            return [fn(x) for x in items]
        return list(self._ex.map(fn, items))  # re-raises the first exception in item order

    def close(self) -> None:
        if self._ex is not None:
            self._ex.shutdown(wait=True)
            self._ex = None


class LockedGrader:
    """A grader shared by the policy threads: ``grade`` calls are serialised (the worker pool's
    pipes are not thread-safe); every other attribute is the wrapped grader's."""

    def __init__(self, grader):
        self._grader = grader
        self._lock = threading.Lock()

    def grade(self, *args, **kwargs):
        with self._lock:
            return self._grader.grade(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._grader, name)


__all__ = ["resolve_workers", "PolicyPool", "LockedGrader"]
