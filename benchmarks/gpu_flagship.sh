#!/usr/bin/env bash
# The GPU half of the flagship DNA model (issue 28; BENCHMARKS.md "Flagship DNA model"), each phase
# one device call of under 10 minutes on one warm machine (/tmp keeps the runs between them).
# The flagship itself (examples/genoformer_dna.ckpt), the GPU to itself:
#   bash benchmarks/gpu_flagship.sh stage1    # configs/genome_dna_gpu.yaml from the shipped model (the flagship
#       itself: it was trained from configs/genome_bacteria_gpu.yaml's model; this trains it on), ~8 min;
#       the bf16 weights come back in $OUT/flagship8k.ckpt (stage 2 can start from them on a new machine)
#   bash benchmarks/gpu_flagship.sh stage2    # configs/genome_dna_32k_gpu.yaml from stage 1, RoPE base 500,000,
#       ~4.5 min; then both stages are scored (benchmarks/flagship.py score) -> $OUT/flagship_final.tar.part*
# How the recipe was chosen, the first session's two calls (600 steps per 8k run, 300 at 32k):
#   bash benchmarks/gpu_flagship.sh sweep     # four 8k runs at once, ~7 min (configs/genome_dna_gpu.yaml):
#       warm      the model shipped before the flagship (examples/genoformer_bacteria_8k.ckpt, trained by
#                 configs/genome_bacteria_gpu.yaml; restore it first: git show 4576bed:examples/genoformer_bacteria_8k.ckpt
#                 > examples/genoformer_bacteria_8k.ckpt) trained on, all nine genomes
#       bacteria  the same start, the four bacteria only (the data ablation: what the eukaryotes add)
#       w256_d8   a fresh 256-wide, 8-layer model, all genomes    } the width/depth sweep at equal
#       w384_d6   a fresh 384-wide, 6-layer model, all genomes    } steps and tokens per step
#   bash benchmarks/gpu_flagship.sh long      # stage 2 (configs/genome_dna_32k_gpu.yaml) from `warm`,
#       two RoPE bases at once (10,000 as `warm` was trained, 500,000), ~4 min of training; then every model is scored on
#       the held-out sets (benchmarks/flagship.py score) and the results and the bf16 models come
#       back in $OUT (models cut in 15 MiB parts: cat them back together).
# Before: .device/dna/genomes.zarr (the nine genomes' store, built on the CPU machine by
# `python -m benchmarks.flagship store`) and .device/dna/heldout/ (`python -m benchmarks.flagship
# heldout`) travel with the call (device tool: carry [".whl", ".device"]).
# SMOKE=1 runs every step on the CPU at tiny sizes (what was run to check this script).
set -uo pipefail
PHASE=${1:?usage: bash benchmarks/gpu_flagship.sh stage1|stage2|sweep|long}
OUT=${OUT:-$PWD/gpu_out}
STORE=${STORE:-.device/dna/genomes.zarr}
HELDOUT=${HELDOUT:-.device/dna/heldout}
RUN=${RUN:-/tmp/flagship}
SMOKE=${SMOKE:-0}
SHIPPED=examples/genoformer_dna.ckpt
PREVIOUS=examples/genoformer_bacteria_8k.ckpt  # the first round's start (sweep): in git until 4576bed
BACTERIA=(examples/ecoli_k12_mg1655.fasta.gz examples/saureus_col.fasta.gz examples/hpylori_els37.fasta.gz examples/vcholerae_o395.fasta.gz)
mkdir -p "$OUT" "$RUN/logs"
export PYTHONUNBUFFERED=1
if [ "$SMOKE" = 1 ]; then
    PYTHON=${PYTHON:-.venv/bin/python}
    TINY=(--trainer.accelerator cpu --trainer.precision 32-true --trainer.max_steps 2 --trainer.val_check_interval 1
          --trainer.limit_val_batches 1 --model.init_args.runtime.compile false --data.init_args.batch_size 2
          --model.init_args.transformer.max_seq_len 256)
    FRESH_TINY=(--model.init_args.transformer.d_model 32 --model.init_args.transformer.n_layers 2 --model.init_args.transformer.n_heads 2)
    LONG_TINY=(--model.init_args.transformer.max_seq_len 512)
    SCORE=(--contexts 128 256 512 --max_bases 4000 --device cpu)
    WORKERS=0
else
    source benchmarks/gpu_setup.sh
    PYTHON=python3
    TINY=(); FRESH_TINY=(); LONG_TINY=(); SCORE=()
    WORKERS=2
    nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader
