#!/usr/bin/env bash
# One GPU, a million tokens (docs/long_context.md) on the GPU machine: from the repository root, OUT set,
#
#   bash benchmarks/gpu_million.sh STEP...        (steps run in the order given; each under 8 minutes)
#
#   A        the highest priority, two calls' worth in one (about 7 min): training steps of the flagship's
#            architecture and the 85M reference with the window + global layout at 128k, 256k, 512k and
#            1M tokens (then 2M, 4M while the budget lasts), dense causal at 128k and 256k, the plain
#            runtime beside, peak memory per token (python -m benchmarks.million --step memory,
#            MEMORY_BUDGET s, default 240); then E. coli's 4.6 Mbp evaluated, scored and embedded in one
#            window by the commands' code (--step chromosome, CHROMOSOME_BUDGET s, default 150)
#   B        the flagship at 8k x 16 and 32k x 4: the recipe's settings today (compiled blocks), eager,
#            CUDA graphs, twice the batch, flash-attn-4 when installed, plain PyTorch with compiled SDPA;
#            torch.profiler summaries and the data loader's rate (--step speed, SPEED_BUDGET, default 300)
#   C        the scaling table: tokens/s and peak memory from 8k to 1M for both models and both
#            layouts, plain PyTorch SDPA and Flex beside them until they run out of memory
#            (--step scaling, SCALING_BUDGET, default 400), and its plot
#   D        does the context help: the flagship continued at 128k for CONTEXT_TRAIN s (default 200),
#            then bits per base of held-out bacterial and eukaryotic DNA at 32k, 128k and 1M with
#            bootstrap intervals (--step context, CONTEXT_BUDGET, default 400), and its plot. Needs
#            .device/million/context_data.npz, made on the CPU machine by
#              python -m benchmarks.million_data --out .device/million
#            and carried with the call (carry [".whl", ".device"]; about 50 MB with the wheels)
#
# Every step is resumable on its own: it writes $OUT/million_<step>.json after each case (a step cut
# short keeps what it measured); running it again measures it again. Wheels for packages the GPU
# image lacks travel in .whl/ (benchmarks/gpu_setup.sh). SMOKE=1 runs every step on the CPU at tiny
# sizes (what was run to check this script).
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "${SMOKE:-0}" = 1 ]; then
    PYTHON=${PYTHON:-.venv/bin/python}
    SMOKE_FLAG=(--smoke)
else
    unset TRITON_INTERPRET
    source benchmarks/gpu_setup.sh
    PYTHON=python3
    SMOKE_FLAG=()
    "$PYTHON" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
    nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
fi

log() { echo "== $(date -u +%H:%M:%S) $*"; }

measure() {  # step, budget seconds, then more options
    local name=$1 budget=$2; shift 2
    log "benchmarks.million --step $name (budget $budget s)"
    timeout $(( budget + 90 )) "$PYTHON" -m benchmarks.million --step "$name" --out "$OUT" --budget-s "$budget" \
        "${SMOKE_FLAG[@]}" "$@" > "$OUT/million_$name.log" 2>&1
    local status=$?
    grep -v "Warning\|warn(" "$OUT/million_$name.log" | tail -n 40
    return $status
}

A() {
    measure memory "${MEMORY_BUDGET:-240}"
    measure chromosome "${CHROMOSOME_BUDGET:-150}"
}

B() { measure speed "${SPEED_BUDGET:-300}"; }

C() { measure scaling "${SCALING_BUDGET:-400}" --plots "$OUT"; }

D() {
    local data=${CONTEXT_DATA:-.device/million}
    if [ "${SMOKE:-0}" = 1 ] && [ ! -f "$data/context_data.npz" ]; then
        "$PYTHON" -m benchmarks.million_data --out "$data" > "$OUT/million_data.log" 2>&1 || return 1
    fi
    [ -f "$data/context_data.npz" ] || { echo "$data/context_data.npz not found: python -m benchmarks.million_data --out $data, then carry .device"; return 1; }
    measure context "${CONTEXT_BUDGET:-400}" --data "$data" --train-s "${CONTEXT_TRAIN:-200}" --plots "$OUT"
}

status=0
for name in "$@"; do
    case "$name" in
        A|B|C|D) "$name" || status=1 ;;
        *) echo "unknown step $name: use A, B, C or D"; exit 2 ;;
    esac
done
exit $status
