"""`graft report`: the paper's tables from run and eval directories, in markdown and LaTeX.

Inputs. A *run directory* holds ``config.yaml`` (method, pair, seed, exchange settings, policies),
``metrics.jsonl`` (training lines with ``time/step``, ``clip_ratio/*``, ``graft/*``; validation lines with
``validation/score``), ``rollouts/`` and ``eval/<policy>/step_NNNNNN/summary.json`` (``graft eval``). A folder
holding run directories is searched (three levels). A standalone ``graft eval --model`` folder (a
``summary.json`` without ``config.yaml``) is listed under "Other evaluations".

Which numbers. A policy's result is the eval summary of its selected step (``best.json``; without it, the
same rule recomputed from the eval summaries, :func:`graft_cli.eval.summary.select_best`): per benchmark
pass@1 mean ± std over eval runs, in percent. Runs are identified by their *variant*, read from the
resolved settings in ``config.yaml`` rather than the method name they were started with (:func:`identify`):
the method config whose composed settings the run's equal (``graft`` with ``exchange.params.delta=0.7`` is
``graft_delta0p7``, with ``exchange.ordering=first`` it is ``graft_first``), plus any setting it still differs
in (``graft[delta=0.5]``); then ``pair`` and ``seed``. The main tables use the lowest seed ("training run
#1", as the paper), Table 4 all seeds.

Tables (graft.md §6), each rendered only when its runs exist:

* **Table 1** — per updated model: GRPO n=8/16/32, dynamic sampling, HACPO, SGT, GRAFT (one row per peer
  pair); Δ vs GRPO n=8 of the same model.
* **Tables 2a/7, 7 (δ sweep), 2b/8** — ablations, δ sweep and alternative designs per receiver; Δ vs full
  GRAFT of the same pair and receiver.
* **Table 9** — clipped-token fraction (%) of self and grafted tokens by minibatch ordering (first /
  uniform / last), the mean over steps ``1..clip_steps`` (48 as the paper) of the per-step fractions
  ``clip_ratio/self`` and ``clip_ratio/peer`` (steps without grafted tokens excluded for the latter), and the
  % of steps with grafted tokens in which none was clipped (``clip_ratio/peer_any`` = 0), both policies pooled.
* **Table 5** — compute: mean wall-clock per step and "GPU-hours" by the paper's accounting, ``devices x
  Σ time/step`` (validation and checkpoint writing are outside ``time/step``), through each policy's best
  step and for the full run. Per-model costs of a joint run split each step's time by the policies' own
  rollout + reward + old-log-prob + update times (an attribution; the paper measured per-model time). "Both":
  online methods (one joint run with exchange) are charged the joint run through the *later* of the two
  selected steps; independent GRPO the sum of the two models' costs.
* **Table 4** — (pair, method) groups with two or more seeds: mean ± sample std over training runs of each
  run's eval mean; Δ GRAFT vs GRPO n=8.
* **Table 6** — stored-trajectory GRAFT receivers; Δ vs GRPO n=8.
* **Complementarity** — mean over training of the per-step cross-solve rates of two-policy runs' rollout
  logs (:mod:`graft_cli.analysis.complementarity`) or the ``graft/complementarity`` metric.
* **Code benchmarks** — beside the math tables, every run policy (at its selected step) and eval folder scored on
  code benchmarks (HumanEval, HumanEval+, MBPP+, LiveCodeBench v6; SAF-OPD's code domain, opd_saf.md §5):
  pass@1 per benchmark and their average. Code benchmarks never enter the math tables' columns or averages.

When the pair is one of the paper's (1, 2, 3) the paper's own numbers (:mod:`graft_cli.report.paper_numbers`)
follow each of our rows as an italic "(paper)" row (Table 9: extra columns).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from graft_cli.console import make_console
from graft_cli.errors import GraftError
from graft_cli.eval.benchmarks import BENCHMARKS, FIVE, display_name
from graft_cli.report import paper_numbers as P
from graft_cli.rundir import (EVAL, atomic_write_text, best_path, config_path, eval_step_dir, read_json,
                              read_json_or_none, read_metrics)

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
SWEEP = (("graft_nofloor", 0.0), ("graft_delta0p7", 0.7), ("graft", 0.8), ("graft_delta0p9", 0.9))  # Table 7's δ
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

    @property
    def online(self) -> bool:
        return self.exchange not in ("", "none") and len(self.policies) >= 2

    def train_rows(self) -> list[dict]:
        return [r for r in self.metrics if "time/step" in r]

    def policy(self, name: str) -> dict:
        return next(p for p in self.policies if p["name"] == name)


@dataclass
class Table:
    key: str
    title: str
    columns: list
    rows: list = field(default_factory=list)  # list of cell lists (strings)
    styles: list = field(default_factory=list)  # per row: None | "paper" | "head"
    notes: list = field(default_factory=list)

    def add(self, cells, style=None):
        self.rows.append([str(c) for c in cells])
        self.styles.append(style)

    def to_json(self) -> dict:
        return {"key": self.key, "title": self.title, "columns": self.columns, "rows": self.rows,
                "styles": self.styles, "notes": self.notes}


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
    """Each method config's own settings: its file merged over its ``defaults`` chain (values as written,
    interpolations kept as strings), flattened, ``method`` left out; with the chain's depth (0: no parent).
    Returns {method: (settings, depth)}."""
    import yaml

    from graft_cli.config import EXPERIMENTS_DIR

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


def composed_config(pair: str, method: str, exp_dir: str | None = None) -> dict | None:
    """``asdict(compose(pair=P, method=M))`` (cached per experiments folder, pair and method); None when it
    does not compose (an unknown pair or method; a method that needs a key only its runs set, e.g.
    graft_stored's partner)."""
    from graft_cli.config import EXPERIMENTS_DIR

    key = (exp_dir or EXPERIMENTS_DIR, str(pair), str(method))
    if key not in _COMPOSED:
        try:
            from graft_cli.config import asdict, compose

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
        import json

        return json.dumps(v, separators=(",", ":"))
    return str(v)


def identify(raw: dict, exp_dir: str | None = None) -> tuple[str, list[tuple[str, str]]]:
    """``(variant, residual)`` of a run's config mapping: the method config whose composed settings are
    nearest the run's, and the (key, value) settings in which the run still differs from it. A function of
    the settings, not of the method name the run was started with.

    Compared: every key some method config sets, except the set-up keys (``SETUP_KEYS``). With ``Δ_M`` the
    compared keys where the run differs from ``compose(pair, M)``, the variant is the ``M`` with the smallest
    ``Δ_M``; on ties the more general config (fewer ``defaults`` levels: ``graft`` before ``graft_nofloor``),
    then the name. Only methods whose own file settings could reach the best so far are composed (``Δ_M``
    holds every key the file sets and the run does not have). Keys a hand-written config.yaml lacks take the
    run's method's value; a run whose pair or method is not here is named by its method."""
    method = str(raw.get("method", "?"))
    pair = str(raw.get("pair", "?"))
    files = _method_files(exp_dir)
    own = _composed(pair, method, exp_dir) if method in files else None
    if own is None:
        return method, []
    keys = sorted({k for f, _ in files.values() for k in f if not _setup(k)})
    run = dict(own)
    run.update(_flatten({k: v for k, v in raw.items() if k != "method"}))

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


def variant_of(raw: dict) -> str:
    """The run's variant name (:func:`identify`): a method config name, plus the settings in which the run
    still differs from it, e.g. ``graft[delta=0.5]``."""
    return variant_label(*identify(raw))


def _model_key(model: str) -> str:
    return P.model_key(model) or model


def _pct(v):
    return None if v is None else 100.0 * v


def policy_result(run: Run, pol: dict) -> PolicyResult | None:
    from graft_cli.eval.summary import select_best

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
    benches = {b: (_pct(v["mean"]), _pct(v["std"])) for b, v in s["benchmarks"].items() if not _is_code(b, v)}
    code = {b: (_pct(v["mean"]), _pct(v["std"])) for b, v in s["benchmarks"].items() if _is_code(b, v)}
    avg = (_pct(s["average"]["mean"]), _pct(s["average"]["std"]))
    code_avg = _code_average(s)
    return PolicyResult(pol["name"], pol["model"], pol["key"], step, int(s.get("num_runs", 0)), benches,
                        avg if benches else (None, None), code, code_avg)


def _is_code(name: str, v: dict) -> bool:
    return v.get("kind") == "code" or (name in BENCHMARKS and BENCHMARKS[name].kind == "code")


def _code_average(summary: dict) -> tuple:
    """(mean %, std %) of a summary's code benchmarks: its ``code_average`` beside math ones, its ``average`` when
    it scored code only, else (None, None)."""
    b = summary["benchmarks"]
    if "code_average" in summary:
        a = summary["code_average"]
    elif b and all(_is_code(k, v) for k, v in b.items()):
        a = summary["average"]
    else:
        return (None, None)
    return (_pct(a["mean"]), _pct(a["std"]))


def load_run(path: str) -> Run:
    import yaml

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
              exchange=str(ex.get("name", "none")), ordering=str(ex.get("ordering", "last")), policies=pols)
    run.metrics.extend(read_metrics(path))
    from graft_cli.eval.files import step_dirs

    for p in pols:
        sd = step_dirs(os.path.join(path, EVAL, p["name"]))
        if sd:
            run.evals[p["name"]] = {s: read_json(os.path.join(d, "summary.json")) for s, d in sd.items()}
    bpath = best_path(path)
    if os.path.exists(bpath):
        run.best = {k: v["step"] for k, v in read_json(bpath).get("policies", {}).items()}
    for p in pols:
        r = policy_result(run, p)
        if r is not None:
            run.results[p["name"]] = r
    return run


