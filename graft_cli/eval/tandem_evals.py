"""Tandem RLVR's evaluations of a checkpoint (tandem.md §2.10), next to the solo evaluation of
:mod:`graft_cli.eval.runner`:

1. **Solo pass@k** (k = 1, 2, 4, 8): the ordinary evaluation folder (its ``summary.json`` holds the
   unbiased pass@k); :func:`pass_at_k_curve` computes every k = 1..8 from its run files, and
   :func:`plot_policy_pass_at_k` draws that curve for every evaluated checkpoint of a policy into
   ``<run>/eval/<policy>/pass_at_k.png`` (solo solid, handoff dashed).
2. **Handoff robustness** (``<step folder>/handoff/``): the senior and the frozen junior write each
   answer in strict alternation at reasoning-step ends: the senior writes first, the author toggles
   after every token whose text ends with ``delimiter`` (``"\\n\\n"``; the tiny pair: ``","``), one
   shared token budget (``max_new_tokens``), ``samples`` chains per problem; the team answer is
   graded and scored like the solo one (same files, same summary, rows also carry the author mask
   and ``senior_frac``). It runs in the tandem engine with the ``sentence`` schedule (the paper's
   in-engine variant, §2.10.4), so both models keep their KV caches and the chain is one batched
   generation; the paper's offline script re-prompts each turn with the text so far (§2.10.2), which
   can tokenize a step boundary differently.
3. **Legibility** (``<step folder>/legibility/``): the frozen junior's per-token cross-entropy
   (nats) on the senior's solo responses (every response of every solo run file), teacher-forced at
   temperature 1 after the same prompt: per response ``ce = −Σ_t log p_junior(y_t | x, y_<t) / |y|``
   over the response re-tokenized from its text (the EOS is not scored). Per benchmark the pooled
   token mean ``Σ nll / Σ |y|`` (``ce``) and the mean of the responses' ``ce``
   (``ce_response_mean``); ``macro_ce``: the unweighted mean over benchmarks of ``ce``. Lower = more
   legible to the junior. :func:`legibility_problems` reads it back per problem (each problem's
   responses pooled) for the paired comparison of two arms.

The junior must share the senior's vocabulary (checked before anything is generated).
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np

from graft_cli.batch import TrainBatch
from graft_cli.errors import GraftError
from graft_cli.eval.files import read_grades, run_file, step_dirs
from graft_cli.eval.metrics import pass_at_k_run
from graft_cli.models.loading import vocab_difference
from graft_cli.models.scoring import ScoreSettings, score_rows
from graft_cli.rollout import ENGINES
from graft_cli.rundir import atomic_write_json, read_json, read_json_or_none, read_jsonl, write_jsonl_atomic

HANDOFF_DIR, LEGIBILITY_DIR = "handoff", "legibility"


def handoff_settings(settings, junior: str, delimiter: str):
    """The solo settings plus what a handoff folder also depends on (junior, schedule,
    delimiter)."""
    return replace(settings, extra={"handoff": {"junior": junior, "schedule": "sentence", "delimiter": delimiter}})


def run_junior(cfg, junior: str | None = None) -> str:
    """The junior of a run's handoff and legibility evaluations: ``junior``, else ``eval.junior``,
    else the frozen model the run's rollout engine co-generates with (tandem), else the pair's
    ``tandem.junior``."""

    if junior or cfg.eval.junior:
        return junior or cfg.eval.junior
    frozen = {p.name: p for p in cfg.policies if p.role == "frozen"}
    for k in ENGINES.get(cfg.rollout.engine).frozen_kwargs if cfg.rollout.engine in ENGINES else ():
        name = cfg.rollout.engine_kwargs.get(k)
        if name in frozen:
            return frozen[name].model
    if (cfg.tandem or {}).get("junior"):
        return cfg.tandem["junior"]
    raise GraftError("the handoff and legibility evaluations need a junior: --junior MODEL, or eval.junior / "
                     "tandem.junior in the run's config")


def check_junior(junior_tok, senior_tok, junior: str, senior: str) -> None:
    diff = vocab_difference(junior_tok, senior_tok)
    if diff:
        raise GraftError(f"junior {junior} and senior {senior} do not share a vocabulary ({diff}); the handoff "
                         "evaluation feeds one token id to both")


def handoff_engine(model, tokenizer, junior_model, delimiter: str, engine_kwargs: dict | None = None,
                   max_batch: int = 256):
    kw = {k: v for k, v in (engine_kwargs or {}).items() if k in ("cache", "compile", "compile_mode", "cache_bucket")}
    return ENGINES.get("tandem")(model, tokenizer, junior=junior_model, schedule="sentence", delimiter=delimiter,
                                 max_batch=max_batch, **kw)


# ------------------------------------------------------------------------------------------- legibility
def legibility(junior_model, tokenizer, spec, solo_dir: str, out_dir: str, benches, junior: str,
               token_budget: int = 32768, force: bool = False) -> dict:
    """Score the junior on every solo response of ``solo_dir`` into ``out_dir`` (module docstring);
    a benchmark whose file already holds every response is read back. Returns the summary."""

    os.makedirs(out_dir, exist_ok=True)
    old = read_json_or_none(os.path.join(out_dir, "summary.json"))
    if old and old.get("junior") != junior and not force:
        raise GraftError(f"{out_dir}: holds legibility under another junior ({old.get('junior')}); use --force")
    per_bench = {}
    for bench, problems in benches:
        rows, k = [], 1
        while os.path.exists(run_file(solo_dir, bench.name, k)):
            rows += read_jsonl(run_file(solo_dir, bench.name, k))
            k += 1
        path = os.path.join(out_dir, f"{bench.name}.jsonl")
        done = read_jsonl(path) if os.path.exists(path) and not force else []
        if not rows:
            continue
        if len(done) != len(rows) or (old or {}).get("junior") != junior:
            b = TrainBatch()
            keep = []
            for r in rows:
                resp = tokenizer(r["response"], add_special_tokens=False)["input_ids"]
                if resp:
                    keep.append(r)
                    b.prompt_ids.append(spec.encode(problems[int(r["problem_index"])].problem, tokenizer))
                    b.response_ids.append(resp)
            lps = score_rows(junior_model, tokenizer.pad_token_id, b, ScoreSettings(temperature=1.0,
                                                                                  token_budget=token_budget))
            scored = {id(r): lp for r, lp in zip(keep, lps)}
            done = []
            for r in rows:
                lp = scored.get(id(r), [])
                nll = -float(sum(lp))
                done.append({"benchmark": bench.name, "problem_index": r["problem_index"], "run": r["run"],
                             "sample": r["sample"], "num_tokens": len(lp), "nll": nll,
                             "ce": nll / len(lp) if lp else None})
            write_jsonl_atomic(path, done)
        per_bench[bench.name] = summarize_legibility(done)
    ces = [v["ce"] for v in per_bench.values() if v["ce"] is not None]
    summary = {"junior": junior, "benchmarks": per_bench, "macro_ce": float(np.mean(ces)) if ces else None}
    atomic_write_json(os.path.join(out_dir, "summary.json"), summary)
    return summary


def summarize_legibility(rows: list[dict]) -> dict:
    """Pooled token-mean CE Σ nll / Σ |y| and the mean of per-response CEs (responses with no token
    skipped)."""
    scored = [r for r in rows if r.get("num_tokens")]
    tokens = sum(int(r["num_tokens"]) for r in scored)
    return {"ce": sum(float(r["nll"]) for r in scored) / tokens if tokens else None,
            "ce_response_mean": float(np.mean([r["ce"] for r in scored])) if scored else None,
            "num_tokens": tokens, "num_responses": len(scored)}


def legibility_problems(folder: str) -> dict[str, np.ndarray]:
    """Per benchmark of a legibility folder (``<bench>.jsonl``) the per-problem CE (nats/token):
    each problem's responses pooled, ``Σ nll / Σ |y|``; NaN for a problem none of whose responses
    has a scored token. A benchmark with an unreadable or malformed file is left out."""
    out = {}
    if not os.path.isdir(folder):
        return out
    for f in sorted(os.listdir(folder)):
        if not f.endswith(".jsonl"):
            continue
        try:
            rows = read_jsonl(os.path.join(folder, f))
            nll: dict[int, float] = {}
            tok: dict[int, int] = {}
            for r in rows:
                i = int(r["problem_index"])
                n = int(r.get("num_tokens") or 0)
                nll[i] = nll.get(i, 0.0) + (float(r["nll"]) if n else 0.0)
                tok[i] = tok.get(i, 0) + n
        except (OSError, KeyError, TypeError, ValueError):
            continue
        if not tok or min(tok) < 0:
            continue
        out[f[: -len(".jsonl")]] = np.array([nll.get(i, 0.0) / tok[i] if tok.get(i) else np.nan
                                             for i in range(max(tok) + 1)])
    return out


# ------------------------------------------------------------------------------------------------ pass@k
CURVE_KS = tuple(range(1, 9))  # the pass@k curves: k = 1..8 (the paper's n = 8 samples)


def pass_at_k_curve(folder: str, ks=CURVE_KS) -> dict[int, float]:
    """k -> macro pass@k (fraction) of an evaluation folder from its run files: per benchmark the
    unbiased pass@k of each run (mean over problems of ``1 − C(n−c, k)/C(n, k)``) averaged over
    runs, then the unweighted mean over benchmarks. k above a benchmark's samples is left out for
    all."""

    grades = read_grades(folder)
    if not grades:
        return {}
    S = min(g.shape[2] for g in grades.values())
    return {k: float(np.mean([np.mean([pass_at_k_run(g[r], k) for r in range(g.shape[0])]) for g in grades.values()]))
            for k in ks if 1 <= k <= S}


SUMMARY_KS = (1, 2, 4, 8)  # the k of an eval summary's pass@k


def macro_pass_at_k(summary: dict | None) -> dict[str, float]:
    """k -> (1/B) Σ_b summary pass@k mean of benchmark b, in %, over every benchmark of the summary;
    a k that some benchmark lacks is left out."""
    benches = summary.get("benchmarks") if isinstance(summary, dict) else None
    if not isinstance(benches, dict):
        return {}
    out = {}
    for k in SUMMARY_KS:
        try:
            vals = [float(b["pass@k"][str(k)]["mean"]) for b in benches.values()]
        except (KeyError, TypeError, ValueError):
            continue
        if vals and all(np.isfinite(vals)):
            out[str(k)] = 100.0 * float(np.mean(vals))
    return out



# ------------------------------------------------------------------------------------------------ plot
def plot_policy_pass_at_k(run_dir: str, policy: str) -> str | None:
    """``<run>/eval/<policy>/pass_at_k.png``: solo (and handoff, dashed) pass@k, k = 1..8 (up to the
    samples), of every evaluated step, from its run files (else the summary's k = 1, 2, 4, 8)."""

    def curve(d: str, summary) -> dict[str, float]:
        c = pass_at_k_curve(d)
        return {str(k): 100.0 * v for k, v in c.items()} if c else macro_pass_at_k(summary)

    curves = {}
    for step, d in step_dirs(os.path.join(run_dir, "eval", policy)).items():
        curves[f"step {step} solo"] = curve(d, read_json(os.path.join(d, "summary.json")))
        h = read_json_or_none(os.path.join(d, HANDOFF_DIR, "summary.json"))
        if h:
            curves[f"step {step} handoff"] = curve(os.path.join(d, HANDOFF_DIR), h)
    curves = {label: {int(k): v / 100.0 for k, v in c.items()} for label, c in curves.items() if c}
    if not curves:
        return None
    return plot_pass_at_k(curves, os.path.join(run_dir, "eval", policy, "pass_at_k.png"),
                          title=f"{policy}: pass@k per checkpoint (macro over benchmarks)")


def plot_pass_at_k(curves: dict[str, dict[int, float]], path: str, title: str = "pass@k") -> str | None:
    """pass@k (in %) against k on a log-2 axis, one line per label (e.g. per checkpoint: ``{"step
    20": {1: .31, 2: .42, ...}}``; a label containing "handoff" is dashed). None without
    matplotlib."""
    try:
        import matplotlib  # a plotting library: imported only when a picture is drawn

        matplotlib.use("Agg")
        # lazy: matplotlib is only needed for plots
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, c in curves.items():
        ks = sorted(c)
        ax.plot(ks, [100 * c[k] for k in ks], marker="o", linestyle="--" if "handoff" in label else "-", label=label)
    ax.set_xscale("log", base=2)
    ax.set(title=title, xlabel="k (samples)", ylabel="pass@k %")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
