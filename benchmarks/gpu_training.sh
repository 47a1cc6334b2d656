#!/usr/bin/env bash
# Training and long context on the GPU machine (repository root, OUT set; benchmarks/gpu_setup.sh: the setup and the
# wheels in .whl/ that the GPU image lacks):
#
#   bash benchmarks/gpu_training.sh STEP...                 (step, speed and ddp run in the order given)
#   bash benchmarks/gpu_training.sh million A|B [STEP...]   (one part per call)
#   bash benchmarks/gpu_training.sh integrity
#
#   step       python -m benchmarks.train_step (the training step of configs/genome_8k_gpu.yaml's model per attention
#              backend), then 40 steps of `genoformer fit` with that config on real E. coli windows (its metrics.csv
#              and loss.png) -> $OUT/train_step/, $OUT/fit_genome_8k/
#   speed      python -m benchmarks.train (end-to-end speed of the 85M reference model, 8k..128k, eager and compiled,
#              plain-PyTorch anchors, profile, data module); TRAIN_BUDGET seconds (default 330) -> $OUT/train/
#   ddp        the same script's two-GPU DDP case beside its one-GPU twin (a machine with 2 GPUs); join it to the
#              one-GPU run with `python -m benchmarks.train --from ONE.json TWO.json` -> $OUT/train_ddp/
#   integrity  the cost of the integrity checks (docs/reliability.md): first checks that a flipped byte in a
#              checkpoint and in a store chunk is refused on this machine, then times `evaluate` of the shipped DNA
#              model on the first 1,000,000 bases of E. coli (its default context) and a training step of the
#              quick-start model (8,192 tokens, 8 windows, bfloat16) on the whole genome, each with the checks and
#              without, in five rotating rounds, by the wall clock; about 4 minutes -> $OUT/integrity_gpu.json (the
#              result file, beside the CPU one) and $OUT/integrity.log
#   million    one GPU, a million tokens (docs/long_context.md), in two calls of under 8 minutes each (H100 80GB or
#              H200), part A first:
#   A  1. check: tests/core/test_long_sequences_gpu.py (window + global attention at 1M, 3M and 4.6M tokens against
#         the exact rows, its gradients at 1M, a chunked recomputed step at 128k against the plain one)
#         -> million_check.log
#      2. memory: training steps of the flagship's architecture and the 85M reference with the window + global
#         layout at 128k, 256k, 512k and 1M tokens, dense causal at 256k, the plain runtime beside, peak memory per
#         token (python -m benchmarks.million --step memory) -> million_memory.json
#      3. speed: the flagship at 8k x 16: the recipe's settings today (compiled blocks), plain PyTorch with compiled
#         SDPA, CUDA graphs, flash-attn-4 (when installed), twice the batch, eager, then 32k; profiles and the data
#         loader's rate -> million_speed.json
#   B  4. chromosome: E. coli's 4.6 Mbp evaluated, scored and embedded in one window by the commands' code
#         -> million_chromosome.json
#      5. context: does the context help: the flagship continued at 128k for what the budget leaves (about a
#         minute), then bits per base of held-out DNA at 32k, 128k and 1M with bootstrap intervals, before and
#         after -> million_context.json, .png. The bacteria come from examples/ (written on the GPU machine);
#         eukaryotic DNA only when .device/million/context_data.npz is carried (about 1.5 MB; on the CPU machine:
#         python -m benchmarks.million_data --out .device/million --no_bacteria --eukaryote_bases 1000000
#         --extra ../shared-extra/genomes)
#      6. scaling: tokens/s and peak memory from 8k to 1M for both models and both layouts, plain PyTorch SDPA and
#         Flex beside them until they run out of memory, what the rest of the 8 minutes allows
#         -> million_scaling.json, .png
#      Each part also writes million_A.log or million_B.log (every step's output); at most 6 files. Step names
#      after the part run only those steps, the later ones getting the time the others leave:
#        bash benchmarks/gpu_training.sh million A check speed     bash benchmarks/gpu_training.sh million B context
#      Each step has a time budget and a hard limit (the budgets' sum keeps a part under 8 minutes); a step
#      rewrites its result file after each case, so a step cut short or failed keeps what it measured and the next
#      step runs; flash-attn-4 is used when installed. SMOKE=1 runs every step on the CPU at tiny sizes (what was
#      run to check it). Afterwards, on the CPU machine, with the fetched folder F:
#        python -m benchmarks.report --results F --out F/million.md     (the tables and verdicts, to read)
#        cp F/million_*.json F/million_*.png benchmarks/results/ && python -m benchmarks.report   (BENCHMARKS.md)
# A result file (NAME.json) goes to benchmarks/results/ to publish it (python -m benchmarks.report rebuilds
# BENCHMARKS.md). The tail of each log is printed.
set -uo pipefail
usage="usage: bash benchmarks/gpu_training.sh step|speed|ddp ...|million A|B [STEP...]|integrity"
case "${1:-}" in
    step|speed|ddp)
        for name in "$@"; do
            case "$name" in step|speed|ddp) ;; *) echo "unknown step $name (step, speed, ddp); $usage"; exit 2 ;; esac
        done ;;
    integrity) ;;
    million)
        PART=${2:-}
        case "$PART" in
            A|B) ;;
            *) echo "usage: bash benchmarks/gpu_training.sh million A|B [STEP...] (A first: check, memory, speed; B: chromosome, context, scaling)"
               exit 2 ;;
        esac
        for name in "${@:3}"; do
            case "$PART:$name" in
                A:check|A:memory|A:speed|B:chromosome|B:context|B:scaling) ;;
                *) echo "part $PART has no step '$name': A has check, memory, speed; B has chromosome, context, scaling"; exit 2 ;;
            esac
        done ;;
    *) echo "$usage"; exit 2 ;;
