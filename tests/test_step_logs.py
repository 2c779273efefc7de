"""What a step leaves besides metrics.jsonl (graft_cli/train/step_logs.py): the rollout and exchange logs, kept
for the last run.keep_rollouts steps, and the step's rollout metrics."""

from __future__ import annotations

import os

import pandas as pd
import pytest
import torch

from graft_cli.batch import PolicyStep, Rollouts, TrainBatch
from graft_cli.data.problems import Problem
from graft_cli.rundir import exchange_log_path, rollout_log_path
from graft_cli.train.step_logs import StepLogs, peer_rows_per_prompt, rollout_metrics


def _step() -> PolicyStep:
    probs = [Problem("q0", "1+1", "2"), Problem("q1", "2+2", "4")]
    ro = Rollouts([[1], [1]], [[5, 6], [7], [8, 9, 10], [11]], ["a", "b", "c", "d"],
                  [[-0.1, -0.2], [-0.3], [-0.4, -0.5, -0.6], [-0.7]], [False, True, False, False], n=2)
    ro.meta["extracted"] = ["2", None, "4", "5"]
    rew = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    return PolicyStep("a", probs, [[1], [1]], ro, rew, torch.tensor([[0.5, -0.5], [0.5, -0.5]]))


def test_rollout_logs_hold_one_row_per_sample_and_keep_the_last_k_steps(tmp_path):
    st = _step()
    for step in (1, 2, 3):
        StepLogs(str(tmp_path), step, seed=7, keep=2).rollouts(st, peer_rows=[3, 0])
    kept = [s for s in (1, 2, 3) if os.path.exists(rollout_log_path(str(tmp_path), "a", s))]
    assert kept == [2, 3]
    df = pd.read_parquet(rollout_log_path(str(tmp_path), "a", 3))
    assert list(df["prompt_id"]) == ["q0", "q0", "q1", "q1"] and list(df["sample_index"]) == [0, 1, 0, 1]
    assert list(df["peer_rows"]) == [3, 3, 0, 0] and list(df["data_seed"]) == [7] * 4
    assert list(df["reward"]) == [1.0, 0.0, 1.0, 0.0] and list(df["truncated"]) == [False, True, False, False]
    assert [list(x) for x in df["rollout_logprobs"]] == [[-0.1, -0.2], [-0.3], [-0.4, -0.5, -0.6], [-0.7]]


def test_exchange_log_only_when_a_row_was_transferred(tmp_path):
    st = _step()
    logs = StepLogs(str(tmp_path), 1, seed=0)
    logs.admission("a", st, None)
    logs.admission("a", st, {"prompt_index": []})
    assert not os.path.exists(exchange_log_path(str(tmp_path), "a", 1))
    logs.admission("a", st, {"prompt_index": [1, 0], "s": [0.9, 0.2], "admitted": [True, False]})
    df = pd.read_parquet(exchange_log_path(str(tmp_path), "a", 1))
    assert list(df["prompt_id"]) == ["q1", "q0"] and list(df["admitted"]) == [True, False]


def test_rollout_metrics_and_peer_rows_by_hand():
    m = rollout_metrics(_step())
    assert m["reward"] == 0.5 and m["frac_all_fail"] == 0.0 and m["frac_all_correct"] == 0.0
    assert m["num_tokens"] == 7 and m["completions/max_length"] == 3 and m["completions/min_length"] == 1
    assert m["completions/clipped_ratio"] == 0.25
    assert m["completions/mean_terminated_length"] == pytest.approx((2 + 3 + 1) / 3)
    b = TrainBatch()
    for src, g in (("self", 0), ("peer", 1), ("peer", 1), ("peer", 0)):
        b.append(prompt_ids=[1], response_ids=[2], advantages=0.0, weights=1.0, source=src, group=g, rewards=0.0,
                 rollout_logprobs=None, texts="")
    assert peer_rows_per_prompt(b, 2) == [1, 2]


def test_a_rollout_log_reads_back_as_a_partner_step_and_an_earlier_column_name_is_renamed(tmp_path):
    from graft_cli.data.rollout_logs import read_partner_step

    st = _step()
    StepLogs(str(tmp_path), 1, seed=7, keep=2).rollouts(st)
    path = rollout_log_path(str(tmp_path), "a", 1)
    log = read_partner_step(path, 1, st.problems, data_seed=7)
    assert log["n"] == 2 and log["rollout_logprobs"][2] == pytest.approx([-0.4, -0.5, -0.6])
    old = pd.read_parquet(path).rename(columns={"rollout_logprobs": "gen_logprobs"})
    old.to_parquet(path)  # a log written before the column was renamed
    log = read_partner_step(path, 1, st.problems, data_seed=7)
    assert "gen_logprobs" not in log and log["rollout_logprobs"][3] == pytest.approx([-0.7])


@pytest.mark.parametrize("older", ["sampler_logprobs", "gen_logprobs"])
def test_a_hand_written_log_with_an_older_log_prob_column_is_a_stored_step(tmp_path, older):
    """A partner run's rollout log written before the column was `rollout_logprobs` (`sampler_logprobs`, and before
    that `gen_logprobs`) is checked and read as a stored step with its log-probs under the current name."""
    from types import SimpleNamespace

    from graft_cli.data.rollout_logs import check_partner_step
    from graft_cli.train.sources import RolloutLogSource

    probs = [Problem("q0", "1+1", "2"), Problem("q1", "2+2", "4")]
    path = rollout_log_path(str(tmp_path), "b", 0)
    os.makedirs(os.path.dirname(path))
    pd.DataFrame({"step": [0] * 4, "prompt_index": [0, 0, 1, 1], "prompt_id": ["q0", "q0", "q1", "q1"],
                  "sample_index": [0, 1, 0, 1], "response": ["2", "3", "4", "5"], "token_ids": [[5], [6, 7], [8], [9]],
                  older: [[-0.1], [-0.2, -0.3], [-0.4], [-0.5]], "truncated": [False] * 4,
                  "reward": [1.0, 0.0, 1.0, 0.0], "advantage": [0.7, -0.7, 0.7, -0.7], "data_seed": [3] * 4,
                  }).to_parquet(path)
    check_partner_step(path, 0, probs, data_seed=3)
    src = RolloutLogSource(SimpleNamespace(name="b", run=str(tmp_path), policy="b", reverify=False), None, None, None,
                           data_seed=3)
    st, met = src.step(probs, 0)
    assert st.rollouts.logprobs == [[-0.1], [-0.2, -0.3], [-0.4], [-0.5]]
    assert met == {"graft/partner_reward": 0.5} and torch.allclose(st.advantages, torch.tensor([[0.7, -0.7]] * 2))
