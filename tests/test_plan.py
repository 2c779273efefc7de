"""Plans: sweep expansion (a table of expected runs per sweep), dry-run output, skip-finished logic on fixture run
directories, partner-first ordering of the reproduction plan, the claims verdicts on hand-made numbers, and one
end-to-end plan (GRPO then stored-trajectory GRAFT from its logs, 2 steps each, on random models) executed twice
(the second time skips everything)."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from conftest import train_overrides

from graft_cli.cli import main
from graft_cli.config import compose
from graft_cli.errors import GraftError
from graft_cli.plan import execute as X
from graft_cli.plan import spec as P
from graft_cli.plan import status as S
from graft_cli.plan.results import run_scores
from graft_cli.report import claims as CL
from graft_cli.train.provenance import record_session
from graft_cli.train.run import RESUME_MAY_DIFFER

# ------------------------------------------------------------------------------------ sweep expansion
# sweep -> [(run directory name on the tiny pair, method, entry overrides)]
EXPECTED = {
    "gate": [("tiny-graft-s0", "graft", ()), ("tiny-graft_nogate-s0", "graft_nogate", ())],
    "floor": [("tiny-graft-s0", "graft", ()), ("tiny-graft_nofloor-s0", "graft_nofloor", ())],
    "ordering": [("tiny-graft-s0", "graft", ()), ("tiny-graft_first-s0", "graft_first", ()),
                 ("tiny-graft_uniform-s0", "graft_uniform", ())],
    "threshold": [("tiny-graft-delta0-s0", "graft", ("exchange.params.delta=0.0",)),
                  ("tiny-graft-delta0p5-s0", "graft", ("exchange.params.delta=0.5",)),
                  ("tiny-graft-delta0p7-s0", "graft", ("exchange.params.delta=0.7",)),
                  ("tiny-graft-s0", "graft", ()),
                  ("tiny-graft-delta0p9-s0", "graft", ("exchange.params.delta=0.9",))],
    "designs": [("tiny-graft-s0", "graft", ()), ("tiny-graft_pooled-s0", "graft_pooled", ()),
                ("tiny-graft_successonly-s0", "graft_successonly", ()),
                ("tiny-graft_successonly_nofloor-s0", "graft_successonly_nofloor", ()),
                ("tiny-graft_hacpo_update-s0", "graft_hacpo_update", ()),
                ("tiny-graft_sft_update-s0", "graft_sft_update", ()),
                ("tiny-graft_luffy-s0", "graft_luffy", ()),
                ("tiny-graft_randprompts-s0", "graft_randprompts", ()),
                ("tiny-graft_randadmit-s0", "graft_randadmit", ()),
                ("tiny-graft_seqratio-s0", "graft_seqratio", ()),
                ("tiny-graft_nobalance-s0", "graft_nobalance", ())],
}


@pytest.mark.parametrize("sweep", sorted(EXPECTED))
def test_sweep_expands_to_expected_runs(sweep):
    plan = P.load_sweep(sweep, pair="tiny")
    got = [(plan.run_name(r), r.method, r.overrides) for r in plan.runs]
    assert got == EXPECTED[sweep]
    assert plan.name == sweep and plan.pair == "tiny"
    assert sweep in P.known(P.sweep_dir()) and "_pairs" not in P.known(P.sweep_dir())


def test_sweep_methods_exist_and_delta_reaches_the_config(tmp_path):
    from graft_cli.config import compose

    methods = set(P.known(os.path.join(os.path.dirname(P.sweep_dir()), "method")))
    for sweep in EXPECTED:
        for r in P.load_sweep(sweep).runs:
            assert r.method in methods, (sweep, r.method)
    plan = P.load_sweep("threshold")
    deltas = [compose(plan.compose_overrides(r, str(tmp_path))).exchange.params["delta"] for r in plan.runs]
    assert deltas == [0.0, 0.5, 0.7, 0.8, 0.9]


def test_sweep_options_seeds_steps_and_pairs(tmp_path):
    plan = P.load_sweep("gate", pair="1", seeds=["0,1"], steps=7)
    assert [plan.run_name(r) for r in plan.runs] == ["1-graft-s0", "1-graft-s1", "1-graft_nogate-s0",
                                                     "1-graft_nogate-s1"]
    assert plan.steps == 7
    ov = plan.compose_overrides(plan.runs[1], str(tmp_path))
    assert ov[:5] == ["pair=1", "method=graft", f"run.out={tmp_path}", "run.name=1-graft-s1", "run.seed=1"]
    assert "run.steps=7" in ov
    # paper pairs: the paper's protocol from _pairs.yaml (validation every 5 steps, best checkpoint, 5 runs)
    real = P.load_sweep("gate", pair="2")
    assert real.steps is None and "eval.every=5" in real.overrides
    assert (real.eval.steps, real.eval.runs, real.eval.samples) == ("best", 5, 8)
    # the tiny pair shares the reproduction plan's budget
    tiny, repro = P.load_sweep("gate", pair="tiny"), P.load_reproduce("tiny")
    assert (tiny.steps, tiny.overrides, tiny.eval) == (repro.steps, repro.overrides, repro.eval)
    with pytest.raises(GraftError, match="known: .*gate"):
        P.load_sweep("nosuch")


def test_plan_file_errors_are_one_line():
    with pytest.raises(GraftError, match="unknown key 'bogus'"):
        P.build_plan({"runs": [{"name": "a", "method": "grpo"}], "bogus": 1})
    with pytest.raises(GraftError, match="listed twice"):
        P.build_plan({"runs": [{"name": "a", "method": "grpo"}, {"name": "a", "method": "grpo"}]})
    with pytest.raises(GraftError, match="different method"):
        P.build_plan({"runs": [{"name": "a", "method": "grpo", "seeds": [0]},
                               {"name": "a", "method": "graft", "seeds": [1]}]})
    with pytest.raises(GraftError, match="partner 'g' has no run with seed 1"):
        P.build_plan({"runs": [{"name": "g", "method": "grpo", "seeds": [0]},
                               {"name": "st", "method": "graft_stored", "seeds": [0, 1],
                                "partner": {"run": "g", "policy": "b"}}]})


# ---------------------------------------------------------------------------------------- dry run
def test_ablate_dry_run_lists_runs(tmp_path):
    res = CliRunner().invoke(main, ["ablate", "--sweep", "ordering", "--dry-run", "--out", str(tmp_path),
                                    "--seeds", "0,1"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("Plan ordering") and "6 runs" in lines[0] and str(tmp_path) in lines[0]
    rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| #")]
    assert [r.split("|")[2].strip() for r in rows] == ["tiny-graft-s0", "tiny-graft-s1", "tiny-graft_first-s0",
                                                      "tiny-graft_first-s1", "tiny-graft_uniform-s0",
                                                      "tiny-graft_uniform-s1"]
    assert all(r.split("|")[7].strip() == "new" and r.split("|")[8].strip() == "ok" for r in rows)
    assert not os.listdir(tmp_path)  # a dry run writes nothing


def test_ablate_unknown_sweep_is_one_line():
    res = CliRunner().invoke(main, ["ablate", "--sweep", "nosuch", "--dry-run"])
    assert res.exit_code == 2 and "known: baselines, designs, floor, gate, ordering, threshold" in res.output


def test_reproduce_dry_run_lists_plan(tmp_path):
    res = CliRunner().invoke(main, ["reproduce", "--pair", "tiny", "--dry-run", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "tiny-grpo-s2" in res.output and "tiny-graft_nogate-s2" in res.output
    # the 60-minute plan names what it leaves out; the full plan runs every method config
    assert "method configs not in the plan: " in res.output and "graft_delta0p7" in res.output
    assert "--pair tiny_full" in res.output
    full = CliRunner().invoke(main, ["reproduce", "--pair", "tiny_full", "--dry-run", "--out", str(tmp_path)])
    assert full.exit_code == 0 and "tiny-graft_delta0p7-s0" in full.output
    assert "tiny-graft_stored-a-s0" in full.output
    assert "checked when its partner has run" in full.output  # stored runs wait for their partner's logs
    assert "method configs not in the plan" not in full.output


# ------------------------------------------------------------------------------------ skip finished
def fake_run(root, name: str, steps: list[int], total: int | None, policies=("a", "b"), incomplete: int | None = None):
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.yaml"), "w") as f:
        f.write("method: graft\npair: tiny\npolicies:\n" + "".join(f"- {{name: {p}, model: 'tiny:{p}'}}\n"
                                                                  for p in policies))
    for s in steps:
        c = os.path.join(d, "checkpoints", f"step_{s:06d}")
        os.makedirs(c, exist_ok=True)
        with open(os.path.join(c, "state.json"), "w") as f:
            json.dump({"step": s, "total_steps": total}, f)
        open(os.path.join(c, "COMPLETE"), "w").close()
    if incomplete:
        os.makedirs(os.path.join(d, "checkpoints", f"step_{incomplete:06d}"), exist_ok=True)  # no COMPLETE
    return d


def stamp(plan, out: str, name: str, seed: int = 0) -> dict:
    """Record the provenance of the (faked) run ``name`` as `graft train` would for the plan's config."""
    r = plan.by_key()[f"{name}-s{seed}"]
    return record_session(compose(plan.compose_overrides(r, out)), plan.run_dir(r, out), RESUME_MAY_DIFFER, 0)


