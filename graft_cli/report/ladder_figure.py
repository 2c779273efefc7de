"""The transfer ladder in one picture, and the gold solutions' likelihood beside it
(docs/studies.md, "Can anything the peer writes teach the receiver").

``python -m graft_cli.report.ladder_figure DIR`` reads ``DIR/claims.json`` (a ``claims.kind:
ladder`` study) and, when present, ``DIR/gold_likelihood.json`` (benchmarks/ladder_likelihood.py)
and writes ``DIR/ladder.png``: per receiver, each rung's and control's weak-family gain over its
baseline with its registered interval (a rung *teaches* when the interval lies right of 0), the
dose it had (grafted rows admitted per step on the weak family) written beside it; and, where
measured, the change of the gold solutions' mean log-likelihood Δℓ in the receiver's own style and
in the peer's, per arm. Reads files only.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from graft_cli.report.plots import _plt

__all__ = ["ladder_figure", "main"]


def _dose(measured: dict, arm: str, p: str) -> float | None:
    seeds = ((measured.get("mechanism") or {}).get(arm) or {}).get(p) or {}
    vals = [v["weak_admitted"] for v in seeds.values() if v.get("weak_admitted") is not None]
    return float(np.mean(vals)) if vals else None


def _likelihood_shift(lik: dict, arm: str, p: str, style: str) -> float | None:
    vals = [r[p]["after"][style] - r[p]["before"][style] for r in (lik.get("runs") or {}).get(arm, {}).values()
            if p in r]
    return float(np.mean(vals)) if vals else None


def ladder_figure(study_dir: str) -> str:
    """Write ``<study_dir>/ladder.png``; returns its path."""
    with open(os.path.join(study_dir, "claims.json"), encoding="utf-8") as f:
        claims = json.load(f)
    lik_path = os.path.join(study_dir, "gold_likelihood.json")
    lik = json.load(open(lik_path, encoding="utf-8")) if os.path.exists(lik_path) else {}
    measured, rows = claims["measured"], [c for c in claims["claims"] if c["key"] != "ladder:reading"]
    policies = measured["policies"]
    plt = _plt()
    ncols = 2 if lik else 1
    fig, axes = plt.subplots(len(policies), ncols, figsize=(7.5 * ncols, 0.55 * len(rows) + 1.6), squeeze=False)
    for i, p in enumerate(policies):
        ax = axes[i][0]
        labels = []
        for y, c in enumerate(rows):
            v = c["per_model"][p]
            iv = v["interval"]
            colour = "tab:green" if v.get("teaches") else ("tab:grey" if c["rung"] is None else "tab:red")
            if iv is not None:
                ax.errorbar(iv[0], y, xerr=[[iv[0] - iv[1]], [iv[2] - iv[0]]], fmt="o", color=colour, capsize=3)
            dose = _dose(measured, c["x"], p)
            labels.append(f"{'rung ' + str(c['rung']) if c['rung'] else 'control'}: {c['label']}"
                          + (f"\n{c['x']} − {c['y']}, dose {dose:.1f}/step" if dose is not None
                             else f"\n{c['x']} − {c['y']}"))
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("Δ held-out weak-family pass@1 (points), registered interval")
        ax.set_title(f"receiver {p} (weak family {claims['settings']['weak'][p]}): green = teaches")
        if lik:
            ax2 = axes[i][1]
            arms = list((lik.get("runs") or {}))
            own = [_likelihood_shift(lik, a, p, "own") for a in arms]
            peer = [_likelihood_shift(lik, a, p, "peer") for a in arms]
            ys = np.arange(len(arms))
            ax2.barh(ys - 0.2, [x or 0.0 for x in own], 0.4, label="gold in own style")
            ax2.barh(ys + 0.2, [x or 0.0 for x in peer], 0.4, label="gold in peer's style")
            ax2.set_yticks(ys, arms, fontsize=7)
            ax2.invert_yaxis()
            ax2.axvline(0, color="black", lw=0.8)
            ax2.set_xlabel("Δℓ = ℓ after − ℓ before (mean log-likelihood per gold token, nats)")
            ax2.legend(fontsize=7)
            ax2.set_title(f"receiver {p}: did training move it toward the gold solutions?")
    fig.tight_layout()
    path = os.path.join(study_dir, "ladder.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study_dir", help="a ladder study's folder (its claims.json)")
    print(ladder_figure(ap.parse_args(argv).study_dir))


if __name__ == "__main__":
    main()