esac
source benchmarks/gpu_setup.sh || exit 1
[ "${SMOKE:-0}" = 1 ] || versions

train_step() {
    stamp "training step per backend"
    timeout "${STEP_TIMEOUT:-200}" "$PYTHON" -m benchmarks.train_step --out "$OUT/train_step" > "$OUT/train_step.log" 2>&1
    TAIL=20 tails "$OUT/train_step.log"
    stamp "genoformer fit, configs/genome_8k_gpu.yaml, 40 steps"
    timeout "${FIT_TIMEOUT:-200}" "$PYTHON" cli.py fit --config configs/genome_8k_gpu.yaml --trainer.max_steps 40 \
        --trainer.val_check_interval 40 --trainer.limit_val_batches 2 --trainer.log_every_n_steps 5 \
        --trainer.enable_progress_bar false --trainer.default_root_dir /tmp/fit8k \
        --data.init_args.store /tmp/fit8k/ecoli.zarr > "$OUT/fit_genome_8k.log" 2>&1
    TAIL=20 tails "$OUT/fit_genome_8k.log"
    mkdir -p "$OUT/fit_genome_8k"
    cp /tmp/fit8k/metrics.csv /tmp/fit8k/loss.png "$OUT/fit_genome_8k/"
}

speed() {
    stamp "end-to-end training speed, budget ${TRAIN_BUDGET:-330} s"
    timeout $((${TRAIN_BUDGET:-330} + 60)) "$PYTHON" -m benchmarks.train --out "$OUT/train" \
        --budget-s "${TRAIN_BUDGET:-330}" > "$OUT/train.log" 2>&1
    TAIL=45 tails "$OUT/train.log"
}

ddp() {
    stamp "two GPUs with DDP against one"
    timeout "${DDP_TIMEOUT:-300}" "$PYTHON" -m benchmarks.train --out "$OUT/train_ddp" \
        --cases 'fit-synthetic-8k,ddp-synthetic-8k-x2' --budget-s 240 > "$OUT/train_ddp.log" 2>&1
    TAIL=25 tails "$OUT/train_ddp.log"
}

