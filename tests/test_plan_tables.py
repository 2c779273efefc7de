"""The papers' own tables as plans (experiments/reproduce/graft_table1, graft_ablations, graft_table6, saf_table,
tandem_table): the dry run lists every run with its resources, its run count and GPU-hours equal what the plan file
says (worked out here from the raw YAML, not through graft's Resources), each run's GPUs hold its models by
benchmarks/plan_resources.py's memory model, per-entry pairs and cross-pair partners, resource errors."""

from __future__ import annotations

import importlib.util
import os
import re
import sys

import pytest
import yaml
from click.testing import CliRunner

from graft_cli.cli import main
from graft_cli.config import EXPERIMENTS_DIR, compose
from graft_cli.errors import GraftError
from graft_cli.plan import spec as P

TABLE_PLANS = ("graft_table1", "graft_ablations", "graft_table6", "saf_table", "tandem_table")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _raw(name: str) -> dict:
    with open(os.path.join(EXPERIMENTS_DIR, "reproduce", f"{name}.yaml")) as f:
        return yaml.safe_load(f)


def _expected(raw: dict) -> tuple[list[str], float, float]:
    """(run directory names, training GPU-hours, evaluation GPU-hours) straight from the YAML mapping."""
    names, train, ev = [], 0.0, 0.0
    base = raw.get("resources") or {}
    for e in raw["runs"]:
        res = {**base, **(e.get("resources") or {})}
        pair = str(e.get("pair", raw.get("pair")))
        for s in e.get("seeds", raw.get("seeds", [0])):
            names.append(f"{pair}-{e['name']}-s{s}")
            train += res.get("nodes", 1) * res.get("gpus", 0) * res.get("hours", 0)
            ev += (res["eval_gpus"] if res.get("eval_gpus") is not None else res.get("gpus", 0)) * res.get(
                "eval_hours", 0)
    return names, train, ev


