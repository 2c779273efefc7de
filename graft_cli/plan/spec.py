"""Plan files and their expansion into runs.

A plan file (YAML) has these keys (all optional except ``runs``)::

    name: gate                      # the plan's name (default: the file name)
    description: ...
    pair: tiny                      # reproduce plans: the pair (ablate: --pair)
    seeds: [0]                      # default seeds of every entry
    steps: 40                       # run.steps of every run (null: the pair's run.epochs)
    overrides: {run.save_every: 10} # config overrides of every run (mapping or list of key=value)
    eval: {steps: last, runs: 2, samples: 4, benchmarks: null}   # how each run is evaluated
    jobs: 1                         # runs trained at the same time (worker processes)
    claims: {...}                   # reproduce plans: which runs the claims compare (report/claims.py)
    resources: {nodes: 1, gpus: 4, gpu: H200, gpu_gb: 141, cpus: 64, hours: 13.7, eval_hours: 0.9}  # per run
    slurm: {partition: gpu, account: ..., qos: ..., time: "24:00:00", extra: ["--mail-type=END"]}  # plan/slurm.py
    runs:
      - {name: grpo, method: grpo, seeds: [0, 1, 2]}
      - {name: graft-delta0p5, method: graft, overrides: {exchange.params.delta: 0.5}}
      - {name: graft_stored-a, method: graft_stored, partner: {run: grpo, policy: b}}
      - {name: hacpo, method: hacpo, pair: "2", resources: {gpus: 8}}

``pair`` (an entry's own pair) lets one plan span pairs (the GRAFT paper's Table 1 is pairs 1-3); such a run's
key is ``<pair>:<name>-s<seed>``. ``resources`` (:class:`Resources`; an entry's keys refine the plan's) are what
each run asks a scheduler for and what the plan's GPU-hours are computed from.

``partner`` (stored-trajectory GRAFT, graft.md §5): the run named ``run`` of this plan with the *same seed*
is the partner (``pair: P`` names the partner entry's own pair, default this entry's); its directory and
``policy`` become ``exchange.params.partner_run`` / ``partner_policy``, and the expansion orders it first.
An entry may repeat a name with other seeds or pairs (e.g. to run seed 0 of everything before seeds 1-2);
(pair, name, seed) must be unique and repeated names must agree on method, overrides and eval (and on the
partner within a pair).

A run's directory is ``<out>/<pair>-<name>-s<seed>`` (``run.name`` = ``<pair>-<name>-s<seed>``), the same
name ``graft train --pair P --method M --seed S`` uses when ``name`` equals the method, so runs are shared
between plans writing into one folder (e.g. full GRAFT between the gate and threshold sweeps).

Sweep files (``experiments/sweep/``) usually list runs only; their per-pair settings (steps, eval,
overrides) come from ``experiments/sweep/_pairs.yaml`` (:func:`load_sweep`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from graft_cli.config import EXPERIMENTS_DIR
from graft_cli.errors import GraftError
from graft_cli.eval.setup import parse_bench_runs

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
EVAL_KEYS = ("steps", "runs", "bench_runs", "samples", "benchmarks", "temperature", "top_p", "top_k", "max_new_tokens",
             "seed")
PLAN_KEYS = ("name", "description", "pair", "seeds", "steps", "overrides", "eval", "jobs", "claims", "runs",
             "resources", "slurm", "analysis")
INTERVAL_RULES = ("paired_t", "floored_t")  # the claims' interval rules (graft_cli/report/power.py)
SPENDING = ("obrien_fleming", "pocock")  # alpha-spending functions of a sequential design (report/sequential.py)
ANALYSIS_KEYS = ("interval", "alpha", "sequential", "reading")
RUN_KEYS = ("name", "method", "seeds", "overrides", "partner", "note", "eval", "pair", "resources")
LAUNCH_MODES = ("auto", "torchrun", "direct")


@dataclass
class EvalPlan:
    """How each run of a plan is evaluated (``graft eval --run DIR`` options)."""
    steps: str = "last"  # last | best | all | "10,20"
    runs: int = 5
    samples: int | None = None  # None: the run's eval.samples (8)
    benchmarks: list | None = None  # None: the five (tiny pair: its five synthetic sets)
    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    seed: int | None = None
    enabled: bool = True
    top_k: int | None = None  # None: the run's eval.final.top_k / eval.top_k (0 = off)
    bench_runs: dict | None = None  # benchmark -> runs where it differs from ``runs`` (graft eval --bench-runs)

    def kwargs(self) -> dict:
        return {"steps": self.steps, "runs": self.runs, "bench_runs": self.bench_runs, "samples": self.samples,
                "benchmarks": ",".join(self.benchmarks) if self.benchmarks else None,
                "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "max_new_tokens": self.max_new_tokens, "seed": self.seed}


@dataclass(frozen=True)
class Resources:
    """What one run of a plan asks a scheduler for, and the hours it is expected to take (for GPU-hours)."""
    nodes: int = 1
    gpus: int = 0  # GPUs per node
    gpu: str = ""  # the GPU the plan was sized for (a label: "H200")
    gpu_gb: float | None = None  # its memory (GB), for the fit check against benchmarks/plan_resources.py
    cpus: int = 1  # CPU cores per node
    mem: str | None = None  # memory per node (sbatch --mem), None: the partition's default
    hours: float | None = None  # expected wall-clock hours of the training job
    eval_gpus: int | None = None  # GPUs of the evaluation job (None: ``gpus``)
    eval_hours: float | None = None  # expected wall-clock hours of the evaluation job
    launch: str = "auto"  # auto: torchrun when the run spans more than one GPU, else one process; torchrun; direct

    @property
    def eval_gpu_count(self) -> int:
        return self.gpus if self.eval_gpus is None else self.eval_gpus

    def train_gpu_hours(self) -> float:
        return self.nodes * self.gpus * (self.hours or 0.0)

    def eval_gpu_hours(self) -> float:
        return self.eval_gpu_count * (self.eval_hours or 0.0)

    def uses_torchrun(self) -> bool:
        return self.launch == "torchrun" or (self.launch == "auto" and self.nodes * self.gpus > 1)

    def label(self) -> str:
        gpus = f"{self.nodes}x{self.gpus} {self.gpu or 'GPU'}" if self.gpus else f"{self.nodes} node, {self.cpus} CPU"
        return gpus + (f", {self.hours:g} h" if self.hours is not None else "") + (
            f" + eval {self.eval_gpu_count} GPU x {self.eval_hours:g} h" if self.eval_hours is not None else "")


RESOURCE_KEYS = tuple(Resources.__dataclass_fields__)


def parse_resources(raw, base: Resources | None = None, where: str = "resources") -> Resources:
    """A ``resources:`` mapping over ``base`` (keys: :data:`RESOURCE_KEYS`)."""
    base = base or Resources()
    if raw is None:
        return base
    if not isinstance(raw, dict):
        raise GraftError(f"{where}: must be a mapping (keys {', '.join(RESOURCE_KEYS)})")
    vals = {k: getattr(base, k) for k in RESOURCE_KEYS}
    for k, v in raw.items():
        if k not in RESOURCE_KEYS:
            raise GraftError(f"{where}: unknown key {k!r}; known: {', '.join(RESOURCE_KEYS)}")
        vals[k] = v
    for k in ("nodes", "gpus", "cpus", "eval_gpus"):
        v = vals[k]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < (1 if k in ("nodes", "cpus")
                                                                                    else 0)):
            raise GraftError(f"{where}.{k}: must be an integer >= {1 if k in ('nodes', 'cpus') else 0}, got {v!r}")
    for k in ("hours", "eval_hours", "gpu_gb"):
        v = vals[k]
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
            raise GraftError(f"{where}.{k}: must be a positive number, got {v!r}")
    if vals["launch"] not in LAUNCH_MODES:
        raise GraftError(f"{where}.launch: {vals['launch']!r}; known: {', '.join(LAUNCH_MODES)}")
    vals["gpu"] = str(vals["gpu"] or "")
    vals["mem"] = None if vals["mem"] is None else str(vals["mem"])
    return Resources(**vals)


@dataclass(frozen=True)
class PlanRun:
    """One training run of a plan."""
    name: str  # the entry's name (e.g. "graft", "graft-delta0p5", "graft_stored-a")
    method: str
    seed: int
    overrides: tuple = ()  # key=value strings of this entry
    partner: tuple | None = None  # (partner entry name, partner policy, partner's own pair or None): same seed
    note: str = ""
    eval_over: tuple = ()  # (key, value) pairs of the entry's `eval:` mapping, refining the plan's eval
    pair: str | None = None  # the entry's own pair (None: the plan's)
    resources: tuple = ()  # (key, value) pairs of the entry's `resources:` mapping, refining the plan's

    @property
    def key(self) -> str:
        return run_key(self.name, self.seed, self.pair)

    def partner_key(self) -> str | None:
        if not self.partner:
            return None
        ppair = self.partner[2] if len(self.partner) > 2 and self.partner[2] is not None else self.pair
        return run_key(self.partner[0], self.seed, ppair)


def run_key(name: str, seed: int, pair: str | None = None) -> str:
    """``name-sSEED``, prefixed with ``pair:`` for an entry that names its own pair."""
    return f"{pair}:{name}-s{seed}" if pair is not None else f"{name}-s{seed}"


@dataclass
class Plan:
    name: str
    pair: str
    runs: list  # [PlanRun] in execution order (partners first)
    steps: int | None = None
    overrides: list = field(default_factory=list)
    eval: EvalPlan = field(default_factory=EvalPlan)
    jobs: int = 1
    claims: dict = field(default_factory=dict)
    description: str = ""
    source: str = ""
    resources: Resources = field(default_factory=Resources)
    slurm: dict = field(default_factory=dict)  # the plan's `slurm:` section (graft_cli/plan/slurm.py)
    analysis: dict = field(default_factory=lambda: parse_analysis(None))  # interval rule, sequential looks, reading

    def eval_for(self, r: PlanRun) -> EvalPlan:
        """How run ``r`` is evaluated: the plan's ``eval`` refined by the entry's own ``eval:`` keys."""
        if not r.eval_over:
            return self.eval
        return parse_eval({k: (list(v) if isinstance(v, tuple) else v) for k, v in r.eval_over}, base=self.eval)

    def resources_for(self, r: PlanRun) -> Resources:
        """What run ``r`` asks for: the plan's ``resources`` refined by the entry's own keys."""
        return parse_resources(dict(r.resources), base=self.resources) if r.resources else self.resources

    def gpu_hours(self) -> tuple[float, float]:
        """(training, evaluation) GPU-hours of every run of the plan: Σ nodes·gpus·hours, Σ eval_gpus·eval_hours."""
        res = [self.resources_for(r) for r in self.runs]
        return sum(x.train_gpu_hours() for x in res), sum(x.eval_gpu_hours() for x in res)

    def run_pair(self, r: PlanRun) -> str:
        return r.pair if r.pair is not None else self.pair

    def run_name(self, r: PlanRun) -> str:
        return f"{self.run_pair(r)}-{r.name}-s{r.seed}"

    def run_dir(self, r: PlanRun, out: str) -> str:
        return os.path.join(out, self.run_name(r))

    def by_key(self) -> dict:
        return {r.key: r for r in self.runs}

    def compose_overrides(self, r: PlanRun, out: str, steps: int | None = None) -> list[str]:
        """The ``compose()`` overrides of run ``r`` writing into ``out`` (plan, then entry, then partner)."""
        ov = [f"pair={self.run_pair(r)}", f"method={r.method}", f"run.out={out}", f"run.name={self.run_name(r)}",
              f"run.seed={r.seed}"]
        steps = self.steps if steps is None else steps
        if steps is not None:
            ov.append(f"run.steps={steps}")
        return ov + self.entry_overrides(r, out)

    def entry_overrides(self, r: PlanRun, out: str) -> list[str]:
        """The overrides of run ``r`` past its pair, method, folder, name, seed and steps: the plan's, the entry's,
        then its partner's run directory and policy."""
        ov = list(self.overrides) + list(r.overrides)
        if r.partner:
            partner = self.by_key().get(r.partner_key())
            if partner is None:
                raise GraftError(f"plan {self.name}: run {r.key}: partner run {r.partner_key()} is not in the plan")
            ov += [f"exchange.params.partner_run={self.run_dir(partner, out)}",
                   f"exchange.params.partner_policy={r.partner[1]}"]
        return ov


