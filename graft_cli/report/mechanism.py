"""How GRAFT acts, beyond the headline: per-family held-out curves, rescue rates and admitted
shares.

* **Per-family pass@1 over steps** (:func:`family_curves`, :func:`plot_family_curves`): for the
  baseline and method runs of a plan, every evaluated checkpoint's per-problem grades on one
  benchmark (``eval/<policy>/step_N/<bench>_run<k>.jsonl``), grouped by the problem's family. The
  family comes from the benchmark's own file (the ``source`` recorded in the folder's
  ``meta.json``), from the first of the fields :data:`FAMILY_KEYS` a record has (the tiny task's
  ``family``; MATH's ``subject`` or ``type``). One PNG per model: a panel per family, GRPO and GRAFT
  as mean ± min/max over seeds.
* **Rescue rate** (:func:`rescue_table`): the ``rescue.json`` of each run's scored step
  (:mod:`graft_cli.eval.rescue`), pooled over seeds: rescued / events per subset.
* **Admitted share** (:func:`admitted_curves`): ``graft/frac_admitted`` per step from
  ``metrics.jsonl`` (share of grafted responses the gate admits; mean over seeds).
* **The gate made visible** (:func:`admission_frame`, :func:`plot_s_histogram`,
  :func:`family_admitted`): every transferred response's compatibility score s from the exchange
  logs (``rollouts/<receiver>/exchange_step_N.parquet``): the distribution of s per direction
  (source → receiver), split into admitted / rejected and correct / wrong, and the admitted share
  per skill family over steps (the family from the run's training file, :func:`train_family_map`).
"""

from __future__ import annotations

import glob
import os

import numpy as np

from graft_cli.algorithms.exchange.base import exchange_params
from graft_cli.algorithms.exchange.graft import gate_floor
from graft_cli.eval.files import STEP_DIR_RE, run_file
from graft_cli.eval.rescue import RESCUE_DIR
from graft_cli.report.markdown import md_table
from graft_cli.report.plots import _plt, _save
from graft_cli.rundir import eval_step_dir, read_json_or_none, read_jsonl, read_metrics, run_config_raw, training_rows
from graft_cli.tiny.build import default_cache_dir

FAMILY_KEYS = ("family", "subject", "type")


def family_map(source: str) -> dict[str, str]:
    """problem id -> family for a local JSONL benchmark file (``{}`` when unreadable or without a
    family)."""
    if not source or not os.path.isfile(source) or not source.endswith(".jsonl"):
        return {}
    try:
        rows = read_jsonl(source)
    except (OSError, ValueError):
        return {}
    out = {}
    for r in rows:
        fam = next((r[k] for k in FAMILY_KEYS if r.get(k) is not None), None)
        if fam is not None and r.get("id") is not None:
            out[str(r["id"])] = str(fam)
    return out


def step_family_pass1(folder: str, bench: str) -> dict[str, float]:
    """family -> mean grade over the problems of that family, every run and sample, in one eval
    folder."""
    meta = read_json_or_none(os.path.join(folder, "meta.json")) or {}
    src = ((meta.get("benchmarks") or {}).get(bench) or {}).get("source", "")
    fam = family_map(src)
    if not fam:
        return {}
    grades: dict[str, list[float]] = {}
    k = 1
    while os.path.exists(p := run_file(folder, bench, k)):
        for r in read_jsonl(p):
            f = fam.get(str(r.get("problem_id")))
            if f is not None:
                grades.setdefault(f, []).append(float(r["grade"]))
        k += 1
    return {f: float(np.mean(v)) for f, v in sorted(grades.items())}


def family_curves(records: list[dict], names: tuple[str, ...], bench: str = "math500") -> dict:
    """``{policy: {run name: {family: {step: [per-seed pass@1]}}}}`` over every evaluated step of
    the runs named ``names``."""
    out: dict = {}
    for r in records:
        if r["name"] not in names:
            continue
        root = os.path.join(r["dir"], "eval")
        if not os.path.isdir(root):
            continue
        for pol in sorted(os.listdir(root)):
            pdir = os.path.join(root, pol)
            for d in sorted(os.listdir(pdir)) if os.path.isdir(pdir) else []:
                m = STEP_DIR_RE.match(d)
                if not m:
                    continue
                for fam, v in step_family_pass1(os.path.join(pdir, d), bench).items():
                    (out.setdefault(pol, {}).setdefault(r["name"], {}).setdefault(fam, {})
                     .setdefault(int(m.group(1)), []).append(v))
    return out


