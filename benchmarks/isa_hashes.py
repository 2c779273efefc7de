"""The tiny pair's weight hashes under each CPU kernel level: does pinning ATen's instruction set make two CPU
types build the same models? (docs/tiny_pair.md, "The same recipe on another CPU").

    python benchmarks/isa_hashes.py                      # plain, ATEN_CPU_CAPABILITY=avx2, =default
    python benchmarks/isa_hashes.py --levels avx2 --steps 60

For each level it runs a reduced build (``Recipe.reduced(steps)``: the build's code path, single-threaded
workers, seconds) in a fresh temporary folder, in a child process whose environment sets
``ATEN_CPU_CAPABILITY`` (read once, when torch loads) and ``MKL_CBWR=COMPATIBLE`` where given, and prints the
CPU model, its vector flags, torch's version and the five models' sha256 prefixes; the last line is JSON.
Compare the JSON of two machines: equal hashes at one pinned level on an AVX-512 and an AVX2 CPU (same torch
build) show the pin makes the build portable.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = """
import json, sys, torch
from graft_cli.tiny.build import build_tiny, read_manifest
from graft_cli.tiny.sft import Recipe
build_tiny(sys.argv[1], recipe=Recipe.reduced(int(sys.argv[2])), progress=False)
man = read_manifest(sys.argv[1])
print("HASHES " + json.dumps({"torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability(),
                              "hashes": {k: v[:16] for k, v in man["hashes"].items()}}))
"""


def cpu() -> dict:
    """The CPU model and its vector flags, as the tiny build's manifest records them."""
    from graft_cli.tiny.build import build_machine  # lazy: torch, only when measuring

    m = build_machine()
    return {"model": m["cpu"], "vector": m["vector"]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="plain,avx2,default",
                    help="comma list: plain (no pin) or an ATEN_CPU_CAPABILITY value (default, avx2, avx512)")
    ap.add_argument("--steps", type=int, default=60, help="SFT steps of the reduced build")
    ap.add_argument("--mkl-cbwr", default="", help="also set MKL_CBWR (e.g. COMPATIBLE)")
    args = ap.parse_args(argv)
    out = {"cpu": cpu(), "steps": args.steps, "mkl_cbwr": args.mkl_cbwr, "levels": {}}
    print(f"cpu {out['cpu']['model']}  vector {' '.join(out['cpu']['vector'])}", flush=True)
    for level in args.levels.split(","):
        env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        if level != "plain":
            env["ATEN_CPU_CAPABILITY"] = level
        if args.mkl_cbwr:
            env["MKL_CBWR"] = args.mkl_cbwr
        with tempfile.TemporaryDirectory() as d:
            res = subprocess.run([sys.executable, "-c", CHILD, d, str(args.steps)], env=env, capture_output=True,
                                 text=True)
        line = [x for x in res.stdout.splitlines() if x.startswith("HASHES ")]
        if res.returncode or not line:
            out["levels"][level] = {"error": (res.stderr.strip().splitlines() or ["?"])[-1]}
        else:
            out["levels"][level] = json.loads(line[-1][len("HASHES "):])
        r = out["levels"][level]
        print(f"{level:<8} " + (r.get("error") or f"torch {r['torch']} kernels {r['capability']}  "
                                + " ".join(f"{k}={v[:12]}" for k, v in r["hashes"].items())), flush=True)
    print("JSON " + json.dumps(out))
    return out


if __name__ == "__main__":
    main()