fi
fit() {  # name, then fit options
    local name=$1; shift
    # two loader workers each: four runs (and the time-series runs beside them) share 16 cores
    "$PYTHON" cli.py fit "$@" --data.init_args.num_workers "$WORKERS" --trainer.default_root_dir "$RUN/$name" > "$RUN/logs/$name.log" 2>&1
}
[ -d "$STORE" ] || { echo "$STORE not found: python -m benchmarks.flagship store, then carry .device"; exit 1; }
if [ "$PHASE" = stage1 ]; then
    fit flagship8k --config configs/genome_dna_gpu.yaml --data.init_args.store "$STORE" --init_weights "$SHIPPED" \
        --model.init_args.warmup_steps 50 "${TINY[@]}"
    status=$?
    tr '\r' '\n' < "$RUN/logs/flagship8k.log" | grep -v "^\s*$" | tail -n 5
    "$PYTHON" cli.py export --checkpoint "$RUN/flagship8k/checkpoints/last.ckpt" --out "$OUT/flagship8k.ckpt" \
        --dtype bfloat16 --overwrite true || status=1
    cp "$RUN/flagship8k/metrics.csv" "$OUT/flagship8k.metrics.csv" 2>/dev/null
    exit $status
elif [ "$PHASE" = stage2 ]; then
    # stage 1's run, or (on a new machine) its weights brought back by the stage1 call and carried here
    START=${START:-$RUN/flagship8k/checkpoints/last.ckpt}
    [ -f "$START" ] || { echo "$START not found: run the stage1 phase first (or START=flagship8k.ckpt)"; exit 1; }
    fit flagship32k --config configs/genome_dna_32k_gpu.yaml --data.init_args.store "$STORE" --init_weights "$START" \
        --model.init_args.transformer.max_seq_len 32768 --model.init_args.transformer.rope_theta 500000 "${TINY[@]}" "${LONG_TINY[@]}"
    status=$?
    tr '\r' '\n' < "$RUN/logs/flagship32k.log" | grep -v "^\s*$" | tail -n 5
    "$PYTHON" -m benchmarks.flagship score --runs "$RUN" --prefix flagship --heldout "$HELDOUT" --out "$OUT/flagship_final" "${SCORE[@]}" || status=1
    exit $status
elif [ "$PHASE" = sweep ]; then
    [ -f "$PREVIOUS" ] || { echo "$PREVIOUS not found: git show 4576bed:$PREVIOUS > $PREVIOUS"; exit 1; }
    weights=$(printf '%s: 1, ' "${BACTERIA[@]##*/}")
    # the first session's budget: 600 steps in at most 7 minutes per run
    C=(--config configs/genome_dna_gpu.yaml --trainer.max_steps 600 --trainer.max_time 00:00:07:00)
    fit warm "${C[@]}" --data.init_args.store "$STORE" --init_weights "$PREVIOUS" --model.init_args.warmup_steps 50 "${TINY[@]}" &
    fit bacteria "${C[@]}" --data.init_args.store "$RUN/bacteria.zarr" --data.init_args.fasta "[$(IFS=,; echo "${BACTERIA[*]}")]" \
        --data.init_args.source_weights "{${weights%, }}" --init_weights "$PREVIOUS" --model.init_args.warmup_steps 50 "${TINY[@]}" &
    fit w256_d8 "${C[@]}" --data.init_args.store "$STORE" "${TINY[@]}" "${FRESH_TINY[@]}" &
    fit w384_d6 "${C[@]}" --data.init_args.store "$STORE" --model.init_args.transformer.d_model 384 \
        --model.init_args.transformer.n_heads 6 "${TINY[@]}" "${FRESH_TINY[@]}" &
    status=0
    for job in $(jobs -p); do wait "$job" || status=1; done
    for log in "$RUN"/logs/*.log; do echo "== $log"; tr '\r' '\n' < "$log" | grep -v "^\s*$" | tail -n 3; done
    ls -la "$RUN"/*/checkpoints/last.ckpt
    exit $status
elif [ "$PHASE" = long ]; then
    # the context on the command line: with --init_weights the model (and a config's model options) is the checkpoint's
    C=(--config configs/genome_dna_32k_gpu.yaml --data.init_args.store "$STORE" --init_weights "$RUN/warm/checkpoints/last.ckpt"
       --model.init_args.transformer.max_seq_len 32768 --trainer.max_steps 300 --trainer.max_time 00:00:04:00)
    fit long_rope10k "${C[@]}" "${TINY[@]}" "${LONG_TINY[@]}" &
    fit long_rope500k "${C[@]}" --model.init_args.transformer.rope_theta 500000 "${TINY[@]}" "${LONG_TINY[@]}" &
    status=0
    for job in $(jobs -p); do wait "$job" || status=1; done
    for log in "$RUN"/logs/long_*.log; do echo "== $log"; tr '\r' '\n' < "$log" | grep -v "^\s*$" | tail -n 3; done
    "$PYTHON" -m benchmarks.flagship score --runs "$RUN" --prefix long --heldout "$HELDOUT" --out "$OUT/flagship_long" "${SCORE[@]}" || status=1
    exit $status
else
    echo "unknown phase $PHASE: use stage1, stage2, sweep or long"; exit 2
fi