def plot_family_curves(curves: dict, out_dir: str, labels: dict | None = None) -> dict[str, str]:
    """One PNG per policy (``family_<policy>.png``): a panel per family, pass@1 (%) over steps per
    run, mean over seeds with the min-max band. Returns policy -> path."""
    plt = _plt()
    labels = labels or {}
    paths = {}
    for pol, runs in curves.items():
        fams = sorted({f for r in runs.values() for f in r})
        if not fams:
            continue
        cols = min(3, len(fams))
        rows = (len(fams) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False, sharex=True)
        for i, fam in enumerate(fams):
            ax = axes[i // cols][i % cols]
            for name, fr in runs.items():
                pts = sorted((fr.get(fam) or {}).items())
                if not pts:
                    continue
                x = [s for s, _ in pts]
                m = [100 * np.mean(v) for _, v in pts]
                ax.plot(x, m, marker="o", label=labels.get(name, name))
                ax.fill_between(x, [100 * min(v) for _, v in pts], [100 * max(v) for _, v in pts], alpha=0.2)
            ax.set_title(fam)
            ax.set_ylabel("pass@1 (%)")
            ax.grid(alpha=0.3)
        for j in range(len(fams), rows * cols):
            axes[j // cols][j % cols].axis("off")
        axes[0][0].legend(fontsize=8)
        for ax in axes[-1]:
            ax.set_xlabel("step")
        fig.suptitle(f"policy {pol}: held-out pass@1 per skill family (mean, min-max over seeds)")
        os.makedirs(out_dir, exist_ok=True)
        paths[pol] = _save(fig, os.path.join(out_dir, f"family_{pol}.png"))
    return paths


def rescue_table(records: list[dict], names: tuple[str, ...]) -> list[dict]:
    """Per (run name, policy): seeds, and per subset (admitted / not_admitted) the events and
    rescued prompts summed over seeds, the pooled rate and the per-seed rates."""
    acc: dict = {}
    for r in records:
        if r["name"] not in names:
            continue
        for pol, sc in (r.get("scores") or {}).items():
            if sc.get("step") is None:
                continue
            path = os.path.join(eval_step_dir(r["dir"], pol, sc["step"]), RESCUE_DIR, "rescue.json")
            js = read_json_or_none(path)
            if not js:
                continue
            a = acc.setdefault((r["name"], pol), {"run": r["name"], "policy": pol, "seeds": 0,
                                                   "admitted": [0, 0, []], "not_admitted": [0, 0, []]})
            a["seeds"] += 1
            for sub in ("admitted", "not_admitted"):
                v = js.get(sub) or {}
                a[sub][0] += int(v.get("events") or 0)
                a[sub][1] += int(v.get("rescued") or 0)
                if v.get("rate") is not None:
                    a[sub][2].append(float(v["rate"]))
    out = []
    for (name, pol), a in sorted(acc.items(), key=lambda kv: (kv[0][1], names.index(kv[0][0]))):
        row = {"run": name, "policy": pol, "seeds": a["seeds"]}
        for sub in ("admitted", "not_admitted"):
            ev, res, rates = a[sub]
            row[sub] = {"events": ev, "rescued": res, "rate": res / ev if ev else None, "per_seed": rates}
        out.append(row)
    return out


def admitted_curves(records: list[dict], name: str) -> dict:
    """policy -> {step: mean over seeds of ``graft/frac_admitted``} for the runs named ``name``."""

    acc: dict = {}
    for r in records:
        if r["name"] != name:
            continue
        for m in training_rows(read_metrics(r["dir"])):
            v = m.get("graft/frac_admitted")
            if v is not None:
                acc.setdefault(str(m.get("policy")), {}).setdefault(int(m["step"]), []).append(float(v))
    return {p: {s: float(np.mean(v)) for s, v in sorted(d.items())} for p, d in acc.items()}


def plot_admitted(curves: dict, path: str) -> str | None:
    if not curves:
        return None
    fig, ax = _plt().subplots(figsize=(5, 3))
    for pol, c in curves.items():
        ax.plot(list(c), [100 * v for v in c.values()], label=f"receiver {pol}")
    ax.set_xlabel("step")
    ax.set_ylabel("grafted responses admitted (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def train_family_map(run_dir: str) -> dict[str, str]:
    """problem id -> family of a run's training problems: its ``data.train`` file when local JSONL,
    the tiny task's ``train.jsonl`` in the tiny cache for ``tiny:train`` (never builds it); ``{}``
    otherwise."""

    train = str((run_config_raw(run_dir).get("data") or {}).get("train") or "")
    if train.startswith("tiny:"):
        train = os.path.join(default_cache_dir(), "task", f"{train.split(':', 1)[1]}.jsonl")
    return family_map(train)


def admission_frame(records: list[dict], name: str):
    """One row per transferred response of the runs named ``name`` (every step's exchange log):
    ``run``, ``receiver``, ``step``, ``prompt_id``, ``source``, ``s``, ``admitted``, ``reward``,
    ``family`` (None when unknown). An empty DataFrame when no run logged its exchange."""

    # lazy: pandas is heavy
    import pandas as pd

    parts = []
    for r in records:
        if r["name"] != name:
            continue
        fam = None
        for path in sorted(glob.glob(os.path.join(r["dir"], "rollouts", "*", "exchange_step_*.parquet"))):
            try:
                df = pd.read_parquet(path, columns=["step", "prompt_id", "source", "s", "admitted", "reward"])
            except Exception:  # noqa: BLE001 - a partial or foreign file: the figure goes without it
                continue
            if fam is None:
                fam = train_family_map(r["dir"])
            df["receiver"] = os.path.basename(os.path.dirname(path))
            df["run"] = r["dir"]
            df["family"] = [fam.get(str(x)) for x in df["prompt_id"]]
            parts.append(df)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["step", "prompt_id", "source", "s", "admitted", "reward", "receiver", "run", "family"])


def plot_s_histogram(df, path: str, delta: float | None = None, s_max: float = 2.0) -> str | None:
    """One panel per direction (source → receiver): stacked histogram of s (clipped to [0,
    ``s_max``]) for admitted-correct, admitted-wrong, rejected-correct and rejected-wrong responses,
    δ as a line (none when ``delta`` is None)."""
    if df is None or not len(df):
        return None
    d = df[df["s"].notna()]
    dirs = sorted({(a, b) for a, b in zip(d["source"], d["receiver"])})
    if not dirs:
        return None
    fig, axes = _plt().subplots(1, len(dirs), figsize=(4.2 * len(dirs), 3.2), squeeze=False)
    bins = np.linspace(0.0, s_max, 41)
    cats = (("admitted, correct", True, True, "#2a9d8f"), ("admitted, wrong", True, False, "#8ecae6"),
            ("rejected, correct", False, True, "#e76f51"), ("rejected, wrong", False, False, "#f4a261"))
    for ax, (src, rec) in zip(axes[0], dirs):
        sub = d[(d["source"] == src) & (d["receiver"] == rec)]
        data = [np.clip(sub[(sub["admitted"] == a) & ((sub["reward"] > 0) == c)]["s"].to_numpy(float), 0, s_max)
                for _, a, c, _ in cats]
        ax.hist(data, bins=bins, stacked=True, label=[c[0] for c in cats], color=[c[3] for c in cats])
        if delta is not None and delta > 0:
            ax.axvline(delta, color="k", lw=1, ls="--")
        ax.set_title(f"{src} → {rec} ({len(sub)} responses, {100 * sub['admitted'].mean():.0f}% admitted)",
                     fontsize=9)
        ax.set_xlabel(f"compatibility s (clipped at {s_max:g})")
        ax.set_ylabel("responses")
    axes[0][0].legend(fontsize=7)
    return _save(fig, path)


def family_admitted(df) -> dict:
    """receiver -> family -> {step: admitted share over seeds' pooled responses}; and ``"all"`` ->
    receiver -> family -> (admitted, total) over every step."""
    out: dict = {"curves": {}, "all": {}}
    if df is None or not len(df):
        return out
    d = df[df["family"].notna()]
    for (rec, fam), g in d.groupby(["receiver", "family"]):
        out["curves"].setdefault(rec, {})[fam] = {int(s): float(x["admitted"].mean()) for s, x in g.groupby("step")}
        out["all"].setdefault(rec, {})[fam] = (int(g["admitted"].sum()), int(len(g)))
    return out


def plot_family_admitted(fa: dict, path: str, smooth: int = 5) -> str | None:
    """One panel per receiver: the admitted share per family over steps (a running mean over
    ``smooth`` steps)."""
    curves = fa.get("curves") or {}
    if not curves:
        return None
    fig, axes = _plt().subplots(1, len(curves), figsize=(4.5 * len(curves), 3.2), squeeze=False)
    for ax, (rec, fams) in zip(axes[0], sorted(curves.items())):
        for fam, pts in sorted(fams.items()):
            xs = sorted(pts)
            ys = np.array([pts[x] for x in xs])
            if smooth > 1 and len(ys) >= smooth:
                ys = np.convolve(ys, np.ones(smooth) / smooth, mode="valid")
                xs = xs[smooth - 1:]
            ax.plot(xs, 100 * ys, label=fam)
        ax.set_title(f"receiver {rec}", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("grafted responses admitted (%)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def _rate(v: dict) -> str:
    if not v["events"]:
        return "—"
    return f"{100 * v['rate']:.1f}% ({v['rescued']}/{v['events']})"


def mechanism_markdown(records: list[dict], report_dir: str, baseline: str, method: str,
                       bench: str = "math500") -> str:
    """The report's mechanism subsection: per-family plots (written into ``report_dir``), the rescue
    table and the mean admitted share."""

    out = ["### Mechanism", ""]
    curves = family_curves(records, (baseline, method), bench)
    pngs = plot_family_curves(curves, report_dir, {baseline: f"{baseline} (GRPO n=8)", method: method})
    if pngs:
        out.append(f"Held-out pass@1 per skill family over training steps ({bench}; mean and min-max over seeds):")
        out.append("")
        out += [f"![family curves {p}]({os.path.basename(x)})" for p, x in pngs.items()]
        out.append("")
        last_rows = []
        for pol, runs in curves.items():
            for fam in sorted({f for r in runs.values() for f in r}):
                cells = []
                for name in (baseline, method):
                    pts = (runs.get(name) or {}).get(fam) or {}
                    if pts:
                        s = max(pts)
                        cells.append(f"{100 * np.mean(pts[s]):.1f}")
                    else:
                        cells.append("—")
                last_rows.append([pol, fam, *cells])
        out += [md_table(["Policy", "Family", f"{baseline} last step", f"{method} last step"], last_rows), ""]
    rows = rescue_table(records, (baseline, method))
    if rows:
        out.append("Rescue rate: of the prompts a receiver all-failed in training, the share it solves at least "
                   "once when drawn again at the last checkpoint (training sampling, n samples); `admitted`: a "
                   "grafted group was admitted on the prompt (graft_cli/eval/rescue.py).")
        out.append("")
        out.append(md_table(["Run", "Policy", "Seeds", "admitted: rescued", "not admitted: rescued"],
                            [[r["run"], r["policy"], r["seeds"], _rate(r["admitted"]), _rate(r["not_admitted"])]
                             for r in rows]))
        out.append("")
    adm = admitted_curves(records, method)
    if adm:
        png = plot_admitted(adm, os.path.join(report_dir, "admitted.png"))
        means = "; ".join(f"{p}: {100 * np.mean(list(c.values())):.1f}%" for p, c in adm.items())
        out.append(f"Grafted responses admitted by the gate, mean over steps: {means}.")
        out.append("")
        if png:
            out += [f"![admitted share]({os.path.basename(png)})", ""]
    out += gate_markdown(records, report_dir, method)
    return "\n".join(out) if len(out) > 2 else ""


def gate_markdown(records: list[dict], report_dir: str, method: str) -> list[str]:
    """The gate made visible: s histograms per direction and the admitted share per family (markdown
    lines)."""

    df = admission_frame(records, method)
    if not len(df):
        return []
    os.makedirs(report_dir, exist_ok=True)
    out = []
    delta = _run_delta(records, method)
    png = plot_s_histogram(df, os.path.join(report_dir, "gate_s_hist.png"), delta)
    if png:
        floor = f"dashed: δ = {delta:g}" if delta else "no floor (the gate is off or δ = 0)"
        out += [f"Compatibility score s of every grafted response of the `{method}` runs (all seeds and steps), by "
                f"direction; {floor}. Correct/wrong is the response's reward.", "",
                f"![s histogram]({os.path.basename(png)})", ""]
    fa = family_admitted(df)
    png = plot_family_admitted(fa, os.path.join(report_dir, "gate_family_admitted.png"))
    if fa["all"]:
        fams = sorted({f for v in fa["all"].values() for f in v})
        rows = [[rec, *(f"{100 * a / t:.0f}% ({t})" if (a, t) != (0, 0) else "—"
                        for a, t in (v.get(f, (0, 0)) for f in fams))] for rec, v in sorted(fa["all"].items())]
        out += ["Admitted share of grafted responses per skill family of the prompt (responses), all seeds and steps:",
                "", md_table(["Receiver", *fams], rows), ""]
    if png:
        out += [f"![admitted per family]({os.path.basename(png)})", ""]
    return out


def _run_delta(records: list[dict], name: str) -> float | None:
    """The gate floor δ of the runs named ``name`` (:func:`~graft_cli.algorithms.exchange.graft.gate_floor`
    of their config's exchange parameters): None with ``gate: none`` or without a GRAFT exchange."""
    for r in records:
        if r["name"] == name:
            return gate_floor(exchange_params(run_config_raw(r["dir"]).get("exchange")))
    return None
    return None


__all__ = ["family_curves", "plot_family_curves", "rescue_table", "admitted_curves", "mechanism_markdown",
           "admission_frame", "plot_s_histogram", "family_admitted", "plot_family_admitted", "gate_markdown",
           "train_family_map",
           "family_map", "step_family_pass1"]
