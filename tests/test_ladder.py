"""The transfer ladder's parts (docs/studies.md, "Can anything the peer writes teach the receiver"):
the tiny task's gold solution read back from a problem's text, the content rules
(graft_cli/algorithms/exchange/content.py), the designed trigger (selection ``family``) and
replacement ``replace_or_add``, the per-family graft metrics, the grafted rows' gradient share, the
ladder's pre-registered reading (graft_cli/report/ladder_claims.py) and a registration that covers
the resolved configs and the analysis code (graft_cli/plan/registration.py), each against rows
and values worked by hand."""

from __future__ import annotations

import functools
import math
import random
import shutil

import numpy as np
import pytest
import torch
from conftest import ROOT, make_char_tokenizer, make_random_model

from graft_cli.algorithms.advantages import grpo_advantages
from graft_cli.algorithms.exchange import ExchangeContext, ReceiverFunctions
from graft_cli.algorithms.exchange import graft as G
from graft_cli.algorithms.exchange import selection
from graft_cli.algorithms.exchange.content import CONTENTS
from graft_cli.batch import PolicyStep, Rollouts
from graft_cli.data import synthetic as S
from graft_cli.data.problems import Problem
from graft_cli.errors import GraftError
from graft_cli.report import ladder_claims as LC


# ------------------------------------------------------------------------------------ the gold solver
def test_gold_solutions_worked_by_hand():
    """Each family's gold solution in the pair's styles, written out by hand from the style rules of
    graft_cli/data/synthetic.py (a prose, b steps, c words)."""
    assert S.gold_solution("3x+5=26, x=?", "prose") == (
        "To find 3x+5=26, subtract first: 26-5=21. Then divide: 21/3=7. The answer is \\boxed{7}.")
    assert S.gold_solution("3x+5=26, x=?", "steps") == (
        "Let's compute 3x+5=26 step by step; subtract 26-5=21; divide 21/3=7; so the final answer is \\boxed{7}")
    assert S.gold_solution("(3+4)*5=?", "steps") == (
        "Let's compute (3+4)*5 step by step; add 3+4=7; multiply 7*5=35; so the final answer is \\boxed{35}")
    assert S.gold_solution("9+2*3=?", "prose") == (
        "To find 9+2*3, multiply first: 2*3=6. Then add: 9+6=15. The answer is \\boxed{15}.")
    assert S.gold_solution("7*6-9=?", "words") == "7*6-9: 7*6 is 42, 42-9 is 33, answer \\boxed{33}"
    # detailed steps for the styles that write them: 47*6 = 40*6 + 7*6
    assert S.gold_solution("47*6=?", "prose") == (
        "To find 47*6, multiply first: 40*6=240. Then multiply: 7*6=42. Then add: 240+42=282. "
        "The answer is \\boxed{282}.")
    assert S.gold_solution("47*6=?", "chain") == "240+42=282 \\boxed{282}"
    assert S.gold_solution("x+4=9, x=?", "prose") == "To find x+4=9, subtract: 9-4=5. The answer is \\boxed{5}."
    assert S.gold_solution("1/3+1/4=?", "chain") == "4/12+3/12=7/12 \\boxed{7/12}"
    assert S.gold_solution("2/7+3/7=?", "words") == "2/7+3/7: 2+3 is 5, answer \\boxed{5/7}"
    assert S.worked_from_problem("2/5*3=?")[2] == "\\frac{6}{5}"
    assert S.family_of("12-7=?") == "sub" and S.family_of("2+3+4=?") == "two" and S.family_of("4x=8, x=?") == "lin"


def test_gold_solver_rebuilds_every_generated_solution():
    """For problems of every family and level from the generators, the text alone gives back the
    family, the worked solution and the gold answer the generator wrote."""
    rng = random.Random(7)
    for fam in S.FAMILIES:
        for level in S.LEVELS:
            for _ in range(300):
                rec = S.make_problem(rng, fam, level)
                family, worked, gold = S.worked_from_problem(rec["problem"])
                assert (family, tuple(worked), gold) == (fam, tuple(rec["worked"]), rec["answer"]), rec["problem"]