# --------------------------------------------------------------------------------------------- parsing
def _override_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float, str)):
        return str(v)
    return json.dumps(v)


def parse_overrides(raw, where: str) -> list[str]:
    """A mapping ``{key: value}`` or a list of ``key=value`` strings -> ``["key=value", ...]``."""
    if raw is None:
        return []
    if isinstance(raw, dict):
        return [f"{k}={_override_value(v)}" for k, v in raw.items()]
    if isinstance(raw, (list, tuple)):
        out = []
        for x in raw:
            if not isinstance(x, str) or "=" not in x:
                raise GraftError(f"{where}: override {x!r}: expected key=value")
            out.append(x)
        return out
    raise GraftError(f"{where}: overrides must be a mapping or a list of key=value, got {type(raw).__name__}")


def parse_seeds(raw, where: str) -> list[int]:
    if raw is None:
        return [0]
    if isinstance(raw, (int, str)):
        raw = [raw]
    try:
        seeds = [int(s) for x in raw for s in str(x).replace(",", " ").split()]
    except (TypeError, ValueError):
        raise GraftError(f"{where}: seeds must be integers, got {raw!r}") from None
    if not seeds:
        raise GraftError(f"{where}: no seeds")
    if len(set(seeds)) != len(seeds):
        raise GraftError(f"{where}: seed listed twice in {seeds}")
    return seeds