integrity() {
    timeout 450 "$PYTHON" -m benchmarks.integrity --device cuda --name integrity_gpu --out "$OUT" 2>&1 \
        | tee "$OUT/integrity.log" | tail -n 60
}

million() {  # part, then step names (none: all the part's steps)
    local part=$1 only=" ${*:2} " status=0
    LOG="$OUT/million_$part.log"
    [ "${SMOKE:-0}" = 1 ] || versions > "$LOG"
    SMOKE_FLAG=()
    [ "${SMOKE:-0}" = 1 ] && SMOKE_FLAG=(--smoke)
    wanted() { [ "$only" = "  " ] || [[ "$only" == *" $1 "* ]]; }
    log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
    left() { echo $((455 - (SECONDS - STARTED))); }  # seconds left of the part's 8 minutes, less a margin
    measure() {  # step, budget seconds, hard limit seconds, then more options
        local name=$1 budget=$2 limit=$3
        shift 3
        if [ "$limit" -lt 45 ]; then
            log "$name: not run (only $limit s left of the part's 8 minutes)"
            return 1
        fi
        log "benchmarks.million --step $name (budget $budget s, limit $limit s)"
        timeout "$limit" "$PYTHON" -m benchmarks.million --step "$name" --out "$OUT" --budget-s "$budget" \
            "${SMOKE_FLAG[@]}" "$@" 2>&1 | tee -a "$LOG" | grep --line-buffered -v "Warning\|warn(\|^ *warnings\.\|^$"
        local code=${PIPESTATUS[0]}
        log "$name: exit $code$([ "$code" = 124 ] && echo ' (cut at its limit: the result file keeps the cases done)')"
        return "$code"
    }
    if [ "$part" = A ]; then
        if wanted check; then
            log "1. correctness: tests/core/test_long_sequences_gpu.py"
            local gpu=(-m gpu)
            [ "${SMOKE:-0}" = 1 ] && gpu=()
            GENOFORMER_TRITON_AUTOTUNE=0 timeout 110 "$PYTHON" -m pytest -q "${gpu[@]}" -rfs --tb=short \
                -p no:cacheprovider tests/core/test_long_sequences_gpu.py > "$OUT/million_check.log" 2>&1
            local check=$?
            log "correctness: exit $check"
            tail -n 8 "$OUT/million_check.log"
            [ $check = 0 ] || status=1
        fi
        if wanted memory; then measure memory "${MEMORY_BUDGET:-95}" 125 --steps 1 || status=1; fi
        if wanted speed; then measure speed "$(($(left) - 35))" "$(left)" || status=1; fi
    else
        if wanted chromosome; then measure chromosome 75 90 || status=1; fi
        if wanted context; then
            local data=("/tmp/million_data/bacteria") smoke_data=()
            [ -f .device/million/context_data.npz ] && data+=(.device/million)
            [ "${SMOKE:-0}" = 1 ] && smoke_data=(--context_before 3000)
            log "the context step's bacteria (python -m benchmarks.million_data --extra none)"
            "$PYTHON" -m benchmarks.million_data --out /tmp/million_data/bacteria --extra none "${smoke_data[@]}" 2>&1 \
                | tee -a "$LOG"
            measure context "${CONTEXT_BUDGET:-170}" 200 --data "${data[@]}" --train-s "${CONTEXT_TRAIN:-80}" \
                --score-reserve-s 60 --plots "$OUT" || status=1
        fi
        if wanted scaling; then measure scaling "$(($(left) - 30))" "$(left)" --plots "$OUT" || status=1; fi
    fi
    log "part $part done in $((SECONDS - STARTED)) s (exit $status); files: $(ls "$OUT" | tr '\n' ' ')"
    return $status
}

case "$1" in
    million) million "${@:2}" ;;
    integrity) integrity ;;
    *) for name in "$@"; do if [ "$name" = step ]; then train_step; else "$name"; fi; done; stamp done ;;
esac
