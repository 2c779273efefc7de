"""Tiny pair v3's regime: writing styles, the regime measurement, and the gate made visible."""

from __future__ import annotations

import json
import math
import os
import random

import pandas as pd
import pytest
import torch

from graft_cli.data import synthetic as syn
from graft_cli.tiny import regime as R


def test_styles_render_the_same_steps_by_hand():
    worked = ("7*6-9=?", (("7*6", "42"), ("42-9", "33")), "33")
    assert syn.render(worked, "chain") == "7*6=42,42-9=33 \\boxed{33}"  # v2's text
    assert syn.render(worked, "prose") == ("To find 7*6-9, multiply first: 7*6=42. Then subtract: 42-9=33. "
                                           "The answer is \\boxed{33}.")
    assert syn.render(worked, "steps") == ("Let's compute 7*6-9 step by step; multiply 7*6=42; subtract 42-9=33; "
                                           "so the final answer is \\boxed{33}")
    assert syn.render(worked, "words") == "7*6-9: 7*6 is 42, 42-9 is 33, answer \\boxed{33}"
    one = ("47+38=?", (("47+38", "85"),), "85")
    assert syn.render(one, "prose") == "To find 47+38, add: 47+38=85. The answer is \\boxed{85}."
    # detailed steps (every v3 style writes them; v2's chain the compact ones)
    frac = ("1/2+2/5=?", (("5/10+4/10", "9/10"),), "9/10",
            (("2*5", "10"), ("1*5", "5"), ("2*2", "4"), ("5+4", "9")))
    assert syn.render(frac, "chain") == "5/10+4/10=9/10 \\boxed{9/10}"
    assert syn.render(frac, "words") == "1/2+2/5: 2*5 is 10, 1*5 is 5, 2*2 is 4, 5+4 is 9, answer \\boxed{9/10}"
    assert syn.render(frac, "prose") == ("To find 1/2+2/5, multiply first: 2*5=10. Then multiply: 1*5=5. "
                                         "Then multiply: 2*2=4. Then add: 5+4=9. The answer is \\boxed{9/10}.")
    assert syn.render(frac, "steps") == ("Let's compute 1/2+2/5 step by step; multiply 2*5=10; multiply 1*5=5; "
                                         "multiply 2*2=4; add 5+4=9; so the final answer is \\boxed{9/10}")
    assert syn.restate("3x+5=26, x=?") == "3x+5=26" and syn.restate("1/2*7=?") == "1/2*7"
    rec = syn.make_problem(random.Random(3), "frac", 1)
    assert rec["solution"] == syn.render(rec["worked"], syn.CANONICAL_STYLE)


def test_canonical_records_and_single_style_stream():
    """The records' solution is v2's chain (``47*6`` -> partial products), and a one-style SFT stream makes no
    extra random draw (the same examples as the default stream): the v2 pair builds as before."""
    rng = random.Random(0)
    while True:
        rec = syn.make_problem(rng, "mul", 3)
        a, b = (int(x) for x in rec["problem"][:-2].split("*"))
        if a % 10:
            break
    t, u = a - a % 10, a % 10
    assert rec["solution"] == f"{t * b}+{u * b}={a * b} \\boxed{{{a * b}}}"
    fams = {"add": 1.0, "frac": 0.5}
    r1, r2 = random.Random("s"), random.Random("s")
    xs = [syn.sft_example(r1, fams, None) for _ in range(50)]
    ys = [syn.sft_example(r2, fams, None, {"chain": 1.0}) for _ in range(50)]
    assert xs == ys
    r3 = random.Random("s")
    zs = [syn.sft_example(r3, fams, None, {"prose": 0.5, "steps": 0.5}) for _ in range(200)]
    share = sum(R.style_of(s) == "steps" for _, s in zs) / len(zs)
    assert 0.35 < share < 0.65  # both styles drawn