def parse_eval(raw, base: EvalPlan | None = None, where: str = "eval") -> EvalPlan:
    ev = EvalPlan(**{k: getattr(base, k) for k in EvalPlan.__dataclass_fields__}) if base else EvalPlan()
    if raw is None:
        return ev
    if raw is False:
        ev.enabled = False
        return ev
    if not isinstance(raw, dict):
        raise GraftError(f"{where}: must be a mapping (keys {', '.join(EVAL_KEYS)}) or false")
    for k, v in raw.items():
        if k == "enabled":
            ev.enabled = bool(v)
        elif k in EVAL_KEYS:
            if k == "steps":
                v = "last" if v is None else str(v)
            if k == "benchmarks" and v is not None:
                v = [x.strip() for x in v.split(",")] if isinstance(v, str) else [str(x) for x in v]
            if k == "bench_runs" and v is not None:
                v = parse_bench_runs(v, f"{where}.bench_runs")
            setattr(ev, k, v)
        else:
            raise GraftError(f"{where}: unknown key {k!r}; known: {', '.join(EVAL_KEYS)}, enabled")
    if ev.runs is None or int(ev.runs) < 1:
        raise GraftError(f"{where}.runs: must be >= 1")
    return ev


def read_yaml(path: str) -> dict:
    if not os.path.exists(path):
        raise GraftError(f"{path}: plan file not found")
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
        raise GraftError(f"{path}: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise GraftError(f"{path}: a plan file is a mapping")
    return raw


def build_plan(raw: dict, pair: str | None = None, source: str = "", seeds=None, steps: int | None = None) -> Plan:
    """Expand a plan mapping (see the module docstring) into a :class:`Plan`. ``pair``/``seeds``/``steps``
    (command-line options) win over the file's."""
    where = source or "plan"
    unknown = sorted(set(raw) - set(PLAN_KEYS))
    if unknown:
        raise GraftError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(PLAN_KEYS)}")
    pair = str(pair if pair is not None else raw.get("pair", "tiny"))
    name = str(raw.get("name") or os.path.splitext(os.path.basename(source))[0] or "plan")
    default_seeds = parse_seeds(seeds, "--seeds") if seeds else parse_seeds(raw.get("seeds"), f"{where}: seeds")
    plan_steps = steps if steps is not None else raw.get("steps")
    if plan_steps is not None and (not isinstance(plan_steps, int) or plan_steps < 1):
        raise GraftError(f"{where}: steps must be a positive integer or null, got {plan_steps!r}")
    jobs = int(raw.get("jobs") or 1)
    if jobs < 1:
        raise GraftError(f"{where}: jobs must be >= 1")
    entries = raw.get("runs")
    if not isinstance(entries, list) or not entries:
        raise GraftError(f"{where}: 'runs' must be a non-empty list")
    expanded: list[PlanRun] = []
    seen: dict[str, PlanRun] = {}
    dirs: set[str] = set()
    plan_res = parse_resources(raw.get("resources"), where=f"{where}: resources")
    slurm = raw.get("slurm") or {}
    if not isinstance(slurm, dict):
        raise GraftError(f"{where}: slurm must be a mapping")
    for i, e in enumerate(entries):
        w = f"{where}: runs[{i}]"
        for r in _entry_runs(e, w, plan_res, default_seeds, bool(seeds)):
            dir_name = f"{r.pair if r.pair is not None else pair}-{r.name}-s{r.seed}"
            if r.key in seen or dir_name in dirs:
                raise GraftError(f"{w}: run {r.name!r} seed {r.seed} is listed twice")
            dirs.add(dir_name)
            # a name means one configuration: the same method/overrides/eval everywhere, the same partner per pair
            for x in (x for x in seen.values() if x.name == r.name):
                if (x.method, x.overrides, x.eval_over) != (r.method, r.overrides, r.eval_over) or (
                        x.pair == r.pair and x.partner != r.partner):
                    raise GraftError(f"{w}: run name {r.name!r} is used with different method/overrides/partner/eval")
            seen[r.key] = r
            expanded.append(r)
    ordered = order_runs(expanded, where)
    ev = parse_eval(raw.get("eval"), where=f"{where}: eval")
    per_arm: dict = {}
    for r in ordered:
        per_arm[r.name] = per_arm.get(r.name, 0) + 1
    analysis = parse_analysis(raw.get("analysis"), f"{where}: analysis", max(per_arm.values()))
    return Plan(name=name, pair=pair, runs=ordered, steps=plan_steps,
                overrides=parse_overrides(raw.get("overrides"), f"{where}: overrides"), eval=ev, jobs=jobs,
                claims=dict(raw.get("claims") or {}), description=str(raw.get("description") or ""), source=source,
                resources=plan_res, slurm=dict(slurm), analysis=analysis)


