"""GRAFT exchange (graft_cli/algorithms/exchange/graft.py): selection tables, gate arithmetic, replacement,
re-tokenization, losses on hand-worked examples, minibatch ordering, stored-trajectory equivalence, the
N-policy rule, and an end-to-end `graft train --method graft` run.

Every expected number below is worked out by hand in the comment next to it (never by the code under test).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, call_loss, make_char_tokenizer, make_random_model, train_overrides

from graft_cli.algorithms.exchange import EXCHANGES, ExchangeContext, ReceiverFunctions
from graft_cli.algorithms.exchange import graft as G
from graft_cli.algorithms.exchange import gates, replacement, selection
from graft_cli.models import retokenize as RT
from graft_cli.algorithms.losses import POLICY_LOSSES, Normaliser, ppo_token_loss
from graft_cli.data.problems import Problem
from graft_cli.errors import GraftError
from graft_cli.batch import Rollouts
from graft_cli.batch import PolicyStep, TrainBatch, self_batch
from graft_cli.algorithms.minibatch import group_schedule as minibatch_schedule


# --------------------------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def tok_char():
    return make_char_tokenizer()


@pytest.fixture(scope="module")
def tok_bpe():
    """A byte-level BPE tokenizer with merges (different ids and lengths than the char tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|end|>", "<|pad|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [f"the answer is \\boxed{{{i}}} because {i}+{i}={2 * i}, so the sum is {i}" for i in range(200)]
    tk.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|end|>", pad_token="<|pad|>",
                                   clean_up_tokenization_spaces=False)


def problems(B):
    return [Problem(f"p{i}", f"{i}+1", str(i + 1)) for i in range(B)]


def make_step(name, tok, probs, k, n=4, truncated=None, lp=-0.5):
    """A PolicyStep whose group q has k[q] correct responses (\\boxed{answer}) and n-k[q] wrong ones
    (\\boxed{0}); responses end with EOS unless ``truncated``; every rollout log-prob is ``lp``."""
    texts, ids, lps, trunc = [], [], [], []
    for q, p in enumerate(probs):
        for j in range(n):
            t = f"so \\boxed{{{p.answer if j < k[q] else 0}}}"
            tr = bool(truncated[q * n + j]) if truncated is not None else False
            r = tok(t, add_special_tokens=False)["input_ids"] + ([] if tr else [tok.eos_token_id])
            texts.append(t)
            ids.append(r)
            lps.append([lp] * len(r))
            trunc.append(tr)
    rewards = torch.tensor([[1.0 if j < k[q] else 0.0 for j in range(n)] for q in range(len(probs))])
    from graft_cli.algorithms.advantages import grpo_advantages

    ro = Rollouts([tok(p.problem)["input_ids"] for p in probs], ids, texts, lps, trunc, n=n)
    return PolicyStep(name, probs, [tok(p.problem + "=")["input_ids"] for p in probs], ro, rewards,
                      grpo_advantages(rewards))


def make_ctx(toks, step=0, seed=0, score=None):
    receivers = ReceiverFunctions(lambda text, name: toks[name](f"Q {text} A", add_special_tokens=False)["input_ids"],
                                  score)
    return ExchangeContext(step=step, seed=seed, tokenizers=toks, receivers=receivers)


def cfg_for(method="graft", overrides=()):
    from graft_cli.config import compose

    return compose([f"method={method}", *overrides])


# ------------------------------------------------------------------------------------ trigger/balance
def test_trigger_and_balanced_table():
    n = 8
    k_a = [0, 3, 8, 0, 1, 5, 0, 2]
    k_b = [2, 0, 0, 0, 0, 0, 8, 0]
    # A→B: k_B = 0 and 1 <= k_A < 8: q1 (3), q4 (1), q5 (5), q7 (2); q2 has k_A = 8 (all correct), q3 k_A = 0
    assert selection.trigger(k_b, k_a, n) == [1, 4, 5, 7]
    # B→A: k_A = 0 and 1 <= k_B < 8: q0 (2); q6 is all-correct (8), q3 has k_B = 0
    assert selection.trigger(k_a, k_b, n) == [0]
    bp = selection.balanced_pair(k_a, k_b, n)
    # m = min(4, 1) = 1; A→B ranks by k_A: q5 (5) first
    assert bp["m"] == 1 and bp["sel_ab"] == [5] and bp["sel_ba"] == [0]
    # SGT eligibility includes all-correct sources: A→B q1,q2,q4,q5,q7; B→A q0,q6
    assert selection.trigger_sgt(k_b, k_a) == [1, 2, 4, 5, 7]
    assert selection.trigger_sgt(k_a, k_b) == [0, 6]


def test_select_with_ties_table():
    cands = [0, 1, 2, 3, 4, 5]
    k = [2, 5, 5, 3, 5, 1]
    # ranked by k desc (ties by index): q1 5, q2 5, q4 5, q3 3, q0 2, q5 1
    assert selection.select_with_ties(cands, k, 1) == [1, 2, 4]  # 1st is k=5: all three tied 5s
    assert selection.select_with_ties(cands, k, 2) == [1, 2, 4]  # 2nd is k=5 too
    assert selection.select_with_ties(cands, k, 3) == [1, 2, 4]
    assert selection.select_with_ties(cands, k, 4) == [1, 2, 3, 4]  # 4th is q3 (k=3), no tie
    assert selection.select_with_ties(cands, k, 5) == [0, 1, 2, 3, 4]
    assert selection.select_with_ties(cands, k, 0) == []
    assert selection.select_with_ties(cands, k, 99) == cands
    # the selected set does not depend on the candidates' order
    assert selection.select_with_ties([5, 4, 3, 2, 1, 0], k, 2) == [1, 2, 4]


def test_m_zero_means_no_exchange_in_either_direction():
    # A→B has a candidate (q0: k_B = 0, k_A = 3) but B→A has none: m = 0, nothing moves
    bp = selection.balanced_pair([3, 0], [0, 0], 8)
    assert bp["cand_ab"] == [0] and bp["cand_ba"] == [] and bp["m"] == 0
    assert bp["sel_ab"] == [] and bp["sel_ba"] == []


def test_balanced_selection_can_exceed_m_and_differ():
    n = 4
    k_a = [0, 0, 2, 2, 1]
    k_b = [1, 3, 0, 0, 0]
    # A→B candidates q2 (2), q3 (2), q4 (1); B→A candidates q0 (1), q1 (3): m = 2
    # A→B: 1st q2, 2nd q3 (k=2) → {q2, q3}; B→A: q1 (3), q0 (1) → {q0, q1}
    bp = selection.balanced_pair(k_a, k_b, n)
    assert bp["m"] == 2 and bp["sel_ab"] == [2, 3] and bp["sel_ba"] == [0, 1]
    # now k_A(q4) = 2 as well: the 2nd is tied with q4 → 3 selected in A→B, 2 in B→A
    bp = selection.balanced_pair([0, 0, 2, 2, 2], k_b, n)
    assert bp["sel_ab"] == [2, 3, 4] and bp["sel_ba"] == [0, 1]


def test_n_policy_rule_hand_table():
    n = 8
    k0, k1, k2 = [0, 0, 4, 0], [3, 0, 0, 0], [5, 2, 0, 8]
    plan = selection.plan_exchange([k0, k1, k2], [n, n, n])
    # pair (0,1): C_{1→0} = {q0}, C_{0→1} = {q2}, m = 1
    # pair (0,2): C_{2→0} = {q0 (5), q1 (2)} (q3 all-correct), C_{0→2} = {q2}, m = 1 → 2→0 keeps q0
    # pair (1,2): C_{2→1} = {q1}, C_{1→2} = {} → m = 0
    assert plan.m[(1, 0)] == 1 and plan.m[(2, 0)] == 1 and plan.m[(2, 1)] == 0
    assert plan.selected[(2, 0)] == [0] and plan.selected[(2, 1)] == []
    # receiver 0, q0: offered by 1 (k=3) and 2 (k=5) → 2 (most successes)
    assert plan.assign == {0: {0: 2}, 1: {2: 0}, 2: {2: 0}}
    # tie between sources → lower policy index
    plan = selection.plan_exchange([k0, [5, 0, 0, 0], k2], [n, n, n])
    assert plan.assign[0] == {0: 1}


