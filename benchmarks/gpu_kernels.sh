#!/usr/bin/env bash
# The kernels' GPU checks and figures (H100 or H200; flash-attn-4 installed first from the staged wheels where a step
# compares with it: docs/flash_attn.md, "flash-attn-4 on this project's lent GPU machine"). From the repository root
# on the GPU machine, OUT set, one step per call (benchmarks/gpu_setup.sh: the setup; carry .whl on a first call):
#   bash benchmarks/gpu_kernels.sh tests       every installed backend against float64, flash-attn-4 at its
#                                              trusted head dims (tests/kernels/test_backends_gpu.py), and our
#                                              kernels' GPU sweep (tests/kernels/test_triton_attention.py), side
#                                              by side; the sm_80 / sm_90 cross-compile test under this Triton,
#                                              of every candidate configuration (GENOFORMER_COMPILE=all)
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
#   These eight put every result file and log into $OUT/gpu_kernels_STEP.tar.gz (a call brings back at most 8 files).
#   bash benchmarks/gpu_kernels.sh flash_params    flash-attn's parameters in our kernels, about 8 minutes (below)
#   bash benchmarks/gpu_kernels.sh plugin 1|2      our kernels plugged in elsewhere, and faster inference (below)
#   bash benchmarks/gpu_kernels.sh doctor          `genoformer doctor` there and its exit status -> $OUT/doctor.txt
#
# flash_params. Before the call, on the CPU side (once): flash-attn's tests/test_flash_attn.py into .flash_attn_suite/,
# a folder git ignores (read and run, never committed; from a clone of Dao-AILab/flash-attention, or a mirror:
# `fetch github:Dao-AILab/flash-attention` gives /work/.mirror/Dao-AILab+flash-attention/repo), and einops's wheel:
#   mkdir -p .flash_attn_suite && echo /.flash_attn_suite/ >> "$(git rev-parse --git-common-dir)/info/exclude"
#   git -C /work/.mirror/Dao-AILab+flash-attention/repo show HEAD:tests/test_flash_attn.py > .flash_attn_suite/test_flash_attn.py
#   mkdir -p .whl && cp ../shared/wheels-cp312/*.whl .whl/ && pip download --no-deps -d .whl einops==0.8.2
# then carry .flash_attn_suite and .whl (and flash-attn-4's staged wheels for the FA4 column; without them FA4 is
# skipped with the reason). Its steps, with their results in $OUT (8 files):
#   1. our GPU tests of the new parameters (tests/kernels/test_flash_params.py: its GPU sweep and its CPU cases at
#      real tile sizes, the in-kernel dropout mask against PyTorch's; test_flash_attn_compat.py) -> flash_params_tests.log
#   2. flash-attn's own test file, unmodified, a seeded stratified sample of its cases against
#      genoformer.kernels.flash_attn_compat (benchmarks/flash_attn_suite.py) -> flash_attn_suite.{json,log}
#      (steps 1 and 2 run side by side: both mostly compile kernels, on the machine's 16 cores)
#   3. the timings: each parameter against its absence, FlexAttention and flash-attn-4, bf16 at 16k
#      (benchmarks/flash_params.py) -> flash_params.json, flash_params.log
# versions.log holds the GPU, torch, triton and flash-attn-4 lines. TESTS_S, SUITE_S and TIMINGS_S (default 290,
# 270, 210 seconds) bound the three steps, to fit a shorter call.
#
# plugin (benchmarks/plugin.py): the GPU tests of what the part measures, then its sections against their same-run
# baselines, each section in a process of its own writing $OUT/plugin_SECTION.json when it ends (one that crashes or
# runs out of time loses only its own file), and $OUT/gpu_tests_PART.log; the call stops starting steps at LIMIT s.
#   part 1, decoding (~4 min): tests of the decoding kernel and of CUDA-graph generation, then generate, decode and
#           mutagenesis
#   part 2, transformers and FP8 (~5 min): tests of transformers models on our kernels, the FP8 kernel and xformers
#           (skipped where it is not installed), then hf, fp8 and fp8_budget
# Join the fetched files into one result (here, not on the GPU):
#   python -m benchmarks.plugin --out benchmarks/results --from DIR1/plugin_*.json DIR2/plugin_*.json
#
# The result files (NAME.json, benchmarks/common.py's format) go to benchmarks/results/ to publish them
# (python -m benchmarks.report rebuilds BENCHMARKS.md). The tails of the logs print last.
set -uo pipefail
usage="usage: bash benchmarks/gpu_kernels.sh tests|headdims|flexflash|attention|gluon|gluontests|bwd|mfu|flash_params|plugin 1|plugin 2|doctor"
step_name=${1:-}
case "$step_name" in
    tests|headdims|flexflash|attention|gluon|gluontests|bwd|mfu|flash_params|doctor) ;;
    plugin) [[ "${2:-}" =~ ^[12]$ ]] || { echo "$usage (plugin 1: decoding; plugin 2: transformers and FP8)"; exit 2; } ;;
    *) echo "$usage"; exit 2 ;;