def fake_eval(run_dir, policy, step, avg, runs=1, samples=4):
    d = os.path.join(run_dir, "eval", policy, f"step_{step:06d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump({"settings": {"samples": samples}, "num_runs": runs, "average": {"mean": avg, "std": 0.01},
                   "benchmarks": {"math500": {"mean": avg, "std": 0.01}}}, f)


def test_run_status_finished_partial_new(tmp_path):
    assert S.run_status(str(tmp_path / "none"), 10).state == "new"
    d = fake_run(tmp_path, "r", [5, 10], 10, incomplete=15)
    assert S.run_status(d, 10).finished and S.run_status(d, 10).step == 10
    st = S.run_status(d, 20)  # more steps planned: partial, resumed from 10 (the incomplete 15 is ignored)
    assert (st.state, st.step, st.total) == ("partial", 10, 20) and st.label() == "partial 10/20"
    assert S.run_status(d, None).finished  # no planned steps: the checkpoint's own total
    assert S.run_status(d, 8).finished and "has 10 steps" in S.run_status(d, 8).note
    d2 = fake_run(tmp_path, "r2", [], None)
    assert S.run_status(d2, 10).label() == "partial 0/10"


def test_eval_done(tmp_path):
    d = fake_run(tmp_path, "r", [5, 10], 10)
    assert not S.eval_done(d, "last", 1)
    fake_eval(d, "a", 10, 0.5)
    assert not S.eval_done(d, "last", 1)  # policy b missing
    fake_eval(d, "b", 10, 0.4)
    assert S.eval_done(d, "last", 1) and S.eval_done(d, "last", 1, samples=4, benchmarks=["math500"])
    assert not S.eval_done(d, "last", 2)  # fewer eval runs than wanted
    assert not S.eval_done(d, "last", 1, samples=8)
    assert not S.eval_done(d, "last", 1, benchmarks=["aime24"])
    assert not S.eval_done(d, "all", 1)  # step 5 not evaluated
    scores = run_scores(d, "last")
    assert scores["a"]["step"] == 10 and scores["a"]["avg"] == pytest.approx(50.0)