@pytest.mark.parametrize("text", ["What is 2+2?", "2+2", "10x=5, x=?", "3/4+1/4=?!", "(2+3)*4=? "])
def test_a_text_no_generator_writes_has_no_gold(text):
    with pytest.raises(ValueError):
        S.worked_from_problem(text)
    assert S.family_of(text) is None


# ----------------------------------------------------------------------------------------- content
TOK = make_char_tokenizer()
STYLES = {"a": "prose", "b": "steps"}
PROBS = [Problem("p0", "2+3+4=?", "9"), Problem("p1", "x+3=7, x=?", "4"), Problem("p2", "5+1+2=?", "8")]


def _step(name: str, k: list[int], n: int = 4) -> PolicyStep:
    """Group q: k[q] correct responses (``own <answer>``) then wrong ones (``own 0``), each ending with
    EOS, rollout log-prob -0.5 per token."""
    texts, ids, lps = [], [], []
    for q, p in enumerate(PROBS):
        for j in range(n):
            t = f"{name} says \\boxed{{{p.answer if j < k[q] else 0}}}"
            r = TOK(t, add_special_tokens=False)["input_ids"] + [TOK.eos_token_id]
            texts.append(t)
            ids.append(r)
            lps.append([-0.5] * len(r))
    rewards = torch.tensor([[1.0 if j < k[q] else 0.0 for j in range(n)] for q in range(len(PROBS))])
    ro = Rollouts([TOK(p.problem)["input_ids"] for p in PROBS], ids, texts, lps, [False] * len(texts), n=n)
    return PolicyStep(name, PROBS, [TOK(p.problem)["input_ids"] for p in PROBS], ro, rewards, grpo_advantages(rewards))


def _ctx():
    enc = ReceiverFunctions(lambda text, name: TOK(f"Q {text} A", add_special_tokens=False)["input_ids"])
    return ExchangeContext(step=0, seed=0, tokenizers={"a": TOK, "b": TOK}, receivers=enc)


def _cfg(method: str, *over: str):
    from graft_cli.config import compose

    return compose([f"method={method}", *over])


def test_content_rules_by_hand():
    assert CONTENTS.get("peer")("2+3+4=?", "a", "b", STYLES) is None
    assert CONTENTS.get("gold_own_style")("2+3+4=?", "a", "b", STYLES) == (
        "To find 2+3+4, add first: 2+3=5. Then add: 5+4=9. The answer is \\boxed{9}.")
    assert CONTENTS.get("gold_peer_style")("2+3+4=?", "a", "b", STYLES) == (
        "Let's compute 2+3+4 step by step; add 2+3=5; add 5+4=9; so the final answer is \\boxed{9}")
    with pytest.raises(GraftError, match="exchange.params.styles"):
        CONTENTS.get("gold_own_style")("2+3+4=?", "c", "b", STYLES)