def shared_settings(runs: list[Run]) -> list[tuple[str, str]]:
    """Residual settings every run has, when the runs are of two or more variants: a plan-wide override
    (e.g. ``exchange.params.peer_logprobs=recompute`` on every run of a sweep) rather than one run's variant."""
    if len({r.base for r in runs}) < 2:
        return []
    common = set(runs[0].residual)
    for r in runs[1:]:
        common &= set(r.residual)
    return sorted(common)


def load_runs(dirs: list[str]) -> tuple[list[Run], list[tuple[str, str]]]:
    """:func:`load_run` of each directory, the settings all of them share (:func:`shared_settings`) taken out
    of their variant names; returns (runs, shared settings)."""
    runs = [load_run(d) for d in dirs]
    shared = shared_settings(runs)
    for r in runs:
        r.residual = [kv for kv in r.residual if kv not in shared]
        r.variant = variant_label(r.base, r.residual)
    return runs, shared


# ------------------------------------------------------------------------------------------ helpers
def fmt(cell, digits: int = 2) -> str:
    if cell is None or cell[0] is None or (isinstance(cell[0], float) and math.isnan(cell[0])):
        return "—"
    m, s = cell
    return f"{m:.{digits}f}" + (f"±{s:.{digits}f}" if s is not None and not math.isnan(s) else "")


