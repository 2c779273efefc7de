"""Rollout correction beside TIS: verl's rejection masks (token, sequence, geometric), the IcePop
band, the per-token veto and the off-policy metrics, each against values worked by hand here."""

import math

import pytest
import torch

from graft_cli.algorithms.correction import (ROLLOUT_REJECTIONS, IcePopParams, RatioBandParams, batch_is_weights,
                                             batch_rejection, mismatch_metrics, token_veto)
from graft_cli.registry import Params

L = math.log


def _t(rows):
    """Rows of log ratios (ragged) -> (log_ratio, mask) padded with 0."""
    T = max(len(r) for r in rows)
    lr = torch.zeros(len(rows), T, dtype=torch.float64)
    m = torch.zeros_like(lr)
    for i, r in enumerate(rows):
        lr[i, :len(r)] = torch.tensor(r, dtype=torch.float64)
        m[i, :len(r)] = 1
    return lr, m


# token ratios rho and the keep decision of each rule, by hand
TOKEN_CASES = [  # (rho, threshold, threshold_lower, keep)
    (1.0, 2.0, 0.0, 1), (2.5, 2.0, 0.0, 0), (0.4, 2.0, 0.0, 0), (0.6, 2.0, 0.0, 1),  # lower 0 -> 1/2
    (2.0, 2.0, 0.0, 1), (0.5, 2.0, 0.0, 1),  # the bounds are inside
    (0.3, 3.0, 0.25, 1), (0.2, 3.0, 0.25, 0), (2.9, 3.0, 0.25, 1),
]


@pytest.mark.parametrize("rho,U,lo,keep", TOKEN_CASES)
def test_token_rejection_table(rho, U, lo, keep):
    lr, m = _t([[L(rho), 0.0]])
    got = ROLLOUT_REJECTIONS.get("token")(lr, m, RatioBandParams(threshold=U, threshold_lower=lo))
    assert got.tolist() == [[float(keep), 1.0]]


def test_sequence_and_geometric_rejection():
    # row 0: log rho 0.5, 0.5 -> product e^1 = 2.72 (> 2: sequence drops it), geometric e^0.5 = 1.65 (kept)
    # row 1: 0.3, 0.3 -> e^0.6 = 1.82 and e^0.3: both keep
    # row 2: 0.8 x 3 -> e^2.4 and e^0.8 = 2.23: both drop
    # row 3: -0.2 (one token) -> e^-0.2 = 0.82 in [0.5, 2]: kept; row 4: -0.4 x 2 -> e^-0.8 = 0.45 < 0.5 dropped by
    # sequence, geometric e^-0.4 = 0.67 kept
    lr, m = _t([[0.5, 0.5], [0.3, 0.3], [0.8, 0.8, 0.8], [-0.2], [-0.4, -0.4]])
    seq = ROLLOUT_REJECTIONS.get("sequence")(lr, m, RatioBandParams(threshold=2.0, threshold_lower=0.0))
    geo = ROLLOUT_REJECTIONS.get("geometric")(lr, m, RatioBandParams(threshold=2.0, threshold_lower=0.0))
    assert seq.tolist() == [[0, 0, 0], [1, 1, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]]
    assert geo.tolist() == [[1, 1, 0], [1, 1, 0], [0, 0, 0], [1, 0, 0], [1, 1, 0]]


def test_icepop_band_and_its_weight():
    """IcePop: band [0.5, 5] on the token ratio; its objective's weight M(k) = k inside the band, 0 outside, is the
    band mask times token TIS with C = 5 (which truncates nothing inside the band)."""
    rho = [0.4, 4.9, 5.1, 1.0, 0.5]
    lr, m = _t([[L(r) for r in rho]])
    keep = ROLLOUT_REJECTIONS.get("icepop")(lr, m, IcePopParams(alpha=0.5, beta=5.0))
    assert keep.tolist() == [[0, 1, 0, 1, 1]]
    old = [[L(r) for r in rho]]
    roll = [[0.0] * 5]
    w, _ = batch_is_weights(old, roll, ["self"], "token", 5.0)
    mask, _ = batch_rejection(old, roll, ["self"], None, "icepop", IcePopParams(alpha=0.5, beta=5.0), 0.0, False)
    eff = [a * b for a, b in zip(w[0], mask[0])]
    assert eff == pytest.approx([0.0, 4.9, 0.0, 1.0, 0.5])


def test_token_veto():
    # threshold 0.01: row 0 holds a token with rho 0.005 -> the whole row goes; row 1's smallest is 0.02
    lr, m = _t([[0.0, L(0.005), 0.1], [L(0.02), 0.0]])
    assert token_veto(lr, m, 0.01).tolist() == [[0.0], [1.0]]
    # the padding of row 1 (log ratio 0) is not a token: a veto threshold above 1 drops every row with a token
    assert token_veto(lr, m, 1.5).tolist() == [[0.0], [0.0]]