@pytest.mark.parametrize("method,style", [("graft_gold_own", "prose"), ("graft_gold_peer", "steps")])
def test_gold_content_replaces_only_the_correct_responses(method, style):
    """a fails q0 (k_a = 0), b's group there is mixed (k_b = 2 of 4), and the reverse on q1, so
    GRAFT's balanced trigger moves q0 to a. The two correct rows carry the gold solution in the
    asked style, re-tokenized with a's tokenizer plus EOS, no source log-probs; the two wrong rows
    are b's own; the advantages are b's: rewards [1, 1, 0, 0], mean 0.5, unbiased std
    sqrt(1/3) → ±0.5/0.57735 = ±0.8660."""
    sa, sb = _step("a", [0, 2, 0]), _step("b", [2, 0, 0])
    batches, _ = G.GraftExchange(_cfg(method)).select({"a": sa, "b": sb}, _ctx())
    a = batches["a"]
    gold = S.gold_solution("2+3+4=?", style)
    assert a.source[:4] == ["peer"] * 4 and a.group[:4] == [0] * 4
    assert a.texts[:4] == [gold, gold, "b says \\boxed{0}", "b says \\boxed{0}"]
    assert a.response_ids[0] == TOK(gold, add_special_tokens=False)["input_ids"] + [TOK.eos_token_id]
    assert a.response_ids[2] == TOK("b says \\boxed{0}", add_special_tokens=False)["input_ids"] + [TOK.eos_token_id]
    assert a.extra["content"][:4] == ["gold", "gold", "peer", "peer"]
    assert a.extra["n_scored"][0] == len(TOK(gold, add_special_tokens=False)["input_ids"])
    assert math.isnan(a.source_logp_mean[0]) and a.source_logp_mean[2] == pytest.approx(-0.5)
    assert a.advantages[:4] == pytest.approx([0.8660, 0.8660, -0.8660, -0.8660], abs=1e-4)
    assert a.rewards[:4] == [1.0, 1.0, 0.0, 0.0]
    assert a.extra["family"][:4] == ["two"] * 4
    assert a.source[4:] == ["self"] * 8  # q1, q2: a's own groups


def test_gold_content_needs_the_gate_off_and_styles():
    from graft_cli.config import compose

    with pytest.raises(GraftError, match=r"^config key 'exchange.params.content': .*gate=none"):
        compose(["method=graft", "exchange.params.content=gold_own_style", "exchange.params.styles={a: prose}"])
    with pytest.raises(GraftError, match=r"^config key 'exchange.params.styles'"):
        compose(["method=graft_nogate", "exchange.params.content=gold_own_style"])
    with pytest.raises(GraftError, match=r"^config key 'exchange.params.families'"):
        compose(["method=graft_nogate", "exchange.params.selection=family"])


# --------------------------------------------------------------------------------- designed trigger
def test_family_trigger_hand_table():
    """n = 4. Receiver a's designated prompts {0, 1, 2}; the source b's k = [2, 4, 1, 3]: q1 is all
    correct (no signal), q3 is not designated → a gets q0 and q2, whatever a's own k; no balancing
    (m None)."""
    ks = [[0, 2, 4, 1], [2, 4, 1, 3]]
    cand, sel, m = selection.select_family(ks, [4, 4], 1, 0, eligible={0, 1, 2})
    assert (cand, sel, m) == ([0, 2], [0, 2], None)
    plan = selection.plan_exchange(ks, [4, 4], "family", eligible=[{0, 1, 2}, {3}])
    assert plan.assign[0] == {0: 1, 2: 1}
    assert plan.assign[1] == {3: 0}  # b's designated q3: a's group k = 1 of 4 is mixed


def test_family_trigger_with_replace_or_add_keeps_the_receivers_signal():
    """graft_gold_own_dose: a's family `two` (q0 and q2), b's `lin` (q1). a: k = [0, 0, 2]; b: k =
    [2, 3, 1]. Into a: q0 (a failed) → b's group replaces a's; q2 (a solved 2 of 4) → a's own group
    stays with its own advantages and b's group (k_b = 1) follows it. Into b: q1 needs a mixed
    source group, a's is all wrong → nothing."""
    sa, sb = _step("a", [0, 0, 2]), _step("b", [2, 3, 1])
    batches, met = G.GraftExchange(_cfg("graft_gold_own_dose")).select({"a": sa, "b": sb}, _ctx())
    a, b = batches["a"], batches["b"]
    assert a.group == [0] * 4 + [1] * 4 + [2] * 8
    assert a.source == ["peer"] * 4 + ["self"] * 4 + ["self"] * 4 + ["peer"] * 4
    assert a.advantages[8:12] == pytest.approx([0.8660, 0.8660, -0.8660, -0.8660], abs=1e-4)  # a's own on q2
    # b's group on q2: rewards [1, 0, 0, 0], mean 0.25, unbiased std 0.5 → +1.5, -0.5, -0.5, -0.5
    assert a.advantages[12:] == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-4)
    gold = S.gold_solution("5+1+2=?", "prose")
    assert a.texts[12] == gold and a.texts[13] == "b says \\boxed{0}"
    assert b.source == ["self"] * 12
    assert met["a"]["graft/selected"] == 2 and met["a"]["graft/transferred"] == 8 and met["b"]["graft/selected"] == 0


