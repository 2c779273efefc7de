"""PNG plots of `graft report` (matplotlib, Agg backend):

* ``reward.png`` — training reward per step, each run and policy;
* ``validation.png`` — the benchmark average per evaluated step (in-training validation or ``graft
  eval``), the selected step marked;
* ``clip_fraction.png`` — clipped-token fraction of self and grafted tokens per step, by minibatch
  ordering (GRAFT runs, ``clip_ratio/self`` / ``clip_ratio/peer``);
* ``complementarity.png`` — per-step cross-solve rates (two-policy runs' rollout logs, else the
  ``graft/complementarity`` metric);
* ``compat_hist.png`` — compatibility scores per direction (receiver ← peer). Per-response scores
  are not logged, so this is the distribution over steps of the per-step mean ``graft/s_mean`` (with
  the per-step 10th/90th percentiles ``graft/s_p10``/``graft/s_p90`` overlaid) and the gate floor δ
  as a line;
* ``transfer_<run>.png`` — runs with three or more policies: the transfer matrix, grafted responses
  admitted per step from each source (row) to each receiver (column), mean over steps
  (``graft/admitted/<source>`` on the receiver's metrics rows; :func:`transfer_matrix`).
"""

from __future__ import annotations

import math
import os

import numpy as np

from graft_cli.algorithms.exchange.base import exchange_params
from graft_cli.algorithms.exchange.graft import gate_floor
from graft_cli.rundir import run_config_raw


def _plt():
    # lazy: matplotlib is only needed for plots
    import matplotlib

    matplotlib.use("Agg")
    # lazy: matplotlib is only needed for plots
    import matplotlib.pyplot as plt

    return plt


def _series(rows, pol, key):
    pts = sorted((int(m["step"]), float(m[key])) for m in rows if m.get("policy") == pol and m.get(key) is not None
                 and not (isinstance(m[key], float) and math.isnan(m[key])))
    return [p[0] for p in pts], [p[1] for p in pts]


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def plot_reward(runs, path):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    n = 0
    for r in runs:
        for p in r.policies:
            xs, ys = _series(r.train_rows(), p["name"], "reward")
            if xs:
                ax.plot(xs, ys, label=f"{r.name}:{p['name']}", lw=1)
                n += 1
    if not n:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward (training rollouts)")
    ax.set_title("Training reward")
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_validation(runs, path):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    n = 0
    for r in runs:
        for p in r.policies:
            ev = r.evals.get(p["name"], {})
            if not ev:
                continue
            xs = sorted(ev)
            ys = [100 * ev[s]["average"]["mean"] for s in xs]
            (line,) = ax.plot(xs, ys, marker="o", ms=3, lw=1, label=f"{r.name}:{p['name']}")
            res = r.results.get(p["name"])
            if res is not None and res.step in ev:
                ax.plot([res.step], [100 * ev[res.step]["average"]["mean"]], marker="*", ms=12, color=line.get_color())
            n += 1
    if not n:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel("benchmark average pass@1 (%)")
    ax.set_title("Validation (★ = selected step)")
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_clip(runs, path, clip_steps):
    runs = [r for r in runs if r.exchange == "graft" and any("clip_ratio/peer" in m for m in r.train_rows())]
    if not runs:
        return None
    plt = _plt()
    pols = []
    for r in runs:
        for p in r.policies:
            if p["name"] not in pols:
                pols.append(p["name"])
    fig, axes = plt.subplots(1, len(pols), figsize=(5 * len(pols), 4), squeeze=False)
    colors = {"first": "tab:green", "uniform": "tab:orange", "last": "tab:blue"}
    for ax, pol in zip(axes[0], pols):
        last_step = 0
        for r in runs:
            c = colors.get(r.ordering)
            for key, ls, what in (("clip_ratio/self", "--", "self"), ("clip_ratio/peer", "-", "grafted")):
                xs, ys = _series(r.train_rows(), pol, key)
                if xs:
                    ax.plot(xs, [100 * y for y in ys], ls=ls, color=c, lw=1, label=f"{r.ordering} {what} ({r.name})")
                    last_step = max(last_step, max(xs))
        if clip_steps < last_step:  # Table 9's window ends inside the runs: mark it (else it would stretch the axis)
            ax.axvline(clip_steps, color="grey", lw=0.5, ls=":")
        ax.set_title(f"receiver {pol}")
        ax.set_xlabel("step")
        ax.set_ylabel("clipped tokens (%)")
        ax.legend(fontsize=7)
    fig.suptitle("Clipped-token fraction by minibatch ordering")
    return _save(fig, path)


