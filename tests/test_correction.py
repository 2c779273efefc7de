"""Truncated importance-sampling correction (algorithms/correction.py) and its use in update_policy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from graft_cli.algorithms.correction import IS_CORRECTIONS, batch_is_weights


def test_token_and_sequence_hand_values():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, 0.0, 0.0]])
    roll = torch.tensor([[-1.5, -1.0, -0.5], [-3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    w = IS_CORRECTIONS.get("token")(old, roll, mask, 2.0)
    want = torch.tensor([[math.exp(0.5), math.exp(-1.0), 1.0], [2.0, 0.0, 0.0]])  # exp(2) truncated to C = 2
    assert torch.allclose(w, want, atol=1e-6)
    s = IS_CORRECTIONS.get("sequence")(old, roll, mask, 2.0)
    # row 0: exp(0.5 - 1 + 0) = exp(-0.5); row 1: exp(2) -> 2, on its one valid token
    assert torch.allclose(s, torch.tensor([[math.exp(-0.5)] * 3, [2.0, 0.0, 0.0]]), atol=1e-6)
    assert IS_CORRECTIONS.get("none")(old, roll, mask, 2.0) is None


def test_batch_weights_only_on_own_rows_and_metrics():
    old = [[-1.0, -2.0], [-1.0], [-0.3, -0.3, -0.3]]
    roll = [[-1.5, -1.0], [-3.0], None]
    src = ["self", "self", "peer"]
    w, met = batch_is_weights(old, roll, src, "token", 2.0)
    assert w[2] == [1.0, 1.0, 1.0]
    assert w[0] == pytest.approx([math.exp(0.5), math.exp(-1.0)]) and w[1] == pytest.approx([2.0])
    assert met["sampling/importance_sampling_ratio/max"] == pytest.approx(2.0)
    assert met["sampling/importance_sampling_ratio/min"] == pytest.approx(math.exp(-1.0))
    assert met["sampling/importance_sampling_ratio/mean"] == pytest.approx((math.exp(0.5) + math.exp(-1) + 2) / 3)
    assert met["sampling/importance_sampling_ratio/clipped_fraction"] == pytest.approx(1 / 3)  # exp(2) cut to 2
    ws, mets = batch_is_weights(old, roll, src, "sequence", 2.0)
    assert ws[0] == pytest.approx([math.exp(-0.5)] * 2) and ws[1] == pytest.approx([2.0])
    assert mets["sampling/importance_sampling_ratio/mean"] == pytest.approx((math.exp(-0.5) + 2) / 2)
    assert mets["sampling/importance_sampling_ratio/clipped_fraction"] == pytest.approx(1 / 2)
    assert batch_is_weights(old, roll, src, "none", 2.0) == (None, {})


def _update(is_weight, tmp_path):
    from conftest import make_random_model, train_overrides

    from graft_cli import config as C
    from graft_cli.models.loading import load_model, load_tokenizer
    from graft_cli.rollout import ENGINES
    from graft_cli.batch import TrainBatch
    from graft_cli.train.policies import Policy
    from graft_cli.train.update import UpdateContext, update_policy

    path = str(tmp_path / "m")
    import os

    if not os.path.exists(path):
        make_random_model(path, "qwen3", 0)
    cfg = C.compose(train_overrides({"a": path}, "unused.jsonl", str(tmp_path)))
    torch.manual_seed(0)
    model, tok = load_model(path, "float32", "cpu"), load_tokenizer(path)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    pol = Policy("a", model, tok, opt, ENGINES.get("hf")(model, tok), {})
    b = TrainBatch()
    for g in range(2):
        for j in range(2):
            resp = [10 + g + j, 20, 30 + j]
            b.append(prompt_ids=[5, 6, 7 + g], response_ids=resp, advantages=1.0 if j == 0 else -1.0, weights=1.0,
                     source="self", group=g, rewards=float(j == 0), rollout_logprobs=[-4.0] * 3, texts="")
    b.old_logprobs = [[-4.6, -4.5, -4.7]] * 4
    if is_weight is not None:  # what the `is_correction` token-advantage function leaves: Â·w per token
        b.token_adv = [[b.advantages[i] * w for w in row] for i, row in enumerate(is_weight)]
    update_policy(pol, b, UpdateContext(cfg, rng=np.random.default_rng(0)))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_unit_weights_change_nothing_and_weights_scale_the_update(tmp_path):
    base = _update(None, tmp_path)
    ones = _update([[1.0] * 3] * 4, tmp_path)
    for k in base:
        assert torch.equal(base[k], ones[k]), k
    # (a uniform scale would not show: AdamW is scale-invariant) weights that differ between rows do
    uneven = _update([[2.0, 1.0, 0.5], [1.0] * 3, [0.2] * 3, [1.0] * 3], tmp_path)
    assert any(not torch.allclose(base[k], uneven[k]) for k in base)