@pytest.mark.parametrize("worked,delta,want", [
    # (problem, steps, answer, detail) -> the slipped last step and answer, worked by hand
    (("7*6-9=?", (("7*6", "42"), ("42-9", "33")), "33", None), 1, ((("7*6", "42"), ("42-9", "34")), "34", None)),
    (("4-4=?", (("4-4", "0"),), "0", None), -1, ((("4-4", "1"),), "1", None)),  # 0 - 1 < 0: the slip goes up
    (("47*6=?", (("240+42", "282"),), "282", (("40*6", "240"), ("7*6", "42"), ("240+42", "282"))), -1,
     ((("240+42", "281"),), "281", (("40*6", "240"), ("7*6", "42"), ("240+42", "281")))),
    # a fraction: the numerator moves, in the compact step and at the end of the detailed ones
    (("1/2+1/3=?", (("3/6+2/6", "5/6"),), "5/6", (("2*3", "6"), ("1*3", "3"), ("1*2", "2"), ("3+2", "5"))), 1,
     ((("3/6+2/6", "6/6"),), "6/6", (("2*3", "6"), ("1*3", "3"), ("1*2", "2"), ("3+2", "6")))),
    (("1/7+0/7=?", (("1/7+0/7", "1/7"),), "1/7", (("1+0", "1"),)), -1,  # numerator 0 is refused: 2/7
     ((("1/7+0/7", "2/7"),), "2/7", (("1+0", "2"),))),
])
def test_slip_moves_the_last_result_and_the_answer(worked, delta, want):
    from graft_cli.reward.answers import grade_one

    got = syn.slip(worked, delta)
    assert got == (worked[0], *want)
    gold = worked[2] if "/" not in worked[2] else "\\frac{%s}{%s}" % tuple(worked[2].split("/"))
    for style in ("prose", "steps", "chain"):  # a correct solution grades 1, its slipped twin 0
        assert grade_one(syn.render(worked, style), gold)[0] == 1.0
        assert grade_one(syn.render(got, style), gold)[0] == 0.0


def test_slip_rate_draws_and_the_unslipped_stream():
    """slip_rate 0 makes no draw (the v3 stream, example for example); 0.4 slips 40% of solutions (binomial
    3-sigma band over 2,000), every slipped one grading 0 and every other 1."""
    from graft_cli.reward.answers import grade_one

    fams = {"add": 1.0, "two": 1.0, "frac": 1.0}
    r1, r2 = random.Random("q"), random.Random("q")
    assert [syn.sft_example(r1, fams, None, {"prose": 1.0}) for _ in range(100)] == \
        [syn.sft_example(r2, fams, None, {"prose": 1.0}, 0.0) for _ in range(100)]
    rng, check = random.Random("slip"), random.Random("slip")
    wrong = 0
    for _ in range(2000):
        problem, text = syn.sft_example(rng, fams, None, {"steps": 1.0}, 0.4)
        rec = syn.sample_problem(check, fams, None)  # the same draws: the record, then the slip's two
        slipped = check.random() < 0.4
        if slipped:
            check.choice((-1, 1))
        assert problem == rec["problem"]
        score = grade_one(text, rec["answer"])[0]
        assert score == (0.0 if slipped else 1.0), (text, rec["answer"])
        wrong += slipped
    assert abs(wrong / 2000 - 0.4) < 3 * (0.4 * 0.6 / 2000) ** 0.5


@pytest.mark.parametrize("text,style", [
    ("To find 7*6-9, multiply first: 7*6=42. Then subtract: 42-9=33. The answer is \\boxed{33}.", "prose"),
    ("Let's compute 7*6-9 step by step; multiply 7*6=42; subtract 42-9=33; so the final answer is \\boxed{33}",
     "steps"),
    ("7*6-9: 7*6 is 42, 42-9 is 33, answer \\boxed{33}", "words"),
    ("x+5=8: 8-5 is 3, answer \\boxed{3}", "words"),
    ("To find x+5=8, subtract: 8-5=3", "prose"),  # truncated: the opening is enough
    ("add 3+4=7. The answer is \\boxed{7}.", "prose"),  # no opening: the closing
    ("Let's compute 3+4", "steps"),
    ("add 3+4=7; so the final answer is \\boxed{7}", "steps"),
    ("To find 3+4, add: 3+4 is 7, answer \\boxed{7}", "words"),  # a mixture: the first rule that matches
    ("(3+4)=7 \\boxed{7}", "chain"),
    ("1/2*7=7/2 \\boxed{7/2}", "chain"),
    ("7*6=42,42-9=33 \\boxed{33}", "chain"),
    ("\\boxed{7}", None),
    ("The answer is \\boxed{12}", None),  # no ". The answer is" and no opening
])
def test_style_of_table(text, style):
    assert R.style_of(text) == style