def fdelta(d) -> str:
    return "—" if d is None or (isinstance(d, float) and math.isnan(d)) else f"{d:+.2f}"


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
        # table columns: the five benchmarks, or whatever the results were scored on (e.g. --data FILE); code
        # benchmarks have their own table (code_table)
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


def _cells(res: PolicyResult, idx: Index) -> list[str]:
    return [fmt(res.benchmarks.get(b)) for b in idx.benches] + [fmt(res.avg)]


def _paper_cells(row: dict, idx: Index) -> list[str]:
    return [fmt(row.get(b)) for b in idx.benches] + [fmt(row["avg"])]


def _bench_cols(idx: Index) -> list[str]:
    return [display_name(b) for b in idx.benches] + ["Avg"]


def _peer_label(run: Run, pol: str, idx: Index) -> str:
    if not run.online:
        return "—"
    peers = [idx.name(p["key"]) for p in run.policies if p["name"] != pol]
    pair = f"Pair {run.pair}" if run.pair in P.PAIRS else run.pair
    return f"{', '.join(peers)} ({pair})"


def _ordered_keys(runs: list[Run]) -> list[str]:
    keys = []
    for r in sorted(runs, key=lambda r: (r.pair, r.path)):
        for p in r.policies:
            if p["key"] not in keys and p["name"] in r.results:
                keys.append(p["key"])
    return keys


def _delta(res, ref) -> float | None:
    if res is None or ref is None or res.avg[0] is None or ref.avg[0] is None:
        return None
    return res.avg[0] - ref.avg[0]


# --------------------------------------------------------------------------------------------- tables
def table1(idx: Index) -> Table | None:
    runs = [r for r in idx.runs if r.variant in T1_METHODS and any(x.avg[0] is not None for x in r.results.values())]
    if not runs:
        return None
    t = Table("table1", "Table 1: main results (pass@1 %, mean ± std over eval runs; Δ vs GRPO n=8)",
              ["Method", "Peer (pair)", *_bench_cols(idx), "Δ vs GRPO n=8"])
    for key in _ordered_keys(runs):
        t.add([f"Updated {idx.name(key)}"] + [""] * (len(t.columns) - 1), "head")
        for method in T1_METHODS:
            pairs = sorted({r.pair for r, _ in idx.entries(key, method)})
            if method.startswith("grpo"):
                pairs = pairs[:1]
            for pair in pairs:
                run, res = idx.first(key, method, pair)
                if res is None:
                    continue
                _, base = idx.first(key, "grpo", pair)
                d = None if method == "grpo" else _delta(res, base)
                t.add([method_label(method), _peer_label(run, res.policy, idx), *_cells(res, idx), fdelta(d)])
                pk = P.model_key(res.model)
                prow = P.table1(pk, method, pair) if pk and pair in P.PAIRS else None
                if prow:
                    t.add([f"{method_label(method)} (paper)", "", *_paper_cells(prow, idx), fdelta(prow["delta"])],
                          "paper")
    t.notes.append("Each policy at its selected step (best.json); ± is the sample std (ddof=1) over eval runs.")
    return t


def _receivers(idx: Index, methods) -> list[tuple[str, str]]:
    """(pair, model key) with a full-GRAFT result and at least one of ``methods`` besides the references."""
    out = []
    for r in idx.runs:
        if r.variant != "graft":
            continue
        for p in r.policies:
            if p["name"] in r.results and (r.pair, p["key"]) not in out:
                if any(idx.entries(p["key"], m, r.pair) for m in methods if m not in ("graft", "grpo")):
                    out.append((r.pair, p["key"]))
    return out


def ablation_table(idx: Index, key: str, title: str, methods, labels: dict | None = None) -> Table | None:
    recv = _receivers(idx, methods)
    if not recv:
        return None
    first_col = "δ" if labels else "Variant"
    t = Table(key, title, [first_col, *_bench_cols(idx), "Δ vs full GRAFT"])
    for pair, mk in recv:
        _, full = idx.first(mk, "graft", pair)
        t.add([f"Receiver {idx.name(mk)} (pair {pair})"] + [""] * (len(t.columns) - 1), "head")
        for m in methods:
            _, res = idx.first(mk, m, pair)
            label = (labels or {}).get(m, method_label(m) + (" (full)" if m == "graft" else ""))
            if res is not None:
                t.add([label, *_cells(res, idx), "—" if m == "graft" else fdelta(_delta(res, full))])
            pk = P.model_key(res.model) if res is not None else None
            prow = P.ablation(pk, m, pair) if pk else None
            if prow is None and pk and m == "graft":
                prow = P.table1(pk, "graft", pair) if pair == "1" else None
            if prow is None and pk and m in ("hacpo", "sgt") and pair == "1":
                prow = P.TABLE8.get(m, {}).get(pk)
            if prow is not None and res is not None:
                t.add([f"{label} (paper)", *_paper_cells(prow, idx), "—" if m == "graft" else fdelta(prow["delta"])],
                      "paper")
    return t


