"""Policies stepped in parallel threads (``run.policy_workers``, graft_cli/train/parallel.py) give exactly the
samples, metrics and weights of stepping them one after the other."""

from __future__ import annotations

import json
import os
import threading

import pytest
import torch
from conftest import metric_rows, train_overrides

from graft_cli.config import compose
from graft_cli.rundir import read_jsonl
from graft_cli.train import parallel as PP


@pytest.mark.parametrize("requested,n,threads,dev,dist,want", [
    (0, 2, 2, "cpu", False, 2),   # auto: one thread per policy when the cores allow
    (0, 2, 1, "cpu", False, 1),   # one core: sequential
    (0, 3, 2, "cpu", False, 2),   # more policies than cores: as many workers as cores
    (0, 2, 8, "cuda", False, 1),  # CUDA: sequential unless asked
    (2, 2, 1, "cuda", False, 2),  # asked explicitly
    (4, 2, 8, "cpu", False, 2),   # never more workers than policies
    (0, 2, 8, "cpu", True, 1),    # data-parallel ranks stay in lock-step
    (0, 1, 8, "cpu", False, 1),   # one policy
])
def test_resolve_workers_table(requested, n, threads, dev, dist, want):
    assert PP.resolve_workers(requested, n, threads, dev, dist) == want


def test_pool_keeps_order_and_raises():
    pool = PP.PolicyPool(2)
    seen = []
    assert pool.map(lambda x: (seen.append(threading.current_thread().name), x * x)[1], [3, 1, 2]) == [9, 1, 4]
    with pytest.raises(ValueError, match="boom"):
        pool.map(lambda x: (_ for _ in ()).throw(ValueError("boom")) if x == 1 else x, [0, 1])
    pool.close()
    assert PP.PolicyPool(1).map(lambda x: x + 1, [1, 2]) == [2, 3]


def test_locked_grader_serialises_calls():
    inside, peak = [0], [0]

    class Slow:
        num_workers = 3

        def grade(self, xs):
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
            threading.Event().wait(0.02)
            inside[0] -= 1
            return xs

    g = PP.LockedGrader(Slow())
    threads = [threading.Thread(target=g.grade, args=([i],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 1 and g.num_workers == 3


def _weights(run_dir: str) -> dict:
    from safetensors.torch import load_file

    ck = os.path.join(run_dir, "checkpoints", "step_000003")
    return {p: load_file(os.path.join(ck, p, "model.safetensors")) for p in ("a", "b")}


@pytest.mark.parametrize("method", ["graft", "grpo"])
def test_parallel_policies_equal_sequential(tiny_models, problems_file, tmp_path, method):
    from graft_cli.train.run import train

    dirs = {}
    prev = torch.get_num_threads()
    try:
        # float results depend on the intra-op thread count (reductions split differently), so the reference is
        # the sequential run on the threads each parallel worker gets: 1 worker x 1 thread vs 2 workers x 1
        for workers in (1, 2):
            cfg = compose([f"method={method}", *train_overrides(
                tiny_models, problems_file, str(tmp_path), [f"run.policy_workers={workers}", "run.steps=3",
                                                            f"run.name=w{workers}", f"run.threads={workers}"])])
            dirs[workers] = train(cfg, progress=False)
    finally:
        torch.set_num_threads(prev)
    assert metric_rows(dirs[1]) == metric_rows(dirs[2])
    for p in ("a", "b"):
        for step in (1, 3):
            f = f"rollouts/{p}/step_{step:06d}.parquet"
            import pandas as pd

            x, y = pd.read_parquet(os.path.join(dirs[1], f)), pd.read_parquet(os.path.join(dirs[2], f))
            assert x.equals(y)
    w1, w2 = _weights(dirs[1]), _weights(dirs[2])
    for p in ("a", "b"):
        assert w1[p].keys() == w2[p].keys()
        assert all(torch.equal(w1[p][k], w2[p][k]) for k in w1[p])
    if method == "graft":  # the exchange ran (grafted rows were trained on) in both
        rows = [r for r in read_jsonl(os.path.join(dirs[2], "metrics.jsonl")) if "graft/transferred" in r]
        assert rows and json.dumps(rows[0], sort_keys=True)


def float_order_runs(tiny_models, problems_file, tmp_path, key: str, extra: list[str], tag: str):
    """Two 3-step GRAFT runs on one thread, ``key`` false then true, otherwise the same; asserts that their
    metric rows agree to float summation order (the same steps and policies, losses to 1e-4 and gradient
    norms to 1e-3 relative) and returns ``(dirs, rows_off, rows_on)``, ``dirs`` keyed by False / True."""
    from graft_cli.train.run import train

    dirs = {}
    for on in (False, True):
        cfg = compose(["method=graft", *train_overrides(
            tiny_models, problems_file, str(tmp_path), [f"{key}={on}", "run.steps=3", *extra,
                                                        f"run.name={tag}{int(on)}", "run.threads=1"])])
        dirs[on] = train(cfg, progress=False)
    ra, rb = metric_rows(dirs[False]), metric_rows(dirs[True])
    assert [(r["step"], r["policy"]) for r in ra] == [(r["step"], r["policy"]) for r in rb]
    for x, y in zip(ra, rb):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-4, abs=1e-6)
        # gradient norms: float-order noise compounds through Adam's 1/sqrt(v) over the steps; measured 1.8e-4
        # relative at step 3 (a step whose norm jumps 0.21 -> 0.76); a wrong mask or normaliser moves it by >1e-2
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-3)
    return dirs, ra, rb


def test_sorted_micro_batches_match_unsorted(tiny_models, problems_file, tmp_path):
    """optim.sort_micro_batches: the same rows, gradient and normaliser, split by length into micro-batches:
    the update equals the unsorted one up to float summation order."""
    dirs, _, _ = float_order_runs(tiny_models, problems_file, tmp_path, "optim.sort_micro_batches",
                                  ["optim.micro_batch_tokens=64"], "s")
    w1, w2 = _weights(dirs[False]), _weights(dirs[True])
    for p in ("a", "b"):
        assert all(torch.allclose(w1[p][k], w2[p][k], rtol=1e-4, atol=1e-6) for k in w1[p])


def _small_llama():
    """The char tokenizer and a seeded 2-layer Llama in eval mode (the scoring tests' model)."""
    from conftest import make_char_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = make_char_tokenizer()
    torch.manual_seed(0)
    return tok, LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=2,
                                             num_key_value_heads=2)).eval()


