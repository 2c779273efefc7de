#!/usr/bin/env bash
# Does a kernel pin make the tiny build portable across CPU types? (docs/tiny_pair.md)
# Run it on two machines (e.g. an AVX-512 Intel and an AVX2 AMD, same torch) and compare what each writes:
#   1. benchmarks/isa_ops.py: one full-shape SFT run of a, b and c (ISA_STEPS steps) under each candidate pin,
#      per-module output and gradient hashes -> $OUT/isa_ops.json (compare: isa_ops.py --compare A B);
#   2. a full build of recipe $GRAFT_TINY_RECIPE (default v4) with the pin $ISA_PIN set for its workers, the roles
#      it finished within ISA_BUILD_S seconds hashed from their saved folders -> $OUT/build_hashes.json.
# Both run at once (the build's three workers and isa_ops each take one core).
#   OUT=/tmp/isa bash benchmarks/isa_portability.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-results/isa}"; mkdir -p "$OUT"
PY="${PY:-python3}"
PIN="${ISA_PIN:-ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2}"
STEPS="${ISA_STEPS:-6}"; BUILD_S="${ISA_BUILD_S:-480}"
CACHE="$(mktemp -d)"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false
T0=$(date +%s)

env $PIN GRAFT_CACHE="$CACHE" timeout -k 5 "$BUILD_S" $PY - <<'PYEOF' > "$OUT/build.log" 2>&1 &
from graft_cli.tiny.build import build_tiny
build_tiny(progress=False)
print("build complete")
PYEOF
BUILD=$!

$PY benchmarks/isa_ops.py --steps "$STEPS" --out "$OUT/isa_ops.json" \
  --env plain --env "$PIN" --env "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2,STRICT" \
  --env "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE" \
  --env "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 ONEDNN_MAX_CPU_ISA=AVX2" 2>&1 | tee "$OUT/isa_ops.log"

wait $BUILD
echo "build exit $? after $(( $(date +%s) - T0 )) s (124: capped at $BUILD_S s)" >> "$OUT/build.log"
$PY - "$CACHE" "$OUT/build_hashes.json" "$PIN" <<'PYEOF'
import json, os, sys, torch
from transformers import AutoModelForCausalLM
from graft_cli.tiny.build import read_manifest
from graft_cli.tiny.sft import weight_hash
cache, out, pin = sys.argv[1:4]
man = read_manifest(cache) or {}
res = {"pin": pin, "complete": bool(man), "build_seconds": man.get("build_seconds"), "hashes": {}}
for role in ("a", "b", "c", "teacher", "junior"):
    d = os.path.join(cache, role)
    if os.path.isfile(os.path.join(d, "model.safetensors")):
        res["hashes"][role] = weight_hash(AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32))
if man:
    res["manifest_hashes"] = man["hashes"]
    res["token_stats"] = man.get("token_stats")
json.dump(res, open(out, "w"), indent=1)
print("build hashes:", {k: v[:12] for k, v in res["hashes"].items()}, "complete:", res["complete"])
PYEOF
rm -rf "$CACHE"
