"""The paper's qualitative claims, judged from measured numbers (the `graft reproduce` report section).

Claims (graft.md §2.7, §6.1/§6.8, §6.4, §6.7):

1. **complementarity** — in independent GRPO n=8 training each model solves a share of the other's
   all-fail prompts (paper: Smol solves 47.9% of Qwen's, Qwen 18.7% of Smol's). Held when, for both
   models, the mean over seeds of the share the *other* model solves exceeds ``complementarity_min``.
2. **graft_beats_grpo** — GRAFT improves over GRPO n=8 for both models of a pair (Table 1, and over 3 runs in
   Table 4). Held when, for both models, the mean over seeds of GRAFT's eval average exceeds GRPO n=8's.
3. **gate_matters** — removing the compatibility gate (w = 1) hurts (Table 2a: −8.36 / −2.51). Held when,
   for both models, w/o gate scores below full GRAFT (means over the seeds both have).
4. **peer_last_clips** — with peer-last ordering the PPO clip acts on grafted tokens, with peer-first it
   almost never does (Table 9: 0.277/0.440% vs 0.004/0.002%). Held when, for both receivers, the mean
   ``clip_ratio/peer`` over steps 1..``clip_steps`` is larger in the peer-last run than in the peer-first run.

Verdicts: ``held`` (every model), ``partly held`` (some), ``did not hold`` (none), ``not measured``
(the runs/evals are missing). :func:`judge` is pure (numbers in, verdicts out); :func:`measure` reads the
numbers from a plan's run directories; :func:`claims_markdown` renders the section, :func:`write_claims`
appends it to ``report.md`` and writes ``claims.json``.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field

import numpy as np

DEFAULTS = {"baseline": "grpo", "method": "graft", "no_gate": "graft_nogate", "peer_first": "graft_first",
            "peer_last": None, "complementarity_min": 0.0, "clip_steps": 48}
VERDICTS = ("held", "partly held", "did not hold", "not measured")


@dataclass
class Claim:
    key: str
    claim: str  # the paper's claim in words
    paper: str  # the paper's numbers
    verdict: str
    per_model: dict = field(default_factory=dict)  # policy -> {"value"/"a"/"b"/"diff", "holds"}
    evidence: str = ""


def settings(cfg: dict | None) -> dict:
    s = {**DEFAULTS, **(cfg or {})}
    if not s.get("peer_last"):
        s["peer_last"] = s["method"]
    return s


def _mean(xs):
    xs = [float(x) for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.mean(xs)) if xs else None


def _verdict(holds: dict) -> str:
    vals = [v for v in holds.values() if v is not None]
    if not vals or len(vals) < len(holds):
        return "not measured" if not vals else ("partly held" if any(vals) else "did not hold")
    if all(vals):
        return "held"
    return "partly held" if any(vals) else "did not hold"


def _f(x, digits=2, pct=False):
    if x is None:
        return "—"
    return f"{100 * x:.{digits}f}%" if pct else f"{x:.{digits}f}"


# ----------------------------------------------------------------------------------------------- pure
def judge(measured: dict, cfg: dict | None = None) -> list[Claim]:
    """Verdicts from measured numbers. ``measured``::

        {"policies": ["a", "b"],
         "scores": {run name: {policy: {seed: eval average (pass@1 %)}}},
         "complementarity": {policy: [per seed: share of this policy's all-fail prompts the other solves]},
         "clip_peer": {run name: {policy: mean clip_ratio/peer (fraction)}}}
    """
    s = settings(cfg)
    pols = list(measured.get("policies") or [])
    scores = measured.get("scores") or {}
    out = []

    # 1. complementarity
    comp = measured.get("complementarity") or {}
    per = {}
    for p in pols:
        m = _mean(comp.get(p) or [])
        per[p] = {"value": m, "seeds": len(comp.get(p) or []),
                  "holds": None if m is None else m > float(s["complementarity_min"])}
    others = {p: ", ".join(q for q in pols if q != p) for p in pols}
    ev = "; ".join(f"{others[p]} solves {_f(per[p]['value'], 1, True)} of {p}'s all-fail prompts"
                   f" ({per[p]['seeds']} GRPO n=8 run{'s' if per[p]['seeds'] != 1 else ''})" for p in pols)
    out.append(Claim("complementarity", f"Complementarity both ways (each model solves > "
                                        f"{100 * float(s['complementarity_min']):.0f}% of the other's all-fail prompts "
                                        f"in independent GRPO n=8 training)",
                     "Smol solves 47.9% of Qwen's all-fail prompts, Qwen 18.7% of Smol's", _verdict(
                         {p: per[p]["holds"] for p in pols}), per, ev))

    # 2. GRAFT > GRPO n=8 (means over seeds)
    base, meth = scores.get(s["baseline"]) or {}, scores.get(s["method"]) or {}
    per = {}
    for p in pols:
        a = _mean((meth.get(p) or {}).values())
        b = _mean((base.get(p) or {}).values())
        per[p] = {"method": a, "baseline": b, "method_seeds": len(meth.get(p) or {}),
                  "baseline_seeds": len(base.get(p) or {}),
                  "diff": None if a is None or b is None else a - b,
                  "holds": None if a is None or b is None else a > b}
    ev = "; ".join(f"{p}: GRAFT {_f(per[p]['method'])} ({per[p]['method_seeds']} seeds) vs GRPO n=8 "
                   f"{_f(per[p]['baseline'])} ({per[p]['baseline_seeds']} seeds), Δ {_sig(per[p]['diff'])}"
                   for p in pols)
    out.append(Claim("graft_beats_grpo", "GRAFT > GRPO n=8 for both models (mean over seeds)",
                     "Pair 1 over 3 runs: +3.97 (Smol), +1.86 (Qwen); Table 1 mean Δ +2.1",
                     _verdict({p: per[p]["holds"] for p in pols}), per, ev))

    # 3. removing the gate hurts (same seeds)
    ng = scores.get(s["no_gate"]) or {}
    per = {}
    for p in pols:
        full, nog = meth.get(p) or {}, ng.get(p) or {}
        common = sorted(set(full) & set(nog), key=str)
        a = _mean([nog[k] for k in common])
        b = _mean([full[k] for k in common])
        per[p] = {"no_gate": a, "method": b, "seeds": len(common),
                  "diff": None if a is None or b is None else a - b,
                  "holds": None if a is None or b is None else a < b}
    ev = "; ".join(f"{p}: w/o gate {_f(per[p]['no_gate'])} vs GRAFT {_f(per[p]['method'])} "
                   f"(Δ {_sig(per[p]['diff'])}, {per[p]['seeds']} common seed{'s' if per[p]['seeds'] != 1 else ''})"
                   for p in pols)
    out.append(Claim("gate_matters", "Removing the compatibility gate hurts (both models)",
                     "w/o gate: −8.36 (Smol), −2.51 (Qwen) vs full GRAFT", _verdict({p: per[p]["holds"] for p in pols}),
                     per, ev))

    # 4. peer-last clips more grafted tokens than peer-first
    clip = measured.get("clip_peer") or {}
    last, first = clip.get(s["peer_last"]) or {}, clip.get(s["peer_first"]) or {}
    per = {}
    for p in pols:
        a, b = last.get(p), first.get(p)
        per[p] = {"last": a, "first": b, "holds": None if a is None or b is None else a > b}
    ev = "; ".join(f"{p} (grafted tokens): last {_f(per[p]['last'], 3, True)} vs first {_f(per[p]['first'], 3, True)}"
                   for p in pols) + f" (clip_ratio/peer, mean over steps 1-{s['clip_steps']})"
    out.append(Claim("peer_last_clips", "Peer-last ordering clips more grafted tokens than peer-first (Table 9)",
                     "Smol←Qwen 0.277% vs 0.004%; Qwen←Smol 0.440% vs 0.002%",
                     _verdict({p: per[p]["holds"] for p in pols}), per, ev))
    return out


def _sig(x):
    return "—" if x is None else f"{x:+.2f}"


# -------------------------------------------------------------------------------------------- measure
def mean_peer_clip(run_dir: str, clip_steps: int | None) -> dict:
    """policy -> mean over steps 1..clip_steps of ``clip_ratio/peer`` (steps with grafted tokens only)."""
    from graft_cli.rundir import read_metrics, training_rows

    vals: dict[str, list] = {}
    for m in training_rows(read_metrics(run_dir)):
        if clip_steps and int(m.get("step", 0)) > clip_steps:
            continue
        v = m.get("clip_ratio/peer")
        if v is not None:
            vals.setdefault(str(m.get("policy")), []).append(float(v))
    return {p: float(np.mean(v)) for p, v in vals.items() if v}


def measure(records: list[dict], cfg: dict | None = None) -> dict:
    """The numbers :func:`judge` needs, from plan records (``graft_cli.plan.execute.execute``: name, seed,
    dir, scores)."""
    s = settings(cfg)
    pols: list[str] = []
    scores: dict = {}
    for r in records:
        for p, sc in (r.get("scores") or {}).items():
            if sc.get("avg") is None:
                continue
            scores.setdefault(r["name"], {}).setdefault(p, {})[str(r["seed"])] = float(sc["avg"])
    for name in (s["baseline"], s["method"]):
        for r in records:
            if r["name"] == name:
                for p in _policies(r["dir"]):
                    if p not in pols:
                        pols.append(p)
    comp: dict = {}
    for r in records:
        if r["name"] != s["baseline"]:
            continue
        try:
            from graft_cli.analysis.complementarity import from_runs

            res = from_runs([r["dir"]])
        except Exception:
            continue
        x, y = res["x"]["policy"], res["y"]["policy"]
        comp.setdefault(x, []).append(res["mean"]["y_solves_x"])  # y solves x's all-fail prompts
        comp.setdefault(y, []).append(res["mean"]["x_solves_y"])
    clip: dict = {}
    for name in (s["peer_last"], s["peer_first"]):
        per_seed: dict[str, list] = {}
        for r in records:
            if r["name"] == name:
                for p, v in mean_peer_clip(r["dir"], s["clip_steps"]).items():
                    per_seed.setdefault(p, []).append(v)
        if per_seed:
            clip[name] = {p: float(np.mean(v)) for p, v in per_seed.items()}
    return {"policies": pols, "scores": scores, "complementarity": comp, "clip_peer": clip}


def _policies(run_dir: str) -> list[str]:
    from graft_cli.rundir import run_policies

    return run_policies(run_dir)


# -------------------------------------------------------------------------------------------- render
def headline_rows(records: list[dict], baseline: str = "grpo") -> tuple[list[str], list[list[str]]]:
    """One row per (plan run name): per policy the eval average, mean ± sample std over seeds, Δ vs baseline."""
    order: list[str] = []
    methods: dict[str, str] = {}
    pols: list[str] = []
    vals: dict = {}
    for r in records:
        if r["name"] not in order:
            order.append(r["name"])
            methods[r["name"]] = r["method"]
        for p, sc in (r.get("scores") or {}).items():
            if p not in pols:
                pols.append(p)
            if sc.get("avg") is not None:
                vals.setdefault(r["name"], {}).setdefault(p, []).append(float(sc["avg"]))
    cols = ["Run", "Method", "Seeds"] + [f"{p} avg" for p in pols] + [f"{p} Δ vs {baseline}" for p in pols]
    rows = []
    base = {p: _mean(vals.get(baseline, {}).get(p, [])) for p in pols}
    for name in order:
        v = vals.get(name, {})
        seeds = max((len(x) for x in v.values()), default=0)
        cells, deltas = [], []
        for p in pols:
            xs = v.get(p, [])
            if not xs:
                cells.append("—")
                deltas.append("—")
                continue
            m = float(np.mean(xs))
            sd = float(np.std(xs, ddof=1)) if len(xs) > 1 else None
            cells.append(f"{m:.2f}" + (f"±{sd:.2f}" if sd is not None else ""))
            deltas.append("—" if name == baseline or base[p] is None else f"{m - base[p]:+.2f}")
        rows.append([name, methods[name], str(seeds), *cells, *deltas])
    return cols, rows


def claims_markdown(claims: list[Claim], records: list[dict] | None = None, cfg: dict | None = None,
                    title: str = "Claims of the paper on this pair (from the measured numbers)") -> str:
    from graft_cli.report.markdown import md_table

    s = settings(cfg)
    out = [f"## {title}", ""]
    out.append(md_table(["#", "Claim", "Verdict", "Measured", "Paper"],
                        [[i, c.claim, f"**{c.verdict}**", c.evidence, c.paper] for i, c in enumerate(claims, 1)]))
    out.append("")
    out.append(f"Runs compared: baseline `{s['baseline']}`, method `{s['method']}`, w/o gate `{s['no_gate']}`, "
               f"peer-last `{s['peer_last']}`, peer-first `{s['peer_first']}` (names in the plan). Verdicts use the "
               "signs of the measured differences only; with few seeds and small eval sets a difference within "
               "the seed-to-seed spread is weak evidence.")
    if records:
        cols, rows = headline_rows(records, s["baseline"])
        out += ["", "### Headline: eval average pass@1 (%) per model, mean ± sample std over seeds", "",
                md_table(cols, rows)]
    return "\n".join(out) + "\n"


BEGIN, END = "<!-- claims: graft reproduce -->", "<!-- /claims -->"


def insert_section(text: str, md: str) -> str:
    """Put ``md`` between markers before the report's first table section (replacing an earlier one)."""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head.rstrip("\n") + "\n\n" + rest.split(END, 1)[1].lstrip("\n")
    block = f"{BEGIN}\n{md.rstrip()}\n{END}\n\n"
    i = text.find("\n## ")
    if i < 0:
        return text.rstrip("\n") + "\n\n" + block
    return text[: i + 1] + block + text[i + 1:]


def write_section(report_dir: str, md: str) -> str:
    """Insert (or replace) the claims section ``md`` in ``<report_dir>/report.md``; returns the file's path."""
    os.makedirs(report_dir, exist_ok=True)
    path = os.path.join(report_dir, "report.md")
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else "# graft report\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(insert_section(text, md))
    return path


def write_claims(report_dir: str, records: list[dict], cfg: dict | None = None) -> tuple[str, list[Claim]]:
    """Judge the claims from ``records``, append the section to ``<report_dir>/report.md`` (replacing an
    earlier claims section) and write ``<report_dir>/claims.json``. Returns (markdown, claims)."""
    from graft_cli.rundir import atomic_write_json

    measured = measure(records, cfg)
    claims = judge(measured, cfg)
    md = claims_markdown(claims, records, cfg)
    write_section(report_dir, md)
    atomic_write_json(os.path.join(report_dir, "claims.json"),
                      {"settings": settings(cfg), "measured": measured, "claims": [asdict(c) for c in claims]})
    return md, claims
