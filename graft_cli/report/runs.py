"""The runs a report reads: each run directory's identity (its method *variant*, read from the
resolved settings in ``config.yaml``: :func:`identify`), pair, seed, metrics and, per policy, the
eval summary of its selected step (:class:`Run`, :class:`PolicyResult`); the method names and the
groups of methods the tables compare."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import yaml

from graft_cli.algorithms.exchange.base import exchange_params
from graft_cli.algorithms.exchange.graft import gate_floor
from graft_cli.config import EXPERIMENTS_DIR, asdict, compose
from graft_cli.config.resolve import rename_older
from graft_cli.errors import GraftError
from graft_cli.eval.benchmarks import BENCHMARKS, FIVE
from graft_cli.eval.files import step_dirs
from graft_cli.eval.summary import select_best
from graft_cli.report import paper_numbers as P
from graft_cli.rundir import EVAL, best_path, config_path, read_json, read_metrics

METHOD_NAMES = {
    "grpo": "GRPO n=8", "grpo_n16": "GRPO n=16", "grpo_n32": "GRPO n=32", "grpo_dapo": "GRPO n=8 + Dynamic Sampling",
    "hacpo": "HACPO", "sgt": "SGT", "grpo_kl": "KL-Reg GRPO", "graft": "GRAFT", "graft_stored": "GRAFT w/ stored traj.",
    "graft_nogate": "w/o compat gate (w=1)", "graft_nofloor": "w/o floor (δ=0)",
    "graft_nobalance": "w/o balanced exchange", "graft_seqratio": "w/o token-level ratio (seq-level)",
    "graft_randprompts": "random prompts", "graft_randadmit": "random admission", "graft_first": "peer first",
    "graft_uniform": "peer uniform", "graft_pooled": "pooled with receiver group",
    "graft_successonly": "success-only", "graft_successonly_nofloor": "success-only + w/o floor",
    "graft_hacpo_update": "HACPO update + GRAFT which", "graft_sft_update": "SFT update (SGT + GRAFT which)",
    "graft_luffy": "LUFFY update", "graft_delta0p7": "δ = 0.7", "graft_delta0p9": "δ = 0.9",
}
T1_METHODS = ("grpo", "grpo_n16", "grpo_n32", "grpo_dapo", "hacpo", "sgt", "graft")
ABLATIONS = ("graft", "graft_nogate", "graft_nofloor", "graft_nobalance", "graft_seqratio", "graft_randprompts",
             "graft_randadmit", "graft_first", "graft_uniform", "graft_pooled", "grpo")
SWEEP = ("graft_nofloor", "graft_delta0p7", "graft", "graft_delta0p9")  # Table 7's δ variants (:func:`method_delta`)
DESIGNS = ("graft", "graft_pooled", "graft_successonly", "graft_successonly_nofloor", "graft_hacpo_update",
           "graft_sft_update", "graft_luffy", "hacpo", "sgt")
ORDERINGS = ("first", "uniform", "last")
SKIP_DIRS = {"checkpoints", "eval", "rollouts", "best", "complementarity", "plots"}


# ------------------------------------------------------------------------------------------ model
@dataclass
class PolicyResult:
    policy: str
    model: str
    key: str  # identity across runs: the paper's model key or the model string
    step: int | None
    num_runs: int
    benchmarks: dict  # name -> (mean %, std % or None); math (every non-code) benchmarks
    avg: tuple  # (mean %, std % or None) over the math benchmarks; (None, None) when only code was scored
    code: dict = field(default_factory=dict)  # code benchmark -> (mean %, std % or None)
    code_avg: tuple = (None, None)


@dataclass
class Run:
    path: str
    name: str
    method: str
    variant: str
    pair: str
    seed: int
    exchange: str
    ordering: str
    policies: list  # [{"name", "model", "key"}]
    base: str = ""  # the method config the run's settings equal (identify); variant = base + residual
    residual: list = field(default_factory=list)  # [(key, value)] settings still differing from base
    metrics: list = field(default_factory=list)
    evals: dict = field(default_factory=dict)  # policy -> {step: summary}
    best: dict = field(default_factory=dict)  # policy -> step
    results: dict = field(default_factory=dict)  # policy -> PolicyResult
    planned_steps: int | None = None  # run.steps of its config

    @property
    def last_step(self) -> int:
        """The last step with a row in metrics.jsonl (0: none)."""
        return max((int(r.get("step", 0)) for r in self.train_rows()), default=0)

    @property
    def finished(self) -> bool:
        """Every planned step trained."""
        return self.planned_steps is None or self.last_step >= self.planned_steps

    @property
    def online(self) -> bool:
        return self.exchange not in ("", "none") and len(self.policies) >= 2

    def train_rows(self) -> list[dict]:
        return [r for r in self.metrics if "time/step" in r]

    def policy(self, name: str) -> dict:
        return next(p for p in self.policies if p["name"] == name)


# ---------------------------------------------------------------------------------------- loading
def find_dirs(paths: list[str]) -> tuple[list[str], list[str]]:
    """Run directories and standalone eval folders under ``paths`` (searched three levels deep)."""
    runs, evals = [], []

    def visit(d: str, depth: int):
        if os.path.exists(config_path(d)):
            runs.append(d)
            return
        if os.path.exists(os.path.join(d, "summary.json")) and os.path.exists(os.path.join(d, "meta.json")):
            evals.append(d)
            return
        if depth <= 0:
            return
        try:
            subs = sorted(os.listdir(d))
        except OSError:
            return
        for s in subs:
            p = os.path.join(d, s)
            if os.path.isdir(p) and s not in SKIP_DIRS and not s.startswith("."):
                visit(p, depth - 1)

    for p in paths:
        if not os.path.isdir(p):
            raise GraftError(f"{p}: not a directory")
        visit(p.rstrip("/"), 3)
    return runs, evals


# ------------------------------------------------------------------------------------ run identity
# A run's variant is read from its resolved settings (config.yaml), not from its method name: `graft` with
# `exchange.params.delta=0.0` *is* `graft_nofloor`, `graft` with `exchange.ordering=first` is `graft_first`, and
# `graft_nofloor` with `delta=0.8` is full GRAFT. The settings compared are every key some method config sets
# (experiments/method/*.yaml, their defaults chains merged); each candidate method's value is its composed config
# for the run's pair (`compose(pair=P, method=M)`), so the pair's own settings count as they do in training.
# keys some method sets that are the run's set-up rather than its design (which models, batch shape, evaluation):
# not compared (the design keys tell every method apart: a reference model is algo.reference, a teacher
# algo.token_advantages, a junior rollout.engine) and never in a label
SETUP_KEYS = ("policies", "data.", "eval.", "run.", "algo.minibatch_prompts")
# keys no method config sets that still change what a step trains on: compared, and in a label where
# they differ (GRAFT at run.staleness=1 is `graft[run.staleness=1]`)
DESIGN_KEYS = ("run.staleness",)
_MISSING = object()
_COMPOSED: dict = {}  # (experiments dir, pair, method) -> composed config (asdict), or None when it fails
_METHOD_FILES: dict = {}  # experiments dir -> {method: flattened settings of its file chain (raw values)}


def _flatten(d, prefix: str = "", out: dict | None = None) -> dict:
    """Nested mapping -> {dotted key: leaf}; lists are leaves, empty mappings contribute nothing."""
    out = {} if out is None else out
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            _flatten(v, key + ".", out)
        else:
            out[key] = v
    return out


def _method_files(exp_dir: str | None = None) -> dict:
    """Each method config's own settings: its file merged over its ``defaults`` chain (values as
    written, interpolations kept as strings), flattened, ``method`` left out; with the chain's depth
    (0: no parent). Returns {method: (settings, depth)}."""

    exp_dir = exp_dir or EXPERIMENTS_DIR
    if exp_dir in _METHOD_FILES:
        return _METHOD_FILES[exp_dir]
    folder = os.path.join(exp_dir, "method")
    raw: dict = {}
    for f in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if f.endswith(".yaml") and not f.startswith("_"):
            try:
                with open(os.path.join(folder, f), encoding="utf-8") as fh:
                    raw[f[:-5]] = yaml.safe_load(fh) or {}
            except (OSError, yaml.YAMLError):
                continue

    def merged(name: str, seen: tuple = ()) -> tuple[dict, int]:
        d = raw.get(name) or {}
        out: dict = {}
        depth = 0
        for dep in d.get("defaults") or []:
            if isinstance(dep, str) and dep != "_self_" and dep in raw and dep not in seen:
                sub, sub_depth = merged(dep, seen + (name,))
                out.update(sub)
                depth = max(depth, sub_depth + 1)
        out.update(_flatten({k: v for k, v in d.items() if k not in ("defaults", "method")}))
        return out, depth

    _METHOD_FILES[exp_dir] = {m: merged(m) for m in raw}
    return _METHOD_FILES[exp_dir]


def method_delta(method: str, exp_dir: str | None = None) -> float | None:
    """The gate floor δ of method config ``method``: the ``exchange.params`` its file sets (over its
    ``defaults`` chain) with its exchange's registered defaults filled in; None for a method with no
    file here or no GRAFT exchange."""
    files = _method_files(exp_dir)
    if method not in files:
        return None
    flat = files[method][0]
    pre = "exchange.params."
    return gate_floor(exchange_params({"name": flat.get("exchange.name"),
                                       "params": {k[len(pre):]: v for k, v in flat.items() if k.startswith(pre)}}))


def composed_config(pair: str, method: str, exp_dir: str | None = None) -> dict | None:
    """``asdict(compose(pair=P, method=M))`` (cached per experiments folder, pair and method); None
    when it does not compose (an unknown pair or method; a method that needs a key only its runs
    set, e.g. graft_stored's partner)."""

    key = (exp_dir or EXPERIMENTS_DIR, str(pair), str(method))
    if key not in _COMPOSED:
        try:
            _COMPOSED[key] = asdict(compose([f"pair={pair}", f"method={method}"], config_dir=key[0]))
        except Exception:  # a run made elsewhere (pair/method configs not here): named as written
            _COMPOSED[key] = None
    return _COMPOSED[key]


def _composed(pair: str, method: str, exp_dir: str | None = None) -> dict | None:
    d = composed_config(pair, method, exp_dir)
    return None if d is None else _flatten(d)


def _setup(k: str) -> bool:
    return any(k == s or k.startswith(s) for s in SETUP_KEYS)


def _label_key(k: str) -> str:
    if k.startswith("exchange.params."):
        return k[len("exchange.params."):]
    return "ordering" if k == "exchange.ordering" else k


def _label_value(v) -> str:
    if v is _MISSING:
        return "unset"
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, dict)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def identify(raw: dict, exp_dir: str | None = None) -> tuple[str, list[tuple[str, str]]]:
    """``(variant, residual)`` of a run's config mapping: the method config whose composed settings
    are nearest the run's, and the (key, value) settings in which the run still differs from it. A
    function of the settings, not of the method name the run was started with.

    Compared: every key some method config sets, except the set-up keys (``SETUP_KEYS``), and
    ``DESIGN_KEYS``. With ``Δ_M`` the compared keys where the run differs from ``compose(pair, M)``,
    the variant is the ``M`` with the smallest ``Δ_M``; on ties the more general config (fewer
    ``defaults`` levels: ``graft`` before ``graft_nofloor``), then the name. Only methods whose own
    file settings could reach the best so far are composed (``Δ_M`` holds every key the file sets
    and the run does not have). Keys a hand-written config.yaml lacks take the run's method's value;
    a run whose pair or method is not here is named by its method."""
    method = str(raw.get("method", "?"))
    pair = str(raw.get("pair", "?"))
    files = _method_files(exp_dir)
    own = _composed(pair, method, exp_dir) if method in files else None
    if own is None:
        return method, []
    keys = sorted({k for f, _ in files.values() for k in f if not _setup(k)} | set(DESIGN_KEYS))
    run = dict(own)
    run.update(rename_older(_flatten({k: v for k, v in raw.items() if k != "method"})))

    def delta(ref: dict) -> set:
        return {k for k in keys if run.get(k, _MISSING) != ref.get(k, _MISSING)}

    d_own = delta(own)
    best = (len(d_own), files[method][1], method, d_own)
    for m, (fset, depth) in sorted(files.items()):
        if m == method:
            continue
        bound = sum(run.get(k, _MISSING) != v for k, v in fset.items()
                    if not _setup(k) and not (isinstance(v, str) and "${" in v))
        if (bound, depth, m) >= best[:3]:
            continue
        ref = _composed(pair, m, exp_dir)
        if ref is None:
            continue
        d = delta(ref)
        if (len(d), depth, m) < best[:3]:
            best = (len(d), depth, m, d)
    _, _, variant, d = best
    residual = [(_label_key(k), _label_value(run.get(k, _MISSING))) for k in sorted(d)]
    return variant, residual


