"""How a step gets its rollouts: with its own weights, or sampled ahead with bounded staleness (``run.staleness``).

At k = 0 (:class:`InlineCollection`) each step collects its rollouts at its start, with the weights it updates,
and each policy's updated weights are pushed into its engine after its update.

At k >= 1 (:class:`AheadCollection`) the rollouts of step t (0-based) are sampled with the weights of version

    v(t) = max(0, t - k)        (a version counts the updates applied; the trainer holds version t at step t)

while the steps before t update:

    start of step t:  launch the collection of step t + k with a copy of version t's weights (at step 0: the
                      collections of steps 0 .. k, all with version 0)
                      take the collection of step t (waiting for it if it is not finished)
    then, as at k = 0: exchange, π_old recomputed at version t, update -> version t + 1

Collections run in step order on one rollout thread. Each loads its weights into the policy's rollout replica
(``Policy.replica``), pushes them into the engine and checks the push with the ``run.sync_check`` probe against the
trainer's log-probs at launch, then samples. With an engine that shares the trainer's device or model (``own_weights``
False: vLLM colocated, tandem) a collection runs in the trainer's thread when it is launched: the same rows, without
overlap. On a GPU a collection runs on a CUDA stream of its own (:class:`RolloutStream`), so that generation's kernels
run beside the update's. Every row of step t carries its version: ``PolicyStep.version``, the rollout logs'
``version`` column, the metrics ``async/version`` and ``async/staleness`` = t - v(t) (at most k;
:func:`check_staleness` refuses an older row) and ``time/rollout_wait`` (how long the trainer waited for it).

The rows of step t do not depend on timing: sampling seeds depend on (run seed, step, policy, round) only, the
data cursor advances in step order, and every exchange sees the groups of one collection (one prompt batch, one
version for every policy). A checkpoint after step t waits for the collections in flight (t + 1 .. t + k) and
stores them (:meth:`AheadCollection.state_dict`), so a resumed run trains on the rows the uninterrupted one would.
Before a checkpoint or an after-step hook (validation samples through the engines) :meth:`settle` waits for them
and loads the trainer's weights into the replicas.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from graft_cli import faults
from graft_cli.batch import PolicyStep, Rollouts
from graft_cli.data.problems import Problem
from graft_cli.schema import samples_ahead
from graft_cli.errors import GraftError
from graft_cli.train.collect import CollectInputs
from graft_cli.train.parallel import PolicyPool
from graft_cli.train.policies import Policy
from graft_cli.train.rollout_worker import RolloutWorker
from graft_cli.train.sync_check import SyncCheck


def check_staleness(step: int, version: int, staleness: int) -> int:
    """``step - version``, the rows' staleness; a row sampled more than ``staleness`` updates ago (or with weights
    the trainer does not have yet) stops the run."""
    age = step - version
    if not 0 <= age <= staleness:
        raise GraftError(f"step {step + 1}: its rollouts were sampled with the weights of version {version}, "
                         f"{age} updates old (run.staleness={staleness})")
    return age


class RolloutStream:
    """The rollout thread's own CUDA stream where the replicas are on a GPU; nothing elsewhere.

    The streams torch creates do not wait on the default stream, so a collection's kernels run beside the
    trainer's. :meth:`mark` (trainer's thread, after the weights are copied) tells the allocator the copies are
    read on this stream and records an event; :meth:`run` (rollout thread) makes the stream wait for that event,
    runs the collection on it and synchronizes it before the rows are handed over (they are host data)."""

    def __init__(self, device: torch.device | None):
        self.stream = torch.cuda.Stream(device) if device is not None and device.type == "cuda" else None

    def mark(self, weights: dict):
        if self.stream is None:
            return None
        for w in weights.values():
            for t in (w or {}).values():
                t.record_stream(self.stream)
        ready = torch.cuda.Event()
        ready.record()
        return ready

    @contextlib.contextmanager
    def run(self, ready):
        if self.stream is None:
            yield
            return
        self.stream.wait_event(ready)
        with torch.cuda.stream(self.stream):
            yield
        self.stream.synchronize()


class InlineCollection:
    """k = 0: the step's rollouts collected at its start; the updated weights pushed after each update."""

    def __init__(self, collector, inputs: CollectInputs, policies: dict[str, Policy], check_sync: SyncCheck,
                 worker: RolloutWorker):
        self.collector, self.inputs, self.policies, self.check_sync = collector, inputs, policies, check_sync
        self.worker = worker

    def take(self, step: int) -> tuple[dict, dict]:
        steps, rows = self.collector.collect(dataclasses.replace(self.inputs, worker=self.worker.at(step)))
        for st in steps.values():
            st.version = step
        return steps, rows

    def push(self, name: str, pol: Policy) -> None:
        pol.engine.sync_weights(pol.model)

    def check(self, name: str, pol: Policy, step: int) -> dict:
        return self.check_sync(name, pol, step)

    def restore(self, state: dict | None, step: int) -> None:
        for name, pol in self.policies.items():
            self.push(name, pol)
            self.check(name, pol, step)

    def settle(self, step: int) -> None:
        """Nothing is in flight."""

    def state_dict(self) -> dict | None:
        return None

    def close(self) -> None:
        """Nothing to stop."""


