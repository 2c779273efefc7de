"""Exchange among more than two peers, judged from a plan's measured numbers (beyond the GRAFT
paper).

The plan (``experiments/reproduce/tiny3.yaml``, ``claims.kind: npeer``) trains GRPO on every model,
GRAFT on every pair of models, and three-way GRAFT under each N-peer rule
(``exchange.params.n_peer``). Two questions:

1. **two_peers_beat_best_single** (one claim per rule R) — per model X: Δ = pass@1 of X in three-way
   GRAFT under R − pass@1 of X in GRAFT with its *best single peer*, the pairwise run with X whose
   mean macro pass@1 over seeds is highest (chosen on the same numbers, which favours the single
   peer: a conservative choice). Verdict per model :func:`~graft_cli.report.stats.verdict` (``held``
   when the 95% interval excludes 0 upwards, ``not significant`` when it straddles 0, ``did not
   hold`` when it excludes 0 downwards); the claim's verdict is the models' common one, else
   ``mixed``.
2. **best_rule** — pooled over the models (each model's benchmarks enter the macro mean as their own
   benchmarks, so every model weighs the same): the rule with the highest mean; Δ = best − each
   other rule. ``held`` when every interval excludes 0 upwards (that rule is best), ``not
   significant`` otherwise. Per model, the rule with the highest mean and its Δ to the runner-up are
   listed too.

Also measured without a verdict: every arm against GRPO per model. Intervals: the interval of record
of :func:`~graft_cli.report.stats.compare`, the t-interval over the seeds' macro pass@1, paired
where the arms share their seeds, with the variance decomposition and the hierarchical bootstrap
beside it. Per-problem pass@1 comes from each run's evaluation files of its evaluated step
(``eval/<policy>/step_<step>/<bench>_run<k>.jsonl``); anything missing is ``not measured``.
:func:`judge` is pure; :func:`measure` reads the run directories. """

from __future__ import annotations

import os
import re

import numpy as np

from graft_cli.eval.files import read_problem_stats
from graft_cli.report.claims import write_section
from graft_cli.report.markdown import md_table, mean_sd
from graft_cli.report.power import VARIANCE_COLUMNS, VARIANCE_NOTE, variance_row
from graft_cli.report.stats import compare, comparison_verdict, macro_mean, overall_verdict, verdict
from graft_cli.rundir import atomic_write_json, eval_step_dir, metrics_path, read_jsonl

RULES = ("best_source", "round_robin", "pooled_donor")
DEFAULTS = {"kind": "npeer", "grpo": "grpo", "pairwise": ["graft_ab", "graft_ac", "graft_bc"],
            "three_way": {"best_source": "graft3", "round_robin": "graft3_rr", "pooled_donor": "graft3_pd"},
            "n_boot": 2000}


def settings(cfg: dict | None) -> dict:
    return {**DEFAULTS, **(cfg or {})}


# ---------------------------------------------------------------------------------------------- measure
def measure(records: list[dict], cfg: dict | None = None) -> dict:
    """``{"problems": model -> run name -> seed -> bench -> per-problem pass@1 (0..1)}, "eval_var":
    the same keys -> v_b (graft_cli.report.power eq. 2), "models": [...], "peers": run name ->
    [models it trains]}`` from the records' evaluated steps."""
    out: dict = {"problems": {}, "eval_var": {}, "models": [], "peers": {}, "exchange": {}}
    for r in records:
        name, seed, rd = r.get("name"), r.get("seed"), r.get("dir") or ""
        if name is None or not os.path.isdir(rd):
            continue
        ex = exchange_volume(rd)
        if ex:
            out["exchange"].setdefault(name, {})[seed] = ex
        for pol, sc in sorted((r.get("scores") or {}).items()):
            if not isinstance(sc, dict) or sc.get("step") is None:
                continue
            probs, var, _ = read_problem_stats(eval_step_dir(rd, pol, int(sc["step"])))
            if not probs:
                continue
            out["problems"].setdefault(pol, {}).setdefault(name, {})[seed] = probs
            out["eval_var"].setdefault(pol, {}).setdefault(name, {})[seed] = var
            if pol not in out["models"]:
                out["models"].append(pol)
            peers = out["peers"].setdefault(name, [])
            if pol not in peers:
                peers.append(pol)
    out["models"].sort()
    return out


