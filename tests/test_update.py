"""One policy's update (graft_cli/train/update.py): the token signals of a new batch in config order, and the
update's metrics from what it accumulated (worked by hand); one policy's stages (graft_cli/train/policy_stages.py)
return new batches, and the exchange's receivers encode and score through the policies."""

from __future__ import annotations

import dataclasses

import pytest

from graft_cli.algorithms.signals import TOKEN_ADVANTAGES, register_token_advantage
from graft_cli.batch import TrainBatch
from graft_cli.train import dist as D
from graft_cli.train.update import AlgoParams, UpdateContext, _Pass, _Totals, _update_metrics, token_signals

if "test_scaled" not in TOKEN_ADVANTAGES:
    @register_token_advantage("test_scaled", scale=2.0)
    def _scaled(batch, ctx):
        """The token advantages so far (Â on every token when none) times ``scale``; reports the scale."""
        base = batch.token_adv or [[a] * len(r) for a, r in zip(batch.advantages, batch.response_ids)]
        return [[x * ctx.params.scale for x in row] for row in base], {"test/scale": ctx.params.scale}

if "test_shifted" not in TOKEN_ADVANTAGES:
    @register_token_advantage("test_shifted", shift=0.0)
    def _shifted(batch, ctx):
        """The token advantages so far (Â on every token when none) plus ``shift`` (so the order shows)."""
        base = batch.token_adv or [[a] * len(r) for a, r in zip(batch.advantages, batch.response_ids)]
        return [[x + ctx.params.shift for x in row] for row in base], {}


def _batch() -> TrainBatch:
    b = TrainBatch()
    b.append(prompt_ids=[1, 2], response_ids=[3, 4, 5], advantages=0.5, weights=1.0, source="self", group=0,
             rewards=1.0, rollout_logprobs=[-0.1, -0.2, -0.3], texts="x")
    b.append(prompt_ids=[1, 2], response_ids=[6], advantages=-1.5, weights=1.0, source="peer", group=0,
             rewards=0.0, rollout_logprobs=None, texts="y")
    b.old_logprobs = [[-0.1, -0.2, -0.3], [-0.4]]
    return b


@pytest.mark.parametrize("order,want", [
    (["test_scaled", "test_shifted"], [[1.5 + 0.25] * 3, [-4.5 + 0.25]]),  # (Â · 3) + 0.25
    (["test_shifted", "test_scaled"], [[(0.5 + 0.25) * 3] * 3, [(-1.5 + 0.25) * 3]]),  # (Â + 0.25) · 3
])
def test_token_signals_run_in_config_order_with_their_parameters(order, want):
    from graft_cli.config import compose

    algo = compose([]).algo
    algo = dataclasses.replace(algo, token_advantages=order, token_adv_params={"scale": 3.0, "shift": 0.25})
    params = AlgoParams.of(algo)
    assert params.token_adv["test_scaled"].scale == 3.0 and params.token_adv["test_shifted"].shift == 0.25
    given = _batch()
    b, met = token_signals(given, algo, params, step=0, name="a", coefs={})
    assert b.loss_mask is None  # the response mask: every token
    assert b.token_adv == want
    assert met == {"test/scale": 3.0}
    assert given.token_adv is None and b is not given  # a new batch; the one given is left as it was


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


def test_policy_stages_return_new_batches_and_the_receivers_encode_and_score_through_the_policies(tmp_path):
    """PolicyStages: old log-probs, admission, the frozen models' columns and the token signals each return the
    batch the next stage reads, the one given left as it was, and put their metrics in the policy's row;
    PolicyReceivers encodes through the policy's prompt cache and scores rows under its weights."""
    from types import SimpleNamespace

    import torch
    from conftest import make_char_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    from graft_cli.algorithms.exchange import EXCHANGES
    from graft_cli.config import compose
    from graft_cli.data.prompts import PromptSpec
    from graft_cli.train.old_logprobs import score_logprobs
    from graft_cli.train.phases import Phases
    from graft_cli.train.policies import Frozen, Policy
    from graft_cli.train.policy_stages import PolicyReceivers, PolicyStages, PolicyWork

    tok = make_char_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2)).eval()
    cfg = compose(["run.device=cpu", "optim.shared_prefix=false", "algo.old_logprobs=trainer"])
    pol = Policy("a", model, tok, None, None, {"1+1": [7, 8]})
    receivers = PolicyReceivers({"a": pol}, PromptSpec.from_config(cfg.prompt), cfg, D.Dist())
    given = dataclasses.replace(_batch(), old_logprobs=None)
    assert receivers.encode("1+1", "a") == [7, 8]
    assert receivers.score("a", given) == score_logprobs(pol, given, cfg)

    ref = Frozen("ref", model, tok, SimpleNamespace(serves=["a"], scorer="logprobs", score_column="ref_logprobs"), "0")
    stages = PolicyStages(cfg, D.Dist(), {"a": pol}, {"ref": ref}, EXCHANGES.get("none")(cfg), None,
                          AlgoParams.of(cfg.algo), str(tmp_path)).at(0, 0, None, {}, Phases(model))
    w = PolicyWork(0, "a", None, given, {}, {"exchange/x": 1.0})
    b1 = stages.old_logprobs(w, given)
    assert given.old_logprobs is None and b1.old_logprobs == score_logprobs(pol, given, cfg)
    assert "sampling/sampling_logp_difference/mean" in w.row  # the gap on the policy's own row
    b2 = stages.admit(w, b1)
    assert b2.old_logprobs == b1.old_logprobs and w.row["exchange/x"] == 1.0
    b3 = stages.frozen_columns(w, b2)
    assert "ref_logprobs" not in b2.extra and b3.extra["ref_logprobs"] == b1.old_logprobs  # the same weights
    b4 = stages.token_signals(w, b3)
    assert b4.response_ids is b3.response_ids and b3.loss_mask is None and b3.token_adv is None
    assert {"score", "score_frozen", "signals"} <= set(w.times)