def delta_sweep(runs: list[Run]) -> tuple[list[str], dict[str, str]]:
    """Table 7's rows (variants, labels): the δ variants (``SWEEP``: no floor, 0.7, full GRAFT = 0.8, 0.9) and
    every run that is full GRAFT but for δ (``graft[delta=X]``, e.g. the threshold sweep's 0.5), by δ."""
    rows = dict(SWEEP)
    for r in runs:
        if r.base == "graft" and len(r.residual) == 1 and r.residual[0][0] == "delta":
            try:
                rows.setdefault(r.variant, float(r.residual[0][1]))
            except ValueError:
                continue
    order = sorted(rows, key=lambda m: rows[m])
    return order, {m: "0 (no floor)" if rows[m] == 0 else f"{rows[m]:g}" for m in order}


def table9(idx: Index, clip_steps: int) -> Table | None:
    runs = [r for r in idx.runs if r.exchange == "graft" and r.online and r.variant.split("[")[0] in
            ("graft", "graft_first", "graft_uniform")
            and any("clip_ratio/self" in m for m in r.train_rows())]
    if not runs:
        return None
    by_order: dict[str, Run] = {}
    for r in sorted(runs, key=lambda r: (r.seed, r.path)):
        by_order.setdefault(r.ordering, r)
    ref = next(iter(by_order.values()))
    pols = [p["name"] for p in ref.policies]
    paper = ref.pair == "1"
    cols = ["Tokens", *[o.capitalize() + (" (GRAFT)" if o == "last" else "") for o in ORDERINGS]]
    if paper:
        cols += [f"{o.capitalize()} (paper)" for o in ORDERINGS]
    t = Table("table9", f"Table 9: clipped-token fraction (%), steps 1-{clip_steps}, by minibatch ordering", cols)

    def stats(run: Run, pol: str):
        rows = [m for m in run.train_rows() if m.get("policy") == pol and m.get("step", 0) <= clip_steps]
        self_ = [m["clip_ratio/self"] for m in rows if m.get("clip_ratio/self") is not None]
        peer = [m["clip_ratio/peer"] for m in rows if m.get("clip_ratio/peer") is not None]
        any_ = [m["clip_ratio/peer_any"] for m in rows if m.get("clip_ratio/peer_any") is not None]
        return self_, peer, any_

    def cell(vals):
        return f"{100 * float(np.mean(vals)):.3f}" if vals else "—"

    keymap = {p["name"]: P.model_key(p["model"]) for p in ref.policies}
    for kind in ("self", "peer"):
        for pol in pols:
            peers = [p for p in pols if p != pol]
            label = f"Self, {pol}" if kind == "self" else f"Grafted, {pol} ← {', '.join(peers)}"
            cells = []
            for o in ORDERINGS:
                run = by_order.get(o)
                if run is None or pol not in [p["name"] for p in run.policies]:
                    cells.append("—")
                    continue
                s, pe, _ = stats(run, pol)
                cells.append(cell(s if kind == "self" else pe))
            if paper:
                pr = P.TABLE9.get(f"{kind}:{keymap.get(pol)}")
                cells += [f"{pr[o]:.3f}" if pr else "—" for o in ORDERINGS]
            t.add([label, *cells])
    cells = []
    for o in ORDERINGS:
        run = by_order.get(o)
        if run is None:
            cells.append("—")
            continue
        any_all = [a for pol in pols for a in stats(run, pol)[2]]
        cells.append(f"{100 * float(np.mean([a == 0 for a in any_all])):.1f}" if any_all else "—")
    if paper:
        cells += [f"{P.TABLE9['zero_peer_steps'][o]:.1f}" for o in ORDERINGS]
    t.add(["% steps with zero peer-token clipping", *cells])
    t.notes.append("Mean over steps of the per-step fractions (clip_ratio/self, clip_ratio/peer); the zero-clipping "
                   "share counts steps that had grafted tokens, both policies pooled. Runs: "
                   + ", ".join(f"{o}={r.name}" for o, r in by_order.items()) + ".")
    return t


def _costs(run: Run, devices: int) -> dict:
    """Per policy: attributed seconds per step; joint seconds per step (steps in order)."""
    rows = run.train_rows()
    steps = sorted({int(m["step"]) for m in rows})
    joint = {}
    own = {p["name"]: {} for p in run.policies}
    for m in rows:
        s = int(m["step"])
        joint[s] = float(m["time/step"])
        if m.get("policy") in own:
            own[m["policy"]][s] = sum(float(m.get(k) or 0.0) for k in
                                      ("time/rollout", "time/reward", "time/old_logprob", "time/update"))
    share = {p: {} for p in own}
    for s in steps:
        tot = sum(own[p].get(s, 0.0) for p in own)
        for p in own:
            share[p][s] = own[p].get(s, 0.0) / tot if tot > 0 else 1.0 / max(len(own), 1)
    return {"steps": steps, "joint": joint, "share": share, "devices": devices}