def test_n2_generalisation_equals_pair_algorithm():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 9))
        B = int(rng.integers(1, 17))
        # skew towards 0 and n so that triggers and ties are common
        k_a = rng.choice([0, 0, 1, 2, n - 1, n], size=B).clip(0, n)
        k_b = rng.choice([0, 0, 1, 2, n - 1, n], size=B).clip(0, n)
        bp = selection.balanced_pair(k_a.tolist(), k_b.tolist(), n)
        plan = selection.plan_exchange([k_a.tolist(), k_b.tolist()], [n, n])
        assert plan.assign[1] == {q: 0 for q in bp["sel_ab"]}
        assert plan.assign[0] == {q: 1 for q in bp["sel_ba"]}
        assert plan.m[(0, 1)] == plan.m[(1, 0)] == bp["m"]


def test_n2_exchange_batches_equal_pair_construction(tok_char, tok_bpe):
    """The exchange's N-policy path on two policies builds exactly the pair algorithm's batches."""
    probs = problems(6)
    k_a, k_b = [0, 3, 2, 0, 4, 1], [2, 0, 0, 0, 0, 0]
    sa, sb = make_step("a", tok_char, probs, k_a), make_step("b", tok_bpe, probs, k_b)
    ctx = make_ctx({"a": tok_char, "b": tok_bpe})
    ex = G.GraftExchange(cfg_for())
    batches, _ = ex.select({"a": sa, "b": sb}, ctx)
    bp = selection.balanced_pair(k_a, k_b, 4)  # m = 1: A→B q1 (k_A = 3); B→A q0
    assert bp["sel_ab"] == [1] and bp["sel_ba"] == [0]
    for recv, src, sel in (("a", sb, bp["sel_ba"]), ("b", sa, bp["sel_ab"])):
        own = sa if recv == "a" else sb
        want = TrainBatch()
        for q in range(6):
            if q in sel:
                want.extend(replacement.peer_group_rows(src, q, ctx.receivers.encode(probs[q].problem, recv),
                                                        ctx.tokenizers[recv], G.GraftParams(), src.name))
            else:
                want.extend(replacement.own_group_rows(own, q))
        got = batches[recv]
        for c in TrainBatch.COLUMNS:
            assert getattr(got, c) == getattr(want, c), c


# -------------------------------------------------------------------------------------- replacement
def test_replacement_keeps_source_advantages_and_retokenizes(tok_char, tok_bpe):
    probs = problems(3)
    k_a, k_b = [0, 1, 0], [3, 0, 0]  # n = 4; A→B: q1 (k_A = 1); B→A: q0 (k_B = 3); m = 1
    trunc_b = [False, True, False, False] + [False] * 8  # B's 2nd response on q0 hit the length limit
    sa, sb = make_step("a", tok_char, probs, k_a), make_step("b", tok_bpe, probs, k_b, truncated=trunc_b, lp=-0.25)
    ex = G.GraftExchange(cfg_for())
    ctx = make_ctx({"a": tok_char, "b": tok_bpe})
    batches, met = ex.select({"a": sa, "b": sb}, ctx)
    a = batches["a"]
    # receiver a: group 0 is b's whole group (4 rows), groups 1, 2 its own; prompt order kept
    assert a.group == [0] * 4 + [1] * 4 + [2] * 4
    assert a.source == ["peer"] * 4 + ["self"] * 8
    # b's group on q0 has rewards [1,1,1,0]: mean 0.75, unbiased std 0.5 → +0.5, +0.5, +0.5, -1.5
    assert a.advantages[:4] == pytest.approx([0.5, 0.5, 0.5, -1.5], abs=1e-5)
    assert a.rewards[:4] == [1.0, 1.0, 1.0, 0.0]
    # re-tokenized with a's (char) tokenizer under a's own prompt encoding
    assert a.prompt_ids[0] == tok_char("Q 0+1 A", add_special_tokens=False)["input_ids"]
    text = "so \\boxed{1}"
    char_ids = tok_char(text, add_special_tokens=False)["input_ids"]
    assert a.response_ids[0] == char_ids + [tok_char.eos_token_id]  # ended with EOS: a's EOS appended
    assert a.response_ids[1] == char_ids  # truncated: no EOS
    assert a.extra["n_scored"][:2] == [len(char_ids), len(char_ids)]
    # source mean log-prob excludes the EOS: every token is -0.25 → -0.25 either way
    assert a.source_logp_mean[:4] == pytest.approx([-0.25] * 4)
    assert a.extra["src_policy"][:4] == ["b"] * 4
    # metrics per receiver (direction b→a): 1 candidate, 1 selected, m = 1
    assert met["a"]["graft/candidates"] == 1 and met["a"]["graft/selected"] == 1 and met["a"]["graft/m"] == 1
    # a's all-fail prompts: q0, q2; b has k >= 1 on q0 only → 1/2
    assert met["a"]["graft/complementarity"] == pytest.approx(0.5)
    # b's all-fail prompts: q1, q2; a has k >= 1 on q1 only → 1/2
    assert met["b"]["graft/complementarity"] == pytest.approx(0.5)
    assert met["a"]["graft/transferred"] == 4


def test_no_transfer_equals_grpo_batch(tok_char, tok_bpe):
    probs = problems(4)
    sa = make_step("a", tok_char, probs, [1, 2, 0, 4])
    sb = make_step("b", tok_bpe, probs, [0, 2, 0, 4])  # only A→B has a candidate (q0): m = 0
    ex = G.GraftExchange(cfg_for())
    ctx = make_ctx({"a": tok_char, "b": tok_bpe})
    batches, met = ex.select({"a": sa, "b": sb}, ctx)
    for name, st in (("a", sa), ("b", sb)):
        want = self_batch(st)
        for c in TrainBatch.COLUMNS:
            assert getattr(batches[name], c) == getattr(want, c), c
        assert met[name]["graft/selected"] == 0
        b = batches[name]
        b.old_logprobs = [[-1.0] * len(r) for r in b.response_ids]
        out, am = ex.admit(name, b, ctx)
        assert out is b and am["graft/admitted"] == 0