def test_scoring_budget_changes_only_float_order():
    """A smaller scoring token budget (more, length-sorted micro-batches) gives the same log-probs to ~1e-5."""
    from graft_cli.batch import TrainBatch
    from graft_cli.models.scoring import ScoreSettings, score_rows

    tok, m = _small_llama()
    b = TrainBatch()
    g = torch.Generator().manual_seed(1)
    for i in range(24):
        n = int(torch.randint(1, 30, (1,), generator=g))
        b.append(prompt_ids=[3, 4, 5], response_ids=torch.randint(3, len(tok), (n,), generator=g).tolist(),
                 advantages=0.0, weights=1.0, source="self", group=i)
    big = score_rows(m, tok.pad_token_id, b, ScoreSettings(token_budget=100000))
    small = score_rows(m, tok.pad_token_id, b, ScoreSettings(token_budget=64))
    assert [len(x) for x in big] == [len(x) for x in small] == [len(r) for r in b.response_ids]
    assert max(abs(u - v) for x, y in zip(big, small) for u, v in zip(x, y)) < 1e-4


def test_rollout_old_logprobs_score_only_foreign_rows():
    """algo.old_logprobs=rollout: the policy's own rows keep the rollout log-probs as they are, the rows another
    policy generated are scored, and only those enter the forward pass (the speed lever); trainer mode rescores
    every row."""
    from types import SimpleNamespace

    from graft_cli import config as C
    from graft_cli.batch import TrainBatch
    from graft_cli.models.scoring import ScoreSettings, score_rows
    from graft_cli.train.old_logprobs import old_logprobs

    tok, m = _small_llama()
    b = TrainBatch()
    g = torch.Generator().manual_seed(2)
    for i in range(10):
        n = int(torch.randint(1, 12, (1,), generator=g))
        src = "b" if i in (2, 5, 6) else "self"
        b.append(prompt_ids=[3, 4, 5], response_ids=torch.randint(3, len(tok), (n,), generator=g).tolist(),
                 advantages=0.0, weights=1.0, source=src, group=i // 2, rollout_logprobs=[-0.5 - i] * n)
    seen = []
    hook = m.model.embed_tokens.register_forward_hook(lambda mod, args, out: seen.append(out.shape[0]))
    pol = SimpleNamespace(model=m, tokenizer=tok)
    full = score_rows(m, tok.pad_token_id, b, ScoreSettings(token_budget=100000))
    seen.clear()
    got = old_logprobs(pol, b, C.compose(["algo.old_logprobs=rollout", "optim.shared_prefix=false"]))
    assert sum(seen) == 3  # the three grafted rows, nothing else
    for i in range(10):
        if b.source[i] == "self":
            assert got[i] == [-0.5 - i] * len(b.response_ids[i])
        else:
            assert max(abs(u - v) for u, v in zip(got[i], full[i])) < 1e-5
    seen.clear()
    trainer = old_logprobs(pol, b, C.compose(["algo.old_logprobs=trainer", "optim.shared_prefix=false"]))
    hook.remove()
    assert sum(seen) == 10
    assert all(max(abs(u - v) for u, v in zip(x, y)) < 1e-5 for x, y in zip(trainer, full))
