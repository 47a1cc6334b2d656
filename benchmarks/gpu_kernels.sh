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
#                                              ): its result names the FLASH_ATTN_4_HEAD_DIMS row to paste
#   bash benchmarks/gpu_kernels.sh flexflash   the attention table's sliding-window and BigBird rows again
#                                              (D 64 and 128, 16k and 32k; ours, Flex, Flex FLASH), with the
#                                              float64 check; join them to the table with --from;
#                                              OURS=gluon for the Hopper path as ours (default triton)
#   bash benchmarks/gpu_kernels.sh attention   the attention table; ATTN_BUDGET=SECONDS (default 420) and
#                                              ATTN_ARGS (e.g. "--rounds 3 --lengths 16384": one length per
#                                              call, as Flex compiles for each shape; "--ours gluon" for the
#                                              Hopper path) shape it
#   bash benchmarks/gpu_kernels.sh gluon       the Gluon forward's GPU tests (tests/kernels/test_gluon.py: every
#                                              table, layouts and key padding, against float64), then its
#                                              forward against flash-attn-4 (benchmarks/gluon_bench.py)
#   bash benchmarks/gpu_kernels.sh gluontests  those GPU tests alone, and the split-row tests of the Triton
#                                              kernels (whose partials the Gluon forward shares); then the
#                                              Gluon forward against the Triton one on block-sparse layouts
#                                              (benchmarks/gluon_bench.py --passes layouts, 16k and 32k)
#   bash benchmarks/gpu_kernels.sh bwd         our backward (tuned) against FA2 and flash-attn-4, D 64 and 128,
#                                              causal and not, 16k, 32k, 8k, 64k (benchmarks/gluon_bench.py
#                                              --passes bwd; BWD_BUDGET seconds, default 260)
#   bash benchmarks/gpu_kernels.sh mfu         the 85M reference model at 8k, compiled (benchmarks/train.py's
#                                              genoformer-causal-8k-compiled), on the gluon backend, then on
#                                              flash_attn_4, then on triton, one after the other
#                                              (MFU_BACKENDS, MFU_BUDGET seconds each: default 180)
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
    timeout 560 python3 -m benchmarks.flash_attn_check --budget-s 420 --out "$R/results" \
        > "$R/flash_attn_head_dims.log" 2>&1
    stamp "head-dim sweep done"
}

flexflash() {
    stamp "sliding window and BigBird rows"
    timeout 560 python3 -m benchmarks.attention --out "$R/results_${OURS:-triton}" --budget-s 420 --rounds 3 \
        --ours "${OURS:-triton}" --patterns sliding_window bigbird --lengths 16384 32768 \
        > "$R/attention_flexflash_${OURS:-triton}.log" 2>&1
    stamp "rows done"
}

attention() {
    stamp "attention table"
    timeout $(( ${ATTN_BUDGET:-420} + 120 )) python3 -m benchmarks.attention --out "$R/results" \
        --budget-s "${ATTN_BUDGET:-420}" ${ATTN_ARGS:-} > "$R/attention.log" 2>&1
    stamp "attention table done"
}

gluon() {
    stamp "Gluon forward GPU tests"
    GENOFORMER_TRITON_AUTOTUNE=0 timeout 300 python3 -m pytest -m gpu -q -rs --tb=short -p no:cacheprovider \
        tests/kernels/test_gluon.py > "$R/gpu_tests_gluon.log" 2>&1
    stamp "Gluon forward against flash-attn-4"
    timeout 220 python3 -m benchmarks.gluon_bench --out "$R/results" --passes fwd --budget-s 170 \
        > "$R/gluon_bench.log" 2>&1
    stamp "done"
}

gluontests() {
    stamp "Gluon forward GPU tests, Triton split rows"
    GENOFORMER_TRITON_AUTOTUNE=0 timeout 330 python3 -m pytest -q -rs --tb=short \
        -p no:cacheprovider tests/kernels/test_gluon.py tests/kernels/test_triton_attention.py -k "gluon or split" \
        > "$R/gpu_tests_gluon.log" 2>&1
    stamp "Gluon forward on layouts against the Triton forward"
    timeout 170 python3 -m benchmarks.gluon_bench --out "$R/results" --passes layouts --seq-lens 16384 32768 \
        --budget-s 110 > "$R/gluon_layouts.log" 2>&1
    stamp "done"
}

bwd() {
    stamp "backward: ours tuned, FA2, flash-attn-4"
    timeout $(( ${BWD_BUDGET:-260} + 80 )) python3 -m benchmarks.gluon_bench --out "$R/results" --passes bwd \
        --seq-lens 16384 32768 8192 65536 --implementations triton fa2 fa4 --budget-s "${BWD_BUDGET:-260}" \
        > "$R/gluon_bwd.log" 2>&1
    stamp "done"
}

mfu() {
    for backend in ${MFU_BACKENDS:-gluon flash_attn_4 triton}; do
        stamp "85M model, 8k, compiled, attention backend $backend"
        timeout $(( ${MFU_BUDGET:-180} + 20 )) python3 -m benchmarks.train --out "$R/train_$backend" \
            --cases genoformer-causal-8k-compiled --attention-backend "$backend" --budget-s "${MFU_BUDGET:-180}" \
            > "$R/train_$backend.log" 2>&1
    done
    stamp "done"
}

case "$step" in
    gluon) gluon ;;
    gluontests) gluontests ;;
    bwd) bwd ;;
    mfu) mfu ;;
    tests) tests ;;
    headdims) headdims ;;
    flexflash) flexflash ;;
    attention) attention ;;
    *) echo "usage: bash benchmarks/gpu_kernels.sh tests|headdims|flexflash|attention|gluon|gluontests|bwd|mfu"; exit 2 ;;
esac
for log in "$R"/*.log; do
    echo "---- $log"; tail -n 25 "$log"
done
tar czf "$OUT/gpu_kernels_$step.tar.gz" -C /tmp "gpu_kernels_$step"
