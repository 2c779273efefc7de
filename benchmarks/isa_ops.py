"""Where two CPU types part ways in the tiny build: per-module hashes of one full-shape SFT step.

    python benchmarks/isa_ops.py --env "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2" --env plain --out ops.json

For each environment (``plain``: none pinned; otherwise space-separated ``NAME=VALUE`` set before torch loads, in a
fresh child interpreter, single-threaded as the build's workers are) and each tiny architecture (``a`` Qwen3, ``b``
Llama, ``c`` GPT-NeoX at the default recipe's shapes, with their own tokenizers), it runs ``--steps`` steps of the
build's own SFT loop (:func:`graft_cli.tiny.sft.sft`) and records:

- ``fwd``: the SHA-256 prefix of every module's output in the first forward pass, in call order;
- ``grad``: of every parameter's gradient after the first backward pass;
- ``final``: the weights after ``--steps`` steps, and the per-step losses (as float hex).

Run it on two machines and compare the JSON with ``--compare A.json B.json``: per environment and architecture it
prints the first module whose output differs (forward order) and the gradients that differ, which names the op
whose kernel depends on the CPU (the build is otherwise deterministic single-threaded code).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import hashlib, json, sys, torch
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
from graft_cli.tiny.sft import Recipe, make_model, sft, weight_hash
from graft_cli.tiny import tokenizers as T
import dataclasses

steps = int(sys.argv[1])
r = Recipe.named(sys.argv[2])

def h(t):
    t = t.detach().contiguous()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()[:12]

out = {"torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability(), "archs": {}}
for kind in ("a", "b", "c"):
    if kind == "a":
        tok = T.build_tokenizer_a(0, r.bpe_vocab, r.tokenizer_style("a"), r.split_a)
        shape, stage, salt = r.shape_a, r.stage_a, 1
    elif kind == "b":
        tok = T.build_tokenizer_b(0, r.bpe_vocab_b, r.tokenizer_style("b"))
        shape, stage, salt = r.shape_b, r.stage_b, 2
    else:
        tok = T.build_tokenizer_c(0, r.bpe_vocab_c, r.tokenizer_style("c"))
        shape, stage, salt = r.shape_c, r.stage_c, 3
    model = make_model(shape, tok, salt)
    rec = {"init": weight_hash(model)[:12], "fwd": [], "grad": {}}
    hooks = []
    def fwd_hook(name):
        def f(mod, inp, outp):
            if len(rec["fwd"]) >= 10000 or getattr(mod, "_seen", False):
                return
            mod._seen = True
            ts = outp if isinstance(outp, (tuple, list)) else (outp,)
            ts = [x for x in ts if torch.is_tensor(x)] or [getattr(outp, "logits", None)]
            ts = [x for x in ts if x is not None]
            rec["fwd"].append([name, type(mod).__name__, [h(x) for x in ts]])
        return f
    for name, mod in model.named_modules():
        hooks.append(mod.register_forward_hook(fwd_hook(name or "<model>")))
    def grad_hook(name):
        def f(g):
            rec["grad"].setdefault(name, h(g))
        return f
    for name, p in model.named_parameters():
        hooks.append(p.register_hook(grad_hook(name)))
    losses = sft(model, tok, dataclasses.replace(stage, steps=steps), f"graft-tiny-sft:0:{kind}")
    rec["losses"] = [float(x).hex() for x in losses]
    rec["final"] = weight_hash(model)[:12]
    out["archs"][kind] = rec
print("OPS " + json.dumps(out))
"""


def parse_env(spec: str) -> dict:
    if spec == "plain":
        return {}
    return dict(kv.split("=", 1) for kv in spec.split())


def run(envs: list[str], steps: int, recipe: str) -> dict:
    res = {}
    pins = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
    for spec in envs:
        env = {k: v for k, v in os.environ.items() if k not in pins}
        env.update(parse_env(spec), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        p = subprocess.run([sys.executable, "-c", CHILD, str(steps), recipe], env=env, capture_output=True, text=True,
                           cwd=ROOT)
        line = [x for x in p.stdout.splitlines() if x.startswith("OPS ")]
        res[spec] = (json.loads(line[-1][4:]) if line and not p.returncode
                     else {"error": (p.stderr.strip().splitlines() or ["?"])[-1]})
        r = res[spec]
        print(f"{spec:<50} " + (r.get("error") or f"torch {r['torch']} {r['capability']}  " + " ".join(
            f"{k}={v['final']}" for k, v in r["archs"].items())), flush=True)
    return res


def compare(x: dict, y: dict) -> None:
    for spec in x["envs"]:
        if spec not in y["envs"] or "error" in x["envs"][spec] or "error" in y["envs"][spec]:
            print(f"{spec}: not in both")
            continue
        for kind, ra in x["envs"][spec]["archs"].items():
            rb = y["envs"][spec]["archs"][kind]
            if ra["final"] == rb["final"]:
                print(f"{spec} | {kind}: identical after {len(ra['losses'])} steps ({ra['final']})")
                continue
            first = next((fa for fa, fb in zip(ra["fwd"], rb["fwd"]) if fa[2] != fb[2]), None)
            grads = [k for k in ra["grad"] if ra["grad"][k] != rb["grad"].get(k)]
            step = next((i for i, (la, lb) in enumerate(zip(ra["losses"], rb["losses"])) if la != lb), None)
            print(f"{spec} | {kind}: DIFFER; init {'same' if ra['init'] == rb['init'] else 'differs'}; first loss "
                  f"differing at step {None if step is None else step + 1}; first module output differing: "
                  f"{first[0] + ' (' + first[1] + ')' if first else 'none'}; grads differing {len(grads)}/"
                  f"{len(ra['grad'])}: {', '.join(grads[:6])}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", action="append", help="plain, or 'NAME=VALUE NAME=VALUE' (repeatable)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--recipe", default="v4")
    ap.add_argument("--out", default="")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = ap.parse_args(argv)
    if args.compare:
        compare(*(json.load(open(p)) for p in args.compare))
        return None
    sys.path.insert(0, ROOT)
    from graft_cli.tiny.build import build_machine  # lazy: torch, only when measuring

    cpu = build_machine()["cpu"]
    out = {"cpu": cpu, "steps": args.steps, "recipe": args.recipe, "envs": run(args.env or ["plain"], args.steps,
                                                                               args.recipe)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f)
    return out


if __name__ == "__main__":
    main()