def exchange_volume(run_dir: str) -> dict:
    """receiver -> {admitted: mean admitted grafted responses per step, share: mean
    ``graft/grafted_share``, from: {source: mean ``graft/admitted/<source>``} (runs of 3+ policies)}
    from ``metrics.jsonl``."""
    try:
        rows = read_jsonl(metrics_path(run_dir))
    except (OSError, ValueError):
        return {}
    acc: dict = {}
    for m in rows:
        pol = m.get("policy")
        if pol is None or "graft/admitted" not in m:
            continue
        a = acc.setdefault(str(pol), {"admitted": [], "share": [], "from": {}})
        a["admitted"].append(float(m["graft/admitted"]))
        a["share"].append(float(m.get("graft/grafted_share", 0.0)))
        for k, v in m.items():
            if k.startswith("graft/admitted/"):
                a["from"].setdefault(k.split("/", 2)[2], []).append(float(v))
    return {p: {"admitted": float(np.mean(a["admitted"])), "share": float(np.mean(a["share"])),
                "from": {s: float(np.mean(v)) for s, v in a["from"].items()}} for p, a in acc.items()}


# ----------------------------------------------------------------------------------------------- pure
def seed_means(arm: dict | None) -> list[float]:
    """Each seed's macro pass@1 (%) over the benchmarks every seed of ``arm`` has (seed order); []
    if none."""
    if not arm:
        return []
    benches = sorted(set.intersection(*(set(v) for v in arm.values())))
    return [100 * macro_mean([np.asarray(v[b], float) for b in benches]) for v in arm.values()] if benches else []


def arm_mean(arm: dict | None) -> float | None:
    """Mean over seeds of :func:`seed_means`; None if empty."""
    xs = seed_means(arm)
    return float(np.mean(xs)) if xs else None


def best_single(problems: dict, model: str, pairwise: list[str]) -> tuple[str | None, float | None]:
    """The pairwise run of ``model`` with the highest mean macro pass@1 of ``model`` (ties: plan
    order)."""
    best, best_v = None, None
    for name in pairwise:
        v = arm_mean((problems.get(model) or {}).get(name))
        if v is not None and (best_v is None or v > best_v):
            best, best_v = name, v
    return best, best_v


def pooled(problems: dict, models: list[str]) -> dict:
    """run name -> seed -> {"<model>/<bench>": per-problem array}: every model's benchmarks as
    benchmarks of one macro mean (so each model weighs by its number of benchmarks, equal here)."""
    out: dict = {}
    for m in models:
        for name, arm in (problems.get(m) or {}).items():
            for seed, benches in arm.items():
                out.setdefault(name, {}).setdefault(seed, {}).update({f"{m}/{b}": v for b, v in benches.items()})
    return out


def judge(measured: dict, cfg: dict | None = None) -> list[dict]:
    """The claims (module docstring) from :func:`measure`'s output."""
    s = settings(cfg)
    n_boot = int(s["n_boot"])
    probs, models = measured.get("problems") or {}, list(measured.get("models") or [])
    evar = measured.get("eval_var") or {}
    rule = (s.get("analysis") or {}).get("interval", "floored_t")  # the plan's registered interval rule
    three = {r: n for r, n in s["three_way"].items() if n}
    claims = []
    for rule, run in three.items():
        per = {}
        for m in models:
            single, _ = best_single(probs, m, [p for p in s["pairwise"] if p in (probs.get(m) or {})])
            if single is None or run not in (probs.get(m) or {}):
                per[m] = {"verdict": "not measured", "interval": None, "welch": None, "best_single": single}
                continue
            c = compare(probs[m], run, single, n_boot, eval_var=evar.get(m), rule=rule)
            per[m] = {"verdict": comparison_verdict(c), "interval": c["interval"], "method": c["method"],
                      "bootstrap": c["bootstrap"], "welch": c["welch"], "decomposition": c["decomposition"],
                      "best_single": single, "benchmarks": c["benchmarks"], "seeds": c["seeds"]}
        claims.append({"key": f"two_peers_beat_best_single[{rule}]", "rule": rule, "run": run,
                       "claim": f"each model gains more from two peers ({rule}) than from its best single peer",
                       "verdict": overall_verdict(v["verdict"] for v in per.values()), "per_model": per,
                       "measured": "Δ = three-way GRAFT − GRAFT with the best single peer, pass@1 points (macro "
                                   "over benchmarks); 95% t-interval over seeds, paired where the arms share seeds"})
    pool = pooled(probs, models)
    means = {r: arm_mean(pool.get(n)) for r, n in three.items()}
    ranked = sorted((r for r in three if means[r] is not None), key=lambda r: -means[r])
    best = ranked[0] if ranked else None
    vs = {r: compare(pool, three[best], three[r], n_boot) for r in ranked[1:]} if best else {}
    if not best:
        v = "not measured"
    else:
        v = "held" if vs and all(verdict(c["interval"]) == "held" for c in vs.values()) else "not significant"
    per_model = {}
    for m in models:
        ms = {r: arm_mean((probs.get(m) or {}).get(n)) for r, n in three.items()}
        rk = sorted((r for r in ms if ms[r] is not None), key=lambda r: -ms[r])
        if len(rk) >= 2:
            c = compare(probs[m], three[rk[0]], three[rk[1]], n_boot, eval_var=evar.get(m), rule=rule)
            per_model[m] = {"best": rk[0], "runner_up": rk[1], "interval": c["interval"], "means": ms,
                            "decomposition": c["decomposition"]}
        elif rk:
            per_model[m] = {"best": rk[0], "runner_up": None, "interval": None, "means": ms}
    claims.append({"key": "best_rule", "rule": best, "claim": f"the best N-peer rule is {best or '—'}",
                   "verdict": v, "means": means, "versus": {r: {"interval": c["interval"], "welch": c["welch"]}
                                                           for r, c in vs.items()},
                   "per_model": per_model,
                   "measured": "pooled over the models: Δ = best rule − each other rule, pass@1 points; 95% t-interval "
                               "over (model, seed) pairs, paired where the arms share them"})
    return claims


