#!/usr/bin/env bash
# Issue 11 on a machine with two GPUs, flash-attn-4 installed first (the staged wheels:
# docs/flash_attn.md, "flash-attn-4 on this project's lent GPU machine"); each step fits one call:
#   bash benchmarks/gpu_issue11.sh bench    (repository root, on the GPU machine; OUT set)
#     GPU 0   the attention benchmark with flash-attn-4 and both Flex backends as columns
#             (420 s: the run of 2026-11-30 reached only 16k and 64k in 210 s)
#     GPU 1   kernel variants, the packed-attention benchmark, the flash-attn check (times per
#             situation and what auto picks), the packed training step (benchmarks/packed_training.py)
#   bash benchmarks/gpu_issue11.sh attention
#     GPU 0   the attention benchmark alone (GPU 1 stays free for other work); ATTN_BUDGET=SECONDS
#             shortens it (default 420), ATTN_ARGS adds options (e.g. "--lengths 16384 8192")
#   bash benchmarks/gpu_issue11.sh flexptx
#     GPU 0   FlexAttention's compiled kernels as PTX (benchmarks/flex_ptx.py) for the custom pattern at
#             D 128 and D 64, 16k, in $R/results/flex_ptx/; read them here with
#             `python -m benchmarks.spills --ptx .../*.ptx --per-loop` and a CUDA 13 ptxas
#             (benchmarks/spills.py says how; about a minute)
#   bash benchmarks/gpu_issue11.sh tests
#     GPU 0   the sweep of our kernels (tests/kernels/test_triton_attention.py: variants, packed rows)
#     GPU 1   every installed backend against float64 (tests/kernels/test_backends_gpu.py)
#     CPU     the sm_80 / sm_90 cross-compile test under this machine's Triton
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

attention() {
    (
        export CUDA_VISIBLE_DEVICES=0
        stamp "gpu0 attention benchmark"
        timeout $(( ${ATTN_BUDGET:-420} + 60 )) python3 -m benchmarks.attention --out "$R/results" --budget-s "${ATTN_BUDGET:-420}" ${ATTN_ARGS:-} > "$R/attention.log" 2>&1
        stamp "gpu0 done"
    )
}

bench() {
    attention &
    (
        export CUDA_VISIBLE_DEVICES=1
        stamp "gpu1 kernel variants"
        timeout 120 python3 -m benchmarks.kernel_variants --out "$R/results" > "$R/kernel_variants.log" 2>&1
        stamp "gpu1 packed attention"
        timeout 100 python3 -m benchmarks.packed --out "$R/results" > "$R/packed.log" 2>&1
        stamp "gpu1 flash-attn check"
        timeout 120 python3 -m benchmarks.flash_attn_check --out "$R/results" --no-sweep > "$R/flash_attn_check.log" 2>&1
        stamp "gpu1 packed training"
        timeout 120 python3 -m benchmarks.packed_training --out "$R/results" > "$R/packed_training.log" 2>&1
        stamp "gpu1 done"
    ) &
    wait
}

flexptx() {
    (
        export CUDA_VISIBLE_DEVICES=0
        for d in 128 64; do
            stamp "gpu0 Flex PTX, custom D$d"
            timeout 240 python3 -m benchmarks.flex_ptx --out "$R/results/flex_ptx/custom-$d" --pattern custom \
                --head-dim "$d" --seq-len 16384 > "$R/flex_ptx_$d.log" 2>&1
        done
        stamp "gpu0 done"
    )
}

tests() {
    # the two sweeps take more than one call's share each when run after the benchmarks: a call of their own
    (
        export CUDA_VISIBLE_DEVICES=0
        stamp "gpu0 our kernels' sweep"
        timeout 420 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider -n 8 \
            tests/kernels/test_triton_attention.py > "$R/gpu_tests_triton.log" 2>&1
        stamp "gpu0 done"
    ) &
    (
        export CUDA_VISIBLE_DEVICES=1
        stamp "gpu1 every installed backend"
        timeout 420 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider -n 8 \
            tests/kernels/test_backends_gpu.py > "$R/gpu_tests_backends.log" 2>&1
        stamp "gpu1 done"
    ) &
    (
        stamp "cpu compile test"
        timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/kernels/test_triton_compile.py > "$R/compile.log" 2>&1
        stamp "cpu done"
    ) &
    wait
}

case "${1:-}" in
    bench) bench ;;
    attention) attention ;;
    tests) tests ;;
    flexptx) flexptx ;;
    *) echo "usage: bash benchmarks/gpu_issue11.sh bench|attention|flexptx|tests"; exit 2 ;;
esac
for log in "$R"/*.log; do
    echo "---- $log"; tail -n 25 "$log"
done
tar czf "$OUT/issue11.tar.gz" -C /tmp issue11