def _gpu_h(c: dict, through: int | None, policy: str | None = None) -> float | None:
    if not c["steps"]:
        return None
    steps = [s for s in c["steps"] if through is None or s <= through]
    sec = sum(c["joint"][s] * (c["share"][policy][s] if policy else 1.0) for s in steps)
    return c["devices"] * sec / 3600.0


def table5(idx: Index, devices: int | None) -> Table | None:
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in idx.runs:
        if r.train_rows() and r.results:
            groups.setdefault((r.pair, r.variant), []).append(r)
    if not groups:
        return None
    pairs = sorted({p for p, _ in groups})
    tabs = []
    for pair in pairs:
        dev = devices or (P.DEVICES if pair in P.PAIRS else 1)
        models: list[str] = []
        for (pp, _), rs in groups.items():
            if pp == pair:
                for r in rs:
                    for p in r.policies:
                        if p["key"] not in models:
                            models.append(p["key"])
        models = models[:2] if len(models) >= 2 else models
        cols = ["Method"]
        for mk in models:
            n = idx.name(mk)
            cols += [f"{n} Avg", f"{n} s/step", f"{n} best GPU-h", f"{n} full GPU-h"]
        cols += ["Both best GPU-h", "Both full GPU-h"]
        t = Table(f"table5_{pair}", f"Table 5: compute, pair {pair} (GPU-h = {dev} x Σ time/step / 3600)", cols)
        order = [v for v in (*T1_METHODS, "graft_stored") if (pair, v) in groups]
        order += sorted(v for (pp, v) in groups if pp == pair and v not in order)
        for variant in order:
            cells, best_h, full_h = [], [], []
            joint_runs = {}
            for mk in models:
                run, res = idx.first(mk, variant, pair)
                if res is None:
                    cells += ["—"] * 4
                    continue
                c = _costs(run, dev)
                if not c["steps"]:
                    cells += [fmt(res.avg), "—", "—", "—"]
                    continue
                mean_step = float(np.mean([c["joint"][s] for s in c["steps"]]))
                b = _gpu_h(c, res.step, res.policy)
                f = _gpu_h(c, None, res.policy)
                cells += [fmt(res.avg), f"{mean_step:.2f}", f"{b:.3g}", f"{f:.3g}"]
                best_h.append(b)
                full_h.append(f)
                if run.online:
                    joint_runs.setdefault(run.path, (run, c, []))[2].append(res.step)
            if joint_runs and len(joint_runs) == 1:
                run, c, bsteps = next(iter(joint_runs.values()))
                both_b, both_f = _gpu_h(c, max(bsteps)), _gpu_h(c, None)
            else:
                both_b = sum(best_h) if best_h else None
                both_f = sum(full_h) if full_h else None
            cells += ["—" if both_b is None else f"{both_b:.3g}", "—" if both_f is None else f"{both_f:.3g}"]
            t.add([method_label(variant), *cells])
            pc = P.compute(variant, pair)
            if pc:
                pkeys = [m if m in P.MODEL_IDS else None for m in models]
                pcells = []
                for pk in pkeys:
                    d = pc.get(pk) if pk else None
                    pcells += [fmt(d["avg"]), "—", f"{d['best']:.1f}", f"{d['full']:.1f}"] if d else ["—"] * 4
                pcells += [f"{pc['both']['best']:.1f}", f"{pc['both']['full']:.1f}"]
                t.add([f"{method_label(variant)} (paper)", *pcells], "paper")
        t.notes.append("best = cost through the selected step; full = the whole run. Per-model costs of a joint run "
                       "split each step's wall-clock by the policies' own rollout/reward/old-log-prob/update times. "
                       "Both best: online methods, the joint run through the later selected step; independent "
                       "training, the sum of the two models' costs.")
        tabs.append(t)
    return tabs


def table4(idx: Index) -> Table | None:
    groups: dict[tuple[str, str, str], list] = {}
    for r in idx.runs:
        for p in r.policies:
            if p["name"] in r.results and r.results[p["name"]].avg[0] is not None:  # math results (code: code_table)
                groups.setdefault((r.pair, p["key"], r.variant), []).append((r.seed, r.results[p["name"]]))
    groups = {k: v for k, v in groups.items() if len({s for s, _ in v}) >= 2}
    if not groups:
        return None
    t = Table("table4", "Table 4: independent training runs (mean ± sample std over runs of each run's eval mean)",
              ["Pair", "Updated model", "Method", "Runs", *_bench_cols(idx), "Δ vs GRPO n=8"])
    agg = {}
    for (pair, mk, variant), items in sorted(groups.items()):
        items = sorted(items, key=lambda t: t[0])
        cells = {}
        for b in (*idx.benches, "avg"):
            vals = [res.avg[0] if b == "avg" else (res.benchmarks.get(b) or (None,))[0] for _, res in items]
            vals = [v for v in vals if v is not None]
            cells[b] = (float(np.mean(vals)), float(np.std(vals, ddof=1)) if len(vals) > 1 else None) if vals else None
        agg[(pair, mk, variant)] = cells
    for (pair, mk, variant), cells in agg.items():
        base = agg.get((pair, mk, "grpo")) or next((v for (pp, kk, vv), v in agg.items()
                                                     if kk == mk and vv == "grpo"), None)
        d = None if variant == "grpo" or base is None or cells["avg"] is None else cells["avg"][0] - base["avg"][0]
        n = len(groups[(pair, mk, variant)])
        t.add([pair, idx.name(mk), method_label(variant), n, *[fmt(cells[b]) for b in (*idx.benches, "avg")],
               fdelta(d)])
        pk = P.model_key(next(res.model for _, res in groups[(pair, mk, variant)]))
        prow = P.repeats(pair, pk, variant) if pk else None
        if prow:
            t.add(["", "", f"{method_label(variant)} (paper)", 3, *_paper_cells(prow, idx), fdelta(prow["delta"])],
                  "paper")
    return t