@dataclasses.dataclass
class _Job:
    step: int
    version: int
    result: Future


class AheadCollection:
    """k >= 1: collections launched k steps ahead (module docstring)."""

    def __init__(self, collector, inputs: CollectInputs, policies: dict[str, Policy], check_sync: SyncCheck,
                 staleness: int, worker: RolloutWorker, total_steps: int):
        self.collector, self.inputs, self.policies, self.check_sync = collector, inputs, policies, check_sync
        self.k, self.total_steps = int(staleness), int(total_steps)
        self.worker = worker  # bound to each collection's step (RolloutWorker.at)
        overlap = all(p.replica is not None for p in policies.values())
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="graft-rollout") if overlap else None
        # the policies sample on threads of their own: the trainer's policy threads are busy updating meanwhile
        self._pool = PolicyPool(inputs.pool.workers) if overlap else inputs.pool
        self._threads = torch.get_num_threads()
        self._stream = RolloutStream(next(next(iter(policies.values())).replica.parameters()).device
                                     if overlap else None)
        self.jobs: dict[int, _Job] = {}

    # -- the trainer's side
    def take(self, step: int) -> tuple[dict, dict]:
        for j in range(step, min(step + self.k + 1, self.total_steps)):  # at step 0 (or resumed without them):
            if j not in self.jobs:  # the steps before t + k too; none past the run's last step
                self._launch(j, step)  # with the weights the trainer holds now
        job = self.jobs.pop(step)
        t0 = time.perf_counter()
        steps, rows = job.result.result()  # a failed collection raises here
        waited = time.perf_counter() - t0
        age = check_staleness(step, job.version, self.k)
        for name in steps:
            rows[name].update({"async/version": job.version, "async/staleness": age, "time/rollout_wait": waited})
        return steps, rows

    def push(self, name: str, pol: Policy) -> None:
        """The updated weights go with the next launch."""

    def check(self, name: str, pol: Policy, step: int) -> dict:
        return {}

    def settle(self, step: int) -> None:
        """Wait for the collections in flight; then the replicas (and engines) hold the trainer's weights (version
        ``step``)."""
        for job in self.jobs.values():
            job.result.result()
        weights, expected = self._copy_weights()
        self._load(weights, expected, step)

    def restore(self, state: dict | None, step: int) -> None:
        self.jobs = {}
        for rec in (state or {}).get("jobs", []):
            done: Future = Future()
            done.set_result(_read_collection(rec["collection"], self.inputs.problems))
            self.jobs[int(rec["step"])] = _Job(int(rec["step"]), int(rec["version"]), done)
        self.settle(step)

    def state_dict(self) -> dict:
        """The collections in flight, finished and stored (plain data: no pickle)."""
        return {"jobs": [{"step": j.step, "version": j.version, "collection": _write_collection(*j.result.result())}
                         for j in sorted(self.jobs.values(), key=lambda j: j.step)]}

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)
            self._thread = None
            self._pool.close()

    # -- launching
    def _copy_weights(self) -> tuple[dict, dict]:
        """Each policy's weights now (a detached copy where a replica will load them later) and the sync probe's
        trainer log-probs."""
        weights, expected = {}, {}
        for name, pol in self.policies.items():
            weights[name] = (None if pol.replica is None else
                             {k: v.detach().clone() for k, v in pol.model.state_dict().items()})
            expected[name] = self.check_sync.expected(name, pol)
        return weights, expected

    def _launch(self, step: int, version: int) -> None:
        weights, expected = self._copy_weights()
        run = functools.partial(self._collect, step, version, weights, expected, self._stream.mark(weights))
        if self._thread is None:  # the engine shares the trainer's model or device: no overlap
            done: Future = Future()
            done.set_result(run())
            self.jobs[step] = _Job(step, version, done)
        else:
            self.jobs[step] = _Job(step, version, self._thread.submit(run))

    def _load(self, weights: dict, expected: dict, version: int) -> dict:
        """The weights into each policy's replica and engine; the sync check's metrics per policy."""
        out = {}
        faults.point("push", version + 1)
        for name, pol in self.policies.items():
            if pol.replica is not None:
                with torch.no_grad():
                    pol.replica.load_state_dict(weights[name])
                pol.engine.sync_weights(pol.replica)
            else:
                pol.engine.sync_weights(pol.model)
            out[name] = self.check_sync.compare(name, pol.engine, expected[name], version)
        return out

    def _collect(self, step: int, version: int, weights: dict, expected: dict, ready=None) -> tuple[dict, dict]:
        torch.set_num_threads(self._threads)  # the trainer's: float results depend on the intra-op thread count
        with self._stream.run(ready):
            checks = self._load(weights, expected, version)
            inputs = dataclasses.replace(self.inputs, worker=self.worker.at(step), pool=self._pool)
            steps, rows = self.collector.collect(inputs)
        for name, st in steps.items():
            st.version = version
            rows[name].update(checks.get(name, {}))
        return steps, rows