def test_execute_skips_finished_and_resumes_partial(tmp_path, monkeypatch):
    out = str(tmp_path)
    plan = P.build_plan({"pair": "tiny", "steps": 10, "eval": {"steps": "last", "runs": 1, "samples": 4},
                         "runs": [{"name": "done", "method": "grpo"}, {"name": "noeval", "method": "grpo"},
                                  {"name": "half", "method": "grpo"}, {"name": "fresh", "method": "grpo"},
                                  {"name": "st", "method": "graft_stored", "partner": {"run": "fresh", "policy": "b"}},
                                  ]})
    d_done = fake_run(out, "tiny-done-s0", [10], 10)
    fake_eval(d_done, "a", 10, 0.5)
    fake_eval(d_done, "b", 10, 0.4)
    fake_run(out, "tiny-noeval-s0", [10], 10)
    for name in ("done", "noeval"):  # finished runs made with the config the plan composes now
        stamp(plan, out, name)
    fake_run(out, "tiny-half-s0", [5], 10)
    calls = []

    def fake_job(job):
        calls.append((os.path.basename(job["run_dir"]), job["finished"]))
        if "fresh" in job["run_dir"]:
            return {"trained": None, "train_s": 0.0, "evaluated": None, "eval_s": 0.0, "error": "boom"}
        return {"trained": None if job["finished"] else "trained", "train_s": 1.0, "evaluated": "evaluated",
                "eval_s": 1.0, "error": None}

    monkeypatch.setattr(X, "run_job", fake_job)
    # the plan pins the tiny pair's identity; faked here (the real one builds the full tiny models: minutes)
    monkeypatch.setattr(X, "tiny_identity",
                        lambda progress=True, code=False, roles=None: {"cache": "c", "hashes": {"a": "1"},
                                                                       "version": 2})
    recs = {r["name"]: r for r in X.execute(plan, out, jobs=1, progress=False)}
    # finished + evaluated: nothing; finished: eval only; partial and new: train; a failed partner: dependent skipped
    assert calls == [("tiny-noeval-s0", True), ("tiny-half-s0", False), ("tiny-fresh-s0", False)]
    assert recs["done"]["trained"] == "skipped (finished)" and recs["done"]["evaluated"] == "skipped (done)"
    assert recs["done"]["scores"]["b"]["avg"] == pytest.approx(40.0)
    assert recs["half"]["status_before"] == "partial 5/10"
    assert recs["fresh"]["error"] == "boom"
    assert "partner fresh-s0 failed" in recs["st"]["error"]
    saved = json.load(open(os.path.join(out, "plan_plan.json")))
    assert [r["name"] for r in saved["runs"]] == ["done", "noeval", "half", "fresh", "st"]
    assert "| tiny-done-s0 | grpo | 0 |" in open(os.path.join(out, "plan_plan.md")).read()


