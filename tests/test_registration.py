"""Study registration, per-run provenance, the training-set mix, the floored and sequential intervals, and the dose
claims: each against values worked by hand or computed independently."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats as sps

from graft_cli.cli import main
from graft_cli.config import compose, to_yaml
from graft_cli.data.mix import load_training_set, mix_problems, mix_sizes
from graft_cli.data.problems import Problem, split_holdout
from graft_cli.errors import GraftError
from graft_cli.plan import execute as X
from graft_cli.plan import registration as R
from graft_cli.plan import spec as P
from graft_cli.report import dose_claims as D
from graft_cli.report.power import seed_interval
from graft_cli.report.sequential import boundaries, judged_look, look_critical
from graft_cli.report.stats import compare, overall_verdict, powered_verdict
from graft_cli.train import provenance as V
from graft_cli.train.run import RESUME_MAY_DIFFER


# ------------------------------------------------------------------------------------------------ data.mix
def test_mix_sizes_worked_by_hand():
    # shares 0.5/0.25/0.25 over groups of 10/10/3: N = 13 is the largest with every round(N s_v) <= |G_v|
    # (N = 14: round(3.5) = 4 > 3 for c); at N = 13 a gets round(6.5) = 6 (Python rounds half to even), b and c 3
    assert mix_sizes({"a": 10, "b": 10, "c": 3}, {"a": 2, "b": 1, "c": 1}) == {"a": 6, "b": 3, "c": 3}
    assert mix_sizes({"a": 100, "b": 10}, {"a": 0.5, "b": 0.5}) == {"a": 10, "b": 10}
    assert mix_sizes({"a": 8, "b": 50}, {"a": 1.0, "b": 0.0}) == {"a": 8, "b": 0}


def test_mix_problems_keeps_shares_and_is_seeded():
    groups = {f: [Problem(f"{f}{i}", f"{f} {i}", "1") for i in range(40)] for f in ("x", "y", "z")}
    out = mix_problems(groups, {"x": 0.5, "y": 0.25, "z": 0.25}, seed=3)
    fams = [p.id[0] for p in out]
    assert (fams.count("x"), fams.count("y"), fams.count("z")) == (40, 20, 20)
    assert out == mix_problems(groups, {"x": 0.5, "y": 0.25, "z": 0.25}, seed=3)
    assert out != mix_problems(groups, {"x": 0.5, "y": 0.25, "z": 0.25}, seed=4)
    assert len({p.id for p in out}) == len(out)  # without replacement


def test_load_training_set_by_family_and_one_line_errors(tmp_path):
    path = tmp_path / "train.jsonl"
    rows = [{"id": f"p{i}", "problem": f"q{i}", "answer": "1", "family": "two" if i % 3 == 0 else "add"}
            for i in range(30)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = load_training_set(str(path), None, None, {"two": 0.5, "add": 0.5})
    assert len(out) == 20 and sum(int(p.id[1:]) % 3 == 0 for p in out) == 10
    with pytest.raises(GraftError, match=r"config key 'data.mix.lin': .* has no row with family = 'lin'"):
        load_training_set(str(path), None, None, {"two": 0.5, "lin": 0.5})
    with pytest.raises(GraftError, match=r"config key 'data.mix.two': a share must be a number >= 0"):
        compose(["pair=tiny", "method=grpo", "data.mix={two: -1}"])


def test_holdout_distinct_drops_training_copies():
    probs = [Problem("a", "1+1", "2"), Problem("b", "1+1", "2"), Problem("c", "2+2", "4"), Problem("d", "3+3", "6")]
    for seed in range(6):
        train, held = split_holdout(probs, 1, seed, distinct=True)
        assert not {p.problem for p in train} & {p.problem for p in held}
        plain, held2 = split_holdout(probs, 1, seed)
        assert held2 == held and len(plain) == 3
    # the held-out "1+1" (either copy) takes its twin out of training as well
    splits = (split_holdout(probs, 1, s, True) for s in range(50))
    train, held = next((t, h) for t, h in splits if h[0].problem == "1+1")
    assert [p.problem for p in train] == ["2+2", "3+3"]


# ------------------------------------------------------------------------------------------ provenance
def test_provenance_records_sessions_and_refuses_another_config(tmp_path):
    cfg = compose(["pair=tiny", "method=grpo", f"run.out={tmp_path}", "run.name=r"])
    d = str(tmp_path / "r")
    os.makedirs(d)
    with open(os.path.join(d, "config.yaml"), "w") as f:
        f.write(to_yaml(cfg))
    assert "no provenance.json" in V.reuse_problem(cfg, d, RESUME_MAY_DIFFER)
    prov = V.record_session(cfg, d, RESUME_MAY_DIFFER, 0)
    V.record_session(cfg, d, RESUME_MAY_DIFFER, 4)
    prov = V.read_provenance(d)
    assert [s["from_step"] for s in prov["sessions"]] == [0, 4]
    commit, _ = V.source_commit()
    assert prov["sessions"][0]["commit"] == commit
    assert V.reuse_problem(cfg, d, RESUME_MAY_DIFFER) is None
    # keys a resumed run may change do not make another run; the learning rate does
    same = compose(["pair=tiny", "method=grpo", f"run.out={tmp_path}", "run.name=r", "run.save_every=3"])
    assert V.reuse_problem(same, d, RESUME_MAY_DIFFER) is None
    other = compose(["pair=tiny", "method=grpo", f"run.out={tmp_path}", "run.name=r", "optim.lr=1e-3"])
    assert V.reuse_problem(other, d, RESUME_MAY_DIFFER) == "its config differs in 'optim.lr'"


def test_provenance_refuses_another_tiny_build(tmp_path, monkeypatch):
    from graft_cli.tiny import build as T

    cfg = compose(["pair=tiny", "method=grpo", f"run.out={tmp_path}", "run.name=r"])
    d = str(tmp_path / "r")
    os.makedirs(d)
    monkeypatch.setattr(T, "read_manifest", lambda cache_dir=None: {"hashes": {"a": "1", "b": "2"}, "task": {}})
    V.record_session(cfg, d, RESUME_MAY_DIFFER, 0)
    assert V.reuse_problem(cfg, d, RESUME_MAY_DIFFER) is None
    monkeypatch.setattr(T, "read_manifest", lambda cache_dir=None: {"hashes": {"a": "1", "b": "3"}, "task": {}})
    assert V.reuse_problem(cfg, d, RESUME_MAY_DIFFER) == "it was made with another tiny build (role 'b')"


def test_provenance_keeps_the_build_record_of_each_source_a_run_names(monkeypatch):
    """Each model source with a build record is asked for the names the run loads from it (its policies'
    ``<source>:<name>`` models) and whether the training data is its own; a source the run names nowhere is null."""
    from types import SimpleNamespace

    from graft_cli.models.loading import SOURCE_BUILDS
    from graft_cli.tiny import build as T

    calls = {}

    def record(names, with_data):
        calls["unitsrc"] = (names, with_data)
        return {"roles": {n: "h" for n in names}}
    monkeypatch.setitem(SOURCE_BUILDS._items, "unitsrc", record)
    monkeypatch.setattr(T, "read_manifest", lambda cache_dir=None: {"hashes": {"b": "2"}, "task": {}})
    models = ("unitsrc:x", "tiny:b", "org/model", "unitsrc:w")
    cfg = SimpleNamespace(policies=[SimpleNamespace(model=m) for m in models],
                          data=SimpleNamespace(train="unitsrc:train"))
    got = V.source_builds(cfg)
    assert calls == {"unitsrc": (["w", "x"], True)}
    assert got["unitsrc_build"]["roles"] == {"w": "h", "x": "h"}
    assert got["tiny_build"]["roles"] == {"b": "2"} and got["tiny_build"]["task"] is None
    hub = SimpleNamespace(policies=[SimpleNamespace(model="org/model")], data=SimpleNamespace(train="org/data:train"))
    assert V.source_builds(hub) == {"tiny_build": None, "unitsrc_build": None}


def test_plan_refuses_to_reuse_a_finished_run_of_another_config(tmp_path, monkeypatch):
    from test_plan import fake_run, stamp

    out = str(tmp_path)
    plan = P.build_plan({"pair": "tiny", "steps": 10, "eval": False, "runs": [{"name": "done", "method": "grpo"}]})
    d = fake_run(out, "tiny-done-s0", [10], 10)
    with open(os.path.join(d, "config.yaml"), "w") as f:  # the config the run was made with
        f.write(to_yaml(compose(plan.compose_overrides(plan.runs[0], out))))
    stamp(plan, out, "done")
    X.reuse_check(plan, plan.runs[0], out)  # the same config: reused
    changed = P.build_plan({"pair": "tiny", "steps": 10, "eval": False, "overrides": {"optim.lr": 0.001},
                            "runs": [{"name": "done", "method": "grpo"}]})
    with pytest.raises(GraftError, match=r"run tiny-done-s0 is finished but cannot be reused: its config differs "
                                         r"in 'optim.lr'"):
        X.execute(changed, out, jobs=1, progress=False)


# ---------------------------------------------------------------------------------------- registration
PLAN = {"name": "study", "pair": "tiny", "steps": 4, "eval": {"runs": 1},
        "analysis": {"interval": "floored_t", "sequential": {"spending": "obrien_fleming", "looks": [2, 4]}},
        "runs": [{"name": "grpo", "method": "grpo", "seeds": [0, 1, 2, 3]},
                 {"name": "graft", "method": "graft", "seeds": [0, 1, 2, 3]}]}


def test_registration_freezes_the_design(tmp_path):
    plan = P.build_plan(json.loads(json.dumps(PLAN)), source="study.yaml")
    path, written = R.register(plan, str(tmp_path))
    reg = R.load_registration(path)
    assert written and reg["plan_hash"] == R.plan_hash(plan) and reg["arms"]["graft"]["seeds"] == [0, 1, 2, 3]
    assert reg["analysis"]["sequential"] == {"spending": "obrien_fleming", "looks": [2, 4]}
    assert R.register(plan, str(tmp_path)) == (path, False)  # the same design: left as it is
    R.check_registration(plan, reg, path)
    grown = json.loads(json.dumps(PLAN))
    grown["runs"][1]["seeds"] = [0, 1, 2, 3, 4]
    grown["runs"][0]["seeds"] = [0, 1, 2, 3, 4]
    grown["analysis"]["sequential"]["looks"] = [2, 5]
    with pytest.raises(GraftError, match=r"differs from its registration in 'analysis.sequential.looks' \(and 2 "
                                         r"more\)"):
        R.check_registration(P.build_plan(grown, source="study.yaml"), reg, path)
    assert R.differences(reg["design"], R.design(P.build_plan(grown, source="study.yaml"))) == [
        "analysis.sequential.looks", "runs.graft-s4", "runs.grpo-s4"]
    with pytest.raises(GraftError, match="differs from its registration"):
        R.register(P.build_plan(grown, source="study.yaml"), str(tmp_path))


def test_analysis_section_is_checked():
    bad = json.loads(json.dumps(PLAN))
    bad["analysis"]["sequential"]["looks"] = [2, 3]
    with pytest.raises(GraftError, match=r"the last look \(3\) must be the plan's seeds per arm \(4\)"):
        P.build_plan(bad)
    bad["analysis"] = {"interval": "bootstrap"}
    with pytest.raises(GraftError, match=r"analysis.interval: 'bootstrap'; known: paired_t, floored_t"):
        P.build_plan(bad)


def test_reproduce_register_then_refuse_a_changed_plan(tmp_path):
    plan_file = tmp_path / "study.yaml"
    plan_file.write_text(json.dumps(PLAN))
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["reproduce", "--pair", str(plan_file), "--out", str(out), "--register"])
    assert res.exit_code == 0, res.output
    assert json.load(open(out / "registration.json"))["plan_hash"]
    assert not [f for f in os.listdir(out) if f != "registration.json"]  # nothing ran
    changed = json.loads(json.dumps(PLAN))
    changed["steps"] = 5
    plan_file.write_text(json.dumps(changed))
    for extra in ([], ["--report-only"], ["--registration", str(out / "registration.json")]):
        res = CliRunner().invoke(main, ["reproduce", "--pair", str(plan_file), "--out", str(out), *extra])
        assert res.exit_code != 0 and "differs from its registration in 'steps'" in res.output
        assert sorted(os.listdir(out)) == ["registration.json"]


# ------------------------------------------------------------------------------------------ intervals
def test_sequential_boundaries_against_simulation():
    """Eq. (2) of report/sequential.py checked by Monte Carlo: the chance of crossing at each look equals the alpha
    spent there (Z_k as cumulative sums of independent normal increments)."""
    looks = [4, 8, 12]
    c = boundaries(looks)
    assert boundaries([12]) == pytest.approx([sps.norm.isf(0.025)])
    t = np.array(looks) / 12
    rng = np.random.default_rng(0)
    inc = rng.standard_normal((400_000, 3)) * np.sqrt(np.diff(np.concatenate([[0], t])))
    z = np.cumsum(inc, axis=1) / np.sqrt(t)
    crossed = np.abs(z) >= np.array(c)
    first = np.where(crossed.any(1), crossed.argmax(1), -1)
    spent = [2 - 2 * sps.norm.cdf(sps.norm.ppf(0.975) / math.sqrt(x)) for x in t]
    want = np.diff(np.concatenate([[0], spent]))
    got = np.array([(first == k).mean() for k in range(3)])
    assert got == pytest.approx(want, abs=4e-4)
    assert crossed.any(1).mean() == pytest.approx(0.05, abs=1.5e-3)
    # the t-version of a boundary: the same nominal level, wider with few df, the boundary itself as df grows
    assert look_critical(c[2], 1e6) == pytest.approx(c[2], rel=1e-4) and look_critical(c[2], 5) > c[2]


def test_judged_look_takes_the_largest_complete_look():
    a = {"sequential": {"spending": "obrien_fleming", "looks": [4, 8, 12]}, "alpha": 0.05}
    keep, c, label = judged_look(a, [str(s) for s in range(10)])
    assert keep == [str(s) for s in range(8)] and c == pytest.approx(boundaries([4, 8, 12])[1])
    assert "look 2 of 3 (8 seeds" in label
    assert judged_look(a, ["0", "1"])[0] == []
    assert judged_look({"sequential": None}, ["1", "0", "10", "2"])[0] == ["0", "1", "2", "10"]


def test_floored_interval_on_planted_data():
    # paired differences 1.0, 1.1, 0.9 (S²_d = 0.01, S²_d/3 = 0.00333); a measured evaluation variance of 0.25 of Δ̂
    x = {"0": 11.0, "1": 11.1, "2": 10.9}
    y = {"0": 10.0, "1": 10.0, "2": 10.0}
    plain = seed_interval(x, y)
    floored = seed_interval(x, y, floor=0.25)
    t2 = sps.t.ppf(0.975, 2)
    assert plain["interval"] == pytest.approx((1.0, 1.0 - t2 * 0.1 / math.sqrt(3), 1.0 + t2 * 0.1 / math.sqrt(3)))
    assert floored["interval"] == pytest.approx((1.0, 1.0 - t2 * 0.5, 1.0 + t2 * 0.5)) and floored["floored"]
    # a floor below S²_d/n changes nothing
    assert seed_interval(x, y, floor=0.001)["interval"] == pytest.approx(plain["interval"])


def test_floored_interval_keeps_coverage_where_the_plain_one_loses_it():
    """Planted studies: 3 seeds, no training variance, evaluation noise of known variance per seed pair. The paired
    t-interval covers ~95%; its half-width is often implausibly small; the floored one is never narrower than the
    evaluation allows and covers at least as often."""
    rng = np.random.default_rng(1)
    n, sd_e, truth = 3, 1.0, 0.5
    cover = {"plain": 0, "floored": 0}
    narrow = 0
    for _ in range(2000):
        d = truth + sd_e * rng.standard_normal(n)
        x = {str(i): float(v) for i, v in enumerate(d)}
        y = {str(i): 0.0 for i in range(n)}
        p = seed_interval(x, y)["interval"]
        f = seed_interval(x, y, floor=sd_e ** 2 / n)["interval"]
        cover["plain"] += p[1] <= truth <= p[2]
        cover["floored"] += f[1] <= truth <= f[2]
        narrow += (p[2] - p[1]) < (f[2] - f[1]) - 1e-12
        assert (f[2] - f[1]) / 2 >= sps.t.ppf(0.975, n - 1) * sd_e / math.sqrt(n) - 1e-9
    assert cover["floored"] >= cover["plain"] and cover["floored"] / 2000 >= 0.95
    assert narrow > 300  # the floor binds often at 3 seeds


def test_powered_verdict_table():
    cases = [((0.5, 0.1, 0.9), "held"), ((-0.5, -0.9, -0.1), "did not hold"), ((0.1, -0.5, 0.7), "not significant"),
             ((0.1, -1.5, 1.7), "underpowered"), ((3.0, 1.5, 4.5), "held"), (None, "not measured")]
    for iv, want in cases:
        assert powered_verdict(iv) == want
    # per seed-pair variance 4: t_{m-1} * sqrt(4 / m) <= 1 first at m = 18 (t_17 = 2.110: 0.9947; m = 17: 1.0599)
    assert powered_verdict((0.1, -1.5, 1.7), per_seed_variance=4.0) == "underpowered (18 seeds for ±1)"
    assert overall_verdict(["underpowered (18 seeds for ±1)", "underpowered (9 seeds for ±1)"]) == "underpowered"


def test_compare_uses_the_floor_from_the_paired_grades():
    # 3 seeds of one benchmark with 2 problems; the arms differ by 0.1 on each problem in every seed (S²_d = 0)
    x = {str(s): [np.array([0.6, 0.4])] for s in range(3)}
    y = {str(s): [np.array([0.5, 0.3])] for s in range(3)}
    ev = {str(s): {"b": 0.01} for s in range(3)}  # v^d_s of Δ in fractions²
    c = compare({"x": {s: {"b": v[0]} for s, v in x.items()}, "y": {s: {"b": v[0]} for s, v in y.items()}}, "x", "y",
                n_boot=50, eval_var_paired=ev)
    h = sps.t.ppf(0.975, 2) * math.sqrt(100 ** 2 * 0.01 / 3)
    assert c["interval"] == pytest.approx((10.0, 10.0 - h, 10.0 + h)) and "floored" in c["method"]
    c0 = compare({"x": {s: {"b": v[0]} for s, v in x.items()}, "y": {s: {"b": v[0]} for s, v in y.items()}}, "x",
                 "y", n_boot=50, eval_var_paired=ev, rule="paired_t")
    assert c0["interval"] == pytest.approx((10.0, 10.0, 10.0))


# ----------------------------------------------------------------------------------------------- dose
def test_dose_reading_table():
    cases = [((3.0, 2.0, 4.0), "the gate or the dose is the bottleneck"),
             ((0.2, -0.8, 1.2), "peer solutions do not teach the skill at this scale"),
             ((1.0, -0.5, 2.5), "open at this power"),
             ((1.0, 0.3, 1.7), "outside the pre-registered readings (a gain below the threshold)"),
             ((-1.0, -1.8, -0.2), "outside the pre-registered readings (a loss)")]
    for iv, want in cases:
        assert D.reading(iv, 2.0) == want


def test_dose_judge_on_planted_scores():
    """Three arms x 4 seeds, one receiver; the no-gate arm solves 2 more of 10 weak-family problems in every seed
    than GRPO: Δ = +20 points exactly with zero spread; the floor from the planted evaluation variance sets SE."""
    base = np.array([1, 1, 0, 0, 0, 0, 0, 0, 0, 0], dtype=float)
    more = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0, 0], dtype=float)
    g = {"weak": {"grpo": {"a": {}}, "graft": {"a": {}}, "graft_nogate": {"a": {}}}, "macro": {}}
    ev = {"weak": {"grpo": {"a": {}}, "graft": {"a": {}}, "graft_nogate": {"a": {}}}, "macro": {}}
    pev = {"weak": {"graft_nogate|grpo": {"a": {}}}, "macro": {}}
    for s in map(str, range(4)):
        for arm, v in (("grpo", base), ("graft", base), ("graft_nogate", more)):
            g["weak"][arm]["a"][s] = {"weak": v.tolist()}
            ev["weak"][arm]["a"][s] = {"weak": 0.0004}
        pev["weak"]["graft_nogate|grpo"]["a"][s] = {"weak": 0.0009}
    measured = {"policies": ["a"], "grades": g, "eval_var": ev, "eval_var_paired": pev, "dose": {}}
    claims = {c["key"]: c for c in D.judge(measured, {"weak": {"a": "two"}})}
    prim = claims["weak:nogate_vs_grpo"]["per_model"]["a"]
    h = sps.t.ppf(0.975, 3) * math.sqrt(100 ** 2 * 0.0009 / 4)
    assert prim["interval"] == pytest.approx((20.0, 20.0 - h, 20.0 + h))
    assert prim["reading"] == "the gate or the dose is the bottleneck" and prim["verdict"] == "held"
    same = claims["weak:graft_vs_grpo"]["per_model"]["a"]
    assert same["interval"][0] == 0.0 and "reading" not in same
    # a registered sequential design with looks at 2 and 4 seeds judges at the second look with its boundary
    seq = {"interval": "floored_t", "alpha": 0.05, "sequential": {"spending": "obrien_fleming", "looks": [2, 4]}}
    prim = {c["key"]: c for c in D.judge(measured, {"weak": {"a": "two"}, "analysis": seq})}[
        "weak:nogate_vs_grpo"]["per_model"]["a"]
    q = look_critical(boundaries([2, 4])[1], 3)
    assert prim["interval"][2] - 20.0 == pytest.approx(q * math.sqrt(100 ** 2 * 0.0009 / 4))


def test_tables_read_the_step_the_claims_judge(tmp_path):
    """One source of scores: a run evaluated at steps 0 and 36 whose best.json selects step 0 (the base scored
    higher) is tabled at step 36 when the plan's claims judge step 36."""
    from test_plan import fake_eval, fake_run

    from graft_cli.report.runs import load_run

    d = fake_run(str(tmp_path), "tiny-grpo-s0", [36], 36)
    fake_eval(d, "a", 0, 0.30)
    fake_eval(d, "a", 36, 0.25)
    json.dump({"policies": {"a": {"step": 0}}}, open(os.path.join(d, "best.json"), "w"))
    assert load_run(d).results["a"].step == 0
    judged = load_run(d, {"a": 36}).results["a"]
    assert judged.step == 36 and judged.avg[0] == pytest.approx(25.0)