def table6(idx: Index) -> Table | None:
    runs = [r for r in idx.runs if r.base == "graft_stored" and r.results]
    if not runs:
        return None
    t = Table("table6", "Table 6: stored-trajectory GRAFT (Δ vs GRPO n=8)",
              ["Pair", "Receiver", *_bench_cols(idx), "Δ vs GRPO n=8"])
    for r in sorted(runs, key=lambda r: (r.pair, r.seed, r.path)):
        for res in r.results.values():
            _, base = idx.first(res.key, "grpo", r.pair)
            t.add([r.pair, idx.name(res.key), *_cells(res, idx), fdelta(_delta(res, base))])
            pk = P.model_key(res.model)
            prow = P.stored(r.pair, pk) if pk else None
            if prow:
                t.add(["", f"{idx.name(res.key)} (paper)", *_paper_cells(prow, idx), fdelta(prow["delta"])], "paper")
    return t


def complementarity_rows(idx: Index) -> list[dict]:
    """Per two-policy run: mean cross-solve rates from its rollout logs (else the graft/complementarity metric)."""
    from graft_cli.analysis.complementarity import from_runs

    out = []
    for r in idx.runs:
        if len(r.policies) != 2:
            continue
        a, b = r.policies[0]["name"], r.policies[1]["name"]
        entry = None
        try:
            res = from_runs([r.path])
            entry = {"run": r, "x": a, "y": b, "steps": res["steps"], "y_solves_x": res["mean"]["y_solves_x"],
                     "x_solves_y": res["mean"]["x_solves_y"], "source": "rollouts"}
        except GraftError:
            vals = {p: [m["graft/complementarity"] for m in r.train_rows() if m.get("policy") == p
                        and m.get("graft/complementarity") is not None] for p in (a, b)}
            if vals[a] or vals[b]:
                # graft/complementarity of receiver p: the peer solves p's all-fail prompts
                entry = {"run": r, "x": a, "y": b, "steps": None,
                         "y_solves_x": float(np.mean(vals[a])) if vals[a] else math.nan,
                         "x_solves_y": float(np.mean(vals[b])) if vals[b] else math.nan, "source": "metrics"}
        if entry:
            out.append(entry)
    return out


def complementarity_table(idx: Index, rows: list[dict]) -> Table | None:
    if not rows:
        return None
    t = Table("complementarity", "Complementarity: % of one model's all-fail prompts the other solves "
                                 "(mean over training steps)", ["Run", "Method", "Solver", "Fails", "%", "Source"])

    def pct(x):
        return "—" if x is None or math.isnan(x) else f"{100 * x:.1f}"

    for e in rows:
        r = e["run"]
        for solver, failer, val in ((e["y"], e["x"], e["y_solves_x"]), (e["x"], e["y"], e["x_solves_y"])):
            t.add([r.name, method_label(r.variant), solver, failer, pct(val), e["source"]])
            if r.pair == "1" and r.variant == "grpo":
                sk, fk = P.model_key(r.policy(solver)["model"]), P.model_key(r.policy(failer)["model"])
                if (sk, fk) in P.COMPLEMENTARITY:
                    t.add(["", "paper (GRPO n=8)", solver, failer, f"{P.COMPLEMENTARITY[(sk, fk)]:.1f}", "paper"],
                          "paper")
    return t