# -------------------------------------------------------------------------------------- reproduce plan
def test_reproduce_plan_orders_partners_first_and_covers_the_study(tmp_path):
    full = P.load_reproduce("tiny_full")
    keys = [r.key for r in full.runs]
    stored = [r for r in full.runs if r.method == "graft_stored"]
    assert {r.name for r in stored} == {"graft_stored-a", "graft_stored-b"}
    for r in stored:
        assert r.partner[0] == "grpo" and r.partner_key() == f"grpo-s{r.seed}"
        assert keys.index(r.partner_key()) < keys.index(r.key)
        ov = full.compose_overrides(r, str(tmp_path))
        assert f"exchange.params.partner_run={tmp_path}/tiny-grpo-s{r.seed}" in ov
        assert f"exchange.params.partner_policy={r.partner[1]}" in ov
    assert {r.partner[1] for r in stored} == {"a", "b"}
    # the powered plan is the four claims: GRPO, GRAFT and w/o gate on 18 seeds (paired by seed number), peer-first
    # on two; the three small sets evaluated in 5 runs, the others in 1
    plan = P.load_reproduce("tiny")
    seeds = {}
    for r in plan.runs:
        seeds.setdefault(r.name, []).append(r.seed)
    eighteen = list(range(18))
    assert seeds == {"grpo": eighteen, "graft": eighteen, "graft_nogate": eighteen, "graft_first": [0, 1]}
    assert plan.eval.runs == 1 and plan.eval.bench_runs == {"aime24": 5, "aime25": 5, "amc23": 5}
    # the claims runs are evaluated at every kept checkpoint, step 0 (the base) included, with the rescue re-draw
    for r in plan.runs:
        ev = plan.eval_for(r)
        assert ev.steps == ("all" if r.name in ("grpo", "graft") else "last")
        assert ("eval.rescue=true" in r.overrides) == (r.name in ("grpo", "graft"))
        assert ("run.save_initial=true" in r.overrides) == (r.name in ("grpo", "graft"))
    # the full plan runs every registered method config (a new baseline joins with one line)
    from graft_cli.plan.commands import unplanned_methods

    assert unplanned_methods(full) == [] and full.pair == "tiny" and full.name == "tiny_full"
    assert {"hacpo", "sgt", "grpo_n32"} <= {r.method for r in full.runs}
    assert {r.key for r in plan.runs} <= {r.key for r in full.runs}
    assert (full.steps, full.overrides, full.eval) == (plan.steps, plan.overrides, plan.eval)
    assert plan.claims["baseline"] == "grpo" and plan.claims["no_gate"] == "graft_nogate"


