#!/usr/bin/env bash
# One GPU, a million tokens (docs/long_context.md): the GPU checks and figures of the long-context work in two calls of
# under 8 minutes each (H100 80GB or H200), from the repository root on the GPU machine, OUT set:
#
#   bash benchmarks/gpu_million.sh A     about 7.5 minutes, the most important: checks, memory, speed
#   bash benchmarks/gpu_million.sh B     about 7.5 minutes: the whole chromosome, scaling, the context
#
#   A  1. correctness: tests/core/test_long_sequences_gpu.py (window + global attention at 1M, 3M and
#         4.6M tokens against the exact rows, its gradients at 1M, a chunked recomputed step at 128k
#         against the plain one) -> million_check.log
#      2. training steps of the flagship's architecture and the 85M reference with the window + global
#         layout at 128k, 256k, 512k and 1M tokens, dense causal at 256k, the plain runtime beside, peak
#         memory per token (python -m benchmarks.million --step memory) -> million_memory.json
#      3. the flagship at 8k x 16: the recipe's settings today (compiled blocks), plain PyTorch with
#         compiled SDPA, CUDA graphs, flash-attn-4 (when installed), twice the batch, eager, then 32k;
#         profiles and the data loader's rate (--step speed) -> million_speed.json
#   B  4. E. coli's 4.6 Mbp evaluated, scored and embedded in one window by the commands' code
#         (--step chromosome) -> million_chromosome.json
#      5. does the context help: the flagship continued at 128k for what the budget leaves (about a
#         minute), then bits per base of held-out DNA at 32k, 128k and 1M with bootstrap intervals, before
#         and after (--step context) -> million_context.json, .png. The bacteria come from examples/
#         (written on the GPU machine); eukaryotic DNA only when .device/million/context_data.npz is
#         carried (about 1.5 MB; on the CPU machine: python -m benchmarks.million_data --out
#         .device/million --no_bacteria --eukaryote_bases 1000000 --extra ../shared-extra/genomes)
#      6. tokens/s and peak memory from 8k to 1M for both models and both layouts, plain PyTorch SDPA and
#         Flex beside them until they run out of memory, what the rest of the 8 minutes allows
#         (--step scaling) -> million_scaling.json, .png
#   Each part also writes million_A.log or million_B.log (every step's output); at most 6 files.
#   Step names after the part run only those steps, the later ones getting the time the others leave:
#     bash benchmarks/gpu_million.sh A check speed        bash benchmarks/gpu_million.sh B chromosome context
#
# Each step has a time budget and a hard limit (the budgets' sum keeps a part under 8 minutes); a step
# rewrites its result file after each case, so a step cut short or failed keeps what it measured and
# the next step runs. Needs the wheels the GPU image lacks on PYTHONPATH=/tmp/site (installed once per
# machine by benchmarks/gpu_setup.sh from a carried .whl/, or already there); flash-attn-4 is used when
# installed. SMOKE=1 runs every step on the CPU at tiny sizes (what was run to check this script).
# Afterwards, on the CPU machine, with the fetched folder F:
#   python -m benchmarks.report --results F --out F/million.md     (the tables and verdicts, to read)
#   cp F/million_*.json F/million_*.png benchmarks/results/ && python -m benchmarks.report   (BENCHMARKS.md)
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
export PYTHONUNBUFFERED=1
PART=${1:-}
ONLY=" ${*:2} "  # step names after the part: only those steps (e.g. A check speed), in the part's order
case "$PART" in
    A|B) ;;
    *) echo "usage: bash benchmarks/gpu_million.sh A|B [STEP...] (A first: check, memory, speed; B: chromosome, context, scaling)"
       exit 2 ;;
esac
for step in ${*:2}; do
    case "$PART:$step" in
        A:check|A:memory|A:speed|B:chromosome|B:context|B:scaling) ;;
        *) echo "part $PART has no step '$step': A has check, memory, speed; B has chromosome, context, scaling"; exit 2 ;;
    esac
done
wanted() { [ "$ONLY" = "  " ] || [[ "$ONLY" == *" $1 "* ]]; }
mkdir -p "$OUT"
LOG="$OUT/million_$PART.log"
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
STARTED=$SECONDS