def test_family_metrics_by_hand():
    log = {"family": ["two", "two", "two", "lin", None], "admitted": [True, False, True, True, True],
           "reward": [1.0, 0.0, 0.0, 1.0, 1.0]}
    assert G.family_metrics(log) == {
        "graft/family/lin/offered": 1, "graft/family/lin/admitted": 1, "graft/family/lin/dropped": 0,
        "graft/family/lin/reward": 1.0,
        "graft/family/two/offered": 3, "graft/family/two/admitted": 2, "graft/family/two/dropped": 1,
        "graft/family/two/reward": 0.5}
    assert G.family_metrics({"family": [None], "admitted": [True], "reward": [1.0]}) == {}


# --------------------------------------------------------------------------------- gradient share
@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return make_random_model(str(tmp_path_factory.mktemp("m") / "r"), "qwen3", seed=3)


def _update(model_path, batch, cfg):
    from transformers import AutoModelForCausalLM

    from graft_cli.train.old_logprobs import score_logprobs
    from graft_cli.train.policies import Policy
    from graft_cli.train.update import UpdateContext, update_policy

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    pol = Policy("a", model, TOK, torch.optim.AdamW(model.parameters(), lr=0.01), None, {})
    batch.old_logprobs = score_logprobs(pol, batch, cfg)
    out = update_policy(pol, batch, UpdateContext(cfg, rng=np.random.default_rng(0)))
    return out, torch.cat([p.detach().flatten() for p in pol.model.parameters()])


def test_grad_share_measures_without_changing_the_update(model_path):
    """One minibatch holding a's own group and the grafted one: measuring the grafted rows' share
    of the gradient norm (a second backward) leaves the update bit for bit as it was; a minibatch
    of grafted rows only has share 1."""
    sa, sb = _step("a", [0, 0, 2]), _step("b", [2, 3, 1])
    base = ["data.prompt_batch=3", "algo.minibatch_prompts=3", "exchange.ordering=last"]
    got = {}
    for every in (0, 1):
        cfg = _cfg("graft_gold_own_dose", *base, f"algo.grad_share_every={every}")
        batch = G.GraftExchange(cfg).select({"a": sa, "b": sb}, _ctx())[0]["a"]
        got[every] = _update(model_path, batch, cfg)
    assert torch.equal(got[0][1], got[1][1])
    assert "grad_share/grafted" not in got[0][0]
    share, rows = got[1][0]["grad_share/grafted"], got[1][0]["grad_share/grafted_rows"]
    assert 0.0 < share and rows == pytest.approx(8 / 16)
    only = _cfg("graft_gold_own", "data.prompt_batch=3", "algo.minibatch_prompts=1", "algo.grad_share_every=1")
    sa2, sb2 = _step("a", [0, 2, 0]), _step("b", [2, 0, 0])
    batch = G.GraftExchange(only).select({"a": sa2, "b": sb2}, _ctx())[0]["a"]
    out, _ = _update(model_path, batch, only)
    assert out["grad_share/grafted"] == pytest.approx(1.0, abs=1e-6)  # the grafted minibatch is grafted rows only
    assert out["grad_share/grafted_rows"] == pytest.approx(1.0)


# ---------------------------------------------------------------------------------- the reading
RUNGS = [{"arm": "r1", "label": "gold own dose", "barrier": "—"},
         {"arm": "r2", "label": "gold own", "barrier": "the default trigger's dose"},
         {"arm": "r3", "label": "gold peer", "barrier": "style"},
         {"arm": "r4", "label": "peer own", "barrier": "the peer's content"}]


