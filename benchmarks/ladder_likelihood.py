"""The gold solutions' likelihood before and after training, for every run of a transfer-ladder
study (graft_cli/eval/gold_likelihood.py, eq. 1).

    python benchmarks/ladder_likelihood.py .cache/reproduce_tiny_ladder --dest results/tiny_ladder [--workers 2]

For each finished run of the plan folder (its ``plan_<name>.json`` names the runs and their arms)
and each receiver, the mean per-token log-likelihood of the held-out weak-family gold solutions in
the receiver's own style and in its peer's, under the starting weights and the last checkpoint.
Writes ``<dest>/gold_likelihood.json`` (``runs[arm][seed][policy]``, the settings) and
``<dest>/gold_likelihood.md`` (per arm and receiver: ℓ before, Δℓ = after − before in own and peer
style, mean over seeds with its range), and prints where.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from graft_cli.report.markdown import md_table  # noqa: E402
from graft_cli.rundir import atomic_write_json, atomic_write_text  # noqa: E402

WEAK = {"a": "two", "b": "lin"}
STYLES = {"a": "prose", "b": "steps"}


def _one(job: tuple[str, str, int]) -> tuple[str, int, dict]:
    import torch

    from graft_cli.eval.gold_likelihood import run_gold_likelihood

    torch.set_num_threads(1)
    arm, run_dir, seed = job
    return arm, seed, run_gold_likelihood(run_dir, WEAK, STYLES)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan_dir")
    ap.add_argument("--dest", required=True)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    plans = sorted(glob.glob(os.path.join(a.plan_dir, "plan_*.json")))
    if not plans:
        sys.exit(f"{a.plan_dir}: no plan_<name>.json (a `graft reproduce` output folder)")
    with open(plans[-1], encoding="utf-8") as f:
        records = json.load(f)["runs"]
    # a run's folder as the plan recorded it, else by its name inside the plan folder (a relative record)
    dirs = [(r, r.get("dir") if r.get("dir") and os.path.isdir(r["dir"]) else
             os.path.join(a.plan_dir, os.path.basename(str(r.get("dir") or r.get("run") or "")))) for r in records]
    jobs = [(r["name"], d, int(r["seed"])) for r, d in dirs if os.path.isdir(os.path.join(d, "checkpoints"))]
    if not jobs:
        sys.exit(f"{a.plan_dir}: no run folder with checkpoints")
    runs: dict = {}
    with ProcessPoolExecutor(a.workers) as pool:
        for i, (arm, seed, res) in enumerate(pool.map(_one, jobs), 1):
            if res:
                runs.setdefault(arm, {})[str(seed)] = res
            print(f"[{i}/{len(jobs)}] {arm} seed {seed}", flush=True)
    rows = []
    for arm, seeds in runs.items():
        for p in WEAK:
            vals = [s[p] for s in seeds.values() if p in s]
            if not vals:
                continue
            cells = [arm, p, str(len(vals)), f"{np.mean([v['before']['own'] for v in vals]):.3f}",
                     f"{np.mean([v['before']['peer'] for v in vals]):.3f}"]
            for style in ("own", "peer"):
                d = [v["after"][style] - v["before"][style] for v in vals]
                cells.append(f"{np.mean(d):+.3f} [{min(d):+.3f}, {max(d):+.3f}]")
            rows.append(cells)
    os.makedirs(a.dest, exist_ok=True)
    atomic_write_json(os.path.join(a.dest, "gold_likelihood.json"),
                      {"weak": WEAK, "styles": STYLES, "benchmark": "heldout", "runs": runs})
    md = ["# The gold solutions' likelihood, before and after training", "",
          "Mean per-token log-likelihood (nats) of the held-out weak-family gold worked solutions (EOS included) "
          "under the training prompt, in the receiver's own style and in its peer's (graft_cli/eval/gold_likelihood.py "
          "eq. 1); before: the starting weights, after: the run's last checkpoint; Δℓ mean over seeds [min, max]. "
          "Made by `python benchmarks/ladder_likelihood.py`.", "",
          md_table(["arm", "receiver", "seeds", "ℓ before, own", "ℓ before, peer", "Δℓ own", "Δℓ peer"], rows), ""]
    atomic_write_text(os.path.join(a.dest, "gold_likelihood.md"), "\n".join(md))
    print(f"wrote {os.path.join(a.dest, 'gold_likelihood.json')} and gold_likelihood.md")


if __name__ == "__main__":
    main()