def test_recipes_by_name(monkeypatch):
    """v6 is the default (v5 packed first-fit decreasing, b 700 SFT steps); v5 (v4 with a's weak family at 0.10), v4
    (v3's writing styles and weak families, with final-step slips in the pair's SFT), v3 and v2 (one style, blind
    families) by name; an unknown name is one line naming the known ones."""
    from graft_cli.errors import GraftError
    from graft_cli.tiny import sft as tiny_sft

    monkeypatch.delenv("GRAFT_TINY_RECIPE", raising=False)
    v6 = tiny_sft.default_recipe()
    assert v6 == tiny_sft.Recipe.v6() and v6.name == "v6"
    v5 = tiny_sft.Recipe.named("v5")
    assert v5 == tiny_sft.Recipe.v5() and v5.name == "v5"
    v4 = tiny_sft.Recipe.named("v4")
    # v5 differs from v4 only in a's two-step weight
    assert v5.stage_a.families == {**v4.stage_a.families, "two": 0.10}
    assert (v5.stage_b, v5.stage_c, v5.stage_teacher, v5.junior_step) == (v4.stage_b, v4.stage_c, v4.stage_teacher,
                                                                           v4.junior_step)
    assert tiny_sft.Recipe.from_dict(v5.to_dict()) == v5
    assert (v4.stage_a.slip, v4.stage_b.slip, v4.stage_c.slip, v4.stage_teacher.slip) == (0.4, 0.4, 0.0, 0.0)
    assert v4.stage_a.families["two"] == 0.08 and v4.stage_b.families["lin"] == 0.14
    assert v4.stage_c == tiny_sft.Recipe.v3().stage_c and v4.own_style("a") == "prose"
    assert tiny_sft.Recipe.from_dict(v4.to_dict()) == v4
    monkeypatch.setenv("GRAFT_TINY_RECIPE", "v2")
    v2 = tiny_sft.default_recipe()
    assert v2 == tiny_sft.Recipe.full() and v2.name == "v2" and v2.stage_a.styles is None
    assert v2.own_style("b") == "chain" and v2.stage_a.families["frac"] == 0.01 and v2.teacher_sharpen == 1.0
    monkeypatch.setenv("GRAFT_TINY_RECIPE", "v3")
    v3 = tiny_sft.default_recipe()
    assert v3.name == "v3" and (v3.own_style("a"), v3.own_style("b")) == ("prose", "steps")
    assert v3.stage_a.styles == {"prose": 0.97, "steps": 0.03} and v3.stage_b.families["lin"] == 0.11
    assert v3.split_a == "qwen" and v3.tokenizer_style("b") == ["prose", "steps", "words"]
    assert v3.stage_a.families["two"] == 0.05 and v3.stage_a.pack == 128 and v3.teacher_sharpen == 4.0
    assert v2.split_a == "free" and v2.tokenizer_style("b") == "chain"
    assert tiny_sft.Recipe.from_dict(v3.to_dict()) == v3 and tiny_sft.Recipe.from_dict(v2.to_dict()) == v2
    monkeypatch.setenv("GRAFT_TINY_RECIPE", "v9")
    with pytest.raises(GraftError, match="tiny recipe 'v9': unknown; known: v2, v3, v4, v5"):
        tiny_sft.default_recipe()


@pytest.mark.parametrize("fig,ok", [
    (dict(style_separability=0.95, own_minus_peer_loglik=0.01, weak_pass1=0.03, weak_peer_mixed=0.30,
          weak_admitted=0.20, admitted=0.25), dict.fromkeys(R.REGIME_TARGETS, True)),
    (dict(style_separability=0.949, own_minus_peer_loglik=0.0, weak_pass1=0.201, weak_peer_mixed=0.299,
          weak_admitted=0.199, admitted=0.751), dict.fromkeys(R.REGIME_TARGETS, False)),
    (dict(style_separability=1.0, own_minus_peer_loglik=2.0, weak_pass1=0.029, weak_peer_mixed=1.0,
          weak_admitted=1.0, admitted=0.75),
     {**dict.fromkeys(R.REGIME_TARGETS, True), "weak_pass1": False}),
    (dict(style_separability=1.0, own_minus_peer_loglik=float("nan"), weak_pass1=float("nan"),
          weak_peer_mixed=1.0, weak_admitted=1.0, admitted=0.5),
     {**dict.fromkeys(R.REGIME_TARGETS, True), "own_minus_peer_loglik": False, "weak_pass1": False}),
])
def test_regime_targets_table(fig, ok):
    assert R.regime_met(fig) == ok


class _Ro:
    def __init__(self, response_ids, texts, logprobs, truncated):
        self.response_ids, self.texts, self.logprobs, self.truncated = response_ids, texts, logprobs, truncated


