"""What one run did, in a few lines and one picture: printed by `graft train` (and `make demo`) at
the end.

Per trained policy, from ``metrics.jsonl``:

- reward, first → last step (the training reward: the mean over the step's responses);
- for cross-model runs (GRAFT and its relatives), summed over the steps: prompt groups the receiver
  got from its peer (``graft/selected``), grafted responses transferred (``graft/transferred``) and
  admitted by the gate (``graft/admitted``), and the mean clipped fraction of the grafted tokens
  (``clip_ratio/peer``);
- seconds per step (median);

and the run's variant as ``graft report`` files it (:func:`run_variant`: read from its resolved
settings, so ``--method graft exchange.params.delta=0.0`` prints "w/o floor (δ=0)", the row of Table
2a/7 it lands in).

``<run>/summary.png``: reward over steps per policy and, when the run exchanged, the groups selected
and responses admitted per step. """

from __future__ import annotations

import os

import numpy as np

from graft_cli.report.markdown import md_table
from graft_cli.report.runs import identify, method_label, variant_label
from graft_cli.rundir import read_metrics, run_config_raw, training_rows


def run_variant(run_dir: str) -> str | None:
    """``"<label> (<variant>)"``: the variant :func:`graft_cli.report.runs.identify` reads from the
    run's config.yaml and its table label; None without a config.yaml."""

    raw = run_config_raw(run_dir)
    if not raw.get("method"):
        return None
    variant = variant_label(*identify(raw))
    return f"{method_label(variant)} ({variant})"


def run_summary(run_dir: str) -> dict:
    """policy -> {reward_first, reward_last, steps, selected, transferred, admitted, clip_peer,
    s_per_step}."""
    rows = training_rows(read_metrics(run_dir))
    out: dict[str, dict] = {}
    for pol in dict.fromkeys(r["policy"] for r in rows):
        rs = sorted((r for r in rows if r["policy"] == pol), key=lambda r: r["step"])
        rew = [r["reward"] for r in rs if r.get("reward") is not None]
        peer = [r["clip_ratio/peer"] for r in rs if r.get("clip_ratio/peer") is not None]
        s = {"steps": len(rs), "reward_first": rew[0] if rew else None, "reward_last": rew[-1] if rew else None,
             "clip_peer": float(np.mean(peer)) if peer else None,
             "s_per_step": float(np.median([r["time/step"] for r in rs])) if rs else None}
        for k in ("selected", "transferred", "admitted"):
            vals = [r[f"graft/{k}"] for r in rs if r.get(f"graft/{k}") is not None]
            s[k] = int(sum(vals)) if vals else None
        out[pol] = s
    return out


def _cell(v, fmt="{}"):
    return "—" if v is None else fmt.format(v)


def summary_markdown(summary: dict) -> str:
    exch = any(s["selected"] is not None for s in summary.values())
    cols = ["policy", "steps", "reward first → last", "s/step"]
    if exch:
        cols += ["groups from peer", "grafted responses", "admitted", "clip on grafted tokens"]
    body = []
    for pol, s in summary.items():
        row = [pol, str(s["steps"]), f"{_cell(s['reward_first'], '{:.3f}')} → {_cell(s['reward_last'], '{:.3f}')}",
               _cell(s["s_per_step"], "{:.1f}")]
        if exch:
            row += [_cell(s["selected"]), _cell(s["transferred"]), _cell(s["admitted"]),
                    _cell(None if s["clip_peer"] is None else 100 * s["clip_peer"], "{:.2f}%")]
        body.append(row)
    return md_table(cols, body)


def summary_plot(run_dir: str, path: str | None = None) -> str | None:
    try:
        # lazy: matplotlib is only needed for plots
        import matplotlib

        matplotlib.use("Agg")
        # lazy: matplotlib is only needed for plots
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = training_rows(read_metrics(run_dir))
    if not rows:
        return None
    pols = list(dict.fromkeys(r["policy"] for r in rows))
    exch = any(r.get("graft/selected") is not None for r in rows)
    fig, axes = plt.subplots(1, 2 if exch else 1, figsize=(11 if exch else 6, 4), squeeze=False)
    for pol in pols:
        rs = sorted((r for r in rows if r["policy"] == pol), key=lambda r: r["step"])
        axes[0][0].plot([r["step"] for r in rs], [r.get("reward") for r in rs], label=pol)
        if exch:
            ax = axes[0][1]
            steps = [r["step"] for r in rs]
            line, = ax.plot(steps, [r.get("graft/selected") or 0 for r in rs], label=f"{pol}: groups from peer")
            ax.plot(steps, [r.get("graft/admitted") or 0 for r in rs], linestyle="--", color=line.get_color(),
                    label=f"{pol}: responses admitted")
    axes[0][0].set(title="training reward", xlabel="step", ylabel="mean reward")
    if exch:
        axes[0][1].set(title="exchange per step", xlabel="step", ylabel="count")
    for ax in axes[0]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = path or os.path.join(run_dir, "summary.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
