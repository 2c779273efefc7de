"""Table 5 of `graft report`: compute, mean wall-clock per step and "GPU-hours" by the GRAFT paper's
accounting, ``devices x Σ time/step`` (docs/spec/graft.md §6.3), through each policy's selected step
and for the full run.

Per-model costs of a joint run split each step's time by the policies' own rollout + reward +
old-log-prob + update times (an attribution: the paper measured per-model time). "Both": an online
method's joint run through the later of the two selected steps; independent training, the sum of the
two models' costs. """

from __future__ import annotations

import numpy as np

from graft_cli.report import paper_numbers as P
from graft_cli.report.render import Table, fmt
from graft_cli.report.runs import T1_METHODS, Index, Run, method_label

__all__ = ["table5"]


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
