#!/usr/bin/env bash
# `genoformer doctor` on the GPU machine (repository root): what it prints there and its exit status,
# into $OUT/doctor.txt. About a minute once the machine's wheels are installed (gpu_setup.sh), no GPU
# work beyond one-element probes. The lead runs it as
#   bash benchmarks/gpu_doctor.sh          (carry .whl: see benchmarks/gpu_setup.sh)
set -uo pipefail
source benchmarks/gpu_setup.sh || exit 1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$OUT/doctor.txt" 2>&1
python3 cli.py doctor >> "$OUT/doctor.txt" 2>&1
status=$?
echo "genoformer doctor exit status: $status" >> "$OUT/doctor.txt"
cat "$OUT/doctor.txt"