def variant_label(base: str, residual) -> str:
    return f"{base}[{','.join(f'{k}={v}' for k, v in residual)}]" if residual else base


def _model_key(model: str) -> str:
    return P.model_key(model) or model


def pct(v):
    return None if v is None else 100.0 * v


def policy_result(run: Run, pol: dict) -> PolicyResult | None:
    steps = run.evals.get(pol["name"], {})
    if not steps:
        return None
    step = run.best.get(pol["name"])
    if step not in steps:
        table = {str(s): {"average_runs": v["average"]["runs"], "five": v["average"].get("five", False),
                          "benchmarks": v["benchmarks"]} for s, v in steps.items()}
        best = select_best(table)
        step = best["step"] if best else max(steps)
    s = steps[step]
    benches = {b: (pct(v["mean"]), pct(v["std"])) for b, v in s["benchmarks"].items() if not is_code(b, v)}
    code = {b: (pct(v["mean"]), pct(v["std"])) for b, v in s["benchmarks"].items() if is_code(b, v)}
    avg = (pct(s["average"]["mean"]), pct(s["average"]["std"]))
    code_avg = code_average(s)
    return PolicyResult(pol["name"], pol["model"], pol["key"], step, int(s.get("num_runs", 0)), benches,
                        avg if benches else (None, None), code, code_avg)