def test_order_runs_moves_stored_after_partner():
    runs = [P.PlanRun("st", "graft_stored", 0, (), ("g", "b")), P.PlanRun("x", "graft", 0),
            P.PlanRun("g", "grpo", 0)]
    assert [r.name for r in P.order_runs(runs)] == ["x", "g", "st"]
    with pytest.raises(GraftError, match="cycle"):
        P.order_runs([P.PlanRun("p", "graft_stored", 0, (), ("q", "a")),
                      P.PlanRun("q", "graft_stored", 0, (), ("p", "a"))])


# ------------------------------------------------------------------------------------------- claims
def numbers(**kw):
    base = [0.2, 0.4, 0.6, 0.8]
    arr = lambda d: {str(s): {"math500": [x + d for x in base]} for s in range(3)}
    m = {"policies": ["a", "b"],
         # a: GRAFT is +0.10 on every problem of every seed -> every bootstrap replicate is +10 points;
         # b: GRAFT is -0.05 everywhere -> -5 points; w/o gate is 0.3 below GRAFT for both
         "problems": {"grpo": {"a": arr(0.0), "b": arr(0.0)}, "graft": {"a": arr(0.1), "b": arr(-0.05)},
                      "graft_nogate": {"a": arr(-0.2), "b": arr(-0.35)}},
         # seed means 0.5, 0.5, 0.4: mean 0.4667, sd 0.05774, t(2) = 4.303 -> ±0.1434
         "complementarity": {"a": {"0": [0.4, 0.6], "1": [0.5, 0.5], "2": [0.3, 0.5]},
                             "b": {"0": [0.0, 0.0], "1": [0.0, 0.0]}},
         # one seed each: peer-last step means resample to {0.01, 0.02, 0.03}, peer-first is always 0
         "clip_peer": {"graft": {"a": {"0": [0.01, 0.03]}, "b": {"0": [0.0, 0.0]}},
                       "graft_first": {"a": {"0": [0.0, 0.0]}, "b": {"0": [0.01, 0.01]}}}}
    m.update(kw)
    return m


def verdicts(m, cfg=None):
    return {c.key: c.verdict for c in CL.judge(m, cfg)}


def test_claims_intervals_and_verdicts():
    cl = {c.key: c for c in CL.judge(numbers())}
    g = cl["graft_beats_grpo"].per_model
    assert g["a"]["interval"] == pytest.approx((10.0, 10.0, 10.0)) and g["a"]["verdict"] == "held"
    assert g["b"]["interval"] == pytest.approx((-5.0, -5.0, -5.0)) and g["b"]["verdict"] == "did not hold"
    assert cl["graft_beats_grpo"].verdict == "mixed"
    assert cl["gate_matters"].verdict == "held"
    assert cl["gate_matters"].per_model["a"]["interval"][0] == pytest.approx(30.0)
    c = cl["complementarity"].per_model
    assert c["a"]["interval"] == pytest.approx((46.667, 32.32, 61.01), abs=0.01) and c["a"]["verdict"] == "held"
    assert c["a"]["method"] == "t over 3 seeds"
    # b: zero share in both seeds, sd 0 -> interval [0, 0] straddles (touches) zero: not significant
    assert c["b"]["interval"] == pytest.approx((0.0, 0.0, 0.0)) and c["b"]["verdict"] == "not significant"
    k = cl["peer_last_clips"].per_model
    assert k["a"]["interval"] == pytest.approx((2.0, 1.0, 3.0)) and k["a"]["verdict"] == "held"
    assert k["b"]["interval"] == pytest.approx((-1.0, -1.0, -1.0)) and k["b"]["verdict"] == "did not hold"
    assert "bootstrap over 2 vs 2 steps" == k["a"]["method"]
    assert "+10.00 pts [+10.00, +10.00]" in cl["graft_beats_grpo"].evidence