def test_provenance_recorded_under_older_names_still_stands_for_the_same_run(tmp_path):
    """A finished run whose config hash was taken when algo.old_logprobs' value `rollout` was called `sampler`:
    its config.yaml reads as the plan's config, so the plan reuses it; another learning rate still does not."""
    import copy

    cfg = compose(["pair=tiny", "method=grpo", f"run.out={tmp_path}", "run.name=r"])
    assert cfg.algo.old_logprobs == "rollout"
    older = copy.deepcopy(cfg)
    older.algo.old_logprobs = "sampler"  # the config as the older code resolved and hashed it
    d = str(tmp_path / "r")
    os.makedirs(d)
    with open(os.path.join(d, "config.yaml"), "w") as f:
        f.write(to_yaml(older))
    prov = V.record_session(older, d, RESUME_MAY_DIFFER, 0)
    assert prov["config_hash"] != V.config_hash(cfg, RESUME_MAY_DIFFER)
    assert V.reuse_problem(cfg, d, RESUME_MAY_DIFFER) is None
    other = compose(["pair=tiny", "method=grpo", f"run.out={tmp_path}", "run.name=r", "optim.lr=1e-3"])
    assert V.reuse_problem(other, d, RESUME_MAY_DIFFER) == "its config differs in 'optim.lr'"