def test_success_only_pooled_sft_hacpo_modes(tok_char, tok_bpe):
    probs = problems(2)
    k_a, k_b = [0, 2], [3, 0]  # A→B q1 (k_A = 2), B→A q0 (k_B = 3), m = 1
    sa, sb = make_step("a", tok_char, probs, k_a), make_step("b", tok_bpe, probs, k_b)
    ctx = make_ctx({"a": tok_char, "b": tok_bpe})
    steps = {"a": sa, "b": sb}
    # success-only: only b's 3 correct responses enter, with their full-group advantages (+0.5 each)
    b = G.GraftExchange(cfg_for("graft_successonly")).select(steps, ctx)[0]["a"]
    assert b.source == ["peer"] * 3 + ["self"] * 4 and b.advantages[:3] == pytest.approx([0.5] * 3, abs=1e-5)
    # pooled: a's 4 zeros ‖ b's [1,1,1,0]; pool mean 3/8, unbiased std sqrt((3·0.390625 + 5·0.140625)/7) =
    # sqrt(1.875/7) = 0.517549 → 1: 0.625/0.517549 = 1.207615, 0: -0.375/0.517549 = -0.724569
    b = G.GraftExchange(cfg_for("graft_pooled")).select(steps, ctx)[0]["a"]
    assert b.group[:8] == [0] * 8 and b.source[:8] == ["self"] * 4 + ["peer"] * 4
    assert b.advantages[:8] == pytest.approx([-0.724569] * 4 + [1.207615] * 3 + [-0.724569], abs=1e-5)
    # sft: a keeps its own zero-advantage group and gains ONE correct b response as an auxiliary NLL row
    b = G.GraftExchange(cfg_for("graft_sft_update")).select(steps, ctx)[0]["a"]
    assert b.source[:5] == ["self"] * 4 + ["peer"] and b.advantages[:5] == [0.0] * 5
    assert b.rewards[4] == 1.0 and b.in_pg[4] is False  # λ (0.1) is the loss's parameter nll_coef
    assert b.in_pg[:4] == [True] * 4
    # hacpo: joint group on q0 with capability-aware advantages. The capabilities include this step's rates
    # (hacpo_capability: current, HACPO's code): P_a = 2/8, P_b = 3/8 → c(b→a) = 1.5, ω = 2/3;
    # r = [0,0,0,0 | 1,1,1,0]: b = 3·(2/3)/8 = 0.25, unbiased std 0.517549 → self −0.25/0.517550 = −0.483045,
    # peer 0.75/0.517550 = 1.449135 / −0.483045; q1 (not selected): own group + b's responses with zero advantage
    b = G.GraftExchange(cfg_for("graft_hacpo_update")).select(steps, ctx)[0]["a"]
    assert b.advantages[:8] == pytest.approx([-0.483045] * 4 + [1.449135] * 3 + [-0.483045], abs=1e-5)
    assert b.extra["hacpo_c"][4:8] == pytest.approx([1.5] * 4)
    assert b.group[8:] == [1] * 8 and b.source[8:] == ["self"] * 4 + ["peer"] * 4 and b.advantages[12:] == [0.0] * 4
    # every row carries n_scored, its tokens without the terminal EOS (all these responses ended with one)
    assert b.extra["n_scored"] == [len(ids) - 1 for ids in b.response_ids]
    # lagged (the window before this step; P = 1 at step 0 → c = 1): b = 3/8 → self −0.724569, peer 1.207615
    b = G.GraftExchange(cfg_for("graft_hacpo_update", ["exchange.params.hacpo_capability=lagged"])).select(steps,
                                                                                                      ctx)[0]["a"]
    assert b.advantages[:8] == pytest.approx([-0.724569] * 4 + [1.207615] * 3 + [-0.724569], abs=1e-5)
    assert b.extra["hacpo_c"][4:8] == [1.0] * 4


def test_random_prompts_are_count_matched():
    k_a, k_b = [0, 3, 2, 0, 1, 0, 0, 0], [2, 0, 0, 0, 0, 1, 0, 0]
    # balanced: A→B cands q1,q2,q4; B→A cands q0,q5; m = 2 → A→B {q1 (3), q2 (2)}, B→A {q0, q5}
    bal = selection.plan_exchange([k_a, k_b], [4, 4])
    assert bal.selected[(0, 1)] == [1, 2] and bal.selected[(1, 0)] == [0, 5]
    for seed in range(5):
        rnd = selection.plan_exchange([k_a, k_b], [4, 4], "random", seed=seed)
        assert len(rnd.assign[1]) == 2 and len(rnd.assign[0]) == 2
        assert all(0 <= q < 8 for q in rnd.assign[1])


# ------------------------------------------------------------------------------------- gate and score
def test_gate_arithmetic_including_s_equal_delta():
    s = [0.5, 0.8, 0.8000001, 0.9, 1.0, 1.7, math.nan]
    w, keep = gates.floor_gate(s, 0.8, cap=True)
    assert keep == [False, False, True, True, True, True, False]  # s = δ exactly is dropped (strict >)
    assert w == pytest.approx([0, 0, 0.8000001, 0.9, 1.0, 1.0, 0])  # min(s, 1) above the floor
    w, keep = gates.floor_gate(s, 0.0, cap=True)  # no floor: everything kept, w = min(s, 1)
    assert all(keep) and w == pytest.approx([0.5, 0.8, 0.8000001, 0.9, 1.0, 1.0, 0])
    w, keep = gates.no_gate(s, 0.8, cap=True)  # w/o gate
    assert all(keep) and w == [1.0] * 7
    w, keep = gates.floor_gate([1.7], 0.8, cap=False)
    assert w == [1.7]
    # the admission rule `gate` is the configured gate with the configured δ and cap
    assert gates.admit_by_gate(s, G.options({}), None) == gates.floor_gate(s, 0.8, True)
    assert gates.admit_by_gate(s, G.options({"gate": "none"}), None) == gates.no_gate(s, 0.8, True)
    assert gates.admit_by_gate(s, G.options({"delta": 0.9, "cap": False}), None) == gates.floor_gate(s, 0.9, False)


def test_compatibility_excludes_eos_on_both_sides():
    # receiver: [-1, -2] + appended EOS (-9): mean over n_scored = 2 → -1.5
    # source: [-1, -1] + EOS (-3) → -1.0;  s = exp(-1.5 - (-1.0)) = exp(-0.5) = 0.6065306597
    src = gates.source_mean_logprob([-1.0, -1.0, -3.0], ended_with_eos=True)
    assert src == pytest.approx(-1.0)
    assert gates.compatibility([-1.0, -2.0, -9.0], 2, src) == pytest.approx(0.6065306597)
    # a truncated source keeps its last token: mean(-1, -1, -3) = -5/3
    assert gates.source_mean_logprob([-1.0, -1.0, -3.0], ended_with_eos=False) == pytest.approx(-5 / 3)
    # equal means → s = 1 exactly
    assert gates.compatibility([-0.7, -0.7], 2, -0.7) == 1.0
    assert math.isnan(gates.compatibility([-9.0], 0, -1.0))  # nothing to score


def test_random_admission_counts():
    s = [0.9, 0.5, 0.95, math.nan, 0.1, 0.85]
    # A = #{s > 0.8} = 3 (0.9, 0.95, 0.85): exactly 3 responses sampled, w = min(s, 1), no floor
    for seed in range(10):
        w, keep = gates.random_admission(s, 0.8, np.random.default_rng(seed))
        assert sum(keep) == 3
        for x, wi, k in zip(s, w, keep):
            assert wi == (0.0 if not k or math.isnan(x) else pytest.approx(min(x, 1.0)))


def test_pooled_and_hacpo_advantages_by_hand():
    # pool [0,0,0,0] ‖ [1,1,0,0]: mean 0.25, unbiased var (2·0.5625 + 6·0.0625)/7 = 1.5/7 → std 0.46291005
    # 1 → 0.75/0.46291005 = 1.620185, 0 → -0.25/0.46291005 = -0.540062
    ar, asrc = replacement.pooled_advantages([0, 0, 0, 0], [1, 1, 0, 0])
    assert ar == pytest.approx([-0.540062] * 4, abs=1e-5) and asrc == pytest.approx([1.620185] * 2 + [-0.540062] * 2,
                                                                                    abs=1e-5)
    # HACPO: r_self [0,0], r_peer [1,0], c = 2: b = mean(0, 0, 1/2, 0) = 0.125; std([0,0,1,0], ddof=1) = 0.5
    a_s, a_p = replacement.hacpo_advantages([0, 0], [1, 0], 2.0)
    assert a_s == pytest.approx([-0.25] * 2, abs=1e-5) and a_p == pytest.approx([1.75, -0.25], abs=1e-5)
    assert replacement.hacpo_advantages([1, 1], [1, 1], 2.0) == ([0.0, 0.0], [0.0, 0.0])  # all equal → 0
    assert replacement.hacpo_capability(0.6, 0.2) == pytest.approx(3.0)
    assert replacement.hacpo_capability(0.9, 0.01) == 10.0


def _loss_tensors(rows):
    """rows: (lengths, logp-old per token, adv) → (logp, old, adv, mask) with one row each, no prompt."""
    T = max(len(r[1]) for r in rows)
    logp = torch.zeros(len(rows), T)
    old = torch.zeros(len(rows), T)
    adv = torch.zeros(len(rows), T)
    mask = torch.zeros(len(rows), T)
    for i, (old_lp, diff, a) in enumerate(rows):
        L = len(diff)
        old[i, :L] = torch.tensor(old_lp)
        logp[i, :L] = torch.tensor(old_lp) + torch.tensor(diff)
        adv[i, :L] = a
        mask[i, :L] = 1
    return logp, old, adv, mask