def parse_analysis(raw, where: str = "analysis", max_seeds: int | None = None) -> dict:
    """The plan's ``analysis`` section checked (one line naming the key) with its defaults filled in."""
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise GraftError(f"{where}: must be a mapping (keys {', '.join(ANALYSIS_KEYS)})")
    bad = sorted(set(raw) - set(ANALYSIS_KEYS))
    if bad:
        raise GraftError(f"{where}: unknown key {bad[0]!r}; known: {', '.join(ANALYSIS_KEYS)}")
    rule = str(raw.get("interval", "paired_t"))
    if rule not in INTERVAL_RULES:
        raise GraftError(f"{where}.interval: {rule!r}; known: {', '.join(INTERVAL_RULES)}")
    alpha = raw.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise GraftError(f"{where}.alpha: must be a number in (0, 1), got {alpha!r}")
    seq = raw.get("sequential")
    if seq is not None:
        if not isinstance(seq, dict) or set(seq) - {"spending", "looks"} or "looks" not in seq:
            raise GraftError(f"{where}.sequential: must be {{spending: {'|'.join(SPENDING)}, looks: [n_1, ...]}}")
        spending = str(seq.get("spending", "obrien_fleming"))
        if spending not in SPENDING:
            raise GraftError(f"{where}.sequential.spending: {spending!r}; known: {', '.join(SPENDING)}")
        looks = seq["looks"]
        if (not isinstance(looks, list) or not looks or any(isinstance(n, bool) or not isinstance(n, int) or n < 2
                                                             for n in looks)
                or any(b <= a for a, b in zip(looks, looks[1:]))):
            raise GraftError(f"{where}.sequential.looks: increasing seed counts >= 2, got {looks!r}")
        if max_seeds is not None and looks[-1] != max_seeds:
            raise GraftError(f"{where}.sequential.looks: the last look ({looks[-1]}) must be the plan's seeds per "
                             f"arm ({max_seeds})")
        seq = {"spending": spending, "looks": list(looks)}
    return {"interval": rule, "alpha": float(alpha), "sequential": seq, "reading": str(raw.get("reading") or "")}


