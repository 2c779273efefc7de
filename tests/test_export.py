"""graft export: a run's checkpoint as Hugging Face folders that from_pretrained
loads and that score exactly as the checkpoint does; a damaged checkpoint, a missing step or policy and an existing
folder are one line with nothing written."""

import os

import pytest
import torch
from click.testing import CliRunner
from conftest import train_overrides

from graft_cli.config import compose


@pytest.fixture(scope="module")
def run(tiny_models, problems_file, tmp_path_factory):
    from graft_cli.train.run import train

    out = str(tmp_path_factory.mktemp("export_run"))
    cfg = compose(["method=grpo", *train_overrides(tiny_models, problems_file, out, ["run.steps=2", "run.name=r",
                                                                                      "run.keep_checkpoints=3"])])
    return train(cfg, progress=False)


def _logits(path: str) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return m(torch.tensor([[3, 5, 7, 9, 11, 2]])).logits


def test_export_writes_loadable_folders_that_score_as_the_checkpoint(run, tmp_path):
    from graft_cli.cli import main

    out = str(tmp_path / "hf")
    res = CliRunner().invoke(main, ["export", run, "--out", out, "--step", "1"])
    assert res.exit_code == 0, res.output
    assert sorted(os.listdir(out)) == ["a", "b"]
    for p in ("a", "b"):
        files = set(os.listdir(os.path.join(out, p)))
        assert {"config.json", "model.safetensors"} <= files and "optimizer.pt" not in files
        ck = os.path.join(run, "checkpoints", "step_000001", p)
        assert torch.equal(_logits(os.path.join(out, p)), _logits(ck))
    # the newest by default, one policy: step 2's weights differ from step 1's (the export follows the step)
    res = CliRunner().invoke(main, ["export", run, "--out", str(tmp_path / "last"), "--policy", "a"])
    assert res.exit_code == 0 and os.listdir(tmp_path / "last") == ["a"], res.output
    assert not torch.equal(_logits(str(tmp_path / "last" / "a")), _logits(os.path.join(out, "a")))
    assert torch.equal(_logits(str(tmp_path / "last" / "a")),
                       _logits(os.path.join(run, "checkpoints", "step_000002", "a")))


def test_export_refuses_in_one_line_and_writes_nothing(run, tmp_path):
    import shutil

    from graft_cli.cli import main

    def bad(args, needle):
        res = CliRunner().invoke(main, ["export", *args])
        assert res.exit_code == 2 and res.stderr.count("\n") == 1 and needle in res.stderr, res.output
    out = str(tmp_path / "x")
    bad([run, "--out", out, "--step", "7"], "--step 7: no complete checkpoint of that step")
    bad([run, "--out", out, "--policy", "c"], "--policy c: not in checkpoint step 2 (policies: a, b)")
    assert not os.path.exists(out)
    # a damaged checkpoint: a flipped byte in the weights fails the manifest
    copy = str(tmp_path / "run")
    shutil.copytree(run, copy)
    w = os.path.join(copy, "checkpoints", "step_000002", "b", "model.safetensors")
    data = bytearray(open(w, "rb").read())
    data[-1] ^= 0xFF
    open(w, "wb").write(bytes(data))
    bad([copy, "--out", out, "--step", "2"], "checkpoint step 2 does not verify")
    assert not os.path.exists(out)
    # the default skips to the newest that verifies
    res = CliRunner().invoke(main, ["export", copy, "--out", out])
    assert res.exit_code == 0 and torch.equal(_logits(os.path.join(out, "b")),
                                              _logits(os.path.join(run, "checkpoints", "step_000001", "b")))
    bad([copy, "--out", out], f"{os.path.join(out, 'a')}: exists")
