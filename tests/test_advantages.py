"""GRPO / Dr. GRPO advantages (graft.md §1, §8 item 6; docs/spec/conventions.md §2).

Every expected value is worked by hand below (or by the small pure-Python reference ``_ref_grpo``),
never taken from the code under test.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from graft_cli.algorithms.advantages import ADVANTAGES, dr_grpo_advantages, grpo_advantages

EPS = 1e-6


def _ref_grpo(group: list[float], eps: float = EPS, norm_by_std: bool = True) -> list[float]:
    """Independent reference: plain Python floats, Bessel std from the standard library."""
    if len(group) < 2:
        return [0.0] * len(group)
    mean = sum(group) / len(group)
    if not norm_by_std:
        return [r - mean for r in group]
    std = statistics.stdev(group)  # unbiased (n - 1)
    return [(r - mean) / (std + eps) for r in group]


def _close(got: torch.Tensor, want, tol: float = 1e-6) -> None:
    want_t = torch.tensor(want, dtype=torch.float64)
    assert got.shape == want_t.shape, (got.shape, want_t.shape)
    assert torch.allclose(got.to(torch.float64), want_t, rtol=0, atol=tol), (got.tolist(), want)


# --- hand-worked groups --------------------------------------------------------------------------------
# [1,0,0,0]: mean .25; deviations (.75, -.25, -.25, -.25); Σd² = .5625 + 3·.0625 = .75;
#            unbiased var = .75/3 = .25, std = .5 -> (.75/.500001, -.25/.500001)
# [1,1,0,0]: mean .5; d = ±.5; Σd² = 1; var = 1/3; std = 0.5773502692 -> ±.5/0.5773512692 = ±0.8660239
# [1,1,1,0]: mirror of the first: (.25/.500001 ×3, -.75/.500001)
# n=8, one success: mean 1/8; Σd² = (7/8)² + 7·(1/8)² = 49/64 + 7/64 = 7/8; var = (7/8)/7 = 1/8;
#            std = 0.3535533906 -> 0.875/0.3535543906 = 2.4748668, -0.125/0.3535543906 = -0.3535524
HAND = [
    ([1.0, 0.0, 0.0, 0.0], [0.75 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001]),
    ([1.0, 1.0, 0.0, 0.0], [0.5 / 0.5773512692, 0.5 / 0.5773512692, -0.5 / 0.5773512692, -0.5 / 0.5773512692]),
    ([1.0, 1.0, 1.0, 0.0], [0.25 / 0.500001, 0.25 / 0.500001, 0.25 / 0.500001, -0.75 / 0.500001]),
    ([0, 0, 0, 1, 0, 0, 0, 0], [-0.125 / 0.3535543906] * 3 + [0.875 / 0.3535543906] + [-0.125 / 0.3535543906] * 4),
]


@pytest.mark.parametrize("rewards,want", HAND)
def test_grpo_hand_groups(rewards, want):
    got = grpo_advantages(torch.tensor([rewards], dtype=torch.float32))
    _close(got, [want])


def test_grpo_one_of_four_is_1p5_and_minus_0p5():
    # the brief's example: [1,0,0,0] -> [1.5, -.5, -.5, -.5] up to the ε = 1e-6 stabiliser
    got = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    _close(got, [[1.5, -0.5, -0.5, -0.5]], tol=5e-6)
    # and it is (.75)/(.5 + 1e-6) exactly, not .75/.5: ε sits in the denominator
    assert got[0, 0].item() == pytest.approx(1.4999970000059999, rel=1e-6)
    assert got[0, 0].item() < 1.5


def test_grpo_uses_unbiased_std_not_population():
    # population std of [1,0,0,0] is sqrt(.75/4) = 0.4330127 -> 0.75/0.4330127 = 1.7320508 (√3);
    # the unbiased (Bessel) std gives 1.5
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    assert grpo_advantages(r)[0, 0].item() == pytest.approx(1.5, abs=1e-5)
    assert grpo_advantages(r, unbiased=False)[0, 0].item() == pytest.approx(math.sqrt(3), abs=1e-5)


def test_grpo_groups_are_independent_and_shape_dtype():
    rewards = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
    got = grpo_advantages(torch.tensor(rewards))
    assert got.shape == (4, 4) and got.dtype == torch.float32
    _close(got, [HAND[0][1], HAND[1][1], [0.0] * 4, [0.0] * 4])


@pytest.mark.parametrize("value", [0.0, 1.0, 0.3])
def test_zero_variance_group_gets_exactly_zero(value):
    got = grpo_advantages(torch.full((2, 8), value))
    assert torch.equal(got, torch.zeros(2, 8))
    assert torch.equal(dr_grpo_advantages(torch.full((2, 8), value)), torch.zeros(2, 8))


@pytest.mark.parametrize("fn", [grpo_advantages, dr_grpo_advantages])
def test_single_response_group_gets_zero(fn):
    got = fn(torch.tensor([[1.0], [0.0], [0.7]]))
    assert got.shape == (3, 1)
    assert torch.equal(got, torch.zeros(3, 1))


def test_grpo_against_reference_on_scalar_rewards():
    groups = [[0.2, 0.9, 0.4], [3.0, -1.0, 0.5, 0.5, 2.0], [0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0]]
    for g in groups:
        got = grpo_advantages(torch.tensor([g], dtype=torch.float32))
        _close(got, [_ref_grpo(g)], tol=1e-5)


def test_advantages_sum_to_zero_per_group():
    r = torch.tensor([[1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]])
    assert abs(grpo_advantages(r).sum().item()) < 1e-5


# --- Dr. GRPO: r - mean, no std ------------------------------------------------------------------------
def test_dr_grpo_hand():
    # [1,0,0,0]: mean .25 -> (.75, -.25, -.25, -.25); [1,1,1,0]: mean .75 -> (.25, .25, .25, -.75)
    got = dr_grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]]))
    _close(got, [[0.75, -0.25, -0.25, -0.25], [0.25, 0.25, 0.25, -0.75]])
    # n = 8 with 2 successes: mean .25 -> (.75 ×2, -.25 ×6), independent of the std
    got = dr_grpo_advantages(torch.tensor([[1.0, 1.0, 0, 0, 0, 0, 0, 0]]))
    _close(got, [[0.75, 0.75] + [-0.25] * 6])
    # the norm_by_std=False switch of grpo is the same estimator
    _close(grpo_advantages(torch.tensor([[0.2, 0.9, 0.4]]), norm_by_std=False),
           [_ref_grpo([0.2, 0.9, 0.4], norm_by_std=False)])


def test_registry_names():
    assert ADVANTAGES.get("grpo") is grpo_advantages
    assert ADVANTAGES.get("dr_grpo") is dr_grpo_advantages
    # registry call with a config-style eps keyword
    got = ADVANTAGES.get("grpo")(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), eps=1e-6)
    _close(got, [HAND[0][1]])
