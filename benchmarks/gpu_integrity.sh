#!/usr/bin/env bash
# One GPU call for the cost of the integrity checks (docs/reliability.md; BENCHMARKS.md, "Integrity
# checks"): first checks that a flipped byte in a checkpoint and in a store chunk is refused on this
# machine, then times `evaluate` of the shipped DNA model on the E. coli genome (trained context) and
# a training step of the quick-start model (8,192 tokens, 8 windows, bfloat16), each with the checks
# and without, in three interleaved rounds. About 2 minutes.
#   bash benchmarks/gpu_integrity.sh    (repository root, on the GPU machine; OUT set)
# Wheels for packages the GPU image lacks travel in .whl/ (benchmarks/gpu_setup.sh).
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_setup.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
python3 -m benchmarks.integrity --device cuda --out "$OUT/integrity" 2>&1 | tee "$OUT/integrity.log" | tail -n 40