def collection_for(cfg, collector, inputs: CollectInputs, policies: dict[str, Policy], check_sync: SyncCheck,
                   worker: RolloutWorker, total_steps: int):
    """``run.staleness`` 0: :class:`InlineCollection`; k >= 1: :class:`AheadCollection`. Both sample through
    ``worker`` bound to the collection's step."""
    if not samples_ahead(cfg.run):
        return InlineCollection(collector, inputs, policies, check_sync, worker)
    return AheadCollection(collector, inputs, policies, check_sync, cfg.run.staleness, worker, total_steps)


# ----------------------------------------------------------------------- a collection as plain data (checkpoints)
def _write_collection(steps: dict, rows: dict) -> dict:
    out = {}
    for name, st in steps.items():
        ro = st.rollouts
        out[name] = {
            "problems": [dataclasses.asdict(p) for p in st.problems], "prompt_ids": st.prompt_ids,
            "rollouts": {"prompt_ids": ro.prompt_ids, "response_ids": ro.response_ids, "texts": ro.texts,
                         "logprobs": ro.logprobs, "truncated": ro.truncated, "n": ro.n, "meta": ro.meta,
                         "token_columns": ro.token_columns},
            "rewards": st.rewards.tolist(), "advantages": st.advantages.tolist(),
            "timed_out": None if st.timed_out is None else [bool(x) for x in st.timed_out],
            "version": st.version, "row": rows[name]}
    return out


def _read_collection(data: dict, problems: list[Problem]) -> tuple[dict, dict]:
    known = {p.id: p for p in problems}
    steps, rows = {}, {}
    for name, d in data.items():
        probs = [known.get(p["id"]) or Problem(**p) for p in d["problems"]]
        ro = Rollouts(**{**d["rollouts"], "truncated": [bool(x) for x in d["rollouts"]["truncated"]]})
        st = PolicyStep(name, probs, d["prompt_ids"], ro, torch.tensor(d["rewards"], dtype=torch.float32),
                        torch.tensor(d["advantages"], dtype=torch.float32),
                        None if d["timed_out"] is None else np.asarray(d["timed_out"], dtype=bool))
        st.version = int(d["version"])
        steps[name], rows[name] = st, dict(d["row"])
    return steps, rows


__all__ = ["InlineCollection", "AheadCollection", "collection_for", "check_staleness"]
