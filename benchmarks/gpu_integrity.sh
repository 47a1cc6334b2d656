#!/usr/bin/env bash
# One GPU call for the cost of the integrity checks (docs/reliability.md): first checks that a flipped
# byte in a checkpoint and in a store chunk is refused on this machine, then times `evaluate` of the
# shipped DNA model on the first 1,000,000 bases of the E. coli genome (its default context) and a
# training step of the quick-start model (8,192 tokens, 8 windows, bfloat16) on the whole genome,
# each with the checks and without, in five rotating rounds, by the wall clock. About 4 minutes.
# Writes OUT/integrity_gpu.json (the result file, beside the CPU one: copy it to benchmarks/results/ and run
# `python -m benchmarks.report`) and OUT/integrity.log.
#   bash benchmarks/gpu_integrity.sh    (repository root, on the GPU machine; OUT set)
# Needs the pre-installed wheels (zarr, ...): benchmarks/gpu_setup.sh puts /tmp/site on PYTHONPATH.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_setup.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
timeout 450 python3 -m benchmarks.integrity --device cuda --name integrity_gpu --out "$OUT" 2>&1 | tee "$OUT/integrity.log" | tail -n 60
