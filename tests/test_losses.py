"""PPO clipped token surrogate, aggregation modes, micro-batch accumulation, clip stats, ppo_seq.

ε_low = 0.2, ε_high = 0.28 (graft.md §1, §7). Every expected number is worked by hand in the comments.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import call_loss

from graft_cli.algorithms.losses import (
    POLICY_LOSSES,
    Normaliser,
    agg_loss,
    clip_stats,
    ppo_seq_loss,
    ppo_surrogate,
    ppo_token_loss,
)

LOW, HIGH = 0.2, 0.28
D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


def lg(x: float) -> float:
    return math.log(x)


# --- the per-token surrogate, one case per branch ------------------------------------------------------
# loss = -min(ρA, clip(ρ, 0.8, 1.28)·A)
#  A=+1, ρ=1.5 : ρA = 1.5,  clip·A = 1.28  -> min 1.28 -> loss -1.28 (clipped high)
#  A=-1, ρ=0.5 : ρA = -0.5, clip·A = -0.8  -> min -0.8 -> loss  0.8  (clipped low)
#  A=+2, ρ=1.1 : inside [0.8, 1.28]       -> -2.2
#  A=-3, ρ=0.9 : inside                   -> 2.7
#  A=+1, ρ=0.5 : ρA = 0.5,  clip·A = 0.8  -> min picks the UNclipped 0.5 -> loss -0.5
#  A=-1, ρ=1.5 : ρA = -1.5, clip·A = -1.28 -> min picks the unclipped -1.5 -> loss 1.5
#  A= 0, ρ=2.0 : 0
SURR_CASES = [
    (1.0, 1.5, -1.28),
    (-1.0, 0.5, 0.8),
    (2.0, 1.1, -2.2),
    (-3.0, 0.9, 2.7),
    (1.0, 0.5, -0.5),
    (-1.0, 1.5, 1.5),
    (0.0, 2.0, 0.0),
]


@pytest.mark.parametrize("adv,ratio,want", SURR_CASES)
def test_surrogate_branches(adv, ratio, want):
    loss, rho = ppo_surrogate(t([lg(ratio)]), t([0.0]), t([adv]), LOW, HIGH)
    assert rho.item() == pytest.approx(ratio, abs=1e-12)
    assert loss.item() == pytest.approx(want, abs=1e-12)


def test_surrogate_old_logp_enters_ratio():
    # logπ_θ = -1.0, logπ_old = -1.0 - ln 1.1 -> ρ = 1.1; A = 2 -> loss -2.2
    loss, rho = ppo_surrogate(t([-1.0]), t([-1.0 - lg(1.1)]), t([2.0]), LOW, HIGH)
    assert rho.item() == pytest.approx(1.1, abs=1e-12)
    assert loss.item() == pytest.approx(-2.2, abs=1e-12)


def _one_token(adv, ratio, weight=1.0, loss_name="ppo_token"):
    m = t([[1.0]])
    return call_loss(POLICY_LOSSES.get(loss_name), t([[lg(ratio)]]), t([[0.0]]), t([[adv]]), m, t([weight]),
                                        torch.tensor([False]), clip_low=LOW, clip_high=HIGH,
                                        agg="token-mean", norm=Normaliser(num_tokens=1.0, num_seqs=1.0))


@pytest.mark.parametrize("adv,ratio,want", SURR_CASES)
def test_ppo_token_single_token_loss(adv, ratio, want):
    loss, _ = _one_token(adv, ratio)
    assert loss.item() == pytest.approx(want, abs=1e-12)


# --- gradient on one token --------------------------------------------------------------------------------
# With old logp 0, ρ = exp(logp) so dρ/dlogp = ρ.  Unclipped branch: d(-ρA)/dlogp = -ρA.
# Clipped branch: the clipped term is constant in logp -> gradient 0.  A weight w multiplies it.
#  A=+2, ρ=1.1  -> -2.2          A=-3, ρ=0.9 -> +2.7
#  A=+1, ρ=1.5  -> 0 (clipped)   A=-1, ρ=0.5 -> 0 (clipped)
#  A=+1, ρ=0.5  -> -0.5          A=-1, ρ=1.5 -> +1.5
#  A=+2, ρ=1.1, w=0.5 -> -1.1
GRAD_CASES = [
    (2.0, 1.1, 1.0, -2.2),
    (-3.0, 0.9, 1.0, 2.7),
    (1.0, 1.5, 1.0, 0.0),
    (-1.0, 0.5, 1.0, 0.0),
    (1.0, 0.5, 1.0, -0.5),
    (-1.0, 1.5, 1.0, 1.5),
    (2.0, 1.1, 0.5, -1.1),
]


@pytest.mark.parametrize("adv,ratio,w,want", GRAD_CASES)
def test_ppo_token_gradient_one_token(adv, ratio, w, want):
    logp = torch.tensor([[lg(ratio)]], dtype=D, requires_grad=True)  # a leaf
    loss, _ = call_loss(ppo_token_loss, logp, t([[0.0]]), t([[adv]]), t([[1.0]]), t([w]), torch.tensor([False]),
                             clip_low=LOW, clip_high=HIGH, agg="token-mean", norm=Normaliser(1.0, 1.0))
    loss.backward()
    assert logp.grad.item() == pytest.approx(want, abs=1e-12)


def test_ppo_token_gradient_divided_by_minibatch_tokens():
    # same one token, but the minibatch holds 4 tokens in all: token-mean divides by 4 -> -2.2 / 4 = -0.55
    logp = torch.tensor([[lg(1.1)]], dtype=D, requires_grad=True)
    loss, _ = call_loss(ppo_token_loss, logp, t([[0.0]]), t([[2.0]]), t([[1.0]]), t([1.0]), torch.tensor([False]),
                             clip_low=LOW, clip_high=HIGH, agg="token-mean", norm=Normaliser(4.0, 1.0))
    loss.backward()
    assert loss.item() == pytest.approx(-0.55, abs=1e-12)
    assert logp.grad.item() == pytest.approx(-0.55, abs=1e-12)


# --- aggregation modes on two sequences of lengths 4 and 2 -------------------------------------------------
# L = [[1, 2, 3, 4], [10, 20, (99), (99)]]   (the 99s are padding, masked out)
# row sums 10 and 30; lengths 4 and 2; 6 tokens, 2 sequences
#   token-mean               : (10 + 30) / 6                 = 6.666666...
#   seq-mean-token-mean      : (10/4 + 30/2) / 2 = (2.5+15)/2  = 8.75
#   seq-mean-token-sum       : (10 + 30) / 2                 = 20
#   seq-mean-token-sum-norm  : (10 + 30) / C (verl: not divided by the 2 sequences), C = 8 = 5 ;  C = 4 -> 10
LMAT = [[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 99.0, 99.0]]
MASK = [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]]
AGG_HAND = [
    ("token-mean", None, 40.0 / 6.0),
    ("seq-mean-token-mean", None, 8.75),
    ("seq-mean-token-sum", None, 20.0),
    ("seq-mean-token-sum-norm", 8.0, 5.0),
    ("seq-mean-token-sum-norm", 4.0, 10.0),
]


@pytest.mark.parametrize("mode,c,want", AGG_HAND)
def test_agg_loss_modes_hand(mode, c, want):
    got = agg_loss(t(LMAT), t(MASK), mode, Normaliser(num_tokens=6.0, num_seqs=2.0, loss_scale_factor=c))
    assert got.item() == pytest.approx(want, abs=1e-12)


def test_agg_loss_unknown_mode():
    with pytest.raises(ValueError, match="bogus"):
        agg_loss(t(LMAT), t(MASK), "bogus", Normaliser(6.0, 2.0))


# The same numbers end to end through ppo_token at ρ = 1 (logp = old_logp): the per-token loss is -A,
# so with A = 1 on row 0 and A = 3 on row 1 the loss matrix is [[-1]*4, [-3]*2]:
#   token-mean              : -(4 + 6)/6            = -1.666666...
#   seq-mean-token-mean     : -(4/4 + 6/2)/2 = -(1+3)/2 = -2
#   seq-mean-token-sum      : -(4 + 6)/2            = -5
#   seq-mean-token-sum-norm : -(4 + 6)/8 (C = 8)  = -1.25
PPO_AGG = [("token-mean", -10.0 / 6.0), ("seq-mean-token-mean", -2.0), ("seq-mean-token-sum", -5.0),
           ("seq-mean-token-sum-norm", -1.25)]


def _two_rows():
    logp = t([[-0.5, -1.0, -1.5, -2.0], [-0.3, -0.7, 0.0, 0.0]])
    adv = t([[1.0] * 4, [3.0] * 4])
    return logp, adv


@pytest.mark.parametrize("mode,want", PPO_AGG)
def test_ppo_token_aggregation_modes(mode, want):
    logp, adv = _two_rows()
    loss, _ = call_loss(ppo_token_loss, logp, logp.clone(), adv, t(MASK), t([1.0, 1.0]), torch.tensor([False, False]),
                             agg=mode, norm=Normaliser(6.0, 2.0, loss_scale_factor=8.0))
    assert loss.item() == pytest.approx(want, abs=1e-12)


# --- weights scale contributions, never the denominator ---------------------------------------------------
# weights (1, 0.5) on the ρ = 1 example above:
#   token-mean          : -(4·1 + 6·0.5)/6 = -7/6     (denominator stays 6, not 4 + 0.5·2 = 5)
#   seq-mean-token-mean : -(1 + 0.5·3)/2   = -1.25    (denominator stays 2 sequences)
#   weight 0 on row 1   : token-mean -(4)/6 = -2/3
@pytest.mark.parametrize("w,mode,want", [((1.0, 0.5), "token-mean", -7.0 / 6.0),
                                          ((1.0, 0.5), "seq-mean-token-mean", -1.25),
                                          ((1.0, 0.0), "token-mean", -4.0 / 6.0)])
def test_weights_scale_numerator_only(w, mode, want):
    logp, adv = _two_rows()
    loss, stats = call_loss(ppo_token_loss, logp, logp.clone(), adv, t(MASK), t(list(w)), torch.tensor([False, True]),
                                 agg=mode, norm=Normaliser(6.0, 2.0))
    assert loss.item() == pytest.approx(want, abs=1e-12)
    assert stats["tokens"].item() == 6  # weights don't change the token counts either


# --- micro-batch accumulation with the minibatch Normaliser == one pass -----------------------------------
def _rand_rows(seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = [5, 2, 3, 1]
    B, T = len(lens), max(lens)
    mask = torch.zeros(B, T, dtype=D)
    for i, n in enumerate(lens):
        mask[i, :n] = 1
    logp = (-torch.rand(B, T, generator=g, dtype=D) * 2)
    old = logp + (torch.rand(B, T, generator=g, dtype=D) - 0.5) * 0.8  # ratios inside and outside the clip
    adv = torch.tensor([1.3, -0.7, 0.4, -2.0], dtype=D)[:, None].expand(B, T).contiguous()
    weight = torch.tensor([1.0, 0.8, 0.9, 1.0], dtype=D)
    peer = torch.tensor([False, True, False, True])
    return logp, old, adv, mask, weight, peer, lens


@pytest.mark.parametrize("loss_name", ["ppo_token", "ppo_seq"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
def test_micro_batch_accumulation_equals_single_pass(loss_name, mode):
    logp, old, adv, mask, weight, peer, lens = _rand_rows()
    norm = Normaliser(num_tokens=float(sum(lens)), num_seqs=float(len(lens)), loss_scale_factor=5.0)
    fn = POLICY_LOSSES.get(loss_name)

    leaf = logp.clone().requires_grad_(True)
    full, full_stats = call_loss(fn, leaf, old, adv, mask, weight, peer, agg=mode, norm=norm)
    full.backward()
    g_full = leaf.grad.clone()

    leaf2 = logp.clone().requires_grad_(True)
    total, sums = 0.0, {}
    for rows in ([0, 1], [2], [3]):  # uneven micro-batches, each trimmed to its own padded width
        w = max(lens[i] for i in rows)
        part, st = call_loss(fn, leaf2[rows, :w], old[rows, :w], adv[rows, :w], mask[rows, :w], weight[rows],
                             peer[rows], agg=mode, norm=norm)
        part.backward()
        total += part.item()
        for k, v in st.items():
            sums[k] = sums.get(k, 0.0) + v.item()
    assert total == pytest.approx(full.item(), abs=1e-12)
    assert torch.allclose(leaf2.grad, g_full, atol=1e-12)
    assert sums == {k: v.item() for k, v in full_stats.items()}


# --- clip stats: counts split into self and peer -----------------------------------------------------------
def test_clip_stats_self_vs_peer_counts():
    # row 0 (self, A=+1):  ρ = (1.5, 1.0, 0.5, pad)   -> 1.5 is a high clip; 0.5 with A>0 is not clipped
    # row 1 (peer, A=-1):  ρ = (0.5, 0.7, 1.5, 1.0)   -> 0.5 and 0.7 are low clips; 1.5 with A<0 is not
    # row 2 (peer, A=+1):  ρ = (1.3, 1.29, pad, pad)  -> both high clips (> 1.28)
    # row 3 (self, A=-1):  ρ = (0.79, 0.81, 0.1 pad)  -> 0.79 low clip; the padded 0.1 never counts
    ratio = t([[1.5, 1.0, 0.5, 9.0], [0.5, 0.7, 1.5, 1.0], [1.3, 1.29, 9.0, 9.0], [0.79, 0.81, 0.1, 9.0]])
    adv = t([[1.0] * 4, [-1.0] * 4, [1.0] * 4, [-1.0] * 4])
    mask = t([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]])
    peer = torch.tensor([False, True, True, False])
    st = clip_stats(ratio, adv, mask, peer, LOW, HIGH)
    # mean ratio parts: own tokens 1.5 + 1.0 + 0.5 + 0.79 + 0.81 = 4.6 over 5; grafted 0.5 + 0.7 + 1.5 + 1.0 +
    # 1.3 + 1.29 = 6.29 over 6 (padded positions never count)
    want = {"tokens": 11, "tokens_self": 5, "tokens_peer": 6, "clip_low": 3, "clip_high": 3,
            "clip_self": 2, "clip_peer": 4, "ratio/self/sum": 4.6, "ratio/self/n": 5, "ratio/peer/sum": 6.29,
            "ratio/peer/n": 6}
    assert {k: v.item() for k, v in st.items()} == pytest.approx(want)

    # the same through ppo_token (ρ built from logp - old_logp) gives the same counts
    logp = torch.log(ratio)
    _, st2 = call_loss(ppo_token_loss, logp, torch.zeros_like(logp), adv, mask, t([1.0] * 4), peer,
                            clip_low=LOW, clip_high=HIGH, norm=Normaliser(11.0, 4.0))
    assert {k: v.item() for k, v in st2.items()} == pytest.approx(want)


def test_clip_boundaries_are_strict():
    # exactly at 1 - ε_low / 1 + ε_high nothing is clipped (clip leaves ρ unchanged there)
    ratio = t([[0.8, 1.28]])
    st = clip_stats(ratio, t([[-1.0, 1.0]]), t([[1.0, 1.0]]), torch.tensor([False]), LOW, HIGH)
    # 0.8 < 0.8 and 1.28 > 1.28 are both false (to within fp: 1 - 0.2 = 0.8, 1 + 0.28 = 1.28 exactly)
    assert st["clip_low"].item() == 0 and st["clip_high"].item() == 0


# --- ppo_seq: one shared sequence ratio = geometric mean of the token ratios -------------------------------
def test_ppo_seq_ratio_is_geometric_mean():
    # token ratios (1.2, 0.9, 1.1): s = (1.2·0.9·1.1)^(1/3) = 1.188^(1/3) = 1.0591 (inside the clip range)
    # A = 1, 3 tokens, token-mean over 3 tokens: loss = -(3·s)/3 = -s
    # gradient: ρ_t = sg(s)·π/sg(π) so dρ_t/dlogp_t = s, d loss/dlogp_t = -A·s/3 for every token
    s = 1.188 ** (1.0 / 3.0)
    logp = torch.tensor([[lg(1.2), lg(0.9), lg(1.1)]], dtype=D, requires_grad=True)
    loss, st = call_loss(ppo_seq_loss, logp, t([[0.0, 0.0, 0.0]]), t([[1.0] * 3]), t([[1.0] * 3]), t([1.0]),
                            torch.tensor([False]), clip_low=LOW, clip_high=HIGH, norm=Normaliser(3.0, 1.0))
    assert loss.item() == pytest.approx(-s, abs=1e-12)
    loss.backward()
    assert torch.allclose(logp.grad, t([[-s / 3] * 3]), atol=1e-12)
    assert st["clip_high"].item() == 0 and st["clip_low"].item() == 0


def test_ppo_seq_clips_on_the_sequence_ratio_and_ignores_padding():
    # row 0: token ratios (2.0, 1.0), the padded third position has a huge log-ratio that must be ignored:
    #   s = sqrt(2) = 1.41421 > 1.28, A = +1 -> every token clipped: per-token loss -1.28, gradient 0
    # row 1: token ratios (2.0, 0.5): s = sqrt(1) = 1 -> not clipped although each token alone would be
    #   (A = -1: per-token loss +1)
    # token-mean over 4 tokens: (-1.28·2 + 1·2)/4 = -0.14
    logp = torch.tensor([[lg(2.0), 0.0, 50.0], [lg(2.0), lg(0.5), 0.0]], dtype=D, requires_grad=True)
    mask = t([[1, 1, 0], [1, 1, 0]])
    adv = t([[1.0] * 3, [-1.0] * 3])
    loss, st = call_loss(ppo_seq_loss, logp, torch.zeros(2, 3, dtype=D), adv, mask, t([1.0, 1.0]),
                            torch.tensor([False, True]), clip_low=LOW, clip_high=HIGH, norm=Normaliser(4.0, 2.0))
    assert loss.item() == pytest.approx(-0.14, abs=1e-12)
    assert st["clip_high"].item() == 2 and st["clip_low"].item() == 0
    assert st["clip_self"].item() == 2 and st["clip_peer"].item() == 0
    loss.backward()
    # row 1 gradient: -A·s/4 = +1/4 per token; row 0 clipped -> 0; padding -> 0
    assert torch.allclose(logp.grad, t([[0.0, 0.0, 0.0], [0.25, 0.25, 0.0]]), atol=1e-12)