def _entry_runs(e, w: str, plan_res, default_seeds: list, cli_seeds: bool) -> list[PlanRun]:
    """One ``runs:`` entry checked (its keys, name, overrides, partner, pair, resources, eval) and expanded into a
    run per seed (command-line seeds replace every entry's; else the entry's, else the plan's)."""
    if not isinstance(e, dict):
        raise GraftError(f"{w}: expected a mapping with name and method")
    bad = sorted(set(e) - set(RUN_KEYS))
    if bad:
        raise GraftError(f"{w}: unknown key {bad[0]!r}; known: {', '.join(RUN_KEYS)}")
    rname = str(e.get("name") or e.get("method") or "")
    method = str(e.get("method") or rname)
    if not rname or not NAME_RE.match(rname):
        raise GraftError(f"{w}: name {rname!r}: letters, digits, '_', '-', '.' only")
    ov = tuple(parse_overrides(e.get("overrides"), w))
    partner = None
    if e.get("partner") is not None:
        p = e["partner"]
        if not isinstance(p, dict) or "run" not in p or "policy" not in p or set(p) - {"run", "policy", "pair"}:
            raise GraftError(f"{w}: partner must be {{run: NAME, policy: POLICY}} (and optionally pair: P)")
        partner = (str(p["run"]), str(p["policy"]), None if p.get("pair") is None else str(p["pair"]))
    entry_pair = None if e.get("pair") is None else str(e["pair"])
    res_raw = e.get("resources")
    parse_resources(res_raw, base=plan_res, where=f"{w}: resources")  # validated here, applied per run
    res_over = tuple((res_raw or {}).items())
    run_seeds = default_seeds if cli_seeds else (parse_seeds(e["seeds"], f"{w}: seeds") if "seeds" in e
                                                 else default_seeds)
    ev_raw = e.get("eval")
    if ev_raw is not None:
        if not isinstance(ev_raw, dict):
            raise GraftError(f"{w}: eval must be a mapping (keys {', '.join(EVAL_KEYS)})")
        parse_eval(ev_raw, where=f"{w}: eval")  # validated here, applied on top of the plan's eval
    ev_over = tuple((str(k), tuple(v) if isinstance(v, list) else v) for k, v in (ev_raw or {}).items())
    return [PlanRun(rname, method, s, ov, partner, str(e.get("note") or ""), ev_over, entry_pair, res_over)
            for s in run_seeds]


