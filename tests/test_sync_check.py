"""run.sync_check (graft_cli/train/sync_check.py): the probe gap against values worked by hand, an engine in sync
passes, and each planted break (a stale copy, the base model instead of the adapted one, a sync that never happens)
stops the run in one line naming the policy and the gap."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
from conftest import make_random_model, metric_rows, write_problems

from graft_cli.errors import GraftError
from graft_cli.models import lora
from graft_cli.rollout.hf import HFEngine
from graft_cli.train import sync_check as S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRAFT = [sys.executable, "-m", "graft_cli.cli"]


def test_the_gap_is_the_mean_absolute_difference_per_token():
    # tokens: |−1.0−(−1.5)| = 0.5, |−2.0−(−2.0)| = 0, |−0.25−(−0.5)| = 0.25 → mean 0.25
    assert S.probe_gap([[-1.0, -2.0], [-0.25]], [[-1.5, -2.0], [-0.5]]) == pytest.approx(0.25)
    assert S.probe_gap([[-1.0]], [[-1.0, -2.0]]) == float("inf")  # an engine that scored other tokens
    assert S.tolerance("float32", None) == 1e-3 and S.tolerance("bfloat16", None) == 5e-2
    assert S.tolerance("float32", 0.3) == 0.3


@pytest.fixture(scope="module")
def model_and_tok(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = make_random_model(str(tmp_path_factory.mktemp("sync") / "a"), "qwen3", 0)
    return path, AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def _probe(tok):
    return S.make_probe([tok.encode("3+4="), tok.encode("12+1=")], ["7", "13"], tok)


def test_the_probe_is_the_prompts_answered_by_boxed_answers_and_eos(model_and_tok):
    _, _, tok = model_and_tok
    p = _probe(tok)
    assert [tok.decode(list(r)) for r in p.responses] == [f" \\boxed{{{a}}}{tok.eos_token}" for a in ("7", "13")]
    assert [list(x) for x in p.prompts] == [tok.encode("3+4="), tok.encode("12+1=")]


def _nudge(model, seed=0, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * scale)


def test_an_engine_in_sync_passes_and_a_stale_copy_is_stopped(model_and_tok):
    _, model, tok = model_and_tok
    model = copy.deepcopy(model)
    probe = _probe(tok)
    engine = HFEngine(model, tok)
    m = S.check("a", engine, model, tok.pad_token_id, probe, 1e-3, "hf", 1)
    assert m["sync/gap"] < 1e-5  # the same weights: the engine's plain forward vs the trainer's chunked one
    stale = HFEngine(copy.deepcopy(model), tok)  # a sync that copied nothing
    _nudge(model)
    with pytest.raises(GraftError, match=r"policy 'a': the hf engine does not sample from the trained weights after "
                                         r"the weight sync of step 3: .* by [0-9.e-]+ nats/token"):
        S.check("a", stale, model, tok.pad_token_id, probe, 1e-3, "hf", 3)
    engine.sync_weights(model)
    assert S.check("a", engine, model, tok.pad_token_id, probe, 1e-3, "hf", 3)["sync/gap"] < 1e-5


def test_an_engine_sampling_the_base_instead_of_the_adapter_is_stopped(model_and_tok):
    path, _, tok = model_and_tok
    from transformers import AutoModelForCausalLM

    m = lora.wrap(AutoModelForCausalLM.from_pretrained(path), 4, 16.0, 0.0, "all-linear", "default")
    _nudge(m, scale=0.2)  # the adapter trained away from B = 0
    probe = _probe(tok)

    class BaseOnly(HFEngine):  # an engine that lost the adapter: the base model's forward
        def score(self, prompt_ids, response_ids):
            with lora.adapter_off(self.model):
                return super().score(prompt_ids, response_ids)

    assert S.check("a", HFEngine(m, tok), m, tok.pad_token_id, probe, 1e-3, "hf", 1)["sync/gap"] < 1e-5
    with pytest.raises(GraftError, match="policy 'a'"):
        S.check("a", BaseOnly(m, tok), m, tok.pad_token_id, probe, 1e-3, "hf", 1)
    # the merged weights an engine that loads full weights receives are in sync
    merged = AutoModelForCausalLM.from_pretrained(path)
    merged.load_state_dict(lora.merged_state_dict(m))
    assert S.check("a", HFEngine(merged, tok), m, tok.pad_token_id, probe, 1e-3, "hf", 1)["sync/gap"] < 1e-4


def test_modes_first_and_off_and_an_engine_that_cannot_score(model_and_tok):
    _, model, tok = model_and_tok

    class Pol:
        def __init__(self, engine):
            self.engine, self.model, self.tokenizer = engine, model, tok

    stale = Pol(HFEngine(copy.deepcopy(model), tok))
    warned = []
    first = S.SyncCheck("first", 1e-3, "hf", warned.append)
    first.probe("a", [tok.encode("3+4=")], ["7"], tok)
    assert set(first("a", Pol(HFEngine(model, tok)), 1)) == {"sync/gap", "time/sync_check"}
    assert first("a", stale, 2) == {}  # checked once only
    off = S.SyncCheck("off", 1e-3, "hf", warned.append)
    off.probe("a", [tok.encode("3+4=")], ["7"], tok)
    assert off("a", stale, 1) == {}

    class Mute(HFEngine):
        def score(self, prompt_ids, response_ids):
            raise NotImplementedError("the Mute engine cannot score token ids")

    every = S.SyncCheck("every", 1e-3, "mute", warned.append)
    every.probe("a", [tok.encode("3+4=")], ["7"], tok)
    assert every("a", Pol(Mute(model, tok)), 1) == {} and every("a", stale, 2) == {}
    assert warned == ["run.sync_check: off: the Mute engine cannot score token ids"]


# ----------------------------------------------------------------------------------------------- through the CLI
STALE_PLUGIN = '''
import copy
from graft_cli.rollout import ENGINES
from graft_cli.rollout.hf import HFEngine


@ENGINES.register("hf_stale")
class StaleEngine(HFEngine):
    """Samples from a copy of the initial weights that no sync updates (the silent failure)."""

    def __init__(self, model, tokenizer, **kw):
        super().__init__(copy.deepcopy(model), tokenizer, **kw)

    def sync_weights(self, model):
        pass
'''


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("sync_cli")
    plugin = d / "stale_engine.py"
    plugin.write_text(STALE_PLUGIN)
    return {"a": make_random_model(str(d / "a"), "qwen3", 0, sft_steps=40),
            "data": write_problems(str(d / "train.jsonl")), "plugin": str(plugin)}


def _train(w, out, extra, lora_r=0):
    pol = f"{{name: a, model: '{w['a']}'" + (f", lora: {{r: {lora_r}}}}}" if lora_r else "}")
    cmd = GRAFT + ["train", "--method", "grpo", "--steps", "2", "--no-progress", "--out", out, "--name", "r",
                   f"policies=[{pol}]", f"data.train={w['data']}", "data.prompt_batch=4", "algo.minibatch_prompts=2",
                   "rollout.n=4", "rollout.max_new_tokens=10", "reward.num_workers=1", "optim.lr=1e-2", *extra]
    return subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("lora_r", [0, 4])
def test_a_run_logs_the_gap_and_a_stale_engine_stops_it_after_its_first_sync(world, tmp_path, lora_r):
    ok = _train(world, str(tmp_path / "ok"), [], lora_r)
    assert ok.returncode == 0, ok.stderr[-2000:]
    gaps = [r["sync/gap"] for r in metric_rows(str(tmp_path / "ok" / "r"))]
    assert len(gaps) == 2 and all(0 <= g < 1e-4 for g in gaps)
    bad = _train(world, str(tmp_path / "bad"), [f"plugins=[{world['plugin']}]", "rollout.engine=hf_stale"], lora_r)
    assert bad.returncode != 0
    last = bad.stderr.strip().splitlines()[-1]
    assert "policy 'a': the hf_stale engine does not sample from the trained weights after the weight sync of step 1" \
        in last and "nats/token" in last, bad.stderr[-2000:]