def versus_grpo(measured: dict, cfg: dict | None = None) -> dict:
    """model -> arm name -> (Δ, lo, hi) of the arm − GRPO (points; the interval of record of
    :func:`graft_cli.report.stats.compare`), for every arm with the model."""
    s = settings(cfg)
    probs = measured.get("problems") or {}
    out: dict = {}
    for m, arms in probs.items():
        if s["grpo"] not in arms:
            continue
        out[m] = {n: compare(arms, n, s["grpo"], int(s["n_boot"]))["interval"] for n in arms if n != s["grpo"]}
    return out


# ---------------------------------------------------------------------------------------------- render
def arm_order(measured: dict, cfg: dict | None = None) -> list[tuple[str, str]]:
    """(run name, label) of every arm in table order: GRPO, the pairs, the three-way rules."""
    s = settings(cfg)
    peers = measured.get("peers") or {}
    rows = [(s["grpo"], "GRPO (each model alone)")]
    rows += [(n, "GRAFT, " + " + ".join(peers.get(n) or ["?"])) for n in s["pairwise"]]
    rows += [(n, f"GRAFT, three peers, {r}") for r, n in s["three_way"].items() if n]
    return rows


def _fmt(arm: dict | None) -> str:
    xs = seed_means(arm)
    return mean_sd(xs) + f" ({len(xs)})" if xs else "—"


def _iv(iv) -> str:
    return "—" if iv is None else f"{iv[0]:+.2f} [{iv[1]:+.2f}, {iv[2]:+.2f}]"


def table_markdown(measured: dict, cfg: dict | None = None) -> str:
    models = measured.get("models") or []
    probs = measured.get("problems") or {}
    rows = [[label, name, *[_fmt((probs.get(m) or {}).get(name)) for m in models]]
            for name, label in arm_order(measured, cfg)]
    return md_table(["Arm", "Run", *[f"{m} pass@1 % (seeds)" for m in models]], rows)


def exchange_markdown(measured: dict, cfg: dict | None = None) -> str:
    """Per arm and receiver: admitted grafted responses per step and the grafted share of its update
    batch (mean over steps and seeds); for three peers, per source."""

    models = measured.get("models") or []
    rows = []
    for name, label in arm_order(measured, cfg):
        seeds = (measured.get("exchange") or {}).get(name) or {}
        if not seeds:
            continue
        cells = []
        for m in models:
            per = [v[m] for v in seeds.values() if m in v]
            if not per:
                cells.append("—")
                continue
            cell = f"{np.mean([p['admitted'] for p in per]):.1f} ({100 * np.mean([p['share'] for p in per]):.1f}%)"
            srcs = sorted({s for p in per for s in p["from"]})
            if srcs:
                cell += " = " + " + ".join(f"{np.mean([p['from'].get(s, 0.0) for p in per]):.1f} from {s}"
                                           for s in srcs)
            cells.append(cell)
        rows.append([label, name, *cells])
    if not rows:
        return ""
    return md_table(["Arm", "Run", *[f"{m} receives / step (grafted share)" for m in models]], rows)