@pytest.mark.parametrize("teaches,reading", [
    ([False, False, False, False], "the miniature cannot teach the weak skill in its budget"),
    ([False, True, True, True], "the miniature cannot teach the weak skill in its budget"),
    ([True, False, True, True], "the default trigger's dose is the barrier"),
    ([True, True, False, False], "style is the barrier"),
    ([True, True, True, False], "the peer's content is the barrier"),
    ([True, True, True, True], "every rung teaches"),
    ([True, None, True, True], "not judged past gold own dose (gold own not measured)"),
    ([None, True, True, True], "not judged past the top rung (gold own dose not measured)"),
])
def test_ladder_reading_table(teaches, reading):
    assert LC.ladder_reading(RUNGS, teaches) == reading


def _measured(diffs: dict[str, list[float]], base: float = 0.20) -> dict:
    """Planted grades: one weak-family problem per seed, GRPO at ``base``, arm x at base + d/100."""
    grades = {"grpo": {"a": {str(s): {"weak": [base]} for s in range(3)}}}
    for arm, ds in diffs.items():
        grades[arm] = {"a": {str(s): {"weak": [base + d / 100]} for s, d in enumerate(ds)}}
    zero = {arm: {"a": {str(s): {"weak": 0.0} for s in range(3)}} for arm in grades}
    return {"policies": ["a"], "grades": {"weak": grades}, "eval_var": {"weak": zero},
            "eval_var_paired": {"weak": {}}, "mechanism": {}}


def test_rung_intervals_are_the_paired_t_worked_by_hand():
    """Rung 1 − GRPO per seed +2, +3, +4 points: mean 3, sd 1, n 3, t_2 = 4.3027 → 3 ± 2.4841, above
    0: it teaches. Rung 2: −1, +1, +3 → mean 1, sd 2, 1 ± 4.9683: it does not → the default
    trigger's dose is the barrier."""
    cfg = {"rungs": RUNGS[:2], "weak": {"a": "two"}, "analysis": {"interval": "paired_t", "alpha": 0.05,
                                                                   "sequential": None}}
    claims = LC.judge(_measured({"r1": [2, 3, 4], "r2": [-1, 1, 3]}), cfg)
    r1, r2 = claims[0]["per_model"]["a"], claims[1]["per_model"]["a"]
    assert r1["interval"] == pytest.approx([3.0, 3.0 - 2.48414, 3.0 + 2.48414], abs=1e-3) and r1["teaches"] is True
    assert r2["interval"] == pytest.approx([1.0, 1.0 - 4.96828, 1.0 + 4.96828], abs=1e-3) and r2["teaches"] is False
    assert claims[-1]["per_model"]["a"]["reading"] == "the default trigger's dose is the barrier"


# ---------------------------------------------------------------------------------- registration
def test_registration_covers_method_configs_and_the_analysis_code(tmp_path, monkeypatch):
    """A method config edited after registration (its YAML, not the plan) is refused in one line
    naming the run; the analysis code's version is recorded and a changed module is named."""
    from graft_cli.config import compose
    from graft_cli.plan import registration as R
    from graft_cli.plan import spec as P

    exp = tmp_path / "experiments"
    shutil.copytree(f"{ROOT}/experiments", exp)
    monkeypatch.setattr(R, "compose", functools.partial(compose, config_dir=str(exp)))
    plan_file = tmp_path / "study.yaml"
    plan_file.write_text("name: study\npair: tiny\nsteps: 2\nclaims: {kind: ladder}\n"
                         "runs:\n  - {name: grpo, method: grpo, seeds: [0]}\n"
                         "  - {name: gold, method: graft_gold_own, seeds: [0]}\n")
    plan = P.load_reproduce(str(plan_file))
    out = tmp_path / "out"
    path, written = R.register(plan, str(out), "graft_cli.report.ladder_claims")
    reg = R.load_registration(path)
    assert written and set(reg["resolved"]["configs"]) == {"grpo-s0", "gold-s0"}
    assert "graft_cli.report.ladder_claims" in reg["analysis_code"]["modules"]
    assert "graft_cli.report.stats" in reg["analysis_code"]["modules"]  # imported by the claims module
    R.check_registration(plan, reg, path, str(out))  # unchanged: passes
    gold = exp / "method" / "graft_gold_own.yaml"
    gold.write_text(gold.read_text().replace("styles: {a: prose, b: steps, c: words}", "styles: {a: steps, b: prose}"))
    with pytest.raises(GraftError, match=r"run gold-s0's resolved config differs from its registration") as ei:
        R.check_registration(plan, reg, path, str(out))
    assert "\n" not in str(ei.value)
    reg["analysis_code"]["modules"]["graft_cli.report.stats"] = "0" * 64
    assert R.analysis_changes(reg, "graft_cli.report.ladder_claims") == ["graft_cli.report.stats"]