def is_code(name: str, v: dict) -> bool:
    return v.get("kind") == "code" or (name in BENCHMARKS and BENCHMARKS[name].kind == "code")


def code_average(summary: dict) -> tuple:
    """(mean %, std %) of a summary's code benchmarks: its ``code_average`` beside math ones, its
    ``average`` when it scored code only, else (None, None)."""
    b = summary["benchmarks"]
    if "code_average" in summary:
        a = summary["code_average"]
    elif b and all(is_code(k, v) for k, v in b.items()):
        a = summary["average"]
    else:
        return (None, None)
    return (pct(a["mean"]), pct(a["std"]))


def load_run(path: str, steps: dict | None = None) -> Run:
    """One run directory; ``steps`` (policy -> step) names the scored step of each policy where a
    plan fixed it (the step its claims judge), else the selected step (``best.json``)."""
    with open(config_path(path), encoding="utf-8") as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise GraftError(f"{path}/config.yaml: not a mapping")
    ex = raw.get("exchange") or {}
    pols = [{"name": str(p["name"]), "model": str(p.get("model", p["name"])),
             "key": _model_key(str(p.get("model", p["name"])))} for p in raw.get("policies") or []
            if "name" in p and p.get("role", "train") == "train"]  # frozen models are not the run's policies
    base, residual = identify(raw)
    run = Run(path=path, name=os.path.basename(path.rstrip("/")), method=str(raw.get("method", "?")),
              variant=variant_label(base, residual), base=base, residual=residual, pair=str(raw.get("pair", "?")),
              seed=int((raw.get("run") or {}).get("seed", 0)),
              exchange=str(ex.get("name", "none")), ordering=str(ex.get("ordering", "last")), policies=pols,
              planned_steps=(raw.get("run") or {}).get("steps"))
    run.metrics.extend(read_metrics(path))

    for p in pols:
        sd = step_dirs(os.path.join(path, EVAL, p["name"]))
        if sd:
            run.evals[p["name"]] = {s: read_json(os.path.join(d, "summary.json")) for s, d in sd.items()}
    bpath = best_path(path)
    if os.path.exists(bpath):
        run.best = {k: v["step"] for k, v in read_json(bpath).get("policies", {}).items()}
    run.best.update({str(k): int(v) for k, v in (steps or {}).items()})
    for p in pols:
        r = policy_result(run, p)
        if r is not None:
            run.results[p["name"]] = r
    return run