def test_measure_regime_scores_s_as_the_gate_does(tiny_models):
    """Two prompts, groups of 2. a all-fails both; b is mixed on prompt 0 (frac) and all-passes prompt 1: the
    grafted responses are b's two on prompt 0. s is recomputed here with a plain forward pass (log-softmax of
    the logits) and the gate's formula exp(mean receiver log-prob - mean source log-prob, EOS excluded)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    side = {}
    for name in ("a", "b"):
        tok = AutoTokenizer.from_pretrained(tiny_models[name])
        model = AutoModelForCausalLM.from_pretrained(tiny_models[name], dtype=torch.float32)
        side[name] = {"model": model, "tokenizer": tok, "style": {"a": "chain", "b": "steps"}[name],
                      "prompt_ids": [tok("1/2+1/2=?", add_special_tokens=False)["input_ids"],
                                     tok("3+4=?", add_special_tokens=False)["input_ids"]]}
    texts = {"a": ["1/2+1/2=2/2 \\boxed{2/2}", "x", "3+4=7 \\boxed{7}", "3+4=9 \\boxed{9}"],
             "b": ["add 1+1=2; so the final answer is \\boxed{2/2}", "add 1+1=3; so the final answer is \\boxed{3/2}",
                   "7; so the final answer is \\boxed{7}", "add 3+4=7; so the final answer is \\boxed{7}"]}
    ok = {"a": [0, 0, 1, 0], "b": [1, 0, 1, 1]}
    for name in ("a", "b"):
        tok = side[name]["tokenizer"]
        ids = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts[name]]
        trunc = [False, True, False, False]
        ids[1] = ids[1][:-1]  # the truncated one has no EOS
        lps = [[-0.1 - 0.01 * j for j in range(len(i))] for i in ids]  # rollout log-probs (made up)
        side[name]["rollouts"] = _Ro(ids, texts[name], lps, trunc)
    out = R.measure_regime(side, ["frac", "add"], ok, {"a": "frac", "b": "lin"}, n=2)
    a = out["a"]
    assert a["grafted"] == 2 and a["weak_grafted"] == 2 and a["weak_peer_mixed"] == 1.0 and a["weak_pass1"] == 0.0

    def s_by_hand(j):
        tok, model = side["a"]["tokenizer"], side["a"]["model"]
        trunc = side["b"]["rollouts"].truncated[j]
        ids = tok(texts["b"][j], add_special_tokens=False)["input_ids"]
        p = side["a"]["prompt_ids"][0]
        full = torch.tensor([p + ids])
        with torch.no_grad():
            lsm = torch.log_softmax(model(input_ids=full).logits[0].float(), -1)
        recv = [float(lsm[len(p) - 1 + t, ids[t]]) for t in range(len(ids))]
        src = side["b"]["rollouts"].logprobs[j]
        src = src if trunc else src[:-1]
        return math.exp(sum(recv) / len(recv) - sum(src) / len(src))

    want = [s_by_hand(0), s_by_hand(1)]
    got = [x for x in (out["a"]["s"][0], out["a"]["s"][1])]
    assert got == pytest.approx(want, rel=1e-4)
    assert a["admitted"] == pytest.approx(sum(x > 0.8 for x in want) / 2)
    assert out["b"]["grafted"] == 0  # b all-fails nothing
    # balanced accuracy of "written in a's style": 3/4 of a's responses (its "x" has no marker), 4/4 of b's not
    assert a["own_style_share"] == pytest.approx(3 / 4) and a["style_separability"] == pytest.approx((0.75 + 1) / 2)
    assert out["b"]["style_separability"] == 1.0
    side["b"]["style"] = "chain"  # declared as a's: none of b's responses is chain, and 3 of a's 4 are
    same = R.measure_regime(side, ["frac", "add"], ok, {"a": "frac", "b": "lin"}, n=2)
    assert same["b"]["style_separability"] == pytest.approx((0 + 1 / 4) / 2)
    assert a["own_minus_peer_loglik"] == pytest.approx(a["own_loglik"] - a["peer_loglik"])
    assert math.isfinite(a["own_minus_peer_loglik"]) and math.isfinite(out["b"]["own_minus_peer_loglik"])


def test_exchange_log_matches_metrics_and_renders_the_gate(tiny_models, tmp_path):
    """A 1-step GRAFT run (every prompt exchanged) writes rollouts/<receiver>/exchange_step_N.parquet with every
    transferred response (kept and dropped): its counts and mean s equal the step's metrics; the report's gate
    section draws the s histogram and the per-family admitted table from it, the family read from the training
    file."""
    from conftest import train_overrides

    from graft_cli.config import compose
    from graft_cli.report import mechanism as M
    from graft_cli.rundir import read_jsonl
    from graft_cli.train.run import train

    data = tmp_path / "train.jsonl"
    with open(data, "w") as f:
        for i in range(16):
            a, b = i % 7 + 1, (3 * i) % 5 + 1
            f.write(json.dumps({"id": f"p{i}", "problem": f"{a}+{b}", "answer": str(a + b),
                                "family": "low" if a < 4 else "high"}) + "\n")
    cfg = compose(["method=graft", *train_overrides(tiny_models, str(data), str(tmp_path), [
        "run.name=r", "run.steps=1", "run.threads=1", "exchange.params.selection=all"])])
    run = train(cfg, progress=False)
    rows = [r for r in read_jsonl(os.path.join(run, "metrics.jsonl")) if "graft/admitted" in r]
    assert rows
    seen = 0
    for m in rows:
        path = os.path.join(run, "rollouts", m["policy"], f"exchange_step_{m['step']:06d}.parquet")
        n = m["graft/admitted"] + m["graft/dropped"]
        if n == 0:
            assert not os.path.exists(path)
            continue
        df = pd.read_parquet(path)
        seen += 1
        assert len(df) == n and int(df["admitted"].sum()) == m["graft/admitted"]
        assert set(df["step"]) == {m["step"] - 1} and set(df["source"]) == ({"a", "b"} - {m["policy"]})
        fin = df["s"].dropna()
        assert fin.mean() == pytest.approx(m["graft/s_mean"], rel=1e-6)
        assert ((df["s"] > 0.8) == df["admitted"]).all()  # the floor gate at δ = 0.8, strict
        assert (df.loc[~df["admitted"], "weight"] == 0).all()
    assert seen
    recs = [{"name": "graft", "dir": run}]
    df = M.admission_frame(recs, "graft")
    assert set(df["family"]) <= {"low", "high"} and df["family"].notna().all()
    fa = M.family_admitted(df)
    for rec, fams in fa["all"].items():
        for fam, (adm, tot) in fams.items():
            sub = df[(df["receiver"] == rec) & (df["family"] == fam)]
            assert (adm, tot) == (int(sub["admitted"].sum()), len(sub))
    lines = "\n".join(M.gate_markdown(recs, str(tmp_path / "rep"), "graft"))
    assert "gate_s_hist.png" in lines and os.path.getsize(tmp_path / "rep" / "gate_s_hist.png") > 0
    assert "δ = 0.8" in lines and "| Receiver | high | low |" in lines


def test_save_initial_checkpoints_the_base_weights_as_step_0(tiny_models, problems_file, tmp_path):
    """run.save_initial: step_000000 holds the initial weights (equal to the model folder's), survives rotation
    (keep_checkpoints 1), and `graft eval --run --steps 0` scores it."""
    from conftest import train_overrides
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from graft_cli.config import compose
    from graft_cli.eval.runner import EvalOptions, evaluate_run
    from graft_cli.train import checkpoint as ckpt
    from graft_cli.train.run import train

    cfg = compose(["method=grpo", *train_overrides(tiny_models, problems_file, str(tmp_path), [
        "run.name=r", "run.steps=2", "run.threads=1", "run.save_initial=true", "run.keep_checkpoints=1",
        "data.prompt_batch=2", "algo.minibatch_prompts=1", "rollout.n=2"])])
    run = train(cfg, progress=False)
    root = os.path.join(run, "checkpoints")
    assert ckpt.valid_steps(root) == [0, 2]  # step 1 rotated out, step 0 kept
    base = AutoModelForCausalLM.from_pretrained(tiny_models["a"]).state_dict()
    d = os.path.join(root, "step_000000", "a")
    saved = {}
    for f in os.listdir(d):
        if f.endswith(".safetensors"):
            saved.update(load_file(os.path.join(d, f)))
    assert saved and all(torch.equal(saved[k], base[k]) for k in saved if k in base)
    toy = tmp_path / "toy.jsonl"
    toy.write_text("".join(open(problems_file).readlines()[:4]))
    evaluate_run(EvalOptions(run_dir=run, steps="0", runs=1, samples=1, benchmarks=f"toy={toy}", progress=False))
    assert os.path.isfile(os.path.join(run, "eval", "a", "step_000000", "summary.json"))