def order_runs(runs: list[PlanRun], where: str = "plan") -> list[PlanRun]:
    """File order, except that every run comes after its partner (a stable topological sort)."""
    keys = {r.key for r in runs}
    for r in runs:
        if r.partner and r.partner_key() not in keys:
            raise GraftError(f"{where}: run {r.key}: partner {r.partner[0]!r} has no run with seed {r.seed} "
                             f"in the plan" + (f" (key {r.partner_key()})" if ":" in r.partner_key() else ""))
        if r.partner and r.partner_key() == r.key:
            raise GraftError(f"{where}: run {r.key} is its own partner")
    placed: list[PlanRun] = []
    done: set[str] = set()
    pending = list(runs)
    while pending:
        for i, r in enumerate(pending):
            if not r.partner or r.partner_key() in done:
                placed.append(r)
                done.add(r.key)
                del pending[i]
                break
        else:
            raise GraftError(f"{where}: partner cycle among {', '.join(r.key for r in pending)}")
    return placed


# ------------------------------------------------------------------------------------------ locating
def sweep_dir() -> str:
    return os.path.join(EXPERIMENTS_DIR, "sweep")


def reproduce_dir() -> str:
    return os.path.join(EXPERIMENTS_DIR, "reproduce")


def known(folder: str) -> list[str]:
    if not os.path.isdir(folder):
        return []
    return sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".yaml") and not f.startswith("_"))


