"""Sharded checkpoints without pickle: each rank writes the part of every tensor it holds, any world size reads them.

An FSDP2 policy's parameters (and AdamW's moments) are DTensors split over the ranks (``Shard(0)``); gathering them
to one rank for a checkpoint costs that rank the whole model and optimizer (~16 B per parameter, 128 GB for an 8B
policy with AdamW). ``torch.distributed.checkpoint`` avoids the gather, but its ``.metadata`` file is a pickle and
nothing graft reads from a run directory is unpickled, so a sharded checkpoint is written here in its own small
format, the same layout DCP uses, with safetensors and JSON::

    <policy>/config.json, generation_config.json, tokenizer files      (rank 0: what from_pretrained needs)
    <policy>/shards/rank-00000-of-00002.safetensors                      each rank's local part of every tensor
    <policy>/shards/rank-00000-of-00002.json                             per tensor: the global shape, the offset
                                                                         of the local part in it; the optimizer's
                                                                         hyperparameters and parameter order

Tensors are named ``model/<parameter or buffer>`` and ``optim/<parameter>/<state key>``. A reader on any world size
(:class:`ShardReader`) takes, for each box ``[offset, offset + shape)`` it needs, the intersection with every saved
box (reading only those rows through safetensors' slices), which is what resharding is: save at 2 ranks, load the
halves at 2, the whole at 1 (``graft export``, ``graft eval``), other cuts at 4.
"""

from __future__ import annotations

import json
import os
import re

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor

from graft_cli.errors import GraftError
from graft_cli.models.lora import is_lora, saved_key

SHARDS = "shards"
FORMAT = 1
MODEL, OPTIM = "model/", "optim/"
_NAME = re.compile(r"^rank-(\d{5})-of-(\d{5})\.json$")


def shard_stem(rank: int, world: int) -> str:
    return f"rank-{rank:05d}-of-{world:05d}"


def is_sharded(folder: str) -> bool:
    """A policy folder written as shards (no ``model.safetensors``; a ``shards/`` index instead)."""
    d = os.path.join(folder, SHARDS)
    return os.path.isdir(d) and any(_NAME.match(f) for f in os.listdir(d))


def local_box(t: torch.Tensor) -> tuple[torch.Tensor, list[int], list[int]]:
    """``(local tensor, global shape, offset of the local part)``: a DTensor's own part (FSDP2's ``Shard(0)`` rows,
    any placement torch can describe), a plain tensor whole at offset 0."""

    if isinstance(t, DTensor):
        # lazy: a private torch API, reached only for a DTensor
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        return t.to_local(), list(t.shape), [int(o) for o in offset]
    return t, list(t.shape), [0] * t.dim()


