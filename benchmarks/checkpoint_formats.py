"""Checkpoint formats under FSDP2: the gathered one (rank 0 writes the whole model and AdamW state) against the
sharded one (each rank writes its part; graft_cli/models/shards.py). Prints, per format: the save time (the slowest
rank, median of 3), the bytes written per rank, and rank 0's peak resident memory growth during the save (what the
gather costs), then the resume time at 1 process from the sharded checkpoint.

    python benchmarks/checkpoint_formats.py [--procs 2] [--hidden 512] [--layers 8]

It launches itself under torchrun (gloo on CPU; NCCL on GPUs). A random-initialised Qwen3 of the given shape, one
AdamW step so the moments exist."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args) -> None:
    import torch

    from graft_cli.train import checkpoint as ckpt
    from graft_cli.train import dist as D

    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    d = D.Dist(rank=rank, world=world, mode="fsdp")
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=32000, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                      tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = d.prepare(model, opt)
    ids = torch.randint(0, 32000, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    from graft_cli.train.policies import Policy

    pol = {"p": Policy("p", model, tok, opt, None, {})}
    out = {}
    for fmt in ("sharded", "full"):  # sharded first: the peak-RSS growth of the gather is measured after it
        root = os.path.join(args.out, fmt)
        times = []
        before = _peak_mb()
        for step in (1, 2, 3):
            torch.distributed.barrier()
            t0 = time.perf_counter()
            D.save_checkpoint(d, root, step, pol, {"step": step}, keep=1, fmt=fmt)
            times.append(time.perf_counter() - t0)
        slowest = [max(x) for x in zip(*d.gather_objects(times))]
        files = {}
        path = ckpt.step_path(root, 3)
        for dirpath, _, names in os.walk(path):
            for n in names:
                files[os.path.relpath(os.path.join(dirpath, n), path)] = os.path.getsize(os.path.join(dirpath, n))
        grew = d.gather_objects(_peak_mb() - before)
        out[fmt] = {"save_s_median": sorted(slowest)[1], "bytes_total": sum(files.values()),
                    "largest_file_bytes": max(files.values()), "rank0_peak_rss_growth_mb": round(grew[0], 1)}
    if rank == 0:
        print(json.dumps({"params": n_params, "world": world, **out}))
    torch.distributed.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: a character one)")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    tmp = tempfile.mkdtemp(prefix="graft-ckpt-bench-")
    try:
        tokdir = args.tokenizer
        if tokdir is None:
            from graft_cli.models.shapes import char_tokenizer

            tokdir = os.path.join(tmp, "tok")
            char_tokenizer().save_pretrained(tokdir)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.procs),
               __file__, "--worker", "--out", tmp, "--tokenizer", tokdir, "--hidden", str(args.hidden), "--layers",
               str(args.layers)]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode:
            sys.exit(r.stderr[-3000:])
        res = json.loads(r.stdout.strip().splitlines()[-1])
        # resume at 1 process from the sharded checkpoint: read every part whole
        from graft_cli.models import shards

        t0 = time.perf_counter()
        full = shards.ShardReader(os.path.join(tmp, "sharded", "step_000003", "p")).full_state()
        res["sharded_read_whole_s"] = round(time.perf_counter() - t0, 3)
        res["sharded_read_tensors"] = len(full)
        print(f"{res['params'] / 1e6:.1f}M parameters, {res['world']} processes (gloo, CPU)")
        for fmt in ("full", "sharded"):
            x = res[fmt]
            print(f"  {fmt:8s} save {x['save_s_median']:.2f} s (slowest rank, median of 3), "
                  f"{x['bytes_total'] / 2**20:.1f} MiB written, "
                  f"largest file {x['largest_file_bytes'] / 2**20:.1f} MiB, "
                  f"rank 0 peak RSS +{x['rank0_peak_rss_growth_mb']:.0f} MiB")
        print(f"  sharded read back whole at 1 process: {res['sharded_read_whole_s']:.2f} s")
        print(json.dumps(res))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
