#!/usr/bin/env bash
# Issue 47's GPU checks and figures in one call (H100 or H200, about 7 minutes), from the repository
# root on the GPU machine with .whl/ carried (benchmarks/gpu_setup.sh; add the xformers wheel to test
# that backend: pip download --no-deps -d .whl xformers==0.0.35):
#   bash benchmarks/gpu_plugin.sh
# 1. correctness: the GPU tests of the decoding kernel (float64 sweep), the FP8 kernel (against its
#    emulation), transformers models on our kernels (bf16 logits within the 2x rule), xformers (every
#    kernel-test input it accepts, when installed) and CUDA-graph generation (same bases as eager);
# 2. the figures: python -m benchmarks.plugin (docstring: sections, baselines, targets).
# Writes $OUT/gpu_tests.log, $OUT/plugin/plugin.json and $OUT/plugin/plugin.md.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT/plugin"
export PYTHONUNBUFFERED=1 GENOFORMER_TRITON_AUTOTUNE=1
unset TRITON_INTERPRET
source benchmarks/gpu_setup.sh || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
python3 -c "import xformers, sys; print('xformers', xformers.__version__)" 2>&1 | tail -1
GENOFORMER_TRITON_AUTOTUNE=0 timeout 180 python3 -m pytest -q -m gpu -rfs --tb=short -p no:cacheprovider \
    tests/kernels/test_triton_decode.py tests/kernels/test_triton_fp8.py tests/kernels/test_transformers_attention.py \
    tests/kernels/test_xformers_backend.py tests/genome/test_generate.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: exit $?"; tail -3 "$OUT/gpu_tests.log"
timeout 330 python3 -m benchmarks.plugin --out "$OUT/plugin"
echo "plugin: exit $?"
tail -c 6000 "$OUT/plugin/plugin.md"