def test_regime_figures_gain_over_base_and_half_widths():
    """GRPO gains +0.1 on every problem of every seed over its step-0 evaluation -> gain +10 points, interval
    [10, 10]; claim 2's interval for a is [10, 10] (half-width 0), claim 3's [30, 30]; with per-problem
    differences ±0.4 on one seed the interval is [-40, 40] (half-width 40)."""
    base = [0.2, 0.4, 0.6, 0.8]
    step0 = {str(s): {"math500": [x - 0.1 for x in base]} for s in range(3)}
    reg = CL.regime_figures(numbers(base={"a": step0}))
    assert reg["a"]["baseline_gain"] == pytest.approx((10.0, 10.0, 10.0))
    assert reg["a"]["graft_beats_grpo_half_width"] == pytest.approx(0.0)
    assert "baseline_gain" not in reg["b"]  # no step-0 evaluation of b
    probs = {"grpo": {"a": {"0": {"math500": [0.5] * 4}}}, "graft": {"a": {"0": {"math500": [0.9, 0.1, 0.9, 0.1]}}}}
    reg = CL.regime_figures(numbers(policies=["a"], problems=probs))
    assert reg["a"]["graft_beats_grpo_half_width"] == pytest.approx(40.0)
    assert reg["a"]["gate_matters_half_width"] is None
    md = CL.claims_markdown(CL.judge(numbers(base={"a": step0})), measured=numbers(base={"a": step0}))
    assert "grpo gain over the base model +10.00 pts [+10.00, +10.00]" in md and "claim 2 0.00 pts" in md


def test_claims_straddling_and_missing():
    # Δ = 0 with per-problem differences of ±0.4: 1/16 of the resamples are all +0.4 (> 2.5%), so the interval
    # is [-40, +40] points: far wider than ±1 point, underpowered
    probs = {"grpo": {"a": {"0": {"math500": [0.5] * 4}}}, "graft": {"a": {"0": {"math500": [0.9, 0.1, 0.9, 0.1]}}}}
    cl = {c.key: c for c in CL.judge(numbers(policies=["a"], problems=probs))}
    assert cl["graft_beats_grpo"].per_model["a"]["interval"] == pytest.approx((0.0, -40.0, 40.0))
    assert cl["graft_beats_grpo"].verdict == "underpowered"
    assert cl["gate_matters"].verdict == "not measured"  # no w/o-gate run
    assert set(verdicts({"policies": ["a", "b"]}).values()) == {"not measured"}
    assert verdicts(numbers(), {"complementarity_min": 0.7})["complementarity"] == "did not hold"


def test_interval_helpers_by_hand():
    from graft_cli.report.stats import diff_interval, mean_interval

    iv = mean_interval({"0": [1.0, 3.0], "1": [2.0, 4.0]}, offset=1.0)  # means 2, 3: mean 2.5, sd 0.7071
    se = 0.70711 / 2 ** 0.5
    assert iv[:3] == pytest.approx((1.5, 1.5 - 12.706 * se, 1.5 + 12.706 * se), abs=1e-3)
    iv = diff_interval({"0": [1.0], "1": [3.0]}, {"0": [0.0], "1": [0.0]})  # Welch: 2 ± 12.706 * 1.0
    assert iv[:3] == pytest.approx((2.0, 2.0 - 12.706, 2.0 + 12.706), abs=1e-3) and iv[3].startswith("Welch")
    assert mean_interval({}) is None and diff_interval({"0": [1.0]}, {}) is None