def test_dropped_responses_leave_numerator_and_denominator(tok_char):
    """admit drops the s <= δ response; the loss at ρ = 1 then equals the hand value with denominator 9."""
    b = TrainBatch()
    b.append(prompt_ids=[5], response_ids=[1, 2], advantages=1.0, weights=1.0, source="self", group=0)
    b.append(prompt_ids=[5], response_ids=[1, 2, 3], advantages=-1.0, weights=1.0, source="self", group=0)
    b.append(prompt_ids=[5], response_ids=[4, 4, 4, 4], advantages=0.5, weights=1.0, source="peer", group=1,
             source_logp_mean=-1.0, n_scored=4)
    b.append(prompt_ids=[5], response_ids=[4, 4, 4, 4, 4], advantages=2.0, weights=1.0, source="peer", group=1,
             source_logp_mean=-1.0, n_scored=5)
    b.old_logprobs = [[-1.0] * 2, [-1.0] * 3, [-1.1] * 4, [-1.5] * 5]
    ex = G.GraftExchange(cfg_for())
    out, met = ex.admit("a", b, make_ctx({"a": tok_char}))
    # s_3 = exp(-1.1 + 1.0) = exp(-0.1) = 0.904837 > 0.8 → w = 0.904837; s_4 = exp(-0.5) = 0.606531 → dropped
    assert len(out) == 3 and out.advantages == [1.0, -1.0, 0.5]
    assert out.weights[2] == pytest.approx(0.9048374180)
    assert met["graft/admitted"] == 1 and met["graft/dropped"] == 1
    assert met["graft/grafted_share"] == pytest.approx(1 / 3)  # 1 admitted row of the 3 left in the batch
    assert met["graft/s_mean"] == pytest.approx((0.9048374180 + 0.6065306597) / 2)
    assert met["graft/w_mean"] == pytest.approx(0.9048374180)
    rows = [(o, [0.0] * len(o), a) for o, a in zip(out.old_logprobs, out.advantages)]
    logp, old, adv, mask = _loss_tensors(rows)
    w = torch.tensor(out.weights)
    is_peer = torch.tensor([s != "self" for s in out.source])
    loss, st = call_loss(ppo_token_loss, logp, old, adv, mask, w, is_peer,
                         norm=Normaliser(num_tokens=9.0, num_seqs=3.0))
    # -(2·1 + 3·(-1) + 0.904837·4·0.5)/(2+3+4) = -(0.809675)/9 = -0.0899639
    assert float(loss) == pytest.approx(-0.0899639, abs=1e-6)
    assert float(st["clip_self"]) == 0 and float(st["clip_peer"]) == 0


# --------------------------------------------------------------------------------------------- losses
def test_ppo_token_two_response_example_by_hand():
    # self: 2 tokens, Â = +1, ρ = [1.5, 0.9]: -min(1.5, 1.28) = -1.28; -min(0.9, 0.9) = -0.9
    # peer: 1 token, Â = -1, ρ = 0.7, w = 0.5: -min(-0.7, -0.8) = 0.8, × 0.5 = 0.4
    # token-mean over 3 tokens: (-1.28 - 0.9 + 0.4)/3 = -0.593333
    logp, old, adv, mask = _loss_tensors([([-1.0, -1.0], [math.log(1.5), math.log(0.9)], 1.0),
                                          ([-2.0], [math.log(0.7)], -1.0)])
    loss, st = call_loss(ppo_token_loss, logp, old, adv, mask, torch.tensor([1.0, 0.5]), torch.tensor([False, True]),
                              clip_low=0.2, clip_high=0.28, norm=Normaliser(num_tokens=3.0, num_seqs=2.0))
    assert float(loss) == pytest.approx(-0.593333, abs=1e-5)
    assert float(st["clip_self"]) == 1 and float(st["clip_peer"]) == 1


def test_luffy_loss_by_hand():
    # self token: ρ = 1, Â = 1 → -1; peer token: π = 0.5, f = 0.5/0.6 = 0.833333, Â = 2 → -1.666667
    # token-mean: (-1 - 1.666667)/2 = -1.333333
    logp, old, adv, mask = _loss_tensors([([-0.3], [0.0], 1.0), ([-9.0], [math.log(0.5) + 9.0], 2.0)])
    loss, st = call_loss(POLICY_LOSSES.get("luffy"), logp, old, adv, mask, torch.ones(2), torch.tensor([False, True]),
                                          norm=Normaliser(num_tokens=2.0, num_seqs=2.0))
    assert float(loss) == pytest.approx(-1.333333, abs=1e-5)
    assert float(st["clip_peer"]) == 0


def test_hacpo_peer_loss_by_hand():
    # self: log-ratios [0.001, 0]: s = exp(0.0005) = 1.00050013 > 1 + 4e-4 → clipped 1.0004, Â = 1 → -1.0004
    # peer: target mean over 2 scored tokens (-1, -2) = -1.5, source mean -1.2 → s_x = exp(-0.3) = 0.740818;
    #   m = 0: L = 0.8 → ŝ = 0.8; c = 2, Â = 0.5 → objective 0.8·0.8·2·0.5 = 0.64 → -0.64
    # seq-mean-token-mean over 2 sequences: (-1.0004 - 0.64)/2 = -0.8202
    logp, old, adv, mask = _loss_tensors([([-1.0, -1.0], [0.001, 0.0], 1.0), ([-1.0, -2.0, -5.0], [0, 0, 0], 0.5)])
    extra = {"n_scored": [None, 2], "source_logp_mean": [None, -1.2], "hacpo_c": [None, 2.0]}
    f = POLICY_LOSSES.get("hacpo_peer")
    kw = dict(clip_low=3e-4, clip_high=4e-4, agg="seq-mean-token-mean", norm=Normaliser(5.0, 2.0), extra=extra)
    loss, _ = call_loss(f, logp, old, adv, mask, torch.ones(2), torch.tensor([False, True]), mb_index=0, **kw)
    assert float(loss) == pytest.approx(-0.8202, abs=1e-5)
    # m = 2: L = 0.85 → objective 0.85²·2·0.5 = 0.7225 → (-1.0004 - 0.7225)/2 = -0.86145
    loss, _ = call_loss(f, logp, old, adv, mask, torch.ones(2), torch.tensor([False, True]), mb_index=2, **kw)
    assert float(loss) == pytest.approx(-0.86145, abs=1e-5)


def test_ppo_token_nll_by_hand():
    # PG row: 2 tokens, ρ = 1, Â = 1 → -2 over the PG denominator 2 (the aux row excluded) = -1
    # aux row: log-probs [-0.5, -1.5] → token-mean NLL 1.0; λ = 0.1; 1 aux row → +0.1; total -0.9
    logp, old, adv, mask = _loss_tensors([([-1.0, -1.0], [0.0, 0.0], 1.0), ([-0.5, -1.5], [0.0, 0.0], 0.0)])
    in_pg = torch.tensor([True, False])  # the second row is outside the policy gradient; λ = nll_coef = 0.1
    loss, st = call_loss(POLICY_LOSSES.get("ppo_token_nll"), logp, old, adv, mask, torch.ones(2),
                         torch.tensor([False, True]), norm=Normaliser(2.0, 1.0, aux_seqs=1.0), in_pg=in_pg,
                         nll_coef=0.1)
    assert float(loss) == pytest.approx(-0.9, abs=1e-6)
    assert float(st["tokens"]) == 2 and float(st["nll_sum"]) == pytest.approx(1.0)


