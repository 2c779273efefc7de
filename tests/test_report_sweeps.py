"""Every `graft ablate` sweep renders its paper table: each sweep's `--dry-run` plan
(experiments/sweep/*.yaml on the tiny pair, --steps 3) is composed run by run into the config.yaml training
would write, given a made-up evaluation, and put through the report's grouping (`load_runs`, `build_tables`).
Each sweep runs twice: as shipped, and with every run configured the other way round (a variant method written
as `graft` plus overrides, an override written as the variant's method config, or another method with an
override that undoes it), so the tables must come from the runs' resolved settings, not their method names.

The made-up scores: run i of a sweep (plan order, from 0) gets pass@1 = (20 + i) % on math500 for both policies,
full GRAFT 40 %, so each row's Δ vs full GRAFT is (20 + i) - 40 (all distinct, all below full GRAFT)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import yaml

from graft_cli import config as C
from graft_cli.plan import execute as X
from graft_cli.plan import spec as S
from graft_cli.report import runs as RU
from graft_cli.report import tables as T

FULL = 40.0
_CONFIGS: dict = {}  # compose overrides -> config.yaml text (a run's config is composed once per module)

# sweep -> (table key, {plan run name: row label}), the row labels as the paper's tables print them
EXPECTED = {
    "threshold": {"table7_delta": {"graft-delta0": "0 (no floor)", "graft-delta0p5": "0.5", "graft-delta0p7": "0.7",
                                   "graft": "0.8", "graft-delta0p9": "0.9"}},
    "floor": {"table7": {"graft": "GRAFT (full)", "graft_nofloor": "w/o floor (δ=0)"}},
    "gate": {"table7": {"graft": "GRAFT (full)", "graft_nogate": "w/o compat gate (w=1)"}},
    "ordering": {"table7": {"graft": "GRAFT (full)", "graft_first": "peer first", "graft_uniform": "peer uniform"}},
    # the designs sweep spans Table 2b / 8 (what is transferred, how it is learned) and Table 2a / 7 (which
    # prompts / responses, the ratio, the balance; pooled groups in both), as graft.md §6.4 and §6.6 list them
    "designs": {
        "table8": {"graft": "GRAFT (full)", "graft_pooled": "pooled with receiver group",
                   "graft_successonly": "success-only", "graft_successonly_nofloor": "success-only + w/o floor",
                   "graft_hacpo_update": "HACPO update + GRAFT which",
                   "graft_sft_update": "SFT update (SGT + GRAFT which)", "graft_luffy": "LUFFY update"},
        "table7": {"graft": "GRAFT (full)", "graft_pooled": "pooled with receiver group",
                   "graft_randprompts": "random prompts",
                   "graft_randadmit": "random admission", "graft_seqratio": "w/o token-level ratio (seq-level)",
                   "graft_nobalance": "w/o balanced exchange"}},
}

# the threshold sweep's runs in the runs table (Method column)
RUN_LABELS = {"graft-delta0": "w/o floor (δ=0)", "graft-delta0p5": "GRAFT [delta=0.5]", "graft-delta0p7": "δ = 0.7",
              "graft": "GRAFT", "graft-delta0p9": "δ = 0.9"}

# the other way round: plan run name -> (method, overrides), written by hand from experiments/method/*.yaml
ALTERNATIVE = {
    "threshold": {"graft-delta0": ("graft_nofloor", ()), "graft-delta0p7": ("graft_delta0p7", ()),
                  "graft-delta0p9": ("graft_delta0p9", ()),
                  "graft-delta0p5": ("graft_nofloor", ("exchange.params.delta=0.5",)),
                  "graft": ("graft_delta0p9", ("exchange.params.delta=0.8",))},
    "floor": {"graft_nofloor": ("graft", ("exchange.params.delta=0.0",))},
    "gate": {"graft_nogate": ("graft", ("exchange.params.gate=none",)),
             "graft": ("graft_nogate", ("exchange.params.gate=floor",))},
    "ordering": {"graft_first": ("graft", ("exchange.ordering=first",)),
                 "graft_uniform": ("graft_first", ("exchange.ordering=uniform",))},
    "designs": {
        "graft_pooled": ("graft", ("exchange.params.mode=pooled",)),
        "graft_successonly": ("graft", ("exchange.params.peer_responses=success",)),
        "graft_successonly_nofloor": ("graft_nofloor", ("exchange.params.peer_responses=success",)),
        "graft_hacpo_update": ("graft", ("algo.loss=hacpo_peer", "algo.agg=seq-mean-token-mean",
                                         "algo.clip_low=3.0e-4", "algo.clip_high=4.0e-4",
                                         "algo.loss_params.lower_bound=0.8", "algo.loss_params.lower_bound_step=0.025",
                                         "algo.loss_params.schedule=minibatch", "algo.loss_params.peer_coef=1.0",
                                         "exchange.params.mode=hacpo", "exchange.params.gate=none",
                                         "exchange.params.hacpo_peer_elsewhere=zero")),
        "graft_sft_update": ("graft", ("algo.loss=ppo_token_nll", "algo.loss_params.nll_coef=0.1",
                                       "exchange.params.mode=sft", "exchange.params.gate=none")),
        "graft_luffy": ("graft_nogate", ("algo.loss=luffy", "algo.loss_params.gamma=0.1")),
        "graft_randprompts": ("graft", ("exchange.params.selection=random",)),
        "graft_randadmit": ("graft", ("exchange.params.admission=random",)),
        "graft_seqratio": ("graft", ("algo.loss=ppo_seq",)),
        "graft_nobalance": ("graft", ("exchange.params.selection=sgt",))},
}


def _config_text(overrides: list[str]) -> str:
    """The config.yaml `graft train` writes for these compose overrides: the pair's and method's composed
    config (the report's own cache, so each is composed once) with the rest of the overrides applied, as
    compose() applies them (checked against compose() itself in test_config_shortcut_is_compose)."""
    key = tuple(overrides)
    if key not in _CONFIGS:
        groups = dict(o.split("=", 1) for o in overrides if o.split("=", 1)[0] in ("pair", "method"))
        rest = [o for o in overrides if o.split("=", 1)[0] not in ("pair", "method")]
        base = RU.composed_config(groups["pair"], groups["method"])
        _CONFIGS[key] = C.to_yaml(C.from_dictconfig(base, rest))
    return _CONFIGS[key]


def test_config_shortcut_is_compose(tmp_path):
    plan = _plan("threshold", alternative=True)
    r = next(r for r in plan.runs if r.name == "graft-delta0p5")  # graft_nofloor + exchange.params.delta=0.5
    ov = plan.compose_overrides(r, str(tmp_path))
    assert _config_text(ov) == C.to_yaml(C.compose(ov))


def _summary(pct: float) -> dict:
    v = pct / 100
    return {"benchmarks": {"math500": {"mean": v, "std": None, "num_runs": 1, "runs": [v]}},
            "average": {"mean": v, "std": None, "runs": [v], "five": False, "benchmarks": ["math500"]},
            "num_runs": 1}


def _plan(sweep: str, alternative: bool) -> S.Plan:
    plan = S.load_sweep(sweep, pair="tiny", steps=3)
    if alternative:
        alt = ALTERNATIVE[sweep]
        plan.runs = [dataclasses.replace(r, method=alt[r.name][0], overrides=alt[r.name][1]) if r.name in alt else r
                     for r in plan.runs]
    return plan


def _materialise(plan: S.Plan, out: str) -> dict[str, float]:
    """config.yaml (composed), metrics and a step-3 evaluation for every run of the dry-run listing;
    returns plan run name -> its made-up score."""
    rows = X.describe(plan, out, check_configs=False)  # the `--dry-run` listing
    scores = {}
    for i, (r, row) in enumerate(zip(plan.runs, rows)):
        assert row["name"] == r.name and row["dir"] == plan.run_dir(r, out)
        d = row["dir"]
        os.makedirs(d)
        with open(os.path.join(d, "config.yaml"), "w") as f:
            f.write(_config_text(plan.compose_overrides(r, out)))
        score = FULL if r.name == "graft" else 20.0 + i
        scores[r.name] = score
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            for step in (1, 2, 3):
                for pol in ("a", "b"):
                    f.write(json.dumps({"step": step, "policy": pol, "time/step": 1.0, "clip_ratio/self": 0.01,
                                        "clip_ratio/peer": 0.02, "clip_ratio/peer_any": 1.0}) + "\n")
        for pol in ("a", "b"):
            sd = os.path.join(d, "eval", pol, "step_000003")
            os.makedirs(sd)
            with open(os.path.join(sd, "summary.json"), "w") as f:
                json.dump(_summary(score), f)
        with open(os.path.join(d, "best.json"), "w") as f:
            json.dump({"policies": {"a": {"step": 3}, "b": {"step": 3}}}, f)
    return scores


@pytest.mark.parametrize("alternative", [False, True], ids=["as-shipped", "other-way"])
@pytest.mark.parametrize("sweep", list(EXPECTED))
def test_sweep_renders_its_paper_table(sweep, alternative, tmp_path):
    plan = _plan(sweep, alternative)
    out = str(tmp_path / "ablate")
    scores = _materialise(plan, out)
    runs, shared = RU.load_runs(RU.find_dirs([out])[0])
    assert shared == []
    tables, _ = T.build_tables(runs)
    for key, labels in EXPECTED[sweep].items():
        t = next((t for t in tables if t.key == key), None)
        assert t is not None, (sweep, key, [t.key for t in tables], [r.variant for r in runs])
        for receiver in ("a", "b"):
            head = t.rows.index(next(r for r, s in zip(t.rows, t.styles) if s == "head" and r[0] ==
                                     f"Receiver {receiver} (pair tiny)"))
            nxt = [i for i, s in enumerate(t.styles) if s == "head" and i > head]
            block = t.rows[head + 1: nxt[0] if nxt else len(t.rows)]
            # every run of the sweep is one row, in the table's order, with its score and Δ vs full GRAFT
            assert [r[0] for r in block] == _table_order(key, labels), (sweep, block)
            by_label = {r[0]: dict(zip(t.columns, r)) for r in block}
            for name, lab in labels.items():
                row = by_label[lab]
                assert row["Avg"] == f"{scores[name]:.2f}"
                assert row["Δ vs full GRAFT"] == ("—" if name == "graft" else f"{scores[name] - FULL:+.2f}")
    labels = {n: lab for table in EXPECTED[sweep].values() for n, lab in table.items()}
    # the runs table names each run by what it is, not by the method it was started with
    named = {r[0]: r[1] for r in T.runs_table(runs).rows}
    want = RUN_LABELS if sweep == "threshold" else {n: lab.replace(" (full)", "") for n, lab in labels.items()}
    assert {n: named[f"tiny-{n}-s0"] for n in labels} == want
    if sweep == "ordering":  # Table 9 reads the orderings from the same runs
        t9 = next(t for t in tables if t.key == "table9")
        assert t9.columns[1:4] == ["First", "Uniform", "Last (GRAFT)"]
        assert dict(zip(t9.columns, t9.rows[0]))["First"] == "1.000"
        assert "first=tiny-graft_first-s0" in t9.notes[0] and "last=tiny-graft-s0" in t9.notes[0]


def _table_order(key: str, labels: dict) -> list[str]:
    """The row order of the paper's table restricted to the labels present (its variant lists in tables.py
    are in the paper's order; Table 7's δ rows by increasing δ)."""
    if key == "table7_delta":
        return sorted(labels.values(), key=lambda lab: float(lab.split()[0]))
    order = {"table7": RU.ABLATIONS, "table8": RU.DESIGNS}[key]
    rank = {RU.method_label(m) + (" (full)" if m == "graft" else ""): i for i, m in enumerate(order)}
    return sorted(labels.values(), key=lambda lab: rank[lab])


def test_identify_by_settings_worked_cases(tmp_path):
    """identify() on hand-written config mappings: a variant written as graft plus overrides, the reverse,
    a δ no method config has, a setting all runs of a plan share, a run from elsewhere, and run.staleness."""
    base = {"pair": "tiny", "exchange": {"name": "graft", "ordering": "last"}}
    cases = [
        ({"method": "graft", "exchange": {"params": {"delta": 0.0}}}, ("graft_nofloor", [])),
        ({"method": "graft", "exchange": {"params": {"delta": 0}}}, ("graft_nofloor", [])),  # int 0 = 0.0
        ({"method": "graft_nofloor", "exchange": {"params": {"delta": 0.8}}}, ("graft", [])),
        ({"method": "graft", "exchange": {"params": {"delta": 0.5}}}, ("graft", [("delta", "0.5")])),
        ({"method": "graft", "exchange": {"ordering": "first"}}, ("graft_first", [])),
        # a plan-wide batch setting is no part of the variant's name
        ({"method": "graft", "algo": {"minibatch_prompts": 8}, "exchange": {"params": {"delta": 0.7}}},
         ("graft_delta0p7", [])),
        ({"method": "grpo", "rollout": {"n": 16}, "exchange": {"name": "none"}}, ("grpo_n16", [])),
        ({"method": "grpo", "algo": {"kl_coef": 0.001, "reference": "initial"}, "exchange": {"name": "none"}},
         ("grpo_kl", [])),
        ({"method": "grpo", "algo": {"kl_coef": 0.01, "reference": "initial"}, "exchange": {"name": "none"}},
         ("grpo_kl", [("algo.kl_coef", "0.01")])),
        ({"method": "no_such_method", "exchange": {"params": {"delta": 0.0}}}, ("no_such_method", [])),
        # no method sets run.staleness, and it changes what a step trains on: named where it is not the default
        ({"method": "graft", "run": {"staleness": 1}}, ("graft", [("run.staleness", "1")])),
        ({"method": "graft", "run": {"staleness": 0, "seed": 3}}, ("graft", [])),
    ]
    for raw, want in cases:
        cfg = {**base, **raw, "exchange": {**base["exchange"], **raw.get("exchange", {})}}
        assert RU.identify(cfg) == want, raw
    assert RU.identify({"method": "graft", "pair": "no_such_pair"}) == ("graft", [])


def test_shared_override_left_out_of_labels(tmp_path):
    """A setting every run of a two-variant folder shares (a plan-wide override) is listed once, not in every
    label; one run's own δ stays in its label."""
    runs = []
    for i, (m, ov) in enumerate((("graft", ["exchange.params.peer_logprobs=recompute"]),
                                 ("graft", ["exchange.params.peer_logprobs=recompute", "exchange.params.delta=0.5"]),
                                 ("graft_nogate", ["exchange.params.peer_logprobs=recompute"]))):
        d = tmp_path / f"r{i}"
        d.mkdir()
        (d / "config.yaml").write_text(_config_text(["pair=tiny", f"method={m}", *ov]))
        runs.append(str(d))
    loaded, shared = RU.load_runs(runs)
    assert shared == [("peer_logprobs", "recompute")]
    assert [r.variant for r in loaded] == ["graft", "graft[delta=0.5]", "graft_nogate"]
    note = T.runs_table(loaded, shared).notes[-1]
    assert "peer_logprobs=recompute" in note
    raw = yaml.safe_load((tmp_path / "r1" / "config.yaml").read_text())
    assert RU.identify(raw) == ("graft", [("delta", "0.5"), ("peer_logprobs", "recompute")])


def test_run_summary_names_the_variant(tmp_path):
    """The end-of-training summary prints the row the run will land in (run_summary.run_variant)."""
    from graft_cli.report.run_summary import run_variant

    for name, ov, want in (("nofloor", ["exchange.params.delta=0.0"], "w/o floor (δ=0) (graft_nofloor)"),
                           ("d05", ["exchange.params.delta=0.5"], "GRAFT [delta=0.5] (graft[delta=0.5])"),
                           ("first", ["exchange.ordering=first"], "peer first (graft_first)")):
        d = tmp_path / name
        d.mkdir()
        (d / "config.yaml").write_text(_config_text(["pair=tiny", "method=graft", *ov]))
        assert run_variant(str(d)) == want
    assert run_variant(str(tmp_path / "no-such-run")) is None