def shared_settings(runs: list[Run]) -> list[tuple[str, str]]:
    """Residual settings every run has, when the runs are of two or more variants: a plan-wide
    override (e.g. ``exchange.params.peer_logprobs=recompute`` on every run of a sweep) rather than
    one run's variant."""
    if len({r.base for r in runs}) < 2:
        return []
    common = set(runs[0].residual)
    for r in runs[1:]:
        common &= set(r.residual)
    return sorted(common)


def load_runs(dirs: list[str], steps: dict | None = None) -> tuple[list[Run], list[tuple[str, str]]]:
    """:func:`load_run` of each directory (``steps``: run directory -> policy -> scored step), the
    settings all of them share (:func:`shared_settings`) taken out of their variant names; returns
    (runs, shared settings)."""
    by_dir = {os.path.abspath(k): v for k, v in (steps or {}).items()}
    runs = [load_run(d, by_dir.get(os.path.abspath(d))) for d in dirs]
    shared = shared_settings(runs)
    for r in runs:
        r.residual = [kv for kv in r.residual if kv not in shared]
        r.variant = variant_label(r.base, r.residual)
    return runs, shared


def method_label(variant: str) -> str:
    base, _, rest = variant.partition("[")
    return METHOD_NAMES.get(base, base) + (f" [{rest.rstrip(']')}]" if rest else "")