# ------------------------------------------------------------------------------------ re-tokenization
def test_retokenization_round_trips_between_different_tokenizers(tok_char, tok_bpe):
    texts = ["so \\boxed{42}", " 8*9=72, 72+4=76. \\boxed{76}", "the answer is \\boxed{\\frac{1}{2}}\n", ""]
    for src, dst in ((tok_char, tok_bpe), (tok_bpe, tok_char)):
        for t in texts:
            src_ids = src(t, add_special_tokens=False)["input_ids"] + [src.eos_token_id]
            decoded = src.decode(src_ids, skip_special_tokens=True)  # what the engine logs as the text
            assert decoded == t
            ids, n_scored = RT.retokenize(decoded, dst, ended_with_eos=True)
            assert ids[-1] == dst.eos_token_id and n_scored == len(ids) - 1
            assert dst.decode(ids, skip_special_tokens=True) == t
            ids2, n2 = RT.retokenize(decoded, dst, ended_with_eos=False)  # truncated: no EOS appended
            assert ids2 == ids[:-1] and n2 == n_scored
            ids3, _ = RT.retokenize(decoded, dst, ended_with_eos=True, append_eos=False)
            assert ids3 == ids[:-1]
    t = " 8*9=72, 72+4=76. \\boxed{76}"
    assert tok_char(t)["input_ids"] != tok_bpe(t)["input_ids"]  # genuinely different tokenizations


def test_retokenization_with_the_tiny_pair_tokenizers():
    tiny_tok = pytest.importorskip("graft_cli.tiny.tokenizers")
    ta, tb = tiny_tok.build_tokenizer_a(), tiny_tok.build_tokenizer_b()
    for t in [" 8*9=72, 72+4=76. \\boxed{76}", " 13-5=8. \\boxed{8}"]:
        for src, dst in ((ta, tb), (tb, ta)):
            text = src.decode(src(t, add_special_tokens=False)["input_ids"] + [src.eos_token_id],
                              skip_special_tokens=True)
            ids, n = RT.retokenize(text, dst, True)
            assert dst.decode(ids[:n]) == t and ids[n] == dst.eos_token_id


def test_direct_ids_when_tokenizers_identical(tok_char):
    probs = problems(2)
    other = make_char_tokenizer()
    assert RT.tokenizers_identical(tok_char, other)
    sa, sb = make_step("a", tok_char, probs, [0, 2]), make_step("b", other, probs, [3, 0])
    ctx = make_ctx({"a": tok_char, "b": other})
    ex = G.GraftExchange(cfg_for(overrides=["exchange.params.direct_ids=true"]))
    a = ex.select({"a": sa, "b": sb}, ctx)[0]["a"]
    assert a.response_ids[:4] == sb.rollouts.response_ids[:4]  # ids as generated, EOS included
    assert a.extra["n_scored"][0] == len(sb.rollouts.response_ids[0]) - 1


def test_recompute_peer_logprobs_hook(tok_char, tok_bpe):
    probs = problems(2)
    sa, sb = make_step("a", tok_char, probs, [0, 2]), make_step("b", tok_bpe, probs, [3, 0])
    calls = []

    def score(name, batch):
        calls.append((name, len(batch)))
        # token t of every row scores -(t+1): mean over all but the EOS of L tokens = -(L-1+1)/2·... computed below
        return [[-(t + 1.0) for t in range(len(r))] for r in batch.response_ids]

    ctx = make_ctx({"a": tok_char, "b": tok_bpe}, score=score)
    ex = G.GraftExchange(cfg_for(overrides=["exchange.params.peer_logprobs=recompute"]))
    batches, _ = ex.select({"a": sa, "b": sb}, ctx)
    assert ("b", 4) in calls and ("a", 4) in calls
    L = len(sb.rollouts.response_ids[0])  # ends with EOS: scored tokens 1..L-1 → mean -(L/2)
    assert batches["a"].source_logp_mean[0] == pytest.approx(-L / 2)
    with pytest.raises(GraftError, match=r"Receivers\.score"):
        ex.select({"a": sa, "b": sb}, make_ctx({"a": tok_char, "b": tok_bpe}))


# ---------------------------------------------------------------------------- ordering and optimisation
def _graft_batch(B=8, grafted=(5, 7)):
    b = TrainBatch()
    for q in range(B):
        for _j in range(2):
            b.append(prompt_ids=[1], response_ids=[2, 3], advantages=1.0, weights=1.0,
                     source="peer" if q in grafted else "self", group=q)
    return b


def test_last_ordering_puts_grafted_prompts_last():
    b = _graft_batch(8, (1, 6))
    mbs = minibatch_schedule(b, 4, "last")
    groups = [sorted({b.group[i] for i in mb}) for mb in mbs]
    assert groups == [[0, 2], [3, 4], [5, 7], [1, 6]]  # own groups in prompt order, grafted ones last
    mbs = minibatch_schedule(b, 4, "first")
    assert [sorted({b.group[i] for i in mb}) for mb in mbs][0] == [1, 6]
    # 3 grafted groups over minibatches of 2 prompts: a boundary minibatch mixes own and grafted groups
    b = _graft_batch(8, (0, 3, 6))
    groups = [[b.group[i] for i in mb][::2] for mb in minibatch_schedule(b, 4, "last")]
    assert groups == [[1, 2], [4, 5], [7, 0], [3, 6]]


