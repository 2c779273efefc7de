"""Sharded checkpoints (graft_cli/models/shards.py): boxes written by ranks, read back at another
world size, assembled whole for export and evaluation; every malformed set refused in one line."""

import json
import os

import pytest
import torch

from graft_cli.errors import GraftError
from graft_cli.models import shards
from conftest import make_random_model


def _write_boxes(folder, full: dict, cuts: list[list[tuple[int, int]]]):
    """Write ``full`` (name -> tensor) as if by ``len(cuts)`` ranks, rank r holding rows ``cuts[r][i]`` of the i-th
    tensor (a 0-dim tensor whole on every rank). The boxes go through ``local_box`` as plain tensors, then their
    offsets are set by hand, as a DTensor's would be."""
    world = len(cuts)
    for r, rows in enumerate(cuts):
        parts = {}
        for (name, t), (a, b) in zip(full.items(), rows):
            parts[name] = t if t.dim() == 0 else t[a:b].clone()
        shards.write_shard(str(folder), r, world, parts, {"param_groups": [], "rank_note": r})
        path = os.path.join(str(folder), shards.SHARDS, shards.shard_stem(r, world) + ".json")
        ix = json.load(open(path))
        for (name, t), (a, _) in zip(full.items(), rows):
            ix["tensors"][name]["global_shape"] = list(t.shape)
            ix["tensors"][name]["offset"] = [] if t.dim() == 0 else [a] + [0] * (t.dim() - 1)
        json.dump(ix, open(path, "w"))


@pytest.fixture()
def saved(tmp_path):
    g = torch.Generator().manual_seed(0)
    full = {"model/w": torch.randn(5, 3, generator=g), "model/v": torch.arange(7.0), "optim/w/step": torch.tensor(4.0)}
    # FSDP2's Shard(0) at 2 ranks: torch.chunk rows (3 + 2, 4 + 3)
    _write_boxes(tmp_path, full, [[(0, 3), (0, 4), (0, 0)], [(3, 5), (4, 7), (0, 0)]])
    return tmp_path, full


def test_a_two_rank_save_reads_back_at_one_two_and_three_ranks(saved):
    folder, full = saved
    r = shards.ShardReader(str(folder))
    assert r.world == 2 and shards.is_sharded(str(folder))
    assert r.extra["rank_note"] == 0  # rank 0's index carries the JSON extras
    for name, t in full.items():  # world 1: the whole tensor
        assert torch.equal(r.read(name), t)
    assert set(r.full_state()) == {"w", "v"} and torch.equal(r.full_state()["w"], full["model/w"])
    for world in (2, 3):
        for name in ("model/w", "model/v"):
            t = full[name]
            chunks = torch.chunk(t, world)  # FSDP2 cuts dim 0 as torch.chunk does
            off = 0
            for c in chunks:
                got = r.read(name, [off] + [0] * (t.dim() - 1), list(c.shape))
                assert torch.equal(got, c), (name, world, off)
                off += c.shape[0]
    # a box across the saved cut (rows 2-3 of w: one row from each rank's file), and a column box
    assert torch.equal(r.read("model/w", [2, 1], [2, 2]), full["model/w"][2:4, 1:3])
    assert r.read("optim/w/step").item() == 4.0


def test_read_like_takes_the_box_a_tensor_holds(saved):
    folder, full = saved
    r = shards.ShardReader(str(folder))
    assert torch.equal(r.read_like("model/w", torch.zeros(5, 3)), full["model/w"])  # a plain tensor: all of it
    with pytest.raises(GraftError, match=r"'model/w' has shape \[5, 3\] in the checkpoint, \[4, 3\] in the model"):
        r.read_like("model/w", torch.zeros(4, 3))


def test_malformed_shard_sets_are_refused_in_one_line(saved, tmp_path_factory):
    folder, full = saved
    d = os.path.join(str(folder), shards.SHARDS)
    os.rename(os.path.join(d, "rank-00001-of-00002.json"), os.path.join(d, "x.json"))  # a rank's index missing
    with pytest.raises(GraftError, match=r"shards of ranks \[0\] for world sizes \[2\]"):
        shards.ShardReader(str(folder))
    os.rename(os.path.join(d, "x.json"), os.path.join(d, "rank-00001-of-00002.json"))
    with open(os.path.join(d, "rank-00000-of-00002.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(GraftError, match="rank-00000-of-00002.json: not a graft shard index"):
        shards.ShardReader(str(folder))
    other = tmp_path_factory.mktemp("gap")  # rows 3-4 of w written by nobody
    _write_boxes(other, {"model/w": full["model/w"]}, [[(0, 3)]])
    ix_path = os.path.join(str(other), shards.SHARDS, "rank-00000-of-00001.json")
    with pytest.raises(GraftError, match=r"cover 9 of the 15 elements of 'model/w'"):
        shards.ShardReader(str(other)).read("model/w")
    assert os.path.exists(ix_path)


def test_a_model_and_its_adamw_state_round_trip_and_load_whole(tmp_path):
    """One process (plain tensors): model + AdamW moments written as one rank's shard, read into a fresh model and
    optimizer equal to the originals; ``load_model`` on the folder (config + shards) gives the same log-probs."""
    from graft_cli.models.loading import load_model

    src = make_random_model(str(tmp_path / "m"), "qwen3", 0, sft_steps=3)
    m = load_model(src, device="cpu")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    ids = torch.tensor([[3, 4, 5, 6]])
    m(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    pdir = str(tmp_path / "ckpt" / "a")
    tensors, meta = shards.optimizer_tensors(m, opt)
    shards.write_shard(pdir, 0, 1, {**shards.model_tensors(m), **tensors}, meta)
    m.config.save_pretrained(pdir)

    fresh = load_model(src, device="cpu")
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=5e-2)
    reader = shards.ShardReader(pdir)
    osd = shards.read_optimizer(reader, fresh, opt2)
    shards.load_state_into(fresh, shards.read_model(reader, fresh))
    opt2.load_state_dict(osd)
    for (n, p), q in zip(m.named_parameters(), fresh.parameters()):
        assert torch.equal(p, q), n
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"][0]["lr"] == b["param_groups"][0]["lr"] == 1e-3
    for i, st in a["state"].items():
        for k, v in st.items():
            assert torch.equal(v, b["state"][i][k]), (i, k)

    whole = load_model(pdir, device="cpu")  # config.json + shards: assembled, tied weights tied again
    with torch.no_grad():
        assert torch.equal(whole(input_ids=ids).logits, m(input_ids=ids).logits)
