"""A step's rollouts: policy ``i`` samples a list of problems, grades them and takes the group advantages
(:class:`RolloutWorker`); a collector decides which problems each policy samples in a step (:class:`SingleRound`,
:class:`DynamicSampling`); a collection decides with which weights and when (:class:`InlineCollection` at
``run.staleness`` 0, :class:`AheadCollection` above). The trainer asks :func:`collection_for` for the step's
:class:`~graft_cli.batch.PolicyStep` per policy and its metrics row so far.

**The worker.** A worker is bound to one 0-based step (:meth:`RolloutWorker.at`): sampling seeds depend on (run
seed, step, policy, round) only, never on RNG state, so a resumed run samples exactly what the uninterrupted one
would, and a collection launched ahead of its step samples what it would have sampled at its step.

**The collectors.** A collector is ``cls(cfg)`` with ``collect(inp: CollectInputs) -> (steps, rows)``: every
trained policy's step and its metrics row so far. It draws prompt batches from ``inp.sampler`` (indices into
``inp.problems``) and samples through ``inp.worker.sample(i, problems, round)`` (policy ``i`` of ``inp.policies``).
:func:`collector_for` picks :class:`DynamicSampling` when ``algo.filter_groups.enable``, else :class:`SingleRound`.

- ``single``: one prompt batch, every policy samples it (GRPO, GRAFT: the policies share the
  prompts); the policies sample in parallel threads when the trainer has a pool of them
  (``run.policy_workers``).
- ``dynamic``: DAPO's dynamic sampling (verl ``algorithm.filter_groups``; baselines.md §4): groups
  whose rewards are all equal (the ``acc`` metric: all correct or all wrong) are dropped, and
  further prompt batches are drawn and sampled until every policy holds ``data.prompt_batch``
  informative groups or ``algo.filter_groups.max_num_gen_batches`` rounds have run (0 = no cap);
  surplus groups beyond the batch are discarded (the first ones are kept, as verl does). A policy
  that ends short trains on the groups it has. Each policy keeps its own groups, so the policies no
  longer share prompts: only ``exchange.name: none``. Metrics: ``filter_groups/rounds``,
  ``/evicted_groups``, ``/discarded_surplus_groups``, ``/kept_groups``, ``/prompts_consumed``.

**The collections.** A step's rollouts are sampled with its own weights, or ahead with bounded staleness
(``run.staleness``).

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
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from graft_cli import config as C
from graft_cli import faults
from graft_cli.batch import PolicyStep, Rollouts, cat_groups
from graft_cli.data.problems import Problem
from graft_cli.data.prompts import PromptSpec
from graft_cli.data.sampler import PromptSampler
from graft_cli.errors import GraftError
from graft_cli.rollout import SamplingParams
from graft_cli.schema import samples_ahead
from graft_cli.train import dist as D
from graft_cli.train.parallel import PolicyPool
from graft_cli.train.policies import Policy, encode_prompt
from graft_cli.train.sync_check import SyncCheck

if TYPE_CHECKING:
    from graft_cli.reward import Grader


# ------------------------------------------------------------------------------------------------ the worker
def sampling_seed(run_seed: int, step: int, policy_index: int) -> int:
    """One seed per (run, step, policy): sampling never depends on RNG state, so resume is exact."""
    return (run_seed * 1_000_003 + step * 7919 + policy_index * 104_729) % (2**31 - 1)


@dataclass(frozen=True)
class RolloutWorker:
    """What sampling reads: the trained policies (their engines and prompt encodings, in order:
    policy ``i`` is the ``i``-th), the prompt format, the grader, the advantage function, the config
    (``rollout``, ``algo``, ``run.seed``), the data-parallel group and the step the seeds are drawn
    for."""

    policies: dict[str, Policy]
    spec: PromptSpec
    grader: Grader  # a LockedGrader where policies are graded from several threads (train/parallel.py)
    adv_fn: Callable[..., torch.Tensor]  # an ADVANTAGES entry: (rewards, eps=, norm_by_std=) -> advantages
    cfg: C.Config
    dist: D.Dist
    step: int = 0

    def at(self, step: int) -> RolloutWorker:
        """This worker for 0-based ``step``."""
        return dataclasses.replace(self, step=step)

    def sample(self, i: int, problems: list[Problem], round_: int = 0) -> tuple[PolicyStep, dict]:
        """Policy ``i`` samples ``problems`` (sampling round ``round_`` of the worker's step),
        grades them and takes the group advantages; the step and its metrics (seconds of rollout and
        reward, the grader's counts, the engine's metrics)."""
        cfg, r, step, dist = self.cfg, self.cfg.rollout, self.step, self.dist
        pol = self.policies[list(self.policies)[i]]
        t0 = time.perf_counter()
        prompt_ids = [encode_prompt(pol, p.problem, self.spec) for p in problems]
        lo, hi = dist.rollout_slice(len(problems))  # data-parallel: this rollout group's prompts
        group = dist.rank // dist.rollout_tp
        seed = sampling_seed(cfg.run.seed, step, i) + group * 1_000_033 + round_ * 15_485_867
        params = SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens,
                                seed=seed % (2**31 - 1))
        ro = pol.engine.generate(prompt_ids[lo:hi], params)
        faults.point("rollout", step + 1)
        t1 = time.perf_counter()
        golds = [p.answer for p in problems[lo:hi] for _ in range(r.n)]
        grades = self.grader.grade(ro.texts, golds)
        faults.point("reward", step + 1)
        if dist.enabled:
            ro, grades = D.concat_rollouts(dist.gather_rollout_groups((ro, grades)))
        t2 = time.perf_counter()
        rewards = torch.tensor(grades.rewards, dtype=torch.float32).view(len(problems), r.n)
        adv = self.adv_fn(rewards, eps=cfg.algo.adv_eps, norm_by_std=cfg.algo.norm_by_std)
        ps = PolicyStep(pol.name, problems, prompt_ids, ro, rewards, adv, np.asarray(grades.timed_out))
        ps.rollouts.meta["extracted"] = grades.extracted
        return ps, {"time/rollout": t1 - t0, "time/reward": t2 - t1, **grades.counts(), **ro.meta.get("metrics", {})}


# -------------------------------------------------------------------------------------------- the collectors
GROUP_METRICS = ("acc",)

@dataclass
class CollectInputs:
    """What a collector draws on: the training problems, the data cursor over them, the trained
    policies' names (in order), the worker policy ``i`` samples and grades a list of problems
    through, and the threads the policies sample on."""

    problems: list[Problem]
    sampler: PromptSampler
    policies: list[str]
    worker: RolloutWorker
    pool: PolicyPool = field(default_factory=lambda: PolicyPool(1))


def informative_groups(rewards: torch.Tensor, metric: str = "acc") -> list[int]:
    """DAPO's filter: the prompt groups whose ``metric`` (``acc``: the binary reward) is not
    constant."""
    if metric not in GROUP_METRICS:
        raise ValueError(f"unknown filter_groups metric {metric!r}; known: {', '.join(GROUP_METRICS)}")
    if rewards.shape[1] < 2:
        return []
    return [q for q in range(rewards.shape[0]) if bool((rewards[q] != rewards[q][0]).any())]


class SingleRound:
    def __init__(self, cfg):
        self.cfg = cfg

    def prompts_at(self, inp: CollectInputs, step: int) -> list | None:
        """The problems of 0-based ``step``, known in advance (one batch per step); step sources
        check their data against them before step 1."""
        return [inp.problems[i] for i in inp.sampler.batch_at(step)]

    def collect(self, inp: CollectInputs):
        problems = [inp.problems[i] for i in inp.sampler.next()]
        out = inp.pool.map(lambda i: inp.worker.sample(i, problems, 0), range(len(inp.policies)))  # policies in threads
        return {n: o[0] for n, o in zip(inp.policies, out)}, {n: o[1] for n, o in zip(inp.policies, out)}


class DynamicSampling:
    def __init__(self, cfg):
        self.cfg = cfg
        fg = cfg.algo.filter_groups
        self.metric, self.max_rounds = fg.metric, int(fg.max_num_gen_batches)

    def prompts_at(self, inp: CollectInputs, step: int) -> list | None:
        """Unknown in advance: a step draws as many batches as its groups need."""
        return None

    def collect(self, inp: CollectInputs):
        B = self.cfg.data.prompt_batch
        names = list(inp.policies)
        kept = {n: [] for n in names}
        count = {n: 0 for n in names}
        evicted = {n: 0 for n in names}
        times = {n: {"time/rollout": 0.0, "time/reward": 0.0} for n in names}
        rounds = consumed = 0
        while True:
            problems = [inp.problems[i] for i in inp.sampler.next()]
            consumed += len(problems)
            for i, name in enumerate(names):
                if count[name] >= B:
                    continue
                ps, t = inp.worker.sample(i, problems, rounds)
                for k, v in t.items():  # times and counts add up over the rounds
                    times[name][k] = times[name].get(k, 0) + v
                keep = informative_groups(ps.rewards, self.metric)
                evicted[name] += len(problems) - len(keep)
                kept[name].append((ps, keep))
                count[name] += len(keep)
            rounds += 1
            if all(count[n] >= B for n in names) or (self.max_rounds > 0 and rounds >= self.max_rounds):
                break
        steps, rows = {}, {}
        for n in names:
            steps[n] = cat_groups(kept[n], B)
            rows[n] = {**times[n], "filter_groups/rounds": rounds, "filter_groups/evicted_groups": evicted[n],
                       "filter_groups/discarded_surplus_groups": max(count[n] - B, 0),
                       "filter_groups/kept_groups": len(steps[n].problems), "filter_groups/prompts_consumed": consumed}
        return steps, rows


def collector_for(cfg):
    """The step's collector: :class:`DynamicSampling` where ``algo.filter_groups.enable`` (verl's switch), else
    :class:`SingleRound`."""
    return DynamicSampling(cfg) if cfg.algo.filter_groups.enable else SingleRound(cfg)


# ------------------------------------------------------------------------------------------- the collections
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
