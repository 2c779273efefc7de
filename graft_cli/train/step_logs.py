"""What a step leaves besides metrics.jsonl: each policy's rollout log
``rollouts/<policy>/step_N.parquet`` and exchange log ``rollouts/<policy>/exchange_step_N.parquet``
(kept for the last ``run.keep_rollouts`` steps), and the per-step rollout metrics."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from graft_cli.batch import PolicyStep, TrainBatch
from graft_cli.rundir import exchange_log_path, rollout_log_path, write_parquet


@dataclass
class StepLogs:
    """The logs of one finished step (1-based ``step``) of the run in ``out``."""

    out: str
    step: int
    seed: int
    keep: int = 0

    def rollouts(self, st: PolicyStep, peer_rows: list[int] | None = None) -> None:
        """``rollouts/<policy>/step_N.parquet``: the policy's own samples of the step, one row each,
        with ``peer_rows``: how many rows of another policy's responses the update used on that
        prompt (after the exchange's admission; 0 without exchange). The rescue analysis
        (graft_cli/eval/rescue.py) reads it."""
        n = st.n
        B = len(st.problems)
        ro = st.rollouts
        cols = {
            "step": [self.step] * (B * n),
            "prompt_index": [i for i in range(B) for _ in range(n)],
            "prompt_id": [p.id for p in st.problems for _ in range(n)],
            "sample_index": [j for _ in range(B) for j in range(n)],
            "answer": [p.answer for p in st.problems for _ in range(n)],
            "response": ro.texts,
            "token_ids": ro.response_ids,
            "rollout_logprobs": ro.logprobs,
            "truncated": ro.truncated,
            "reward": st.rewards.flatten().tolist(),
            "advantage": st.advantages.flatten().tolist(),
            "extracted": ro.meta.get("extracted", [None] * (B * n)),
            "data_seed": [self.seed] * (B * n),
            "version": [int(st.version)] * (B * n),  # the weights' version it was sampled with (train/rollouts.py)
            "peer_rows": [int((peer_rows or [0] * B)[i]) for i in range(B) for _ in range(n)],
            **ro.token_columns,  # engine columns (tandem: author, 1 = senior)
        }
        write_parquet(rollout_log_path(self.out, st.name, self.step), cols)
        rotate_log(rollout_log_path, self.out, st.name, self.step, self.keep)

    def admission(self, name: str, st: PolicyStep, cols: dict | None) -> None:
        """``rollouts/<policy>/exchange_step_N.parquet``: every row another policy's response put
        into this policy's batch this step, kept or dropped by the exchange's admission (``cols``:
        the exchange's ``admission_log``, e.g. the compatibility score s), with the step and prompt
        id. Written only when the exchange logs (``cols`` not None) and a row was transferred."""
        if not cols or not cols.get("prompt_index"):
            return
        k = len(cols["prompt_index"])
        write_parquet(exchange_log_path(self.out, name, self.step),
                      {"step": [self.step] * k, "prompt_id": [st.problems[q].id for q in cols["prompt_index"]],
                       **cols})
        rotate_log(exchange_log_path, self.out, name, self.step, self.keep)


def rotate_log(log_path, out: str, policy: str, step: int, keep: int) -> None:
    """``run.keep_rollouts`` = k > 0: only the last k steps' logs (``log_path(out, policy, step)``)
    stay."""
    if keep > 0 and step >= keep:
        old = log_path(out, policy, step - keep)
        if os.path.exists(old):
            os.remove(old)


def rollout_metrics(step: PolicyStep) -> dict:
    if not len(step.rollouts):  # dynamic sampling kept no group
        return {"num_tokens": 0}
    r = step.rewards
    lens = np.array([len(x) for x in step.rollouts.response_ids])
    trunc = np.array(step.rollouts.truncated)
    term = lens[~trunc]
    return {
        "reward": float(r.mean()),
        "reward_std": float(r.std()) if r.numel() > 1 else 0.0,
        "frac_reward_zero_std": float((r.std(-1) == 0).float().mean()) if r.shape[1] > 1 else 1.0,
        "frac_all_fail": float((step.k == 0).float().mean()),
        "frac_all_correct": float((step.k == step.n).float().mean()),
        "completions/mean_length": float(lens.mean()),
        "completions/min_length": int(lens.min()),
        "completions/max_length": int(lens.max()),
        "completions/mean_terminated_length": float(term.mean()) if term.size else 0.0,
        "completions/clipped_ratio": float(trunc.mean()),
        "num_tokens": int(lens.sum()),
    }


def peer_rows_per_prompt(batch: TrainBatch, num_prompts: int) -> list[int]:
    """Per prompt index, the rows of ``batch`` that are not the policy's own samples (``source !=
    'self'``)."""
    out = [0] * num_prompts
    for g, s in zip(batch.group, batch.source):
        if s != "self" and g is not None and 0 <= int(g) < num_prompts:
            out[int(g)] += 1
    return out