def write_shard(folder: str, rank: int, world: int, tensors: dict, extra: dict | None = None) -> list[str]:
    """Write this rank's part of ``tensors`` (name -> tensor or DTensor) under ``folder/shards/`` and its JSON index
    (global shapes, offsets, ``extra``); both files are fsynced. Returns their paths."""

    d = os.path.join(folder, SHARDS)
    os.makedirs(d, exist_ok=True)
    stem = os.path.join(d, shard_stem(rank, world))
    local, index = {}, {}
    for name, t in tensors.items():
        part, shape, offset = local_box(t.detach())
        local[name] = part.to("cpu", copy=True).contiguous()
        index[name] = {"global_shape": shape, "offset": offset}
    save_file(local, stem + ".safetensors", metadata={"format": "pt"})
    with open(stem + ".json", "w", encoding="utf-8") as f:
        json.dump({"format": FORMAT, "rank": rank, "world": world, "tensors": index, **(extra or {})}, f)
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(stem + ".safetensors", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return [stem + ".safetensors", stem + ".json"]


class ShardReader:
    """The shards of one policy folder, read for any world size. Every index is JSON; every tensor file safetensors
    (nothing is unpickled). A missing rank, a mixed world size or a tensor whose boxes do not cover its global
    shape raises one line naming the file."""

    def __init__(self, folder: str):
        self.folder = folder
        d = os.path.join(folder, SHARDS)
        files = sorted(f for f in os.listdir(d) if _NAME.match(f)) if os.path.isdir(d) else []
        if not files:
            raise GraftError(f"{d}: no shard index (rank-NNNNN-of-NNNNN.json)")
        self.indexes = []
        for f in files:
            path = os.path.join(d, f)
            try:
                with open(path, encoding="utf-8") as fh:
                    ix = json.load(fh)
                ok = ix.get("format") == FORMAT and isinstance(ix.get("tensors"), dict)
            except (OSError, ValueError):
                ok = False
            if not ok:
                raise GraftError(f"{path}: not a graft shard index (format {FORMAT})")
            ix["_path"] = path
            self.indexes.append(ix)
        world = {ix["world"] for ix in self.indexes}
        ranks = sorted(ix["rank"] for ix in self.indexes)
        if len(world) != 1 or ranks != list(range(next(iter(world)))):
            raise GraftError(f"{d}: shards of ranks {ranks} for world sizes {sorted(world)}: a checkpoint needs "
                             f"one shard per rank of one world size")
        self.world = next(iter(world))
        self._open: dict[int, object] = {}

    @property
    def extra(self) -> dict:
        """Rank 0's index without its tensors (what :func:`write_shard` was given as ``extra``)."""
        return {k: v for k, v in self.indexes[0].items() if k not in ("tensors", "_path")}

    def names(self, prefix: str = "") -> list[str]:
        return [n for n in self.indexes[0]["tensors"] if n.startswith(prefix)]

    def global_shape(self, name: str) -> list[int]:
        meta = self.indexes[0]["tensors"].get(name)
        if meta is None:
            raise GraftError(f"{self.indexes[0]['_path']}: no tensor {name!r}")
        return list(meta["global_shape"])

    def _file(self, r: int):
        if r not in self._open:
            path = self.indexes[r]["_path"].removesuffix(".json") + ".safetensors"
            try:
                self._open[r] = safe_open(path, framework="pt", device="cpu")
            except Exception as e:
                raise GraftError(f"{path}: unreadable ({type(e).__name__}: {(str(e).splitlines() or [''])[0]})")\
                    from None
        return self._open[r]

    def read(self, name: str, offset: list[int] | None = None, shape: list[int] | None = None) -> torch.Tensor:
        """The box ``[offset, offset + shape)`` of tensor ``name`` (default: all of it), assembled from the saved
        boxes it intersects; each saved box is read only where it intersects."""
        full = self.global_shape(name)
        offset = list(offset) if offset is not None else [0] * len(full)
        shape = list(shape) if shape is not None else list(full)
        out, covered = None, 0
        for r, ix in enumerate(self.indexes):
            meta = ix["tensors"].get(name)
            if meta is None:
                continue
            f = self._file(r)
            sl = f.get_slice(name)
            have = list(sl.get_shape())
            lo = [max(o, so) for o, so in zip(offset, meta["offset"])]
            hi = [min(o + s, so + h) for o, s, so, h in zip(offset, shape, meta["offset"], have)]
            if any(a >= b for a, b in zip(lo, hi)) and len(full):
                continue
            src = tuple(slice(a - so, b - so) for a, b, so in zip(lo, hi, meta["offset"]))
            part = sl[src] if src else f.get_tensor(name)
            if out is None:
                out = torch.empty(shape, dtype=part.dtype)
            dst = tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, offset))
            out[dst] = part
            n = 1
            for a, b in zip(lo, hi):
                n *= b - a
            covered += n
            if not full:
                break
        want = 1
        for s in shape:
            want *= s
        if out is None or covered < want:
            raise GraftError(f"{os.path.join(self.folder, SHARDS)}: the shards cover {covered} of the {want} "
                             f"elements of {name!r} asked for (offset {offset}, shape {shape})")
        return out

    def read_like(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """The part of ``name`` that ``t`` (a DTensor or a plain tensor of the global shape) holds on this rank."""
        part, shape, offset = local_box(t)
        if list(shape) != self.global_shape(name):
            raise GraftError(f"{os.path.join(self.folder, SHARDS)}: {name!r} has shape {self.global_shape(name)} "
                             f"in the checkpoint, {list(shape)} in the model")
        return self.read(name, offset, list(part.shape))

    def full_state(self, prefix: str = MODEL) -> dict[str, torch.Tensor]:
        """Every tensor under ``prefix`` whole (the prefix removed): a model's state dict for ``from_pretrained``."""
        return {n[len(prefix):]: self.read(n) for n in self.names(prefix)}


def model_tensors(model) -> dict:
    """``model/<name>`` -> parameter or persistent buffer (DTensor under FSDP2), tied parameters once; a LoRA
    policy's adapter parameters only (its base is the base model's folder, not the checkpoint's)."""
    if is_lora(model):
        return {MODEL + n: p for n, p in model.named_parameters() if p.requires_grad}
    out = {MODEL + n: p for n, p in model.named_parameters()}
    non_persistent = {f"{m}.{b}" if m else b for m, mod in model.named_modules()
                      for b in getattr(mod, "_non_persistent_buffers_set", ())}
    for n, b in model.named_buffers():
        if n not in non_persistent:
            out[MODEL + n] = b
    return out


def optimizer_tensors(model, optimizer) -> tuple[dict, dict]:
    """``optim/<parameter>/<key>`` -> the optimizer's state tensors, and the JSON part (hyperparameters of each
    group, its parameters by name, the non-tensor state values)."""
    names = {id(p): n for n, p in model.named_parameters()}
    tensors, plain = {}, {}
    groups = []
    for g in optimizer.param_groups:
        params = [names[id(p)] for p in g["params"]]
        groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": params})
        for p, n in zip(g["params"], params):
            for k, v in optimizer.state.get(p, {}).items():
                if torch.is_tensor(v):
                    tensors[f"{OPTIM}{n}/{k}"] = v
                else:
                    plain[f"{n}/{k}"] = v
    return tensors, {"param_groups": groups, "state_values": plain}


def read_model(reader: ShardReader, model) -> dict[str, torch.Tensor]:
    """This rank's part of every model tensor, keyed as :func:`model_tensors` (read before anything is changed)."""
    want = model_tensors(model)
    missing = [n for n in want if n not in reader.indexes[0]["tensors"]]
    if missing:
        raise GraftError(f"{os.path.join(reader.folder, SHARDS)}: no {missing[0]!r} ({len(missing)} model tensors "
                         f"missing): written for another model")
    return {n: reader.read_like(n, t) for n, t in want.items()}


def read_optimizer(reader: ShardReader, model, optimizer) -> dict:
    """An optimizer ``state_dict`` for this rank's ``optimizer`` (state tensors shaped as its parameters: DTensor
    parts under FSDP2), built from the shards: what ``optimizer.load_state_dict`` takes."""

    extra = reader.extra
    saved = extra.get("param_groups")
    names = {id(p): n for n, p in model.named_parameters()}
    if saved is None or len(saved) != len(optimizer.param_groups):
        raise GraftError(f"{os.path.join(reader.folder, SHARDS)}: optimizer groups differ from the run's")
    state, groups, idx = {}, [], 0
    plain = extra.get("state_values") or {}
    for g, sg in zip(optimizer.param_groups, saved):
        params = [names[id(p)] for p in g["params"]]
        if params != sg["params"]:
            raise GraftError(f"{os.path.join(reader.folder, SHARDS)}: optimizer parameters differ from the run's")
        ids = []
        for p, n in zip(g["params"], params):
            st = {}
            for key in reader.names(f"{OPTIM}{n}/"):
                k = key.rsplit("/", 1)[1]
                if list(reader.global_shape(key)) == list(p.shape):
                    part = reader.read_like(key, p)
                    st[k] = (DTensor.from_local(part.to(p.device), p.device_mesh, p.placements, shape=p.shape,
                                                stride=p.stride()) if isinstance(p, DTensor) else part.to(p.device))
                else:
                    st[k] = reader.read(key)
            for k, v in plain.items():
                if k.rsplit("/", 1)[0] == n:
                    st[k.rsplit("/", 1)[1]] = v
            if st:
                state[idx] = st
            ids.append(idx)
            idx += 1
        groups.append({**{k: v for k, v in sg.items() if k != "params"}, "params": ids})
    return {"state": state, "param_groups": groups}


def load_state_into(model, parts: dict[str, torch.Tensor]) -> None:
    """Copy :func:`read_model`'s parts into the model's (local) tensors."""

    tensors = model_tensors(model)
    with torch.no_grad():
        for n, part in parts.items():
            t = tensors[n]
            (t.to_local() if isinstance(t, DTensor) else t).copy_(part)


def sharded_adapter(path: str) -> dict:
    """The LoRA adapter of a sharded checkpoint's policy folder, every rank's part assembled, under PEFT's saved keys
    (the adapter's name left out)."""
    return {saved_key(k): v for k, v in ShardReader(path).full_state().items()}


__all__ = ["SHARDS", "ShardReader", "is_sharded", "local_box", "write_shard", "model_tensors", "optimizer_tensors",
           "read_model", "read_optimizer", "load_state_into", "shard_stem", "sharded_adapter"]