def code_table(runs: list[Run], eval_dirs: list[str]) -> Table | None:
    """Code benchmarks: each run policy at its selected step and each ``graft eval --model`` folder that scored
    code benchmarks, pass@1 % per benchmark and their average; None when nothing did."""
    rows = [(r.name, method_label(r.variant), r.pair, p["name"], res.step, res.code, res.code_avg)
            for r in runs for p in r.policies if (res := r.results.get(p["name"])) is not None and res.code]
    for d in eval_dirs:
        s = read_json(os.path.join(d, "summary.json"))
        code = {b: (_pct(v["mean"]), _pct(v["std"])) for b, v in s["benchmarks"].items() if _is_code(b, v)}
        if code:
            rows.append((s.get("model", d), "graft eval --model", "", "", "", code, _code_average(s)))
    if not rows:
        return None
    order = [b for b in ("humaneval", "humanevalplus", "mbppplus", "livecodebench") if any(b in x[5] for x in rows)]
    order += sorted({b for x in rows for b in x[5]} - set(order))
    t = Table("code", "Code benchmarks (pass@1 %, mean ± std over eval runs)",
              ["Run", "Method", "Pair", "Policy", "Step", *[display_name(b) for b in order], "Code avg"])
    for name, method, pair, pol, step, code, avg in rows:
        t.add([name, method, pair, pol, step if step is not None else "—", *[fmt(code.get(b)) for b in order],
               fmt(avg)])
    t.notes.append("Graded by the code reward (every test must pass; graft_cli/code_reward.py). SAF-OPD reports code "
                   "gains of SAF over fixed-coefficient fusion of 1.67 / 2.70 / 0.51 points for Qwen3-8B / 4B / 1.7B "
                   "on HumanEval+, MBPP+ and LiveCodeBench v6 (opd_saf.md §6; per-benchmark numbers [U]).")
    return t


def other_evals(dirs: list[str]) -> Table | None:
    if not dirs:
        return None
    t = Table("evals", "Other evaluations (graft eval --model)", ["Folder", "Runs", "Benchmarks", "Avg"])
    for d in dirs:
        s = read_json(os.path.join(d, "summary.json"))
        cells = ", ".join(f"{display_name(b)} {fmt((_pct(v['mean']), _pct(v['std'])))}"
                          for b, v in s["benchmarks"].items())
        t.add([s.get("model", d), s.get("num_runs", ""), cells, fmt((_pct(s["average"]["mean"]),
                                                                    _pct(s["average"]["std"])))])
    return t


def build_tables(runs: list[Run], eval_dirs: list[str] | None = None, devices: int | None = None,
                 clip_steps: int = 48) -> tuple[list[Table], list[dict]]:
    idx = Index(runs)
    comp = complementarity_rows(idx)
    tables: list[Table | None] = [
        table1(idx),
        ablation_table(idx, "table7", "Tables 2a / 7: ablations (Δ vs full GRAFT)", ABLATIONS),
        ablation_table(idx, "table7_delta", "Table 7: gate floor δ sweep (Δ vs δ = 0.8)", *delta_sweep(runs)),
        ablation_table(idx, "table8", "Tables 2b / 8: alternative designs (Δ vs full GRAFT)", DESIGNS),
        table9(idx, clip_steps),
    ]
    t5 = table5(idx, devices)
    tables += t5 or []
    tables += [table4(idx), table6(idx), complementarity_table(idx, comp), tandem_table(runs),
               code_table(runs, eval_dirs or []), other_evals(eval_dirs or [])]
    return [t for t in tables if t is not None], comp


def tandem_table(runs: list[Run]) -> Table | None:
    """Solo and handoff pass@k and legibility of every run whose selected step has the tandem evaluations
    (``graft eval --run --tandem``: ``step_N/handoff/``, ``step_N/legibility/``); None when no run has them."""
    from graft_cli.eval.tandem import macro_pass_at_k
    from graft_cli.report.tandem_claims import KS, legibility_ce

    t = Table("tandem", "Tandem RLVR evaluations: solo and handoff pass@k %, legibility (junior CE, nats/token)",
              ["Run", "Method", "Policy", "Step", *[f"Solo pass@{k}" for k in KS],
               *[f"Handoff pass@{k}" for k in KS], "Legibility CE"])
    for r in runs:
        for p in r.policies:
            res = r.results.get(p["name"])
            if not res or res.step is None:
                continue
            d = eval_step_dir(r.path, p["name"], res.step)
            hand = read_json_or_none(os.path.join(d, "handoff", "summary.json"))
            if hand is None:
                continue
            solo = macro_pass_at_k(read_json_or_none(os.path.join(d, "summary.json")))
            h = macro_pass_at_k(hand)
            ce = legibility_ce(read_json_or_none(os.path.join(d, "legibility", "summary.json")))
            t.add([r.name, method_label(r.variant), p["name"], res.step,
                   *[f"{solo[str(k)]:.2f}" if str(k) in solo else "—" for k in KS],
                   *[f"{h[str(k)]:.2f}" if str(k) in h else "—" for k in KS], "—" if ce is None else f"{ce:.4f}"])
    if not t.rows:
        return None
    t.notes.append("Handoff: the senior and the run's junior alternate at eval.handoff_delimiter, the senior "
                   "first (graft_cli/eval/tandem.py); legibility: the junior's per-token cross-entropy on the "
                   "senior's solo answers (lower = more legible).")
    return t


def runs_table(runs: list[Run], shared: list | None = None) -> Table:
    t = Table("runs", "Runs", ["Run", "Method", "Pair", "Seed", "Steps", "Policy", "Selected step", "Eval runs", "Avg"])
    for r in runs:
        steps = max((int(m["step"]) for m in r.train_rows()), default=0)
        for p in r.policies:
            res = r.results.get(p["name"])
            t.add([r.name, method_label(r.variant), r.pair, r.seed, steps, p["name"],
                   res.step if res else "—", res.num_runs if res else 0, fmt(res.avg) if res else "—"])
    t.notes.append("Method: the variant the run's resolved settings (config.yaml) are, whatever method name it was "
                   "started with (e.g. graft with exchange.params.delta=0.0 is 'w/o floor (δ=0)'); [k=v]: settings "
                   "in which it still differs from that method's config.")
    if shared:
        t.notes.append("Settings every run shares, left out of the method labels: "
                       + ", ".join(f"{k}={v}" for k, v in shared) + ".")
    return t