def _plan_path(name: str, folder: str, what: str) -> str:
    if name.endswith(".yaml") or os.path.sep in name:
        return name
    path = os.path.join(folder, f"{name}.yaml")
    if not os.path.exists(path):
        raise GraftError(f"{what} {name!r}: no {os.path.relpath(path, EXPERIMENTS_DIR)}; known: "
                         f"{', '.join(known(folder)) or 'none'}")
    return path


def pair_settings(pair: str) -> dict:
    """Per-pair settings of sweeps (``experiments/sweep/_pairs.yaml``): the pair's entry, else ``default``. An
    entry ``{plan: reproduce/<file>.yaml}`` takes steps/overrides/eval/jobs from that reproduction plan."""
    path = os.path.join(sweep_dir(), "_pairs.yaml")
    raw = read_yaml(path) if os.path.exists(path) else {}
    entry = raw.get(str(pair), raw.get("default")) or {}
    if not isinstance(entry, dict):
        raise GraftError(f"{path}: entry {pair!r} must be a mapping")
    entry = dict(entry)
    if "plan" in entry:
        ref = read_yaml(os.path.join(EXPERIMENTS_DIR, entry.pop("plan")))
        entry = {**{k: ref[k] for k in ("steps", "overrides", "eval", "jobs") if k in ref}, **entry}
    return entry


def load_sweep(name: str, pair: str = "tiny", seeds=None, steps: int | None = None) -> Plan:
    """``experiments/sweep/<name>.yaml`` (or a path) over the pair's settings from ``_pairs.yaml``."""
    path = _plan_path(name, sweep_dir(), "sweep")
    raw = read_yaml(path)
    base = pair_settings(pair)
    merged = {**{k: v for k, v in base.items() if k in PLAN_KEYS}, **raw}
    if "eval" in raw and "eval" in base:  # a sweep's eval keys refine the pair's
        merged["eval"] = {**(base["eval"] or {}), **(raw["eval"] or {})}
    if "overrides" in raw and "overrides" in base:
        merged["overrides"] = (parse_overrides(base["overrides"], "_pairs.yaml")
                               + parse_overrides(raw["overrides"], path))
    merged.pop("pair", None)
    return build_plan(merged, pair=pair, source=path, seeds=seeds, steps=steps)


def load_reproduce(pair: str = "tiny", steps: int | None = None) -> Plan:
    """``experiments/reproduce/<pair>.yaml`` (or a path)."""
    path = _plan_path(pair, reproduce_dir(), "reproduction plan")
    raw = read_yaml(path)
    return build_plan(raw, pair=raw.get("pair", pair), source=path, steps=steps)