def plot_complementarity(runs, comp, path):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    n = 0
    for e in comp:
        r = e["run"]
        if e["steps"]:
            xs = [s["step"] for s in e["steps"]]
            for key, lab in (("y_solves_x", f"{e['y']} solves {e['x']}"), ("x_solves_y", f"{e['x']} solves {e['y']}")):
                ys = [100 * s[key] if s[key] is not None and not math.isnan(s[key]) else np.nan for s in e["steps"]]
                ax.plot(xs, ys, lw=1, label=f"{r.name}: {lab}")
                n += 1
        else:
            for recv, solver in ((e["x"], e["y"]), (e["y"], e["x"])):
                xs, ys = _series(r.train_rows(), recv, "graft/complementarity")
                if xs:
                    ax.plot(xs, [100 * y for y in ys], lw=1, label=f"{r.name}: {solver} solves {recv}")
                    n += 1
    if not n:
        plt.close(fig)
        return None
    ax.set_xlabel("step")
    ax.set_ylabel("% of all-fail prompts solved by the peer")
    ax.set_ylim(0, 100)
    ax.set_title("Complementarity over training")
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_compat_hist(runs, path):
    dirs = []
    for r in runs:
        if r.exchange not in ("graft", "graft_stored"):
            continue
        for p in r.policies:
            xs, ys = _series(r.train_rows(), p["name"], "graft/s_mean")
            if ys:
                peers = ", ".join(q["name"] for q in r.policies if q["name"] != p["name"]) or "stored"
                p10 = _series(r.train_rows(), p["name"], "graft/s_p10")[1]
                p90 = _series(r.train_rows(), p["name"], "graft/s_p90")[1]
                dirs.append((f"{r.name}: {p['name']} ← {peers}", ys, p10, p90, _delta_of(r)))
    if not dirs:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(dirs), figsize=(4.5 * len(dirs), 3.6), squeeze=False)
    for ax, (label, ys, p10, p90, delta) in zip(axes[0], dirs):
        allv = [v for v in ys + p10 + p90 if math.isfinite(v)]
        bins = np.linspace(min(allv + [0.0]), max(allv + [1.2]), 30)
        ax.hist(ys, bins=bins, alpha=0.7, label="per-step mean s")
        if p10:
            ax.hist(p10, bins=bins, alpha=0.35, label="per-step p10")
        if p90:
            ax.hist(p90, bins=bins, alpha=0.35, label="per-step p90")
        if delta:  # a gate with a floor (none with gate: none or δ = 0)
            ax.axvline(delta, color="k", lw=1, ls="--", label=f"floor δ={delta}")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("compatibility score s")
        ax.legend(fontsize=7)
    fig.suptitle("Compatibility scores per direction")
    return _save(fig, path)


def _delta_of(run) -> float | None:
    """The gate floor δ of the run's config (:func:`~graft_cli.algorithms.exchange.graft.gate_floor`
    of its exchange's parameters, defaults filled in); None without a gate."""
    return gate_floor(exchange_params(run_config_raw(run.path).get("exchange")))


def transfer_matrix(rows: list[dict], names: list[str], key: str = "graft/admitted") -> np.ndarray:
    """``M[s, r]`` = mean over the receiver's steps of ``<key>/<source>`` (0 where never logged)."""
    idx = {n: i for i, n in enumerate(names)}
    tot = np.zeros((len(names), len(names)))
    cnt = np.zeros((len(names), len(names)))
    for m in rows:
        r = idx.get(str(m.get("policy")))
        if r is None:
            continue
        for sname, s in idx.items():
            v = m.get(f"{key}/{sname}")
            if v is not None and s != r:
                tot[s, r] += float(v)
                cnt[s, r] += 1
    return np.divide(tot, cnt, out=np.zeros_like(tot), where=cnt > 0)


def plot_transfer(run, path) -> str | None:
    names = [p["name"] for p in run.policies]
    if len(names) < 3:
        return None
    M = transfer_matrix(run.train_rows(), names)
    if not M.any():
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(1.2 * len(names) + 2.5, 1.2 * len(names) + 1.5))
    im = ax.imshow(M, cmap="viridis")
    ax.set_xticks(range(len(names)), names)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("receiver")
    ax.set_ylabel("source")
    for s in range(len(names)):
        for r in range(len(names)):
            ax.text(r, s, "—" if s == r else f"{M[s, r]:.1f}", ha="center", va="center",
                    color="white" if M[s, r] < M.max() / 2 else "black")
    fig.colorbar(im, ax=ax, label="admitted grafted responses per step")
    ax.set_title(f"{run.name}: transfer matrix")
    return _save(fig, path)


def make_plots(runs, comp, out_dir: str, clip_steps: int = 48) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    made = [
        plot_reward(runs, os.path.join(out_dir, "reward.png")),
        plot_validation(runs, os.path.join(out_dir, "validation.png")),
        plot_clip(runs, os.path.join(out_dir, "clip_fraction.png"), clip_steps),
        plot_complementarity(runs, comp, os.path.join(out_dir, "complementarity.png")),
        plot_compat_hist(runs, os.path.join(out_dir, "compat_hist.png")),
    ]
    made += [plot_transfer(r, os.path.join(out_dir, f"transfer_{os.path.basename(r.path.rstrip('/'))}.png"))
             for r in runs]
    return [p for p in made if p]