def test_claims_measure_and_write(tmp_path):
    d_last = fake_run(tmp_path, "tiny-graft-s0", [3], 3)
    d_first = fake_run(tmp_path, "tiny-graft_first-s0", [3], 3)
    for d, vals in ((d_last, [0.01, 0.03, None]), (d_first, [0.0, 0.0, 0.0])):
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            for step, v in enumerate(vals, 1):
                for p in ("a", "b"):
                    row = {"step": step, "policy": p, "time/step": 1.0}
                    if v is not None:
                        row["clip_ratio/peer"] = v
                    f.write(json.dumps(row) + "\n")
            f.write(json.dumps({"step": 3, "policy": "a", "validation/score": 0.5}) + "\n")
    assert CL.mean_peer_clip(d_last, 48) == {"a": pytest.approx(0.02), "b": pytest.approx(0.02)}
    assert CL.mean_peer_clip(d_last, 1) == {"a": pytest.approx(0.01), "b": pytest.approx(0.01)}
    recs = [{"name": "graft", "method": "graft", "seed": 0, "dir": d_last,
             "scores": {"a": {"avg": 40.0}, "b": {"avg": 30.0}}},
            {"name": "graft_first", "method": "graft_first", "seed": 0, "dir": d_first,
             "scores": {"a": {"avg": 38.0}, "b": {"avg": 31.0}}}]
    m = CL.measure(recs)
    assert m["policies"] == ["a", "b"] and m["clip_peer"]["graft_first"] == {"a": {"0": [0.0, 0.0, 0.0]},
                                                                            "b": {"0": [0.0, 0.0, 0.0]}}
    assert m["clip_peer"]["graft"]["a"] == {"0": [0.01, 0.03]}
    assert m["scores"]["graft"]["a"] == {"0": 40.0}
    rdir = tmp_path / "report"
    rdir.mkdir()
    (rdir / "report.md").write_text("# graft report\n\nintro\n\n## Runs\n\n| x |\n")
    md, claims = CL.write_claims(str(rdir), recs)
    text = (rdir / "report.md").read_text()
    assert text.index("Claims of the paper") < text.index("## Runs")  # the claims come before the tables
    assert "peer-first" in md.lower() and "| graft_first | graft_first | 1 | 38.00 | 31.00 |" in md
    CL.write_claims(str(rdir), recs)  # rewriting replaces the section
    assert (rdir / "report.md").read_text().count("Claims of the paper") == 1
    saved = json.load(open(rdir / "claims.json"))
    # peer-last 0.01/0.03 vs peer-first 0: bootstrap over steps [1, 3] points -> held
    assert [c["verdict"] for c in saved["claims"]][-1] == "held"


# ------------------------------------------------------------------------------- end to end (random models)
def test_execute_end_to_end_with_stored_partner(tiny_models, problems_file, tmp_path):
    out = str(tmp_path / "runs")
    bench = str(tmp_path / "bench.jsonl")
    with open(problems_file) as f, open(bench, "w") as g:
        g.writelines(f.readlines()[:4])
    ov = train_overrides(tiny_models, problems_file, out, ["run.log_rollouts=true"])
    ov = [o for o in ov if not o.startswith("run.out=")]
    plan = P.build_plan({"name": "e2e", "pair": "tiny", "steps": 2, "overrides": ov,
                         "eval": {"steps": "last", "runs": 1, "samples": 2, "benchmarks": [f"toy={bench}"]},
                         "runs": [{"name": "st", "method": "graft_stored", "partner": {"run": "grpo", "policy": "b"}},
                                  {"name": "grpo", "method": "grpo"}]})
    assert [r.name for r in plan.runs] == ["grpo", "st"]
    recs = {r["name"]: r for r in X.execute(plan, out, jobs=1, progress=False)}
    for name in ("grpo", "st"):
        assert recs[name]["error"] is None, recs[name]
        assert recs[name]["trained"] == "trained" and recs[name]["evaluated"] == "evaluated"
        assert recs[name]["status"] == "finished 2/2"
    assert set(recs["grpo"]["scores"]) == {"a", "b"} and set(recs["st"]["scores"]) == {"a"}
    assert recs["st"]["scores"]["a"]["step"] == 2
    again = {r["name"]: r for r in X.execute(plan, out, jobs=1, progress=False)}
    assert all(r["trained"] == "skipped (finished)" and r["evaluated"] == "skipped (done)" for r in again.values())