def first_seed(pngs: list[str]) -> list[str]:
    """Of ``transfer_<pair>-<name>-s<seed>.png`` files, the lowest seed of each run name (sorted by
    name)."""

    best: dict = {}
    for p in pngs:
        m = re.fullmatch(r"transfer_(.+)-s(\d+)\.png", p)
        if m and (m[1] not in best or int(m[2]) < best[m[1]][0]):
            best[m[1]] = (int(m[2]), p)
    return [best[k][1] for k in sorted(best)]


def claims_markdown(claims: list[dict], models: list[str]) -> str:
    rows = []
    for c in claims:
        if c["key"] == "best_rule":
            ev = "; ".join(f"vs {r}: {_iv(v['interval'])}" for r, v in c["versus"].items()) or "—"
            ev += " | per model: " + "; ".join(
                f"{m} best {v['best']}" + (f" (vs {v['runner_up']} {_iv(v['interval'])})" if v["runner_up"] else "")
                for m, v in c["per_model"].items())
        else:
            ev = "; ".join(f"{m}: {_iv(v['interval'])} vs {v['best_single'] or '—'} ({v['verdict']})"
                           for m, v in c["per_model"].items())
        rows.append([c["claim"], c["verdict"], ev])
    return md_table(["Claim", "Verdict", "Measured Δ, pass@1 points [95% CI]"], rows)


def section_markdown(measured: dict, claims: list[dict], cfg: dict | None, report_dir: str) -> str:
    s = settings(cfg)
    models = measured.get("models") or []
    vg = versus_grpo(measured, cfg)
    names = [n for n, _ in arm_order(measured, cfg) if n != s["grpo"]]
    grpo_rows = [[n, *[_iv((vg.get(m) or {}).get(n)) if n in (vg.get(m) or {}) else "—" for m in models]]
                 for n in names]
    exchange = exchange_markdown(measured, cfg)
    var_rows = [variance_row(f"{c['rule']} − best single ({v['best_single']})", m, v.get("decomposition"))
                for c in claims if c["key"].startswith("two_peers") for m, v in c["per_model"].items()
                if v.get("decomposition")]
    plots = sorted(f for f in os.listdir(os.path.join(report_dir, "plots"))
                   if f.startswith("transfer_")) if os.path.isdir(os.path.join(report_dir, "plots")) else []
    return "\n".join([
        "## Exchange among three peers (from the measured numbers)", "",
        "Held-out pass@1 (%, macro over the benchmarks, mean ± std over seeds; the number of seeds in brackets):", "",
        table_markdown(measured, cfg), "",
        "### Claims", "", claims_markdown(claims, models), "",
        *(["### Where the variance comes from (two peers − best single peer)", "",
           md_table(VARIANCE_COLUMNS, var_rows), "", VARIANCE_NOTE, ""] if var_rows else []),
        *(["Exchange volume (admitted grafted responses per step, mean over steps and seeds; the share of the "
           "receiver's update batch that is grafted):", "", exchange, ""] if exchange else []),
        "Each arm against GRPO (Δ pass@1 points [95% CI], no verdict):", "",
        md_table(["Run", *models], grpo_rows), "",
        *(["Transfer matrices (admitted grafted responses per step, source → receiver), the first seed of each "
           "three-peer run (every run's is `plots/transfer_<run>.png`):", "",
           *[f"![transfer {p[len('transfer_'):-4]}](plots/{p})" for p in first_seed(plots)], ""] if plots else []),
        "Intervals: the 95% t-interval over the seeds' macro pass@1 (Δ macro-averaged over the benchmarks both "
        "arms have; paired where the arms ran the same seeds, Welch otherwise; the evaluation's sampling noise is "
        "inside each seed's score). The best single peer is chosen per model as the pairwise run with the higher "
        "mean, on the same numbers (which favours it). `held`: the interval excludes 0 upwards; `not significant`: it "
        "straddles 0; `did not hold`: it excludes 0 downwards; `mixed`: the models disagree.", ""])


def write_claims(report_dir: str, records: list[dict], cfg: dict | None = None) -> tuple[str, list[dict]]:
    """The three-peer section (table, claims, versus GRPO) into ``<report_dir>/report.md`` and
    ``claims.json``."""

    measured = measure(records, cfg)
    claims = judge(measured, cfg)
    md = section_markdown(measured, claims, cfg, report_dir)
    write_section(report_dir, md)
    atomic_write_json(os.path.join(report_dir, "claims.json"),
                      {"settings": settings(cfg), "models": measured["models"], "peers": measured["peers"],
                       "exchange": measured["exchange"],
                       "versus_grpo": versus_grpo(measured, cfg), "claims": claims})
    return md, claims
