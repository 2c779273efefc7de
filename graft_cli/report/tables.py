"""`graft report`: the paper's tables from run and eval directories, in markdown and LaTeX.

Inputs. A *run directory* holds ``config.yaml`` (method, pair, seed, exchange settings, policies),
``metrics.jsonl`` (training lines with ``time/step``, ``clip_ratio/*``, ``graft/*``; validation
lines with ``validation/score``), ``rollouts/`` and ``eval/<policy>/step_NNNNNN/summary.json``
(``graft eval``). A folder holding run directories is searched (three levels). A standalone ``graft
eval --model`` folder (a ``summary.json`` without ``config.yaml``) is listed under "Other
evaluations".

Which numbers. A policy's result is the eval summary of its scored step: the step a plan's claims
judge (``steps``), else the selected step (``best.json``; without it, the same rule recomputed from
the eval summaries, :func:`graft_cli.eval.summary.select_best`): per benchmark pass@1 mean ± std
over eval runs, in percent. Runs are identified by their *variant*, read from the resolved settings
in ``config.yaml`` rather than the method name they were started with (:func:`identify`): the method
config whose composed settings the run's equal (``graft`` with ``exchange.params.delta=0.7`` is
``graft_delta0p7``, with ``exchange.ordering=first`` it is ``graft_first``), plus any setting it
still differs in (``graft[delta=0.5]``); then ``pair`` and ``seed``. The main tables use the lowest
seed ("training run #1", as the paper), Table 4 all seeds.

Tables (graft.md §6), each rendered only when its runs exist:

* **Table 1** — per updated model: GRPO n=8/16/32, dynamic sampling, HACPO, SGT, GRAFT (one row per
  peer pair); Δ vs GRPO n=8 of the same model.
* **Tables 2a/7, 7 (δ sweep), 2b/8** — ablations, δ sweep and alternative designs per receiver; Δ vs
  full GRAFT of the same pair and receiver.
* **Table 9** — clipped-token fraction (%) of self and grafted tokens by minibatch ordering (first /
  uniform / last), the mean over steps ``1..clip_steps`` (48 as the paper) of the per-step fractions
  ``clip_ratio/self`` and ``clip_ratio/peer`` (steps without grafted tokens excluded for the
  latter), and the % of steps with grafted tokens in which none was clipped (``clip_ratio/peer_any``
  = 0), both policies pooled.
* **Table 5** — compute: mean wall-clock per step and "GPU-hours" by the paper's accounting,
  ``devices x Σ time/step`` (validation and checkpoint writing are outside ``time/step``), through
  each policy's best step and for the full run. Per-model costs of a joint run split each step's
  time by the policies' own rollout + reward + old-log-prob + update times (an attribution; the
  paper measured per-model time). "Both": online methods (one joint run with exchange) are charged
  the joint run through the *later* of the two selected steps; independent GRPO the sum of the two
  models' costs.
* **Table 4** — (pair, method) groups with two or more seeds: mean ± sample std over training runs
  of each run's eval mean; Δ GRAFT vs GRPO n=8.
* **Table 6** — stored-trajectory GRAFT receivers; Δ vs GRPO n=8.
* **Complementarity** — mean over training of the per-step cross-solve rates of two-policy runs'
  rollout logs (:mod:`graft_cli.eval.complementarity`) or the ``graft/complementarity`` metric.
* **Code benchmarks** — beside the math tables, every run policy (at its selected step) and eval
  folder scored on code benchmarks (HumanEval, HumanEval+, MBPP+, LiveCodeBench v6; SAF-OPD's code
  domain, opd_saf.md §5): pass@1 per benchmark and their average. Code benchmarks never enter the
  math tables' columns or averages.

When the pair is one of the paper's (1, 2, 3) the paper's own numbers
(:mod:`graft_cli.report.paper_numbers`) follow each of our rows as an italic "(paper)" row (Table 9:
extra columns). """

from __future__ import annotations

