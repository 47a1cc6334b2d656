#!/usr/bin/env bash
# Our kernels plugged in elsewhere, and faster inference (benchmarks/plugin.py): the GPU tests of what
# each part measures, then its sections against their same-run baselines, in two calls of under 8
# minutes each (H100 or H200), from the repository root on the GPU machine, with .whl/ carried on a
# machine's first call (benchmarks/gpu_setup.sh says how to fill it):
#   bash benchmarks/gpu_plugin.sh 1   # decoding (~4 min): tests of the decoding kernel and of CUDA-graph
#                                     # generation, then the sections generate, decode and mutagenesis
#   bash benchmarks/gpu_plugin.sh 2   # transformers and FP8 (~5 min): tests of transformers models on our
#                                     # kernels, the FP8 kernel and xformers (skipped where it is not
#                                     # installed), then the sections hf, fp8 and fp8_budget
# Each step has its own time limit and the call stops starting steps at LIMIT seconds. Each section runs
# in a process of its own and writes $OUT/plugin_SECTION.json when it ends (one that crashes or runs out
# of time loses only its own file); a part writes 4 files: $OUT/gpu_tests_PART.log and its sections'.
# Join the fetched files into one result (here, not on the GPU):
#   python -m benchmarks.plugin --out benchmarks/results --from DIR1/plugin_*.json DIR2/plugin_*.json
set -uo pipefail
PART=${1:-}
case "$PART" in
    1) TESTS="tests/kernels/test_triton_decode.py tests/genome/test_generate.py"
       STEPS="generate:120 decode:60 mutagenesis:90" ;;
    2) TESTS="tests/kernels/test_transformers_attention.py tests/kernels/test_triton_fp8.py tests/kernels/test_xformers_backend.py"
       STEPS="hf:130 fp8:130 fp8_budget:80" ;;
    *) echo "usage: bash benchmarks/gpu_plugin.sh 1|2 (1: decoding; 2: transformers and FP8)"; exit 2 ;;
esac
LIMIT=${LIMIT:-450}  # seconds for the whole call: the 8 minutes of a GPU call, less its start and transfers
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
source benchmarks/gpu_setup.sh || exit 1

step() {  # step CAP COMMAND...: run COMMAND for at most CAP seconds, fewer when the call's time runs out
    local cap=$1 left=$((LIMIT - SECONDS))
    shift
    if [ "$left" -lt 30 ]; then
        echo "[${SECONDS}s] SKIPPED, the call's ${LIMIT} s are spent: $*"
        return 1
    fi
    [ "$cap" -gt "$left" ] && cap=$left
    echo "[${SECONDS}s] $* (at most ${cap} s)"
    timeout -k 10 "$cap" "$@"
    local code=$?
    [ "$code" -eq 124 ] && echo "[${SECONDS}s] TIMED OUT after ${cap} s: $*"
    return "$code"
}

nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
python3 - <<'EOF'
import importlib.metadata as m, importlib.util as u
print(", ".join(f"{p} {m.version(p) if u.find_spec(s) else 'NOT INSTALLED'}" for p, s in (
    ("torch", "torch"), ("triton", "triton"), ("transformers", "transformers"), ("xformers", "xformers"))),
    "; flash-attn-4", "importable" if u.find_spec("flash_attn") else "NOT INSTALLED", flush=True)
EOF

# 1. correctness: the GPU tests of what this part measures (untuned launch configurations: faster)
GENOFORMER_TRITON_AUTOTUNE=0 step 150 python3 -m pytest -q -m gpu -rfs --tb=short -p no:cacheprovider $TESTS \
    > "$OUT/gpu_tests_$PART.log" 2>&1
code=$?
echo "[${SECONDS}s] gpu tests: exit $code"
tail -4 "$OUT/gpu_tests_$PART.log"
[ "$code" -ne 0 ] && echo "GPU TESTS FAILED ($OUT/gpu_tests_$PART.log): the figures below are of code that failed its checks"

# 2. the figures, one process per section (the tuner on: the launch configurations users get)
failed=0
for entry in $STEPS; do
    section=${entry%%:*}
    step "${entry##*:}" python3 -m benchmarks.plugin --out "$OUT" --name "plugin_$section" --sections "$section" \
        || failed=1
    echo "[${SECONDS}s] $section: $([ -f "$OUT/plugin_$section.json" ] && echo "$OUT/plugin_$section.json" || echo 'NO RESULT')"
done
echo "[${SECONDS}s] part $PART done; tests exit $code; a section failed: $failed"