esac
source benchmarks/gpu_setup.sh || exit 1
export GENOFORMER_TRITON_AUTOTUNE=1
R=/tmp/gpu_kernels_$step_name
mkdir -p "$R/results"
PYTEST=("$PYTHON" -m pytest -rfs --tb=short -p no:cacheprovider)

tests() {
    stamp "every installed backend; our kernels' sweep; the cross-compile test"
    timeout 540 "${PYTEST[@]}" -q -n 6 tests/kernels/test_backends_gpu.py > "$R/gpu_tests_backends.log" 2>&1 &
    timeout 540 "${PYTEST[@]}" -q -n 6 tests/kernels/test_triton_attention.py > "$R/gpu_tests_triton.log" 2>&1 &
    GENOFORMER_COMPILE=all timeout 540 "${PYTEST[@]}" -q tests/kernels/test_triton_compile.py > "$R/compile.log" 2>&1 &
    wait
}

headdims() {
    timeout 560 "$PYTHON" -m benchmarks.flash_attn_check --budget-s 420 --out "$R/results" > "$R/flash_attn_head_dims.log" 2>&1
}

flexflash() {
    timeout 560 "$PYTHON" -m benchmarks.attention --out "$R/results_${OURS:-triton}" --budget-s 420 --rounds 3 \
        --ours "${OURS:-triton}" --patterns sliding_window bigbird --lengths 16384 32768 \
        > "$R/attention_flexflash_${OURS:-triton}.log" 2>&1
}

attention() {
    timeout $((${ATTN_BUDGET:-420} + 120)) "$PYTHON" -m benchmarks.attention --out "$R/results" \
        --budget-s "${ATTN_BUDGET:-420}" ${ATTN_ARGS:-} > "$R/attention.log" 2>&1
}

gluon() {
    GENOFORMER_TRITON_AUTOTUNE=0 timeout 300 "${PYTEST[@]}" -m gpu -q tests/kernels/test_gluon.py > "$R/gpu_tests_gluon.log" 2>&1
    stamp "Gluon forward against flash-attn-4"
    timeout 220 "$PYTHON" -m benchmarks.gluon_bench --out "$R/results" --passes fwd --budget-s 170 > "$R/gluon_bench.log" 2>&1
}

gluontests() {
    GENOFORMER_TRITON_AUTOTUNE=0 timeout 330 "${PYTEST[@]}" -q tests/kernels/test_gluon.py tests/kernels/test_triton_attention.py \
        -k "gluon or split" > "$R/gpu_tests_gluon.log" 2>&1
    stamp "Gluon forward on layouts against the Triton forward"
    timeout 170 "$PYTHON" -m benchmarks.gluon_bench --out "$R/results" --passes layouts --seq-lens 16384 32768 \
        --budget-s 110 > "$R/gluon_layouts.log" 2>&1
}

bwd() {
    timeout $((${BWD_BUDGET:-260} + 80)) "$PYTHON" -m benchmarks.gluon_bench --out "$R/results" --passes bwd \
        --seq-lens 16384 32768 8192 65536 --implementations triton fa2 fa4 --budget-s "${BWD_BUDGET:-260}" \
        > "$R/gluon_bwd.log" 2>&1
}