import math
import os

import numpy as np

from graft_cli.eval.complementarity import from_runs
from graft_cli.console import make_console
from graft_cli.errors import GraftError
from graft_cli.eval.benchmarks import display_name
from graft_cli.eval.tandem_evals import macro_pass_at_k
from graft_cli.report import paper_numbers as P
from graft_cli.report.plots import make_plots
from graft_cli.report.compute_table import table5
from graft_cli.report.render import Table, fdelta, fmt, to_latex, to_markdown
from graft_cli.report.runs import (
    ABLATIONS,
    DESIGNS,
    ORDERINGS,
    SWEEP,
    T1_METHODS,
    Index,
    PolicyResult,
    Run,
    code_average,
    find_dirs,
    is_code,
    load_runs,
    method_delta,
    method_label,
    pct,
)
from graft_cli.report.tandem_claims import KS, legibility_ce
from graft_cli.rundir import atomic_write_json, atomic_write_text, eval_step_dir, read_json, read_json_or_none


# ------------------------------------------------------------------------------------------ helpers
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
    """(pair, model key) with a full-GRAFT result and at least one of ``methods`` besides the
    references."""
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
    """Table 7's rows (variants, labels): the δ variants (``SWEEP``: no floor, 0.7, full GRAFT, 0.9;
    each method config's δ, :func:`method_delta`) and every run that is full GRAFT but for δ
    (``graft[delta=X]``, e.g. the threshold sweep's 0.5), by δ."""
    rows = {m: d for m in SWEEP if (d := method_delta(m)) is not None}
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
    last = min(clip_steps, max(r.last_step for r in by_order.values()))  # the steps the window really holds
    t = Table("table9", f"Table 9: clipped-token fraction (%), steps 1-{last}, by minibatch ordering", cols)

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
    """Per two-policy run: mean cross-solve rates from its rollout logs (else the
    graft/complementarity metric)."""

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
    """Code benchmarks: each run policy at its selected step and each ``graft eval --model`` folder
    that scored code benchmarks, pass@1 % per benchmark and their average; None when nothing did."""
    rows = [(r.name, method_label(r.variant), r.pair, p["name"], res.step, res.code, res.code_avg)
            for r in runs for p in r.policies if (res := r.results.get(p["name"])) is not None and res.code]
    for d in eval_dirs:
        s = read_json(os.path.join(d, "summary.json"))
        code = {b: (pct(v["mean"]), pct(v["std"])) for b, v in s["benchmarks"].items() if is_code(b, v)}
        if code:
            rows.append((s.get("model", d), "graft eval --model", "", "", "", code, code_average(s)))
    if not rows:
        return None
    order = [b for b in ("humaneval", "humanevalplus", "mbppplus", "livecodebench") if any(b in x[5] for x in rows)]
    order += sorted({b for x in rows for b in x[5]} - set(order))
    t = Table("code", "Code benchmarks (pass@1 %, mean ± std over eval runs)",
              ["Run", "Method", "Pair", "Policy", "Step", *[display_name(b) for b in order], "Code avg"])
    for name, method, pair, pol, step, code, avg in rows:
        t.add([name, method, pair, pol, step if step is not None else "—", *[fmt(code.get(b)) for b in order],
               fmt(avg)])
    t.notes.append("Graded by the code reward (every test must pass; graft_cli/reward/code_grader.py). SAF-OPD "
                   "reports code gains of SAF over fixed-coefficient fusion of 1.67 / 2.70 / 0.51 points for Qwen3-8B "
                   "/ 4B / 1.7B on HumanEval+, MBPP+ and LiveCodeBench v6 (opd_saf.md §6; per-benchmark numbers [U]).")
    return t