class Index:
    """Lookup of policy results by (model key, variant, pair, seed)."""

    def __init__(self, runs: list[Run]):
        self.runs = runs
        self.names: dict[str, str] = {}  # model key -> display name
        for r in runs:
            for p in r.policies:
                self.names.setdefault(p["key"], P.MODEL_NAMES.get(p["key"], p["name"]))
        # table columns: the five benchmarks, or whatever the results were scored on (e.g. --data
        # FILE); code benchmarks have their own table (code_table)
        seen = [b for r in runs for res in r.results.values() for b in res.benchmarks]
        self.benches = list(FIVE) if not seen or set(FIVE) <= set(seen) else \
            [b for b in FIVE if b in seen] + sorted(set(seen) - set(FIVE))

    def entries(self, key: str, variant: str, pair: str | None = None):
        """[(run, result)] sorted by (pair match, seed)."""
        out = []
        for r in self.runs:
            if r.variant != variant or (pair is not None and r.pair != pair):
                continue
            for p in r.policies:
                if p["key"] == key and p["name"] in r.results and r.results[p["name"]].avg[0] is not None:
                    out.append((r, r.results[p["name"]]))  # math results only (code: code_table)
        return sorted(out, key=lambda t: (t[0].seed, t[0].path))

    def first(self, key: str, variant: str, pair: str | None = None):
        e = self.entries(key, variant, pair)
        if not e and pair is not None and variant.split("[")[0] in ("grpo", "grpo_n16", "grpo_n32", "grpo_dapo"):
            e = self.entries(key, variant, None)  # independent baselines do not depend on the pair
        return e[0] if e else (None, None)

    def name(self, key: str) -> str:
        return self.names.get(key, key)