@pytest.mark.parametrize("name", TABLE_PLANS)
def test_table_plan_dry_run_lists_every_run_and_its_gpu_hours(name, tmp_path):
    res = CliRunner().invoke(main, ["reproduce", "--pair", name, "--dry-run", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    names, train, ev = _expected(_raw(name))
    rows = [ln.split("|") for ln in res.output.splitlines() if ln.startswith("| ") and not ln.startswith("| #")]
    assert sorted(r[2].strip() for r in rows) == sorted(names) and len(set(names)) == len(names)
    assert all(r[8].strip() in ("ok", "checked when its partner has run") for r in rows), res.output
    # per-run GPU-h column and the plan's total, both against the YAML
    assert sum(float(r[10]) for r in rows) == pytest.approx(train + ev, abs=0.05 * len(rows))
    m = re.search(r"GPU-hours: ([\d,.]+) \(([\d,.]+) training \+ ([\d,.]+) evaluation\) over (\d+) runs", res.output)
    assert m, res.output
    total, t, e, n = (float(x.replace(",", "")) for x in m.groups())
    assert (t, e, int(n)) == (pytest.approx(train, abs=0.05), pytest.approx(ev, abs=0.05), len(names))
    assert total == pytest.approx(train + ev, abs=0.1)
    assert "method configs not in the plan" not in res.output and not os.listdir(tmp_path)


def test_graft_table1_is_the_papers_table():
    plan = P.load_reproduce("graft_table1")
    got = {(plan.run_pair(r), r.method, r.seed) for r in plan.runs}
    co = {(p, m, s) for p in "123" for m in ("hacpo", "sgt", "graft") for s in (0, 1, 2)}
    grpo = {(p, m, s) for p in "12" for m in ("grpo", "grpo_n16", "grpo_n32") for s in (0, 1, 2)}
    assert got == co | grpo and len(plan.runs) == 45
    assert plan.steps == 174 and "eval.every=5" not in plan.overrides  # validation every 5: common/paper.yaml
    assert (plan.eval.steps, plan.eval.runs, plan.eval.samples) == ("best", 5, 8)
    cfg = compose(plan.compose_overrides(plan.by_key()["2:grpo_octo-s1"], "/tmp/o"))
    assert [p.model for p in cfg.policies] == ["OctoThinker/OctoThinker-3B-Hybrid-Base"]
    assert (cfg.eval.every, cfg.run.seed, cfg.run.steps, cfg.eval.samples) == (5, 1, 174, 8)
    assert all(plan.resources_for(r).gpus == 4 and plan.resources_for(r).gpu == "H200" for r in plan.runs)
    # the hours behind the GPU-hours: Table 5's 3-epoch cost / 4 GPUs + the validation bound (YAML comment)
    step = 29.9 * 3600 / 4 / 174
    val = 34 * (872 * 8 / 1024) * step / 3600
    assert plan.resources_for(plan.by_key()["1:graft-s0"]).hours == pytest.approx(43.3 / 4 + val, abs=0.05)
    assert plan.resources_for(plan.by_key()["1:grpo_n32-s2"]).hours == pytest.approx(145.1 / 4 + val, abs=0.05)


def test_ablation_plan_runs_share_table1_directories(tmp_path):
    abl, t1 = P.load_reproduce("graft_ablations"), P.load_reproduce("graft_table1")
    dirs = {abl.run_dir(r, str(tmp_path)) for r in abl.runs}
    shared = dirs & {t1.run_dir(r, str(tmp_path)) for r in t1.runs}
    assert {os.path.basename(d) for d in shared} == {"1-graft-s0", "1-grpo-s0", "1-hacpo-s0", "1-sgt-s0"}
    methods = {r.method for r in abl.runs}
    assert {"graft_nogate", "graft_nofloor", "graft_delta0p7", "graft_delta0p9", "graft_first", "graft_uniform",
            "graft_pooled", "graft_successonly_nofloor", "graft_luffy", "graft_seqratio"} <= methods
    assert {abl.run_pair(r) for r in abl.runs} == {"1"} and {r.seed for r in abl.runs} == {0}


def test_cross_pair_partner_orders_and_points_at_the_partner_directory(tmp_path):
    plan = P.load_reproduce("graft_table6")
    keys = [r.key for r in plan.runs]
    octo = plan.by_key()["2:graft_stored-octo-s0"]
    assert octo.partner_key() == "1:grpo-s0" and keys.index("1:grpo-s0") < keys.index(octo.key)
    ov = plan.compose_overrides(octo, str(tmp_path))
    assert f"exchange.params.partner_run={tmp_path}/1-grpo-s0" in ov and "pair=2" in ov
    smol3 = plan.by_key()["3:graft_stored-smol-s0"]
    assert smol3.partner_key() == "2:grpo_octo-s0"
    assert f"exchange.params.partner_run={tmp_path}/2-grpo_octo-s0" in plan.compose_overrides(smol3, str(tmp_path))


def _plan_resources():
    spec = importlib.util.spec_from_file_location("plan_resources", os.path.join(ROOT, "benchmarks",
                                                                                  "plan_resources.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", TABLE_PLANS)
def test_each_run_fits_its_gpus_by_plan_resources(name, tmp_path):
    """Every run's trained and frozen models fit the GPUs it names (16 B per trained parameter, 2 B per frozen one,
    activations, the vLLM engine; 10 % headroom), by the script's own memory model."""
    pr = _plan_resources()
    plan = P.load_reproduce(name)
    for r in plan.runs:
        if r.partner:  # a stored-trajectory receiver trains one model of the pair: no larger than its partner run
            continue
        cfg = compose(plan.compose_overrides(r, str(tmp_path)))
        res = plan.resources_for(r)
        run = pr.Run(r.key, tuple(p.model for p in cfg.policies if p.role == "train"),
                     tuple(p.model for p in cfg.policies if p.role != "train"), cfg.rollout.max_prompt_tokens,
                     cfg.rollout.max_new_tokens)
        gpus = res.nodes * res.gpus
        fits = [pr.plan(run, gpus, res.gpu_gb, 32768, 4096, tp, 64)["peak"] <= res.gpu_gb * 1e9 / pr.GB * 0.9
                for tp in (1, 2, 4, 8) if tp <= gpus]
        assert any(fits), (name, r.key, gpus)


def test_resources_errors_are_one_line():
    with pytest.raises(GraftError, match=r"runs\[0\]: resources.gpus: must be an integer >= 0"):
        P.build_plan({"runs": [{"name": "a", "method": "grpo", "resources": {"gpus": -1}}]})
    with pytest.raises(GraftError, match="resources: unknown key 'gpu_count'"):
        P.build_plan({"resources": {"gpu_count": 4}, "runs": [{"name": "a", "method": "grpo"}]})
    with pytest.raises(GraftError, match="resources.launch: 'mpi'"):
        P.build_plan({"resources": {"launch": "mpi"}, "runs": [{"name": "a", "method": "grpo"}]})
    with pytest.raises(GraftError, match="resources.hours: must be a positive number"):
        P.build_plan({"resources": {"hours": 0}, "runs": [{"name": "a", "method": "grpo"}]})
    # an entry's keys refine the plan's; GPU-hours by hand: 2 x 4 x 3 + 4 x 0.5, then 1 x 8 x 1 + 8 x 0.5
    plan = P.build_plan({"resources": {"gpus": 4, "nodes": 2, "hours": 3, "eval_hours": 0.5},
                         "runs": [{"name": "a", "method": "grpo"},
                                  {"name": "b", "method": "grpo", "resources": {"nodes": 1, "gpus": 8, "hours": 1}}]})
    assert plan.gpu_hours() == (pytest.approx(24 + 8), pytest.approx(2 + 4))
    assert plan.resources_for(plan.runs[0]).uses_torchrun() and not P.Resources(gpus=1).uses_torchrun()
