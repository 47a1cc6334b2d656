#!/usr/bin/env bash
# The attention kernels' GPU checks and figures, on one H200 with flash-attn-4 installed first (the
# staged wheels: docs/flash_attn.md, "flash-attn-4 on this project's lent GPU machine"). From the
# repository root on the GPU machine, OUT set; each step fits one call:
#   bash benchmarks/gpu_kernels.sh tests       every installed backend against float64, flash-attn-4 at its
#                                              trusted head dims (tests/kernels/test_backends_gpu.py), and our
#                                              kernels' GPU sweep (tests/kernels/test_triton_attention.py), side
#                                              by side; the sm_80 / sm_90 cross-compile test under this Triton
#   bash benchmarks/gpu_kernels.sh headdims    flash-attn-4 and our kernels at every head dim 16..256, output
#                                              and gradients against float64 (benchmarks/flash_attn_check.py
#                                              --head-dims): prints the FLASH_ATTN_4_HEAD_DIMS row to paste
#   bash benchmarks/gpu_kernels.sh flexflash   the attention table's sliding-window and BigBird rows again
#                                              (D 64 and 128, 16k and 32k; ours, Flex, Flex FLASH), with the
#                                              float64 check; merge them into the table with --render-from
#   bash benchmarks/gpu_kernels.sh attention   the attention table; ATTN_BUDGET=SECONDS (default 420) and
#                                              ATTN_ARGS (e.g. "--rounds 3 --lengths 16384": one length per
#                                              call, as Flex compiles for each shape) shape it
# Every result file and log goes into $OUT/gpu_kernels_STEP.tar.gz (a call brings back at most 8
# files); the tails of the logs are printed last.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GENOFORMER_TRITON_AUTOTUNE=1
unset TRITON_INTERPRET
source benchmarks/gpu_setup.sh
step=${1:-}
R=/tmp/gpu_kernels_$step
mkdir -p "$R/results"
python3 -c "import flash_attn.cute, torch, triton; print('flash-attn-4 imports; torch', torch.__version__, 'triton', triton.__version__)" \
    2>&1 | tee "$R/versions.log"
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee -a "$R/versions.log"
began=$(date +%s)
stamp() { echo "== $(( $(date +%s) - began )) s: $*"; }

tests() {
    (
        stamp "every installed backend"
        timeout 540 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider -n 6 \
            tests/kernels/test_backends_gpu.py > "$R/gpu_tests_backends.log" 2>&1
        stamp "backends done"
    ) &
    (
        stamp "our kernels' sweep"
        timeout 540 python3 -m pytest -q -rfs --tb=short -p no:cacheprovider -n 6 \
            tests/kernels/test_triton_attention.py > "$R/gpu_tests_triton.log" 2>&1
        stamp "our kernels done"
    ) &
    (
        stamp "cross-compile test"
        timeout 540 python3 -m pytest -q -rs -p no:cacheprovider tests/kernels/test_triton_compile.py > "$R/compile.log" 2>&1
        stamp "cross-compile done"
    ) &
    wait
}

headdims() {
    stamp "head-dim sweep"
    timeout 560 python3 -m benchmarks.flash_attn_check --head-dims --budget-s 420 --out "$R/results" \
        > "$R/flash_attn_head_dims.log" 2>&1
    stamp "head-dim sweep done"
}

flexflash() {
    stamp "sliding window and BigBird rows"
    timeout 560 python3 -m benchmarks.attention --out "$R/results" --budget-s 420 --rounds 3 \
        --patterns sliding_window bigbird --lengths 16384 32768 > "$R/attention_flexflash.log" 2>&1
    stamp "rows done"
}

attention() {
    stamp "attention table"
    timeout $(( ${ATTN_BUDGET:-420} + 120 )) python3 -m benchmarks.attention --out "$R/results" \
        --budget-s "${ATTN_BUDGET:-420}" ${ATTN_ARGS:-} > "$R/attention.log" 2>&1
    stamp "attention table done"
}

case "$step" in
    tests) tests ;;
    headdims) headdims ;;
    flexflash) flexflash ;;
    attention) attention ;;
    *) echo "usage: bash benchmarks/gpu_kernels.sh tests|headdims|flexflash|attention"; exit 2 ;;
esac
for log in "$R"/*.log; do
    echo "---- $log"; tail -n 25 "$log"
done
tar czf "$OUT/gpu_kernels_$step.tar.gz" -C /tmp "gpu_kernels_$step"