def test_mismatch_metrics_by_hand():
    # one response, two tokens: pi_old = (1/2, 1/4), pi_rollout = (1/4, 1/4) -> rho = (2, 1)
    old = torch.tensor([[L(0.5), L(0.25)]], dtype=torch.float64)
    roll = torch.tensor([[L(0.25), L(0.25)]], dtype=torch.float64)
    m = torch.ones_like(old)
    got = mismatch_metrics(old, roll, m)
    want = {
        "kl": (L(0.25) - L(0.5)) / 2,  # mean(log roll - log old) = -log2 / 2
        "k3_kl": ((2 - L(2) - 1) + 0.0) / 2,
        "training_ppl": math.exp(-(L(0.5) + L(0.25)) / 2),  # 2^1.5
        "rollout_ppl": 4.0,
        "log_ppl_diff": L(0.25) - (L(0.5) + L(0.25)) / 2,  # -log2 / 2
        "log_ppl_abs_diff": L(2) / 2,
        "ppl_ratio": 2 ** -0.5,
        "chi2_token": (4 + 1) / 2 - 1,
        "chi2_seq": (2 * 1) ** 2 - 1,
    }
    assert got == pytest.approx(want, abs=1e-12)
    # a padded second response of one token with rho = 1 changes the token means and the per-response means
    old2 = torch.tensor([[L(0.5), L(0.25)], [L(0.5), 0.0]], dtype=torch.float64)
    samp2 = torch.tensor([[L(0.25), L(0.25)], [L(0.5), 0.0]], dtype=torch.float64)
    m2 = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
    got2 = mismatch_metrics(old2, samp2, m2)
    assert got2["chi2_token"] == pytest.approx((4 + 1 + 1) / 3 - 1)
    assert got2["chi2_seq"] == pytest.approx((4 + 1) / 2 - 1)
    assert got2["rollout_ppl"] == pytest.approx((4 + 2) / 2)


def test_batch_rejection_keeps_other_rows_and_the_existing_mask():
    """Only the receiver's own rows with rollout log-probs are tested; the existing loss mask (e.g. tandem's
    author mask) is multiplied, not replaced; fractions over the tested rows' tokens."""
    old = [[L(2.5), 0.0, 0.0], [0.0, 0.0], [L(9.0)], [0.0, L(3.0)]]
    roll = [[0.0, 0.0, 0.0], [0.0, 0.0], None, [0.0, 0.0]]
    source = ["self", "self", "peer", "self"]
    loss_mask = [None, [1.0, 0.0], None, [1.0, 1.0]]
    mask, met = batch_rejection(old, roll, source, loss_mask, "token", RatioBandParams(threshold=2.0), 0.0, True)
    assert mask == [[0.0, 1.0, 1.0], [1.0, 0.0], None, [1.0, 0.0]]
    assert met["rollout_corr/rs_masked_fraction"] == pytest.approx(2 / 7)  # 2 of the 7 tested tokens
    assert met["rollout_corr/rs_seq_masked_fraction"] == pytest.approx(2 / 3)
    assert met["rollout_corr/chi2_token"] == pytest.approx((2.5 ** 2 + 5 + 3.0 ** 2) / 7 - 1)
    # sequence mode with a veto: row 3's product is 3 (> 2, dropped); veto 0.5 drops nothing more (no rho < 0.5)
    mask, met = batch_rejection(old, roll, source, None, "sequence", RatioBandParams(threshold=2.0), 0.5, False)
    assert mask == [[0.0, 0.0, 0.0], [1.0, 1.0], None, [0.0, 0.0]]
    assert met == {"rollout_corr/veto_fraction": 0.0, "rollout_corr/rs_masked_fraction": pytest.approx(5 / 7),
                   "rollout_corr/rs_seq_masked_fraction": pytest.approx(2 / 3)}
    # none without veto: the mask untouched (the same object), metrics only
    lm = [None, None, None, None]
    mask, met = batch_rejection(old, roll, source, lm, "none", Params(), 0.0, True)
    assert mask is lm and set(met) == {f"rollout_corr/{k}" for k in (
        "kl", "k3_kl", "training_ppl", "rollout_ppl", "log_ppl_diff", "log_ppl_abs_diff", "ppl_ratio", "chi2_token",
        "chi2_seq")}


def test_config_checks_the_rejection_and_its_parameters():
    from graft_cli.config import compose
    from graft_cli.errors import GraftError

    assert compose([]).algo.rollout_correction.metrics is False  # off where the HF engine's log-probs are exact
    c = compose(["algo.rollout_correction.rejection=icepop"])
    assert c.algo.rollout_correction.params == {"alpha": 0.5, "beta": 5.0}
    c = compose(["algo.rollout_correction.rejection=geometric", "algo.rollout_correction.params.threshold=1.5"])
    assert c.algo.rollout_correction.params == {"threshold": 1.5, "threshold_lower": 0.0}
    for ov, msg in ((["algo.rollout_correction.rejection=tok"], r"rejection.*unknown rollout rejection mask 'tok'"),
                    (["algo.rollout_correction.rejection=token", "algo.rollout_correction.params.thresh=3"],
                     r"params.thresh': not a parameter of rejection mask 'token'; known: threshold, threshold_lower"),
                    (["algo.rollout_correction.rejection=token", "algo.rollout_correction.params.threshold=-1"],
                     r"params.threshold': must be > 0"),
                    (["algo.rollout_correction.veto_threshold=-1"], r"veto_threshold': must be >= 0")):
        with pytest.raises(GraftError, match=msg):
            compose(ov)


def test_batch_rejection_takes_the_masks_params_object_not_a_mapping():
    """The rejection mask reads its Params object (``p.threshold``); a mapping, or another mask's Params, stops with a
    TypeError naming the class it must be."""
    old, roll = [[L(2.5), 0.0]], [[0.0, 0.0]]
    # ρ = 2.5: dropped under U = 2, kept under U = 3
    assert batch_rejection(old, roll, ["self"], None, "token", RatioBandParams(threshold=3.0), 0.0, False)[0] == [
        [1.0, 1.0]]
    for bad, name in (({"threshold": 3.0}, "dict"), (IcePopParams(), "IcePopParams")):
        want = f"^rejection mask 'token': parameters must be a RatioBandParams, got {name}$"
        with pytest.raises(TypeError, match=want):
            batch_rejection(old, roll, ["self"], None, "token", bad, 0.0, False)