mfu() {
    for backend in ${MFU_BACKENDS:-gluon flash_attn_4 triton}; do
        stamp "85M model, 8k, compiled, attention backend $backend"
        timeout $((${MFU_BUDGET:-180} + 20)) "$PYTHON" -m benchmarks.train --out "$R/train_$backend" \
            --cases genoformer-causal-8k-compiled --attention-backend "$backend" --budget-s "${MFU_BUDGET:-180}" \
            > "$R/train_$backend.log" 2>&1
    done
}

flash_params() {
    stamp "our GPU tests and flash-attn's suite, side by side"
    (
        timeout "${TESTS_S:-290}" "${PYTEST[@]}" -v -n 6 tests/kernels/test_flash_params.py tests/kernels/test_flash_attn_compat.py \
            > "$OUT/flash_params_tests.log" 2>&1
        echo "pytest exit status $?" >> "$OUT/flash_params_tests.log"
    ) &
    "$PYTHON" -m benchmarks.flash_attn_suite --out "$OUT" --workers 8 --budget "${SUITE_S:-270}" > "$OUT/flash_attn_suite.txt" 2>&1
    wait
    stamp "timings"
    timeout "${TIMINGS_S:-210}" "$PYTHON" -m benchmarks.flash_params --out "$OUT" > "$OUT/flash_params.log" 2>&1
    grep -E "passed|failed|exit status" "$OUT/flash_params_tests.log" | tail -n 3
    TAIL=30 tails "$OUT/flash_attn_suite.txt" "$OUT/flash_params.log"
}

plugin() {
    local part=$1 tests sections code failed=0
    if [ "$part" = 1 ]; then
        tests="tests/kernels/test_triton_decode.py tests/genome/test_generate.py"
        sections="generate:120 decode:60 mutagenesis:90"
    else
        tests="tests/kernels/test_transformers_attention.py tests/kernels/test_triton_fp8.py tests/kernels/test_xformers_backend.py"
        sections="hf:130 fp8:130 fp8_budget:80"
    fi
    "$PYTHON" - <<'EOF'
import importlib.metadata as m, importlib.util as u
print(", ".join(f"{p} {m.version(p) if u.find_spec(s) else 'NOT INSTALLED'}" for p, s in (
    ("torch", "torch"), ("triton", "triton"), ("transformers", "transformers"), ("xformers", "xformers"))),
    "; flash-attn-4", "importable" if u.find_spec("flash_attn") else "NOT INSTALLED", flush=True)
EOF
    # 1. correctness: the GPU tests of what this part measures (untuned launch configurations: faster)
    GENOFORMER_TRITON_AUTOTUNE=0 step 150 "${PYTEST[@]}" -q -m gpu $tests > "$OUT/gpu_tests_$part.log" 2>&1
    code=$?
    stamp "gpu tests: exit $code"
    tail -4 "$OUT/gpu_tests_$part.log"
    [ "$code" -ne 0 ] && echo "GPU TESTS FAILED ($OUT/gpu_tests_$part.log): the figures below are of code that failed its checks"
    # 2. the figures, one process per section (the tuner on: the launch configurations users get)
    for entry in $sections; do
        section=${entry%%:*}
        step "${entry##*:}" "$PYTHON" -m benchmarks.plugin --out "$OUT" --name "plugin_$section" --sections "$section" \
            || failed=1
        stamp "$section: $([ -f "$OUT/plugin_$section.json" ] && echo "$OUT/plugin_$section.json" || echo 'NO RESULT')"
    done
    stamp "part $part done; tests exit $code; a section failed: $failed"
}

doctor() {
    {
        nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv
        "$PYTHON" cli.py doctor
        echo "genoformer doctor exit status: $?"
    } > "$OUT/doctor.txt" 2>&1
    cat "$OUT/doctor.txt"
}

{
    versions
    "$PYTHON" -c "import flash_attn.cute; print('flash-attn-4 imports')" 2>&1 | tail -n 1
} > "$R/versions.log"
cat "$R/versions.log"
case "$step_name" in
    flash_params) cp "$R/versions.log" "$OUT/versions.log"; flash_params ;;
    plugin) plugin "$2" ;;
    doctor) doctor ;;
    *)
        stamp "$step_name"
        "$step_name"
        stamp "$step_name done"
        tails "$R"/*.log
        tar czf "$OUT/gpu_kernels_$step_name.tar.gz" -C /tmp "gpu_kernels_$step_name"
        ;;
esac
