#!/usr/bin/env bash
# One GPU call for the genome-science figures (BENCHMARKS.md, "Genome science"):
# trains the two recipe configs at the same time on one GPU (each process gets about half of it),
# exports the region-held-out model (the one shipped in examples/), scores the held-out data at
# 1k to 8k tokens of context and times `genoformer evaluate` on the 4.6 Mbp E. coli genome.
#   bash benchmarks/gpu_genome_science.sh MINUTES [MAX_STEPS]    (repository root, on the GPU machine; OUT set)
# Wheels for packages the GPU image lacks travel in .whl/ (copied from ../shared/wheels-cp312).
set -uo pipefail
MINUTES=${1:-7}
MAX_STEPS=${2:-0}   # 0: the configs' own max_steps
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_setup.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
python3 -m benchmarks.genome_science train --config configs/genome_bacteria_gpu.yaml --minutes "$MINUTES" --max_steps "$MAX_STEPS" \
    --out "$OUT/regions" --run_dir /tmp/gs_regions > "$OUT/regions.log" 2>&1 &
regions=$!
python3 -m benchmarks.genome_science train --config configs/genome_bacteria_heldout_gpu.yaml --minutes "$MINUTES" --max_steps "$MAX_STEPS" \
    --held_out val+test --out "$OUT/heldout" --run_dir /tmp/gs_heldout > "$OUT/heldout.log" 2>&1 &
heldout=$!
wait $regions; echo "regions exit $?"; wait $heldout; echo "heldout exit $?"
for run in regions heldout; do tail -n 40 "$OUT/$run/fit.log" | tr "\r" "\n" | tail -n 40 >> "$OUT/$run.log"; done
rm -f "$OUT"/heldout/model.ckpt "$OUT"/heldout/metrics.csv "$OUT"/regions/fit.log "$OUT"/heldout/fit.log
grep -h "context\|Error\|error" "$OUT"/regions.log "$OUT"/heldout.log | tail -20