@pytest.fixture(scope="module")
def random_policy(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from graft_cli.train.policies import Policy

    path = make_random_model(str(tmp_path_factory.mktemp("m") / "r"), "qwen3", seed=3)

    def make(lr):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(path)
        tok = make_char_tokenizer()
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        return Policy("a", model, tok, opt, None, {})

    return make


def _record_loss(records):
    from graft_cli.algorithms.losses import LossSpec

    base = POLICY_LOSSES.get("ppo_token")

    def loss(inp):
        out = base(inp)
        ratio = torch.exp(inp.logp.detach() - inp.old_logp)[inp.mask > 0]
        records.append({"mb": inp.mb_index, "max_dev": float((ratio - 1).abs().max()),
                        "clip_self": float(out[1]["clip_self"]), "clip_peer": float(out[1]["clip_peer"]),
                        "peer_tokens": float(out[1]["tokens_peer"])})
        return out

    return LossSpec("test_record_ppo", loss, {})


def _exchange_batch(tok, seed=0):
    """8 prompts × 4 responses of a receiver, 3 groups grafted from a peer (same tokenizer for simplicity)."""
    rng = np.random.default_rng(seed)
    probs = problems(8)
    k_a = [0, 0, 0, 2, 1, 3, 2, 1]
    k_b = [2, 1, 3, 0, 0, 0, 0, 4]
    sa, sb = make_step("a", tok, probs, k_a), make_step("b", tok, probs, k_b)
    for st in (sa, sb):  # varied response texts so that log-probs differ
        for r in range(len(st.rollouts.texts)):
            t = "".join(rng.choice(list("0123456789+=x ")) for _ in range(int(rng.integers(4, 12))))
            st.rollouts.texts[r] = t
            st.rollouts.response_ids[r] = tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ctx = make_ctx({"a": tok, "b": tok})
    return sa, sb, ctx


@pytest.mark.parametrize("ordering", ["last", "first"])
def test_first_minibatch_ratio_one_and_peer_last_clipping(random_policy, ordering):
    from graft_cli.train.old_logprobs import score_logprobs
    from graft_cli.train.update import UpdateContext, update_policy

    pol = random_policy(lr=0.05)
    cfg = cfg_for("graft", ["algo.minibatch_prompts=2", "exchange.params.gate=none"])
    sa, sb, ctx = _exchange_batch(pol.tokenizer)
    ex = G.GraftExchange(cfg)
    batches, met = ex.select({"a": sa, "b": sb}, ctx)
    b = batches["a"]
    # B→A candidates q0,q1,q2; A→B candidates q3..q6: m = 3 → a receives q0,q1,q2 (k_B = 2,1,3)
    assert met["a"]["graft/selected"] == 3 and met["b"]["graft/selected"] == 3
    b.old_logprobs = score_logprobs(pol, b, cfg)
    b, am = ex.admit("a", b, ctx)
    assert am["graft/admitted"] == 12
    records = []
    POLICY_LOSSES._items["test_record_ppo_" + ordering] = _record_loss(records)
    cfg.algo.loss, cfg.exchange.ordering = "test_record_ppo_" + ordering, ordering
    out = update_policy(pol, b, UpdateContext(cfg, rng=np.random.default_rng(0)))
    assert out["num_minibatches"] == 4
    first = [r for r in records if r["mb"] == 0]
    assert first and all(r["max_dev"] < 1e-5 and r["clip_self"] == 0 and r["clip_peer"] == 0 for r in first)
    peer_mbs = sorted({r["mb"] for r in records if r["peer_tokens"] > 0})
    if ordering == "last":
        assert peer_mbs == [2, 3]  # 3 grafted groups over minibatches of 2 prompts: the last two
        assert sum(r["clip_peer"] for r in records if r["mb"] >= 2) > 0  # earlier updates moved ρ: clipping acts
        assert out["clip_ratio/peer"] > 0 and out["clip_ratio/peer_any"] == 1.0
    else:
        assert peer_mbs == [0, 1]


def test_graft_update_without_transfer_equals_grpo(random_policy):
    """No prompt triggers: GRAFT's batch and update are GRPO's, parameter for parameter."""
    from graft_cli.train.old_logprobs import score_logprobs
    from graft_cli.train.update import UpdateContext, update_policy

    tok = make_char_tokenizer()
    probs = problems(4)
    sa, sb = make_step("a", tok, probs, [1, 2, 0, 4]), make_step("b", tok, probs, [0, 2, 0, 4])
    ctx = make_ctx({"a": tok, "b": tok})
    cfg = cfg_for("graft", ["algo.minibatch_prompts=2"])
    params = []
    for build in ("graft", "grpo"):
        pol = random_policy(lr=0.01)
        if build == "graft":
            ex = G.GraftExchange(cfg)
            b = ex.select({"a": sa, "b": sb}, ctx)[0]["a"]
            b.old_logprobs = score_logprobs(pol, b, cfg)
            b, _ = ex.admit("a", b, ctx)
        else:
            b = self_batch(sa)
            b.old_logprobs = score_logprobs(pol, b, cfg)
        cfg.exchange.ordering = "last"
        update_policy(pol, b, UpdateContext(cfg, rng=np.random.default_rng(0)))
        params.append(torch.cat([p.detach().flatten() for p in pol.model.parameters()]))
    assert torch.equal(params[0], params[1])


# ------------------------------------------------------------------------------------------- validation
def test_params_validation_is_one_line():
    from graft_cli.config import compose

    with pytest.raises(GraftError, match="exchange.params.bogus"):
        compose(["method=graft", "exchange.params.bogus=1"])
    with pytest.raises(GraftError, match="exchange.params.gate"):
        compose(["method=graft", "exchange.params.gate=maybe"])
    with pytest.raises(GraftError, match="algo.loss"):
        compose(["method=graft", "exchange.params.mode=sft"])
    with pytest.raises(GraftError, match="exchange.params.delta"):
        compose(["method=graft", "exchange.params.delta=abc"])
    assert "graft" in EXCHANGES and "graft_stored" in EXCHANGES


# ------------------------------------------------------------------------------------- stored variant
def _write_partner_log(run_dir, st: PolicyStep, step: int, seed: int = 0):
    from graft_cli.train.step_logs import StepLogs

    st.rollouts.meta["extracted"] = [None] * len(st.rollouts)
    StepLogs(str(run_dir), step, seed).rollouts(st)


def _stored_cfg(run_dir, extra=()):
    return cfg_for("graft_stored", [f"exchange.params.partner_run={run_dir}", "exchange.params.partner_policy=b",
                                    "reward.num_workers=0", *extra])


class _StoredGraft:
    """The stored-trajectory exchange as the trainer runs it: the partner's step comes from the rollout-log
    source (graded by the trainer's grader), then the GRAFT exchange builds the receiver's batch."""

    def __init__(self, cfg):
        from graft_cli.algorithms.advantages import ADVANTAGES
        from graft_cli.reward import make_grader
        from graft_cli.train.sources import STEP_SOURCES

        self.exchange = EXCHANGES.get("graft_stored")(cfg)
        self.grader = make_grader(cfg.reward, num_workers=0, timeout_s=5.0)
        (sc,) = cfg.sources
        self.source = STEP_SOURCES.get(sc.kind)(sc, self.grader, ADVANTAGES.get(cfg.algo.advantage), cfg.algo,
                                                cfg.run.seed)

    def select(self, steps, ctx):
        ctx.receiver_names = list(steps)
        (recv,) = steps.values()
        part, smet = self.source.step(recv.problems, ctx.step)
        batches, metrics = self.exchange.select({**steps, self.source.name: part}, ctx)
        for m in metrics.values():
            m.update(smet)
        return batches, metrics


def test_stored_graft_equals_online_graft(tmp_path, tok_char, tok_bpe):
    probs = problems(6)
    # n = 4: B→A candidates q0 (k_B 2), q3 (1) (q2 is all-correct); A→B has one candidate, q1
    k_a, k_b = [0, 3, 0, 0, 0, 0], [2, 0, 4, 1, 0, 0]
    trunc = [False] * 24
    trunc[1] = True
    sa, sb = make_step("a", tok_char, probs, k_a), make_step("b", tok_bpe, probs, k_b, truncated=trunc, lp=-0.3)
    for step in (0, 1):
        _write_partner_log(tmp_path, sb, step)
    cfg = _stored_cfg(tmp_path)
    assert [p.name for p in cfg.policies] == ["a"] and cfg.exchange.params["receiver"] == "a"
    stored = _StoredGraft(cfg)
    online = G.GraftExchange(cfg_for("graft", ["exchange.params.selection=unbalanced"]))
    ctx2 = make_ctx({"a": tok_char, "b": tok_bpe}, step=1)
    want, wmet = online.select({"a": sa, "b": sb}, ctx2)
    got, gmet = stored.select({"a": sa}, make_ctx({"a": tok_char}, step=1))
    assert set(got) == {"a"}
    for c in TrainBatch.COLUMNS:
        assert getattr(got["a"], c) == getattr(want["a"], c), c
    for k in ("n_scored", "src_policy"):
        assert got["a"].extra[k] == want["a"].extra[k]
    assert gmet["a"]["graft/selected"] == 2 and gmet["a"]["graft/reverify_changed"] == 0
    assert got["a"].group.count(0) == 4 and got["a"].source[:4] == ["peer"] * 4
    # one-way, no balancing: both candidates move; online balanced GRAFT would move only m = min(2, 1) = 1 (q0)
    bal = G.GraftExchange(cfg_for("graft")).select({"a": sa, "b": sb}, ctx2)[1]
    assert bal["a"]["graft/selected"] == 1 and bal["a"]["graft/m"] == 1


def test_stored_graft_reverifies_rewards(tmp_path, tok_char, tok_bpe):
    probs = problems(2)
    sa, sb = make_step("a", tok_char, probs, [0, 0]), make_step("b", tok_bpe, probs, [2, 0])
    sb.rewards[0] = torch.tensor([1.0, 1.0, 1.0, 1.0])  # the log claims 4 successes; only 2 verify
    _write_partner_log(tmp_path, sb, 0)
    ex = _StoredGraft(_stored_cfg(tmp_path))
    b, met = ex.select({"a": sa}, make_ctx({"a": tok_char}))
    assert met["a"]["graft/reverify_changed"] == 2
    # re-verified [1,1,0,0]: mean .5, unbiased std 0.57735 → ±0.866025
    assert b["a"].advantages[:4] == pytest.approx([0.866025, 0.866025, -0.866025, -0.866025], abs=1e-5)


def test_stored_graft_refuses_mismatched_prompts_and_steps(tmp_path, tok_char, tok_bpe):
    probs = problems(3)
    sb = make_step("b", tok_bpe, list(reversed(probs)), [1, 0, 0])
    _write_partner_log(tmp_path, sb, 0, seed=7)
    ex = _StoredGraft(_stored_cfg(tmp_path))
    sa = make_step("a", tok_char, probs, [0, 0, 0])
    with pytest.raises(GraftError, match="prompt order differs") as e:
        ex.select({"a": sa}, make_ctx({"a": tok_char}))
    assert "\n" not in str(e.value) and "data seed [7]" in str(e.value)
    with pytest.raises(GraftError, match="no partner rollout log"):
        ex.select({"a": sa}, make_ctx({"a": tok_char}, step=5))
    # a file whose step column disagrees with its name
    src = os.path.join(tmp_path, "rollouts", "b", "step_000001.parquet")
    os.replace(src, os.path.join(tmp_path, "rollouts", "b", "step_000002.parquet"))
    with pytest.raises(GraftError, match="step mismatch"):
        ex.select({"a": sa}, make_ctx({"a": tok_char}, step=1))
    with pytest.raises(GraftError, match="partner_run"):
        cfg_for("graft_stored", [f"exchange.params.partner_run={tmp_path}/nope", "exchange.params.partner_policy=b"])


# ------------------------------------------------------------------------------------------ end to end
SPLIT_REWARD = '''
import numpy as np
from graft_cli.reward import REWARDS
from graft_cli.reward.pool import Grades


@REWARDS.register("split_by_policy")
class SplitByPolicy:
    """Policy a (graded first in each step, policy_workers=1) fails the first half of the prompts and is mixed on
    the rest; b the other way round: every step each policy receives on half the batch (GRAFT's balance m = B/2)."""

    def __init__(self, **_):
        self.calls = 0

    def start(self, wait=True):
        return self

    def grade(self, texts, golds):
        self.calls += 1
        n, B = 4, len(texts) // 4
        fail_low = self.calls % 2 == 1
        r = [0.0 if ((i // n) < B // 2) == fail_low else float(i % 2) for i in range(len(texts))]
        return Grades(np.array(r, dtype=np.float32), np.zeros(len(texts), dtype=bool), [None] * len(texts))

    def close(self):
        pass
'''


def test_graft_train_cli_writes_graft_metrics(tiny_models, problems_file, tmp_path):
    """`graft train --method graft` with a reward that makes each policy all-fail on half the prompts, where its
    peer is mixed: every step transfers (m = B/2 = 2 prompts, 4 responses each per receiver) and the gate's counts
    add up (admitted + dropped = transferred), with the peer clip metrics written."""
    plugin = tmp_path / "split_reward.py"
    plugin.write_text(SPLIT_REWARD)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    args = ["train", "--pair", "tiny", "--method", "graft", "--steps", "2", "--name", "g", "--no-progress",
            *train_overrides(tiny_models, problems_file, str(tmp_path),
                             ["rollout.max_new_tokens=16", f"plugins=[{plugin}]", "reward.name=split_by_policy",
                              "run.policy_workers=1"])]
    r = subprocess.run([sys.executable, "-m", "graft_cli.cli", *args], cwd=ROOT, env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    with open(tmp_path / "g" / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    assert [(x["step"], x["policy"]) for x in rows] == [(1, "a"), (1, "b"), (2, "a"), (2, "b")]
    for row in rows:
        assert row["frac_all_fail"] == 0.5 and row["reward"] == 0.25
        assert (row["graft/candidates"], row["graft/selected"], row["graft/m"]) == (2, 2, 2)
        assert row["graft/transferred"] == 2 * 4  # two prompts' peer groups of 4
        assert row["graft/admitted"] + row["graft/dropped"] == row["graft/transferred"]
        assert "graft/s_mean" in row and "clip_ratio/self" in row
        if row["graft/admitted"]:
            assert "clip_ratio/peer" in row


def test_graft_stored_trains_against_a_grpo_run(tiny_models, problems_file, tmp_path):
    """A GRPO run of the pair writes rollout logs; a stored-trajectory run of receiver a reads b's logs."""
    from graft_cli.config import compose
    from graft_cli.train.run import train

    ov = train_overrides(tiny_models, problems_file, str(tmp_path), ["rollout.max_new_tokens=16", "run.steps=2"])
    partner = train(compose(["method=grpo", "run.name=partner", *ov]), progress=False)
    cfg = compose(["method=graft_stored", "run.name=stored", f"exchange.params.partner_run={partner}",
                   "exchange.params.partner_policy=b", *ov])
    assert [p.name for p in cfg.policies] == ["a"]
    out = train(cfg, progress=False)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    assert [(x["step"], x["policy"]) for x in rows] == [(1, "a"), (2, "a")]
    for row in rows:
        assert row["graft/reverify_changed"] == 0 and "graft/selected" in row and "graft/partner_reward" in row
    # a partner run with a different data seed is refused with one line
    bad = compose(["method=graft_stored", "run.name=stored2", f"exchange.params.partner_run={partner}",
                   "exchange.params.partner_policy=b", *ov, "run.seed=5"])
    with pytest.raises(GraftError, match="prompt order differs"):
        train(bad, progress=False)
    assert not os.path.exists(os.path.join(str(tmp_path), "stored2"))  # found before step 1: nothing written
    # a partner that covers fewer steps than this run: its missing log is named before step 1, not at step 3
    ov3 = train_overrides(tiny_models, problems_file, str(tmp_path), ["rollout.max_new_tokens=16", "run.steps=3"])
    short = compose(["method=graft_stored", "run.name=stored3", f"exchange.params.partner_run={partner}",
                     "exchange.params.partner_policy=b", *ov3])
    with pytest.raises(GraftError, match="no partner rollout log .*step_000003.parquet for step 3"):
        train(short, progress=False)
    assert not os.path.exists(os.path.join(str(tmp_path), "stored3"))


# ------------------------------------------------------------------ EOS-only and empty peer responses
def custom_step(name, tok, responses, rewards):
    """One prompt; ``responses``: (text, ended, log-probs: a list, or one value for every token) each, ids = the
    text's tokens (+ EOS)."""
    from graft_cli.algorithms.advantages import grpo_advantages

    probs = problems(1)
    ids = [tok(t, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if e else []) for t, e, _ in responses]
    lps = [list(lp) if isinstance(lp, list) else [lp] * len(i) for i, (_, _, lp) in zip(ids, responses)]
    assert [len(x) for x in lps] == [len(i) for i in ids]
    ro = Rollouts([tok(p.problem)["input_ids"] for p in probs], ids, [t for t, _, _ in responses], lps,
                  [not e for _, e, _ in responses], n=len(responses))
    r = torch.tensor([rewards], dtype=torch.float32)
    return PolicyStep(name, probs, [tok(p.problem + "=")["input_ids"] for p in probs], ro, r, grpo_advantages(r))


EOS_ONLY = ("", True, [-0.8])  # the source wrote only its EOS; that token's log-prob −0.8


def test_eos_only_peer_row_keeps_its_eos_as_the_released_code(tok_char, tok_bpe):
    # HACPO's materialize_rollout_records keeps an EOS-only response's EOS (its one action): the source mean is
    # −0.8, and build_training_view gives the learner its own EOS, scored (n_scored 1)
    src = custom_step("b", tok_bpe, [EOS_ONLY, ("so 4", True, -0.5)], [0.0, 1.0])
    opts = G.GraftParams(append_eos=True)
    rows = replacement.peer_group_rows(src, 0, [5, 6], tok_char, opts, "b")
    assert rows.response_ids[0] == [tok_char.eos_token_id] and rows.extra["n_scored"][0] == 1
    assert rows.source_logp_mean[0] == pytest.approx(-0.8) and "src_logp_mean" not in rows.extra
    assert rows.source_logp_mean[1] == pytest.approx(-0.5)  # an ordinary response: its EOS left out
    same = replacement.peer_group_rows(src, 0, [5, 6], tok_bpe, opts, "b", same_tokenizer=True)
    assert same.response_ids[0] == [tok_bpe.eos_token_id] and same.extra["n_scored"][0] == 1
    assert gates.source_mean_logprob([-0.8], True) == pytest.approx(-0.8)
    assert math.isnan(gates.source_mean_logprob([], True))


def test_hacpo_loss_on_an_eos_only_peer_row():
    # one peer row, the receiver's EOS at log-prob −1.0, the source's −0.8: s_x = exp(−0.2) = 0.818731 ∈ [L_0, 1]
    # → ŝ = 0.818731, objective ŝ²·c·Â = 0.670320 (c = 1, Â = 1), loss −0.670320 (N = 1); a ratio taken as 1
    # (the mean over no token) would give −1
    spec = POLICY_LOSSES.get("hacpo_peer")
    lp = torch.tensor([[-1.0]])
    cols = {"n_scored": [1], "source_logp_mean": [-0.8], "hacpo_c": [1.0]}
    loss, _ = call_loss(spec, lp, lp.clone(), torch.ones(1, 1), torch.ones(1, 1), torch.ones(1),
                        torch.tensor([True]), norm=Normaliser(1.0, 1.0), agg="seq-mean-token-mean", extra=cols,
                        clip_low=3e-4, clip_high=4e-4)
    assert float(loss) == pytest.approx(-math.exp(-0.2) ** 2, abs=1e-6)
    with pytest.raises(ValueError, match="no source mean log-prob"):
        call_loss(spec, lp, lp.clone(), torch.ones(1, 1), torch.ones(1, 1), torch.ones(1), torch.tensor([True]),
                  norm=Normaliser(1.0, 1.0), agg="seq-mean-token-mean", extra={**cols, "source_logp_mean": [None]})


def test_hacpo_refuses_an_empty_peer_response(tok_char, tok_bpe):
    # a truncated response of one pad token decodes to "" and encodes to no learner token: HACPO's
    # build_training_view raises on it; graft stops with one line naming the policy and the prompt
    src = custom_step("b", tok_bpe, [("so 4", True, -0.5), ("so 4", True, -0.5)], [0.0, 1.0])
    src.rollouts.response_ids[1], src.rollouts.texts[1] = [tok_bpe.pad_token_id], ""
    src.rollouts.logprobs[1], src.rollouts.truncated[1] = [-0.3], True
    recv = custom_step("a", tok_char, [("so 4", True, -0.5), ("so 5", True, -0.5)], [0.0, 0.0])
    ctx = make_ctx({"a": tok_char, "b": tok_bpe})
    with pytest.raises(GraftError, match=r"HACPO: a response of policy 'b' to prompt 0 has no token to score"):
        G.GraftExchange(cfg_for("hacpo", ["exchange.params.peer_logprobs=rollout"])).select({"a": recv, "b": src},
                                                                                             ctx)


def test_graft_gate_scores_an_eos_only_response_and_drops_an_empty_one(tok_char, tok_bpe):
    # s = exp(mean log π_old^R − mean log π_S): the EOS-only row scores its receiver EOS (−1.0) against the
    # source EOS (−0.8): s = 0.818731 > δ = 0.8, admitted with w = s; an empty row (nothing to score) has no s
    # and the floor drops it
    assert gates.compatibility([-1.0], 1, -0.8) == pytest.approx(math.exp(-0.2))
    assert math.isnan(gates.compatibility([-1.0], 0, -0.8)) and math.isnan(gates.compatibility([-1.0], 1, math.nan))
    recv = custom_step("a", tok_char, [("so 5", True, -0.5), ("so 6", True, -0.5)], [0.0, 0.0])
    src = custom_step("b", tok_bpe, [EOS_ONLY, ("so \\boxed{1}", True, -0.5)], [0.0, 1.0])
    ctx = make_ctx({"a": tok_char, "b": tok_bpe})
    ex = G.GraftExchange(cfg_for("graft_nobalance", ["exchange.params.peer_logprobs=rollout"]))
    b = ex.select({"a": recv, "b": src}, ctx)[0]["a"]
    assert b.source == ["peer", "peer"] and b.response_ids[0] == [tok_char.eos_token_id]
    b.old_logprobs = [[-1.0], [-0.5] * len(b.response_ids[1])]
    b, met = ex.admit("a", b, ctx)
    assert b.extra["graft_s"][0] == pytest.approx(math.exp(-0.2)) and b.weights[0] == pytest.approx(math.exp(-0.2))
    assert met["graft/admitted"] == 2


def test_sgt_nll_on_an_eos_only_correct_peer_response(tok_char, tok_bpe):
    # SGT's NLL row for a correct EOS-only response is the receiver's EOS alone: NLL = −log π(EOS) = 1.0 for
    # log-prob −1.0, so the loss is λ·1.0 = 0.1 (no PG row carries an advantage)
    recv = custom_step("a", tok_char, [("so 5", True, -0.5), ("so 6", True, -0.5)], [0.0, 0.0])
    src = custom_step("b", tok_bpe, [EOS_ONLY, ("so 6", True, -0.5)], [1.0, 0.0])
    b = G.GraftExchange(cfg_for("sgt")).select({"a": recv, "b": src}, make_ctx({"a": tok_char, "b": tok_bpe}))[0]["a"]
    assert b.source == ["self", "self", "peer"] and b.in_pg[2] is False
    assert b.response_ids[2] == [tok_char.eos_token_id] and b.extra["n_scored"][2] == 1
    spec = POLICY_LOSSES.get("ppo_token_nll")
    lp = torch.tensor([[-1.0]])
    norm = Normaliser(0.0, 0.0, aux_seqs=1.0)
    loss, st = call_loss(spec, lp, lp.clone(), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1),
                         torch.tensor([True]), norm=norm, in_pg=torch.tensor([False]))
    assert float(loss) == pytest.approx(0.1) and float(st["nll_sum"]) == pytest.approx(1.0)


# ------------------------------------------------------------------ decoding for re-tokenization
CLEANUP_TEXT = "so x = 3 , y = 4 . it is n't 7 ! is it ?"


def test_decode_keeps_the_text_a_clean_up_tokenizer_would_change():
    # a tokenizer whose config sets clean_up_tokenization_spaces (as many hub tokenizers do): its default decode
    # drops the spaces before , . ! ? and n't; decode_responses keeps the text the source wrote
    tok = make_char_tokenizer()
    tok.clean_up_tokenization_spaces = True
    ids = tok(CLEANUP_TEXT, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    cleaned = tok.decode(ids, skip_special_tokens=True)
    assert cleaned == "so x = 3, y = 4. it isn't 7! is it?"  # what the default would hand the receiver
    assert RT.decode_responses(tok, [ids]) == [CLEANUP_TEXT]
    recv_ids, n_scored = RT.retokenize(RT.decode_responses(tok, [ids])[0], make_char_tokenizer(), True)
    assert n_scored == len(CLEANUP_TEXT) and len(tok(cleaned, add_special_tokens=False)["input_ids"]) < n_scored


def shipped_tokenizers():
    """Every tokenizer the tests use: conftest's character tokenizer, test_graft's byte-level BPE, the tiny pair's
    a, b and c and the tiny code model's (as built), hacpo_compare's character tokenizer (97 ids, no newline) and
    the random-weight real shapes' synthetic tokenizer."""
    from graft_cli.models.shapes import char_tokenizer, shape_config, synthetic_tokenizer
    from graft_cli.tiny import code, tokenizers as T

    return {"char": make_char_tokenizer(), "bpe": tok_bpe.__wrapped__(), "tiny_a": T.build_tokenizer_a(),
            "tiny_b": T.build_tokenizer_b(), "tiny_c": T.build_tokenizer_c(), "tiny_code": code.build_tokenizer(),
            "hacpo_compare": char_tokenizer(97),
            "synthetic": synthetic_tokenizer(shape_config("Qwen/Qwen3-1.7B-Base", shrink=True))}


def test_a_sources_text_survives_decode_encode_decode_on_every_shipped_tokenizer():
    texts = [CLEANUP_TEXT, "Let's compute: 12 + 30 = 42.\n\nSo the answer is \\boxed{42}.", "a  b\t c ,d", ""]
    for name, tok in shipped_tokenizers().items():
        checked = 0
        for t in texts:
            ids = tok(t, add_special_tokens=False)["input_ids"]
            if tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) != t:
                continue  # the tokenizer cannot write this text at all (an unknown character): nothing to keep
            first = RT.decode_responses(tok, [ids + [tok.eos_token_id]])[0]
            again = RT.decode_responses(tok, [tok(first, add_special_tokens=False)["input_ids"]])[0]
            assert first == t and again == t, (name, t)
            checked += 1
        assert checked >= 2, name  # the empty text and at least one other