# ------------------------------------------------------------------------------------------ rendering
def to_markdown(tables: list[Table]) -> str:
    out = []
    for t in tables:
        out.append(f"## {t.title}\n")
        out.append("| " + " | ".join(t.columns) + " |")
        out.append("|" + "|".join("---" for _ in t.columns) + "|")
        for row, style in zip(t.rows, t.styles):
            cells = [c.replace("|", "\\|") for c in row]
            if style == "paper":
                cells = [f"*{c}*" if c and c != "—" else c for c in cells]
            elif style == "head":
                cells = [f"**{c}**" if c else c for c in cells]
            out.append("| " + " | ".join(cells) + " |")
        for n in t.notes:
            out.append(f"\n{n}")
        out.append("")
    return "\n".join(out)


_TEX = [("\\", "\\textbackslash{}"), ("&", "\\&"), ("%", "\\%"), ("_", "\\_"), ("#", "\\#"), ("{", "\\{"),
        ("}", "\\}"), ("±", "$\\pm$"), ("Δ", "$\\Delta$"), ("δ", "$\\delta$"), ("←", "$\\leftarrow$"),
        ("Σ", "$\\Sigma$"), ("—", "--"), ("≥", "$\\geq$")]


def tex_escape(s: str) -> str:
    for a, b in _TEX:
        s = s.replace(a, b)
    return s


def to_latex(tables: list[Table]) -> str:
    out = ["% graft report: tables in the layout of the GRAFT paper (booktabs)", ""]
    for t in tables:
        ncol = len(t.columns)
        out += ["\\begin{table}[t]", "\\centering", "\\small", f"\\caption{{{tex_escape(t.title)}}}",
                f"\\label{{tab:{t.key}}}", "\\begin{tabular}{l" + "c" * (ncol - 1) + "}", "\\toprule",
                " & ".join(tex_escape(c) for c in t.columns) + " \\\\", "\\midrule"]
        for row, style in zip(t.rows, t.styles):
            if style == "head":
                out.append(f"\\multicolumn{{{ncol}}}{{l}}{{\\textbf{{{tex_escape(row[0])}}}}} \\\\")
                continue
            cells = [tex_escape(c) for c in row]
            if style == "paper":
                cells = [f"\\textit{{{c}}}" if c else c for c in cells]
            out.append(" & ".join(cells) + " \\\\")
        out += ["\\bottomrule", "\\end{tabular}"]
        if t.notes:
            out.append("\\\\[2pt]{\\footnotesize " + tex_escape(" ".join(t.notes)) + "}")
        out += ["\\end{table}", ""]
    return "\n".join(out)


# ------------------------------------------------------------------------------------------- command
def report_main(paths: list[str], out: str | None = None, devices: int | None = None, clip_steps: int = 48,
                plots: bool = True, console=None) -> str:
    """The ``graft report`` command: writes report.md, tables.tex, report.json and plots/*.png into ``out``."""
    from graft_cli.rundir import atomic_write_json

    console = console or make_console(stderr=True)
    if not paths:
        raise GraftError("give at least one run directory (or a folder of runs)")
    if devices is not None and devices < 1:
        raise GraftError("--devices must be >= 1")
    run_dirs, eval_dirs = find_dirs(paths)
    if not run_dirs and not eval_dirs:
        raise GraftError(f"no run directory (config.yaml) or eval folder (summary.json) under {', '.join(paths)}")
    runs, shared = load_runs(run_dirs)
    tables, comp = build_tables(runs, eval_dirs, devices, clip_steps)
    tables = [runs_table(runs, shared)] + tables if runs else tables
    out = out or os.path.join("results", "report")
    os.makedirs(out, exist_ok=True)
    images = []
    if plots and runs:
        from graft_cli.report.plots import make_plots

        images = make_plots(runs, comp, os.path.join(out, "plots"), clip_steps)
    md = ["# graft report", "", f"Runs: {len(runs)}; eval folders: {len(eval_dirs)}. Numbers are pass@1 in %; "
          "*(paper)* rows are the GRAFT paper's own numbers (reference/graft.md §6).", "", to_markdown(tables)]
    if images:
        md += ["## Plots", ""] + [f"![{os.path.basename(p)}](plots/{os.path.basename(p)})" for p in images]
    atomic_write_text(os.path.join(out, "report.md"), "\n".join(md) + "\n")
    atomic_write_text(os.path.join(out, "tables.tex"), to_latex(tables))
    atomic_write_json(os.path.join(out, "report.json"),
                      {"runs": [r.path for r in runs], "eval_dirs": eval_dirs, "tables": [t.to_json() for t in tables],
                       "plots": images})
    console.print(f"report: {os.path.join(out, 'report.md')} (LaTeX: {os.path.join(out, 'tables.tex')}; "
                  f"{len(images)} plots in {os.path.join(out, 'plots')})")
    return out