# ------------------------------------------------------------------------------ gold likelihood
def test_gold_loglik_is_the_token_mean_of_the_model_log_probs(model_path):
    """Eq. (1) of graft_cli/eval/gold_likelihood.py against a direct forward pass: Σ log softmax of
    each gold token (the EOS included) given the prompt and the tokens before it, over both
    problems, divided by their token count."""
    from transformers import AutoModelForCausalLM

    from graft_cli.data.prompts import PromptSpec
    from graft_cli.eval.gold_likelihood import gold_loglik

    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    spec = PromptSpec()
    probs = ["2+3+4=?", "x+3=7, x=?"]
    total, count = 0.0, 0
    for p in probs:
        prompt = spec.encode(p, TOK)
        resp = TOK(S.gold_solution(p, "steps"), add_special_tokens=False)["input_ids"] + [TOK.eos_token_id]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + resp])).logits[0].double()
        lp = torch.log_softmax(logits[len(prompt) - 1:-1], -1)
        total += float(lp.gather(-1, torch.tensor(resp)[:, None]).sum())
        count += len(resp)
    assert gold_loglik(model, TOK, spec, probs, "steps", batch=1) == pytest.approx(total / count, abs=1e-5)
    assert gold_loglik(model, TOK, spec, probs, "steps", batch=2) == pytest.approx(total / count, abs=1e-5)


# ------------------------------------------------------------------------------ the audit's fixes
def test_an_execution_records_its_stage_after_every_run_and_replaces_it(tmp_path):
    """Three writes of one execution (two while running, then its stop) leave one stage, the last;
    a second execution adds its own; the published paths are the repository's, not the machine's."""
    import json

    from graft_cli.plan import spec as P
    from graft_cli.plan.results import shown_path, write_results

    plan = P.load_reproduce("tiny_ladder")
    out = tmp_path / "out"
    out.mkdir()
    recs = [{"run": "a", "method": "grpo", "seed": 0, "trained": "trained"},
            {"run": "b", "method": "grpo", "seed": 1, "trained": None}]
    write_results(plan, str(out), recs[:1], 60.0, started="2026-01-01 00:00:00", state="running")
    write_results(plan, str(out), recs, 120.0, started="2026-01-01 00:00:00", state="running")
    write_results(plan, str(out), recs, 125.0, started="2026-01-01 00:00:00", state="stopped")
    got = json.loads((out / "plan_tiny_ladder.json").read_text())
    assert [(e["wall_s"], e["state"], e["trained"]) for e in got["executions"]] == [(125.0, "stopped", 1)]
    write_results(plan, str(out), recs, 30.0, started="2026-01-01 01:00:00")
    got = json.loads((out / "plan_tiny_ladder.json").read_text())
    assert [(e["wall_s"], e["state"]) for e in got["executions"]] == [(125.0, "stopped"), (30.0, "finished")]
    assert got["source"] == "experiments/reproduce/tiny_ladder.yaml"
    assert "source experiments/reproduce/tiny_ladder.yaml;" in (out / "plan_tiny_ladder.md").read_text()
    assert shown_path("/somewhere/else/plan.yaml") == "plan.yaml"


