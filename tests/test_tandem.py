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
from conftest import ROOT, make_char_tokenizer, make_random_model, write_problems

from graft_cli.algorithms.handoff import (HANDOFFS, HandoffContext, initial_state, row_uniforms,
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
    with pytest.raises(GraftError, match="handoff schedule"):
        ENGINES.get("tandem")(s, tok, junior=s, schedule="coinflip")
    with pytest.raises(ValueError, match="p_senior"):
        ENGINES.get("tandem")(s, tok, junior=s, p_senior=1.5)


# ------------------------------------------------------------------------------------------- loss mask
def test_author_mask_and_its_denominator():
    """mask_t = author_t + w (1 − author_t); the token-mean denominator counts senior tokens (w = 0), and junior
    positions get no gradient."""
    from conftest import call_loss

    from graft_cli.algorithms.losses import POLICY_LOSSES, Normaliser
    from graft_cli.algorithms.signals import LOSS_MASKS, SignalContext
    from graft_cli.batch import TrainBatch
    from graft_cli.train.loop import _row_tokens

    b = TrainBatch()
    b.append(prompt_ids=[1], response_ids=[4, 5, 6], advantages=1.0, weights=1.0, source="self", group=0,
             rewards=1.0, sampler_logprobs=[0.0] * 3, texts="", author=[1, 0, 1])
    b.append(prompt_ids=[1], response_ids=[4, 5], advantages=-1.0, weights=1.0, source="self", group=0,
             rewards=0.0, sampler_logprobs=[0.0] * 2, texts="", author=[0, 1])
    fn = LOSS_MASKS.get("author")
    b.loss_mask = fn(b, SignalContext(0, "a", None, params={"junior_weight": 0.0}))
    assert b.loss_mask == [[1.0, 0.0, 1.0], [0.0, 1.0]]
    assert [_row_tokens(b, i) for i in range(2)] == [2.0, 1.0]
    assert fn(b, SignalContext(0, "a", None, params={"junior_weight": 0.2}))[0] == [1.0, 0.2, 1.0]
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
    return {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}


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