if [ "${SMOKE:-0}" = 1 ]; then
    PYTHON=${PYTHON:-.venv/bin/python}
    SMOKE_FLAG=(--smoke)
else
    unset TRITON_INTERPRET
    if [ -f /tmp/site/.genoformer_installed ] || ls .whl/*.whl >/dev/null 2>&1; then
        source benchmarks/gpu_setup.sh || exit 1
    fi
    export PYTHONPATH=/tmp/site:$PWD
    PYTHON=python3
    SMOKE_FLAG=()
    if ! "$PYTHON" -c "import genoformer.kernels, genoformer.data, zarr, jsonargparse" 2>/dev/null; then
        log "installing this checkout (pip install -e ., no dependencies)"
        "$PYTHON" -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
    fi
    "$PYTHON" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" 2>&1 | tee -a "$LOG"
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee -a "$LOG"
fi

measure() {  # step, budget seconds, hard limit seconds, then more options
    local name=$1 budget=$2 limit=$3; shift 3
    if [ "$limit" -lt 45 ]; then
        log "$name: not run (only $limit s left of the part's 8 minutes)"
        return 1
    fi
    log "benchmarks.million --step $name (budget $budget s, limit $limit s)"
    timeout "$limit" "$PYTHON" -m benchmarks.million --step "$name" --out "$OUT" --budget-s "$budget" \
        "${SMOKE_FLAG[@]}" "$@" 2>&1 | tee -a "$LOG" | grep --line-buffered -v "Warning\|warn(\|^ *warnings\.\|^$"
    local status=${PIPESTATUS[0]}
    log "$name: exit $status$([ "$status" = 124 ] && echo ' (cut at its limit: the result file keeps the cases done)')"
    return "$status"
}

left() { echo $(( 455 - (SECONDS - STARTED) )); }  # seconds left of the part's 8 minutes, less a margin

status=0
if [ "$PART" = A ]; then
    if wanted check; then
        log "1. correctness: tests/core/test_long_sequences_gpu.py"
        if [ "${SMOKE:-0}" = 1 ]; then
            "$PYTHON" -m pytest -q -rs -p no:cacheprovider tests/core/test_long_sequences_gpu.py > "$OUT/million_check.log" 2>&1
        else
            GENOFORMER_TRITON_AUTOTUNE=0 timeout 110 "$PYTHON" -m pytest -q -m gpu -rfs --tb=short -p no:cacheprovider \
                tests/core/test_long_sequences_gpu.py > "$OUT/million_check.log" 2>&1
        fi
        check=$?
        log "correctness: exit $check"; tail -n 8 "$OUT/million_check.log"
        [ $check = 0 ] || status=1
    fi
    if wanted memory; then measure memory "${MEMORY_BUDGET:-95}" 125 --steps 1 || status=1; fi
    if wanted speed; then measure speed "$(( $(left) - 35 ))" "$(left)" || status=1; fi
else
    if wanted chromosome; then measure chromosome 75 90 || status=1; fi
    if wanted context; then
        data=("/tmp/million_data/bacteria")
        [ -f .device/million/context_data.npz ] && data+=(.device/million)
        smoke_data=()
        [ "${SMOKE:-0}" = 1 ] && smoke_data=(--context_before 3000)
        log "the context step's bacteria (python -m benchmarks.million_data --extra none)"
        "$PYTHON" -m benchmarks.million_data --out /tmp/million_data/bacteria --extra none "${smoke_data[@]}" 2>&1 | tee -a "$LOG"
        measure context "${CONTEXT_BUDGET:-170}" 200 --data "${data[@]}" --train-s "${CONTEXT_TRAIN:-80}" \
            --score-reserve-s 60 --plots "$OUT" || status=1
    fi
    if wanted scaling; then measure scaling "$(( $(left) - 30 ))" "$(left)" --plots "$OUT" || status=1; fi
fi
log "part $PART done in $(( SECONDS - STARTED )) s (exit $status); files: $(ls "$OUT" | tr '\n' ' ')"
exit $status
