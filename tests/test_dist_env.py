"""The FSDP settings graft reads from an ``accelerate launch`` config (graft_cli/train/dist.py ``accelerate_fsdp``):
accelerate sets them as environment variables; graft shards with its own FSDP2 wrapper and refuses what it cannot
honour in one line naming the config key; and the one place a process's launch rank decides whether it writes."""

import ast
import os

import pytest
from conftest import ROOT

from graft_cli.errors import GraftError
from graft_cli.train.dist import ShardSpec, accelerate_fsdp, launched_main

BASE = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "ACCELERATE_MIXED_PRECISION": "no"}


@pytest.mark.parametrize("env, spec, bf16", [
    ({}, ShardSpec(), False),
    ({"ACCELERATE_MIXED_PRECISION": "bf16"}, ShardSpec(), True),
    ({"FSDP_RESHARD_AFTER_FORWARD": "false"}, ShardSpec(reshard_after_forward=False), False),
    ({"FSDP_OFFLOAD_PARAMS": "true"}, ShardSpec(offload_params=True), False),
    ({"FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
      "FSDP_TRANSFORMER_CLS_TO_WRAP": "Qwen3DecoderLayer, LlamaDecoderLayer"},
     ShardSpec(layer_classes=("Qwen3DecoderLayer", "LlamaDecoderLayer")), False),
])
def test_launch_config_settings(env, spec, bf16):
    assert accelerate_fsdp({**BASE, **env}) == (spec, bf16)


@pytest.mark.parametrize("env, key", [
    ({"FSDP_VERSION": "1"}, "fsdp_config.fsdp_version"),
    ({"FSDP_VERSION": None}, "fsdp_config.fsdp_version"),
    ({"ACCELERATE_MIXED_PRECISION": "fp16"}, "mixed_precision"),
    ({"FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP"}, "fsdp_config.fsdp_auto_wrap_policy"),
    ({"FSDP_ACTIVATION_CHECKPOINTING": "true"}, "fsdp_config.fsdp_activation_checkpointing"),
])
def test_refused_settings_name_the_key(env, key):
    e = {k: v for k, v in {**BASE, **env}.items() if v is not None}
    with pytest.raises(GraftError) as err:
        accelerate_fsdp(e)
    msg = str(err.value)
    assert msg.startswith(f"accelerate launch config: {key}: ") and "\n" not in msg


@pytest.mark.parametrize("config", ["fsdp_4gpu.yaml", "fsdp_8gpu.yaml", "fsdp_2x8gpu.yaml"])
def test_shipped_launch_configs_are_honoured(config):
    """Each shipped accelerate config, turned into the environment by accelerate's own launcher code, shards
    every decoder layer in full with bf16 compute."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = launch_command_parser().parse_args(
        ["--config_file", os.path.join(root, "experiments", "accelerate", config), "train.py"])
    args, *_ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)
    assert env["ACCELERATE_USE_FSDP"] == "true"
    assert accelerate_fsdp(env) == (ShardSpec(), True)


def test_the_launch_rank_is_read_in_train_dist_alone(monkeypatch):
    """Whether a process writes a run's files (rank 0 of its launch) is decided from the launcher's ``RANK`` in
    train/dist.py alone (``launched_main``; ``Dist.is_main`` once the group exists); graft_cli/faults.py reads
    ``RANK`` as well, to fire a fault ``<point>:<step>@<rank>`` in that rank's process only (it sits below train/,
    which it cannot import)."""
    readers = set()
    for d, _, names in os.walk(os.path.join(ROOT, "graft_cli")):
        for f in (n for n in names if n.endswith(".py")):
            path = os.path.join(d, f)
            tree = ast.parse(open(path, encoding="utf-8").read())
            if any(isinstance(n, ast.Constant) and n.value == "RANK" for n in ast.walk(tree)):
                readers.add(os.path.relpath(path, ROOT).replace(os.sep, "/"))
    assert readers == {"graft_cli/train/dist.py", "graft_cli/faults.py"}
    monkeypatch.delenv("RANK", raising=False)
    assert launched_main()
    monkeypatch.setenv("RANK", "1")
    assert not launched_main()
    monkeypatch.setenv("RANK", "0")
    assert launched_main()