def test_a_studys_report_leaves_unfinished_runs_out(tmp_path):
    """Two runs of a 4-step config, one stopped after 2 steps: with ``finished_only`` (a plan's
    report) only the finished one is in the runs table, the other named with its steps."""
    import json

    import yaml

    from graft_cli.report.tables import report_main

    for name, last in (("tiny-grpo-s0", 4), ("tiny-grpo-s1", 2)):
        d = tmp_path / "runs" / name
        d.mkdir(parents=True)
        (d / "config.yaml").write_text(yaml.safe_dump({"method": "grpo", "pair": "tiny", "run": {"steps": 4, "seed": 0},
                                                       "exchange": {"name": "none"},
                                                       "policies": [{"name": "a", "model": "tiny:a"}]}))
        (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "policy": "a", "time/step": 1.0}) + "\n"
                                                 for s in range(1, last + 1)))
    md = (tmp_path / "r1").as_posix()
    report_main([str(tmp_path / "runs")], out=md, plots=False, finished_only=True)
    text = open(f"{md}/report.md").read()
    assert "Runs: 1;" in text and "Left out, not finished: tiny-grpo-s1 (2 of 4 steps)." in text
    report_main([str(tmp_path / "runs")], out=(tmp_path / "r2").as_posix(), plots=False)
    assert "Runs: 2;" in open(f"{tmp_path / 'r2'}/report.md").read()


def test_the_ladder_figure_reads_claims_and_likelihood(tmp_path):
    """The figure's numbers by hand: the dose is the mean over seeds of the weak family's admitted
    rows per step (12 and 18 → 15), Δℓ the mean over seeds of after − before (−0.5 → −0.4 and
    −0.5 → −0.2: +0.2); the PNG is written and opens."""
    import json

    from matplotlib.image import imread

    from graft_cli.report import ladder_figure as LF

    measured = _measured({"r1": [2, 3, 4]})
    measured["mechanism"] = {"r1": {"a": {"0": {"weak_admitted": 12.0}, "1": {"weak_admitted": 18.0}}}}
    cfg = {"rungs": RUNGS[:1], "weak": {"a": "two"}, "analysis": {"interval": "paired_t", "alpha": 0.05,
                                                                   "sequential": None}}
    claims = LC.judge(measured, cfg)
    (tmp_path / "claims.json").write_text(json.dumps({"settings": LC.settings(cfg), "measured": measured,
                                                      "claims": claims}))
    lik = {"runs": {"r1": {"0": {"a": {"before": {"own": -0.5, "peer": -1.0}, "after": {"own": -0.4, "peer": -1.0}}},
                           "1": {"a": {"before": {"own": -0.5, "peer": -1.0}, "after": {"own": -0.2, "peer": -0.9}}}}}}
    (tmp_path / "gold_likelihood.json").write_text(json.dumps(lik))
    assert LF._dose(measured, "r1", "a") == pytest.approx(15.0)
    assert LF._likelihood_shift(lik, "r1", "a", "own") == pytest.approx(0.2)
    assert LF._likelihood_shift(lik, "r1", "a", "peer") == pytest.approx(0.05)
    path = LF.ladder_figure(str(tmp_path))
    assert path == str(tmp_path / "ladder.png") and imread(path).shape[0] > 100


def test_published_plan_files_name_no_machine_folder():
    from graft_cli.report.publish import machine_free

    text = ('{"source": "/co/repo/experiments/reproduce/tiny.yaml", "dir": "/co/repo/.cache/r/tiny-grpo-s0", '
            '"x": "/co/other"}')
    assert machine_free(text, "/co/repo") == ('{"source": "experiments/reproduce/tiny.yaml", "dir": '
                                              '".cache/r/tiny-grpo-s0", "x": "/co/other"}')
