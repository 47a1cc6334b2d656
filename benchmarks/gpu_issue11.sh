#!/usr/bin/env bash
# Issue 11 in one command on a machine with two GPUs, flash-attn-4 installed first (the staged
# wheels: docs/flash_attn.md, "flash-attn-4 on this project's lent GPU machine"):
#   GPU 0   kernel variants, then the attention benchmark with flash-attn-4 and both Flex
#           backends as columns (what `gpu_session.sh round2` runs)
#   GPU 1   the GPU test sweeps (every installed backend, packed rows, the kernel variants), the
#           packed-attention benchmark, the flash-attn check (times per situation and what auto
#           picks), the packed training step (benchmarks/packed_training.py)
#   CPU     the sm_80 / sm_90 cross-compile test under this machine's Triton
#   bash benchmarks/gpu_issue11.sh      (repository root, on the GPU machine; OUT set)
# Every result file and log goes into $OUT/issue11.tar.gz (the device tool brings back at most 8
# files); the tails of the logs are printed last.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GENOFORMER_TRITON_AUTOTUNE=1
unset TRITON_INTERPRET
source benchmarks/gpu_setup.sh
R=/tmp/issue11
mkdir -p "$R/results"
python3 -c "import flash_attn.cute, torch, triton; print('flash-attn-4 imports; torch', torch.__version__, 'triton', triton.__version__)" \
    2>&1 | tee "$R/versions.log"
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee -a "$R/versions.log"
began=$(date +%s)
stamp() { echo "== $(( $(date +%s) - began )) s: $*"; }

(
    export CUDA_VISIBLE_DEVICES=0
    stamp "gpu0 kernel variants"
    timeout 130 python3 -m benchmarks.kernel_variants --out "$R/results" > "$R/kernel_variants.log" 2>&1
    stamp "gpu0 attention benchmark"
    timeout 270 python3 -m benchmarks.attention --out "$R/results" --budget-s 210 > "$R/attention.log" 2>&1
    stamp "gpu0 done"
) &
(
    export CUDA_VISIBLE_DEVICES=1
    stamp "gpu1 tests"
    timeout 170 python3 -m pytest -q -rs -p no:cacheprovider -n 8 tests/kernels/test_backends_gpu.py \
        tests/kernels/test_triton_attention.py > "$R/gpu_tests.log" 2>&1
    stamp "gpu1 packed attention"
    timeout 110 python3 -m benchmarks.packed --out "$R/results" > "$R/packed.log" 2>&1
    stamp "gpu1 flash-attn check"
    timeout 90 python3 -m benchmarks.flash_attn_check --out "$R/results" --no-sweep > "$R/flash_attn_check.log" 2>&1
    stamp "gpu1 packed training"
    timeout 90 python3 -m benchmarks.packed_training --out "$R/results" > "$R/packed_training.log" 2>&1
    stamp "gpu1 done"
) &
(
    stamp "cpu compile test"
    timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/kernels/test_triton_compile.py > "$R/compile.log" 2>&1
    stamp "cpu done"
) &
wait
for log in versions compile gpu_tests kernel_variants attention packed flash_attn_check packed_training; do
    echo "---- $log"; tail -n 25 "$R/$log.log"
done
tar czf "$OUT/issue11.tar.gz" -C /tmp issue11
