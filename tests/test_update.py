"""One policy's update (graft_cli/train/update.py): the token signals written into the batch in config order, and
the update's metrics from what it accumulated (worked by hand)."""

from __future__ import annotations

import dataclasses

import pytest

from graft_cli.algorithms.signals import TOKEN_ADVANTAGES, register_token_advantage, token_adv_params
from graft_cli.batch import TrainBatch
from graft_cli.train import dist as D
from graft_cli.train.update import UpdateContext, _Pass, _Totals, _update_metrics, token_signals

if "test_scaled" not in TOKEN_ADVANTAGES:
    @register_token_advantage("test_scaled", scale=2.0)
    def _scaled(batch, ctx):
        """The token advantages so far (Â on every token when none) times ``scale``; reports the scale."""
        base = batch.token_adv or [[a] * len(r) for a, r in zip(batch.advantages, batch.response_ids)]
        return [[x * ctx.params["scale"] for x in row] for row in base], {"test/scale": ctx.params["scale"]}

if "test_shifted" not in TOKEN_ADVANTAGES:
    @register_token_advantage("test_shifted", shift=0.0)
    def _shifted(batch, ctx):
        """The token advantages so far (Â on every token when none) plus ``shift`` (so the order shows)."""
        base = batch.token_adv or [[a] * len(r) for a, r in zip(batch.advantages, batch.response_ids)]
        return [[x + ctx.params["shift"] for x in row] for row in base], {}


def _batch() -> TrainBatch:
    b = TrainBatch()
    b.append(prompt_ids=[1, 2], response_ids=[3, 4, 5], advantages=0.5, weights=1.0, source="self", group=0,
             rewards=1.0, sampler_logprobs=[-0.1, -0.2, -0.3], texts="x")
    b.append(prompt_ids=[1, 2], response_ids=[6], advantages=-1.5, weights=1.0, source="peer", group=0,
             rewards=0.0, sampler_logprobs=None, texts="y")
    b.old_logprobs = [[-0.1, -0.2, -0.3], [-0.4]]
    return b


@pytest.mark.parametrize("order,want", [
    (["test_scaled", "test_shifted"], [[1.5 + 0.25] * 3, [-4.5 + 0.25]]),  # (Â · 3) + 0.25
    (["test_shifted", "test_scaled"], [[(0.5 + 0.25) * 3] * 3, [(-1.5 + 0.25) * 3]]),  # (Â + 0.25) · 3
])
def test_token_signals_run_in_config_order_with_their_parameters(order, want):
    from graft_cli.config import compose

    algo = compose([]).algo
    algo = dataclasses.replace(algo, token_advantages=order)
    params = token_adv_params(order, {"scale": 3.0, "shift": 0.25})
    b = _batch()
    met = token_signals(b, algo, params, step=0, name="a", coefs={})
    assert b.loss_mask is None  # the response mask: every token
    assert b.token_adv == want
    assert met == {"test/scale": 3.0}


def test_update_metrics_from_the_accumulated_sums():
    """Clip fractions over the loss tokens, self and peer apart; <name>/sum and <name>/n as a mean; other loss
    statistics as loss/<name>; loss and gradient norm averaged over the optimizer steps; entropy per token."""
    from graft_cli.config import compose

    cfg = compose(["algo.log_entropy=true"])
    acc = _Totals(stats={"tokens": 10.0, "tokens_self": 6.0, "tokens_peer": 4.0, "clip_low": 1.0, "clip_high": 2.0,
                         "clip_self": 1.0, "clip_peer": 2.0, "kl/sum": 0.5, "kl/n": 5.0, "pg": 0.3},
                  losses=[1.0, 3.0], grad_norms=[0.5, 1.5], ent_sum=2.0, ent_n=4.0, skipped=1)
    out = _update_metrics(_Pass(None, TrainBatch(), None, UpdateContext(cfg), D.Dist()), acc)
    assert out == pytest.approx({
        "loss": 2.0, "grad_norm": 1.0, "clip_ratio/low_mean": 0.1, "clip_ratio/high_mean": 0.2,
        "clip_ratio/region_mean": 0.3, "clip_ratio/self": 1 / 6, "num_minibatches": 2, "train/nonfinite_skipped": 1,
        "clip_ratio/peer": 0.5, "clip_ratio/peer_any": 1.0, "kl": 0.1, "loss/pg": 0.3, "entropy": 0.5})
