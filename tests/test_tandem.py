"""Tandem RLVR (tandem.md §2): the handoff state machine on hand-worked draws, the two-cache engine against the
single-model engine, the senior-only loss mask and its denominator, and the vocabulary check.

The anchor: with identical weights for senior and junior and greedy decoding, tandem output equals single-model
output token for token, for prompts of different lengths.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, metric_rows, proc_env, make_char_tokenizer, make_random_model, write_problems

from graft_cli.rollout.handoff import (HANDOFFS, HandoffContext, initial_state, row_uniforms,
                                          suffix_boundary_ids, word_boundary_ids)

V = 128


def run_schedule(name: str, toks: list[int], uniforms: list[float], boundary=(), p=0.5, max_gap=32, chunk=32):
    """Authors (1 = senior) of each token of one sequence, and the draws used, stepping the schedule by hand."""
    b = torch.zeros(V, dtype=torch.bool)
    b[list(boundary)] = True
    ctx = HandoffContext(uniforms=torch.tensor([uniforms], dtype=torch.float64), boundary=b, p_senior=p,
                         max_gap_tokens=max_gap, chunk_size=chunk)
    st = initial_state(name, ctx, 1)
    authors = []
    for t in toks:
        authors.append(int(st.senior[0]))
        st = HANDOFFS.get(name)(st, torch.tensor([t]), ctx)
    return authors, int(st.draws[0])


# ------------------------------------------------------------------------------------------ state machine
def test_redraw_right_after_the_boundary_token():
    # tandem.md §2.2: tokens [1, 2, 100, 3] with B = {100}: 2 draws, the author changes after 100
    authors, draws = run_schedule("word", [1, 2, 100, 3], [0.1, 0.9, 0.3], boundary=[100])
    assert authors == [1, 1, 1, 0]
    assert draws == 2  # the start, and the redraw after 100 (none after the plain token 3)


def test_a_redraw_may_keep_the_author():
    authors, draws = run_schedule("word", [100, 5, 100, 7], [0.2, 0.4, 0.45], boundary=[100])
    assert authors == [1, 1, 1, 1] and draws == 3


def test_gap_counter_fires_on_the_32nd_token_and_is_reset_by_a_boundary():
    toks = [5] * 40
    authors, draws = run_schedule("word", toks, [0.1, 0.9, 0.1])
    assert authors[:32] == [1] * 32 and authors[32:] == [0] * 8  # redraw after the 32nd token
    assert draws == 2
    # a boundary at token 10 resets the counter: the next redraw comes 32 tokens later, after token 42
    toks = [5] * 9 + [100] + [5] * 40
    authors, draws = run_schedule("word", toks, [0.1, 0.9, 0.2], boundary=[100])
    assert authors[:10] == [1] * 10 and authors[10:42] == [0] * 32 and authors[42:] == [1] * 8
    # the paper's max_gap = 4 test: the redraw fires on the 4th token
    authors, _ = run_schedule("word", [5] * 6, [0.1, 0.9], max_gap=4)
    assert authors == [1, 1, 1, 1, 0, 0]


def test_first_author_is_a_bernoulli_draw():
    assert run_schedule("word", [5], [0.7])[0] == [0]  # u >= p: the junior starts
    assert run_schedule("word", [5], [0.7], p=0.8)[0] == [1]
    assert run_schedule("bernoulli", [5, 5, 5], [0.1, 0.9, 0.6, 0.2])[0] == [1, 0, 0]


@pytest.mark.parametrize("name,toks,kw,want", [
    ("alternating", [5, 5, 5, 5], {}, [1, 0, 1, 0]),
    ("sentence", [5, 9, 5, 5, 9, 5, 9, 5], {"boundary": [9]}, [1, 1, 0, 0, 0, 1, 1, 0]),
    ("chunk", [5] * 7, {"chunk": 3}, [1, 1, 1, 0, 0, 0, 1]),
])
def test_deterministic_schedules(name, toks, kw, want):
    assert run_schedule(name, toks, [0.99] * 9, **kw)[0] == want  # the senior starts; draws are not read


def test_schedules_step_all_rows_at_once():
    """A batch of rows in one call gives what each row gives alone."""
    toks = [[1, 100, 2, 3, 100, 4], [100, 100, 5, 6, 7, 8]]
    uni = [[0.1, 0.8, 0.2, 0.7], [0.6, 0.3, 0.9, 0.1]]
    b = torch.zeros(V, dtype=torch.bool)
    b[100] = True
    ctx = HandoffContext(uniforms=torch.tensor(uni, dtype=torch.float64), boundary=b)
    st = initial_state("word", ctx, 2)
    got = [[], []]
    for t in range(6):
        for i in range(2):
            got[i].append(int(st.senior[i]))
        st = HANDOFFS.get("word")(st, torch.tensor([toks[0][t], toks[1][t]]), ctx)
    for i in range(2):
        assert got[i] == run_schedule("word", toks[i], uni[i], boundary=[100])[0]


def test_row_draws_depend_on_seed_and_row_only():
    a = row_uniforms(7, [0, 1, 2], 5)
    assert torch.equal(a[1], row_uniforms(7, [1], 5)[0])
    assert not torch.equal(a[0], a[1]) and not torch.equal(a, row_uniforms(8, [0, 1, 2], 5))


def test_boundary_sets_from_the_vocabulary():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "a": 1, "b": 2, "\u0120a": 3, "\u0120ab": 4, "ab": 5, "\u0120": 6, "\u010a\u010a": 7,
             ".\u010a\u010a": 8}
    tk = Tokenizer(models.BPE(vocab, [("a", "b")]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    bpe = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>")
    assert word_boundary_ids(bpe).nonzero().flatten().tolist() == [3, 4, 6]  # the Ġ ids, no special token
    assert suffix_boundary_ids(bpe, "\n\n").nonzero().flatten().tolist() == [7, 8]
    char = make_char_tokenizer()  # no leading-space marker: ids whose decoded string starts with a space
    assert [char.decode([i]) for i in word_boundary_ids(char).nonzero().flatten().tolist()] == [" "]


# ------------------------------------------------------------------------------------------------ engine
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tandem_models")
    return {"s": make_random_model(str(d / "s"), "qwen3", seed=0),
            "j": make_random_model(str(d / "j"), "qwen3", seed=5)}


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts():
    tok = make_char_tokenizer()
    return [tok(t)["input_ids"] for t in ("1+2=", "What is 12 times 7? ", "x")]


def _engines(models, junior_path, **kw):
    from graft_cli.rollout import ENGINES

    tok = make_char_tokenizer()
    s = _load(models["s"])
    return ENGINES.get("hf")(s, tok), ENGINES.get("tandem")(s, tok, junior=_load(junior_path), **kw), tok


def test_identical_weights_and_greedy_give_the_single_model_output(models, prompts):
    from graft_cli.rollout import SamplingParams

    hf, td, _ = _engines(models, models["s"])
    p = SamplingParams(n=2, temperature=0.0, max_new_tokens=24, seed=3)
    a, b = hf.generate(prompts, p), td.generate(prompts, p)
    assert b.response_ids == a.response_ids and b.texts == a.texts and b.truncated == a.truncated
    assert [len(x) for x in b.token_columns["author"]] == [len(x) for x in b.response_ids]
    assert 0 < b.meta["metrics"]["tandem/senior_token_frac"] < 1  # both authors wrote, the text is the same


@pytest.mark.parametrize("p_senior,who", [(1.0, "s"), (0.0, "j")])
def test_one_author_only_gives_that_models_greedy_output(models, prompts, p_senior, who):
    from graft_cli.rollout import ENGINES, SamplingParams

    hf, td, tok = _engines(models, models["j"], p_senior=p_senior)
    p = SamplingParams(n=1, temperature=0.0, max_new_tokens=20, seed=0)
    want = ENGINES.get("hf")(_load(models[who]), tok).generate(prompts, p)
    got = td.generate(prompts, p)
    assert got.response_ids == want.response_ids
    assert all(set(a) <= {int(p_senior)} for a in got.token_columns["author"])


def test_each_token_is_its_authors_greedy_choice_on_the_shared_prefix(models, prompts):
    """Both caches see the chosen token: a full forward of each model on the co-written prefix reproduces it."""
    from graft_cli.rollout import SamplingParams

    _, td, _ = _engines(models, models["j"], schedule="bernoulli")
    ro = td.generate(prompts, SamplingParams(n=2, temperature=0.0, max_new_tokens=16, seed=11))
    sen, jun = _load(models["s"]), _load(models["j"])
    authors = {a for row in ro.token_columns["author"] for a in row}
    assert authors == {0, 1}
    for r, (ids, author) in enumerate(zip(ro.response_ids, ro.token_columns["author"])):
        prompt = prompts[r // 2]
        full = torch.tensor([prompt + ids])
        with torch.no_grad():
            ls, lj = sen(full).logits[0], jun(full).logits[0]
        for t, (tok, a) in enumerate(zip(ids, author)):
            logits = (ls if a else lj)[len(prompt) + t - 1]
            assert int(logits.argmax()) == tok, (r, t)


def test_sampling_is_seeded_and_the_mask_is_returned(models, prompts):
    from graft_cli.rollout import SamplingParams

    _, td, _ = _engines(models, models["j"])
    p = SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=5)
    a, b = td.generate(prompts, p), td.generate(prompts, p)
    assert a.response_ids == b.response_ids and a.token_columns == b.token_columns
    c = td.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=6))
    assert c.response_ids != a.response_ids
    m = a.meta["metrics"]
    tot = sum(len(x) for x in a.response_ids)
    assert m["tandem/senior_token_frac"] == pytest.approx(sum(map(sum, a.token_columns["author"])) / tot)
    assert m["tandem/tokens_senior"] + m["tandem/tokens_junior"] == pytest.approx(tot / len(a.response_ids))


def test_engine_options_are_checked(models):
    from graft_cli.errors import GraftError
    from graft_cli.rollout import ENGINES

    tok = make_char_tokenizer()
    s = _load(models["s"])
    with pytest.raises(GraftError, match=r"rollout.engine_kwargs.schedule.*must be one of .*sentence, word"):
        ENGINES.get("tandem")(s, tok, junior=s, schedule="coinflip")
    with pytest.raises(ValueError, match="p_senior"):
        ENGINES.get("tandem")(s, tok, junior=s, p_senior=1.5)


# ------------------------------------------------------------------------------------------- loss mask
def test_author_mask_and_its_denominator():
    """mask_t = author_t + w (1 − author_t); the token-mean denominator counts senior tokens (w = 0), and junior
    positions get no gradient."""
    from conftest import call_loss

    from graft_cli.algorithms.losses import POLICY_LOSSES, Normaliser
    from graft_cli.algorithms.signals import LOSS_MASKS, AuthorMaskParams, SignalContext
    from graft_cli.batch import TrainBatch
    from graft_cli.train.update import row_tokens as _row_tokens

    b = TrainBatch()
    b.append(prompt_ids=[1], response_ids=[4, 5, 6], advantages=1.0, weights=1.0, source="self", group=0,
             rewards=1.0, rollout_logprobs=[0.0] * 3, texts="", author=[1, 0, 1])
    b.append(prompt_ids=[1], response_ids=[4, 5], advantages=-1.0, weights=1.0, source="self", group=0,
             rewards=0.0, rollout_logprobs=[0.0] * 2, texts="", author=[0, 1])
    fn = LOSS_MASKS.get("author")
    b.loss_mask = fn(b, SignalContext(0, "a", None, params=AuthorMaskParams(junior_weight=0.0)))
    assert b.loss_mask == [[1.0, 0.0, 1.0], [0.0, 1.0]]
    assert [_row_tokens(b, i) for i in range(2)] == [2.0, 1.0]
    assert fn(b, SignalContext(0, "a", None, params=AuthorMaskParams(junior_weight=0.2)))[0] == [1.0, 0.2, 1.0]
    # token-mean PPO loss at ratio 1: -(Σ_senior A_t) / #senior tokens = -(1 + 1 - 1) / 3
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]]) * mask
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, _ = call_loss(POLICY_LOSSES.get("ppo_token"), logp, torch.zeros(2, 3), adv, mask, torch.ones(2),
                        torch.zeros(2, dtype=torch.bool), norm=Normaliser(num_tokens=3.0, num_seqs=2.0))
    assert float(loss.detach()) == pytest.approx(-1.0 / 3)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1 / 3, 0.0, -1 / 3], [0.0, 1 / 3, 0.0]]))


# ------------------------------------------------------------------------------------------- training
GRAFT = [sys.executable, "-m", "graft_cli.cli"]


def _env():
    return proc_env(PYTHONPATH=ROOT)


def _tandem_args(models, data, out, name, steps=2, extra=()):
    return ["train", "--method", "tandem", "--steps", str(steps), "--out", out, "--name", name, "--no-progress",
            f"tandem.senior={{name: a, model: '{models['s']}'}}", f"tandem.junior={models['j']}",
            f"data.train={data}", "data.prompt_batch=4", "algo.minibatch_prompts=2", "rollout.n=4",
            "rollout.max_new_tokens=12", "reward.num_workers=1", "run.save_every=1", "optim.lr=1e-3", *extra]


def test_vocabulary_mismatch_is_one_line_and_writes_nothing(models, tmp_path):
    import shutil

    other = str(tmp_path / "other")
    shutil.copytree(models["j"], other)
    path = os.path.join(other, "tokenizer.json")
    tj = json.load(open(path))
    v = tj["model"]["vocab"]
    v["a"], v["b"] = v["b"], v["a"]  # same size, two ids swapped
    json.dump(tj, open(path, "w"))
    data = write_problems(str(tmp_path / "train.jsonl"))
    out = str(tmp_path / "runs")
    res = subprocess.run(GRAFT + _tandem_args({**models, "j": other}, data, out, "bad"), cwd=ROOT, env=_env(),
                         capture_output=True, text=True)
    assert res.returncode == 2, res.stderr[-2000:]
    last = res.stderr.strip().splitlines()[-1]
    assert "rollout.engine_kwargs.junior" in last and "do not share a vocabulary" in last
    assert f"token id {v['b']}" in last and "Traceback" not in res.stderr
    assert not os.path.exists(os.path.join(out, "bad"))


@pytest.mark.slow
def test_tandem_trains_resumes_exactly_and_evaluates(models, tmp_path):
    """`graft train --method tandem`: the author column reaches the batch (mask), the rollout logs and the metrics;
    validation runs the senior solo; a run killed after its step-2 checkpoint resumes to identical metrics; and
    `graft eval --run --tandem` writes solo, handoff and legibility results and the pass@k plot."""
    import hashlib

    import pandas as pd

    from conftest import kill_after

    data = write_problems(str(tmp_path / "train.jsonl"))
    out = str(tmp_path / "runs")
    val = ["eval.every=2", f"eval.benchmarks=[smoke={data}]", "eval.samples=2"]
    ref = subprocess.run(GRAFT + _tandem_args(models, data, out, "ref", steps=4, extra=val), cwd=ROOT, env=_env(),
                         capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = metric_rows(os.path.join(out, "ref"))
    train = [r for r in want if "tandem/senior_token_frac" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert all(0.0 < r["tandem/senior_token_frac"] < 1.0 and r["tandem/redraws_per_response"] >= 0 for r in train)
    assert any(r.get("validation/score") is not None for r in want)
    log = pd.read_parquet(os.path.join(out, "ref", "rollouts", "a", "step_000001.parquet"))
    assert all(len(a) == len(t) and set(a) <= {0, 1} for a, t in zip(log["author"], log["token_ids"]))
    frac = sum(map(sum, log["author"])) / sum(map(len, log["author"]))
    assert frac == pytest.approx(train[0]["tandem/senior_token_frac"])
    # validation sampled the senior alone: its rows carry no author mask
    vrow = json.loads(open(os.path.join(out, "ref", "eval", "a", "step_000002", "smoke_run1.jsonl")).readline())
    assert "author" not in vrow

    marker = os.path.join(out, "killed", "checkpoints", "step_000002", "COMPLETE")
    kill_after(GRAFT + _tandem_args(models, data, out, "killed", steps=4, extra=val), marker, _env())
    res = subprocess.run(GRAFT + _tandem_args(models, data, out, "killed", steps=4, extra=val), cwd=ROOT, env=_env(),
                         capture_output=True, text=True)
    assert res.returncode == 0 and "resumed from step" in res.stderr, res.stderr[-3000:]
    assert metric_rows(os.path.join(out, "killed")) == want
    w = ["checkpoints", "step_000004", "a", "model.safetensors"]
    assert (hashlib.sha256(open(os.path.join(out, "ref", *w), "rb").read()).hexdigest()
            == hashlib.sha256(open(os.path.join(out, "killed", *w), "rb").read()).hexdigest())

    ev = subprocess.run(GRAFT + ["eval", "--run", os.path.join(out, "ref"), "--steps", "last", "--runs", "1",
                                 "--samples", "4", "--data", data, "--no-progress", "--workers", "1", "--force"],
                        cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert ev.returncode == 0, ev.stderr[-3000:]
    step = os.path.join(out, "ref", "eval", "a", "step_000004")
    solo = json.load(open(os.path.join(step, "summary.json")))
    hand = json.load(open(os.path.join(step, "handoff", "summary.json")))
    leg = json.load(open(os.path.join(step, "legibility", "summary.json")))
    assert set(solo["benchmarks"]["train"]["pass@k"]) == {"1", "2", "4"} == set(hand["benchmarks"]["train"]["pass@k"])
    hrows = [json.loads(x) for x in open(os.path.join(step, "handoff", "train_run1.jsonl"))]
    assert len(hrows) == 16 * 4 and all(r["author"][:1] in ([], [1]) for r in hrows)  # the senior writes first
    assert hand["junior"] == models["j"] and leg["junior"] == models["j"]
    lrows = [json.loads(x) for x in open(os.path.join(step, "legibility", "train.jsonl"))]
    scored = [r for r in lrows if r["num_tokens"]]
    assert leg["benchmarks"]["train"]["ce"] == pytest.approx(sum(r["nll"] for r in scored) /
                                                             sum(r["num_tokens"] for r in scored))
    assert os.path.exists(os.path.join(out, "ref", "eval", "a", "pass_at_k.png"))
    rep = subprocess.run(GRAFT + ["report", os.path.join(out, "ref"), "--out", str(tmp_path / "rep"), "--no-plots"],
                         cwd=ROOT, env=_env(), capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr[-3000:]
    md = open(tmp_path / "rep" / "report.md").read()
    # the run's label is its variant (graft report names the settings it differs in from the method config)
    row = next(x for x in md.splitlines() if x.startswith("| ref | tandem [rollout.n=4] | a | 4 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == f"{100 * solo['benchmarks']['train']['pass@k']['1']['mean']:.2f}"
    assert cells[8] == f"{100 * hand['benchmarks']['train']['pass@k']['1']['mean']:.2f}"
    assert cells[12] == f"{leg['macro_ce']:.4f}"


# ------------------------------------------------------------------------------------------- evaluations
class Scripted(torch.nn.Module):
    """A model that writes a fixed script: after a prompt of ``P`` tokens, the token at response position ``t``
    is ``script[t]`` (EOS after the script), whatever the text so far (it reads only the position ids)."""

    def __init__(self, script: list[int], prompt_len: int, vocab: int, eos: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.script, self.P, self.V, self.eos = script + [eos], prompt_len, vocab, eos

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, use_cache=None, logits_to_keep=None,
                past_key_values=None, **kw):
        from types import SimpleNamespace

        pos = position_ids[:, -1]
        logits = torch.zeros(input_ids.shape[0], 1, self.V)
        for i, p in enumerate(pos.tolist()):
            t = p + 1 - self.P
            logits[i, 0, self.script[min(t, len(self.script) - 1)]] = 10.0
        return SimpleNamespace(logits=logits + self.w)


def test_handoff_alternates_strictly_at_the_delimiter_on_a_scripted_pair():
    from graft_cli.eval.tandem_evals import handoff_engine
    from graft_cli.rollout import SamplingParams

    tok = make_char_tokenizer()
    prompt = tok("q: 1+1=")["input_ids"]
    enc = lambda s: tok(s)["input_ids"]  # noqa: E731
    senior = Scripted(enc("ab,cd,ef,gh"), len(prompt), len(tok), tok.eos_token_id)
    junior = Scripted(enc("AB,CD,EF,GH"), len(prompt), len(tok), tok.eos_token_id)
    eng = handoff_engine(senior, tok, junior, ",")
    ro = eng.generate([prompt, prompt], SamplingParams(n=1, temperature=0.0, max_new_tokens=32, seed=0))
    assert ro.texts == ["ab,CD,ef,GH"] * 2  # the senior writes first; the author toggles after each ","
    assert ro.token_columns["author"][0] == [1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0]  # ... the junior writes the EOS
    short = eng.generate([prompt], SamplingParams(n=1, temperature=0.0, max_new_tokens=5, seed=0))
    assert short.texts == ["ab,CD"] and short.truncated == [True]  # one token budget shared by both authors


def test_legibility_against_a_hand_computation(models, tmp_path):
    from graft_cli.data.problems import Problem
    from graft_cli.data.prompts import PromptSpec
    from graft_cli.eval.benchmarks import BenchmarkSource
    from graft_cli.eval.tandem_evals import legibility

    tok = make_char_tokenizer()
    junior = _load(models["j"])
    spec = PromptSpec(chat_template="none")
    problems = [Problem(id="p0", problem="2+3", answer="5"), Problem(id="p1", problem="7+1", answer="8")]
    solo = tmp_path / "solo"
    solo.mkdir()
    rows = [{"benchmark": "toy", "problem_index": i, "run": 1, "sample": j, "response": r, "grade": 0.0}
            for (i, j, r) in [(0, 0, "5 \\boxed{5}"), (0, 1, ""), (1, 0, "8"), (1, 1, "x=8, so \\boxed{8}")]]
    (solo / "toy_run1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bench = BenchmarkSource(name="toy", display="toy", source="test")
    out = legibility(junior, tok, spec, str(solo), str(tmp_path / "leg"), [(bench, problems)], "J")
    nll, n, ces = 0.0, 0, []
    for r in rows:
        resp = tok(r["response"], add_special_tokens=False)["input_ids"]
        if not resp:
            continue
        p = spec.encode(problems[r["problem_index"]].problem, tok)
        with torch.no_grad():
            logp = torch.log_softmax(junior(torch.tensor([p + resp])).logits[0].float(), -1)
        row_nll = -sum(float(logp[len(p) + t - 1, y]) for t, y in enumerate(resp))
        nll, n = nll + row_nll, n + len(resp)
        ces.append(row_nll / len(resp))
    b = out["benchmarks"]["toy"]
    assert b["num_tokens"] == n and b["num_responses"] == 3
    assert b["ce"] == pytest.approx(nll / n, rel=1e-5) and out["macro_ce"] == pytest.approx(nll / n, rel=1e-5)
    assert b["ce_response_mean"] == pytest.approx(sum(ces) / 3, rel=1e-5)
    lines = [json.loads(x) for x in open(tmp_path / "leg" / "toy.jsonl")]
    assert [x["ce"] is None for x in lines] == [False, True, False, False]


def test_holdout_split_and_the_heldout_benchmark(tmp_path):
    import numpy as np

    from graft_cli.config import compose
    from graft_cli.data.problems import load_problems, split_holdout
    from graft_cli.eval.setup import run_benches

    data = write_problems(str(tmp_path / "train.jsonl"), n=10)
    probs = load_problems(data)
    train, held = split_holdout(probs, 3, seed=0)
    idx = sorted(np.random.default_rng(0).choice(10, size=3, replace=False).tolist())
    assert [p.id for p in held] == [f"p{i}" for i in idx]
    assert [p.id for p in train] == [f"p{i}" for i in range(10) if i not in idx]
    assert split_holdout(probs, 0) == (probs, [])
    with pytest.raises(ValueError, match="leaves no training problem"):
        split_holdout(probs, 10)
    cfg = compose([f"data.train={data}", "data.holdout=3"])
    (b, got), = run_benches(cfg, ["heldout"])
    assert b.name == "heldout" and [p.id for p in got] == [p.id for p in held]


def test_the_static_cache_path_gives_the_same_co_generation(models, prompts):
    """The CUDA fast path's static caches (here on CPU, without compile) co-generate token for token what the
    dynamic caches do, author masks included."""
    from graft_cli.rollout import SamplingParams

    _, dyn, _ = _engines(models, models["j"], cache="dynamic")
    _, sta, _ = _engines(models, models["j"], cache="static", compile=False, cache_bucket=16)
    assert sta.senior.static and sta.junior.static and not dyn.senior.static
    p = SamplingParams(n=2, temperature=1.0, max_new_tokens=20, seed=4)
    a, b = dyn.generate(prompts, p), sta.generate(prompts, p)
    assert a.response_ids == b.response_ids and a.token_columns == b.token_columns


def test_shared_prefill_gives_the_same_tandem_samples(models, prompts):
    """rollout.engine_kwargs.share_prompts reaches both decoders (senior, junior): the same co-written samples."""
    from graft_cli.rollout import SamplingParams

    p = SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=5)
    _, td, _ = _engines(models, models["j"])
    _, shared, _ = _engines(models, models["j"], share_prompts=True)
    assert shared.senior.share_prompts and shared.junior.share_prompts
    a, b = td.generate(prompts, p), shared.generate(prompts, p)
    assert b.response_ids == a.response_ids and b.token_columns == a.token_columns