def test_tiny_pair_is_pinned_for_a_plan(monkeypatch, tmp_path):
    from graft_cli.tiny import build as tiny_build, sft as tiny_sft

    assert X.uses_tiny(P.load_reproduce("tiny"), str(tmp_path))
    man = {"hashes": {"a": "1", "b": "2"}, "recipe": tiny_sft.default_recipe().to_dict()}
    monkeypatch.setattr(tiny_build, "read_manifest", lambda *a, **k: man)
    X.check_tiny({"hashes": {"a": "1", "b": "2"}})
    monkeypatch.setenv("GRAFT_TINY_RECIPE", "v2")  # the code would build the v2 pair: a v3 cache is refused
    with pytest.raises(GraftError, match="recipe in the code changed"):
        X.check_tiny({"hashes": {"a": "1", "b": "2"}})
    monkeypatch.delenv("GRAFT_TINY_RECIPE")
    X.check_tiny(None)
    with pytest.raises(GraftError, match="changed since this plan started"):
        X.check_tiny({"hashes": {"a": "1", "b": "3"}})  # the cache was rebuilt
    man["recipe"] = {"other": 1}
    with pytest.raises(GraftError, match="recipe in the code changed"):
        X.check_tiny({"hashes": {"a": "1", "b": "2"}})  # ensure_tiny would rebuild it
    # a folder made with another build is refused before anything runs
    monkeypatch.setattr(X, "uses_tiny", lambda plan, out, source="tiny": True)
    monkeypatch.setattr(X, "tiny_identity",
                        lambda progress=True, code=False, roles=None: {"cache": "c", "hashes": {"a": "9"}})
    with open(tmp_path / "plan_p.json", "w") as f:
        json.dump({"tiny": {"hashes": {"a": "1"}}}, f)
    plan = P.build_plan({"name": "p", "steps": 1, "runs": [{"name": "g", "method": "grpo"}]})
    with pytest.raises(GraftError, match="another build of the tiny pair"):
        X.execute(plan, str(tmp_path), progress=False)
    # the same pair but other tiny code models (a plan with a code arm) is refused too
    monkeypatch.setattr(X, "tiny_identity", lambda progress=True, code=False, roles=None: {
        "cache": "c", "hashes": {"a": "1"}, **({"code_hashes": {"junior": "8"}} if code else {})})
    with open(tmp_path / "plan_p.json", "w") as f:
        json.dump({"tiny": {"hashes": {"a": "1"}, "code_hashes": {"junior": "7"}}}, f)
    with pytest.raises(GraftError, match="another build of the tiny pair"):
        X.execute(plan, str(tmp_path), progress=False)


def test_a_plan_builds_the_roles_its_policies_train(tmp_path):
    """tiny_roles: the tiny policies the runs train (tiny: a, b; tiny3 adds c); teachers and c otherwise come when a
    run asks for them. same_models: a role built since the plan started is no change; another hash for a role
    it had is."""
    assert X.tiny_roles(P.load_reproduce("tiny"), str(tmp_path)) == ("a", "b")
    plan3 = P.build_plan({"name": "p", "pair": "tiny3", "steps": 1, "runs": [{"name": "g", "method": "grpo"}]})
    assert X.tiny_roles(plan3, str(tmp_path)) == ("a", "b", "c")
    assert X.same_models({"a": "1", "b": "2"}, {"a": "1", "b": "2", "teacher": "3"})
    assert not X.same_models({"a": "1", "b": "2"}, {"a": "1", "b": "4"})
    assert not X.same_models({"a": "1", "teacher": "3"}, {"a": "1"})  # a role it had is gone: rebuilt
    assert X.same_models(None, {"a": "1"})


def test_per_run_eval_refines_the_plan_eval():
    raw = {"name": "x", "pair": "tiny", "eval": {"steps": "last", "runs": 2, "samples": 4},
           "runs": [{"name": "g", "method": "grpo", "eval": {"steps": "all", "samples": 8}},
                    {"name": "h", "method": "graft"}]}
    plan = P.build_plan(raw)
    g, h = plan.runs
    assert (plan.eval_for(g).steps, plan.eval_for(g).samples, plan.eval_for(g).runs) == ("all", 8, 2)
    assert plan.eval_for(h) is plan.eval
    bad = {**raw, "runs": [{"name": "g", "method": "grpo", "eval": {"stepz": 1}}]}
    with pytest.raises(GraftError, match=r"runs\[0\]: eval: unknown key 'stepz'"):
        P.build_plan(bad)
    with pytest.raises(GraftError, match="eval must be a mapping"):
        P.build_plan({**raw, "runs": [{"name": "g", "method": "grpo", "eval": "all"}]})