def other_evals(dirs: list[str]) -> Table | None:
    if not dirs:
        return None
    t = Table("evals", "Other evaluations (graft eval --model)", ["Folder", "Runs", "Benchmarks", "Avg"])
    for d in dirs:
        s = read_json(os.path.join(d, "summary.json"))
        cells = ", ".join(f"{display_name(b)} {fmt((pct(v['mean']), pct(v['std'])))}"
                          for b, v in s["benchmarks"].items())
        t.add([s.get("model", d), s.get("num_runs", ""), cells, fmt((pct(s["average"]["mean"]),
                                                                    pct(s["average"]["std"])))])
    return t


def build_tables(runs: list[Run], eval_dirs: list[str] | None = None, devices: int | None = None,
                 clip_steps: int = 48) -> tuple[list[Table], list[dict]]:
    idx = Index(runs)
    comp = complementarity_rows(idx)
    d = method_delta("graft")
    vs = "full GRAFT" if d is None else f"δ = {d:g}"
    tables: list[Table | None] = [
        table1(idx),
        ablation_table(idx, "table7", "Tables 2a / 7: ablations (Δ vs full GRAFT)", ABLATIONS),
        ablation_table(idx, "table7_delta", f"Table 7: gate floor δ sweep (Δ vs {vs})", *delta_sweep(runs)),
        ablation_table(idx, "table8", "Tables 2b / 8: alternative designs (Δ vs full GRAFT)", DESIGNS),
        table9(idx, clip_steps),
    ]
    t5 = table5(idx, devices)
    tables += t5 or []
    tables += [table4(idx), table6(idx), complementarity_table(idx, comp), tandem_table(runs),
               code_table(runs, eval_dirs or []), other_evals(eval_dirs or [])]
    return [t for t in tables if t is not None], comp


def tandem_table(runs: list[Run]) -> Table | None:
    """Solo and handoff pass@k and legibility of every run whose selected step has the tandem
    evaluations (``graft eval --run --tandem``: ``step_N/handoff/``, ``step_N/legibility/``); None
    when no run has them."""

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
                   "first (graft_cli/eval/tandem_evals.py); legibility: the junior's per-token cross-entropy on the "
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


# ------------------------------------------------------------------------------------------- command
def report_main(paths: list[str], out: str | None = None, devices: int | None = None, clip_steps: int = 48,
                plots: bool = True, console=None, steps: dict | None = None, finished_only: bool = False) -> str:
    """The ``graft report`` command: writes report.md, tables.tex, report.json and plots/*.png into
    ``out``. ``steps`` (run directory -> policy -> step): the scored step of a plan's runs, so that
    every table reads the numbers its claims judge. ``finished_only`` (a study's report): runs that
    did not train every planned step are left out of every table and named in a note."""

    console = console or make_console(stderr=True)
    if not paths:
        raise GraftError("give at least one run directory (or a folder of runs)")
    if devices is not None and devices < 1:
        raise GraftError("--devices must be >= 1")
    run_dirs, eval_dirs = find_dirs(paths)
    if not run_dirs and not eval_dirs:
        raise GraftError(f"no run directory (config.yaml) or eval folder (summary.json) under {', '.join(paths)}")
    runs, shared = load_runs(run_dirs, steps)
    partial = [r for r in runs if not r.finished] if finished_only else []
    runs = [r for r in runs if r not in partial]
    tables, comp = build_tables(runs, eval_dirs, devices, clip_steps)
    tables = [runs_table(runs, shared)] + tables if runs else tables
    out = out or os.path.join("results", "report")
    os.makedirs(out, exist_ok=True)
    images = []
    if plots and runs:
        images = make_plots(runs, comp, os.path.join(out, "plots"), clip_steps)
    left = (" Left out, not finished: " + ", ".join(f"{r.name} ({r.last_step} of {r.planned_steps} steps)"
                                                    for r in partial) + "." if partial else "")
    md = ["# graft report", "", f"Runs: {len(runs)}; eval folders: {len(eval_dirs)}. Numbers are pass@1 in %; "
          f"*(paper)* rows are the GRAFT paper's own numbers (docs/spec/graft.md §6).{left}", "", to_markdown(tables)]
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
