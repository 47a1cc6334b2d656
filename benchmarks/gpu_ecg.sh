#!/usr/bin/env bash
# One GPU call for the ECG forecasting figures (BENCHMARKS.md, "Time series: ECG"):
# prepares the store, trains configs/ecg_8k_gpu.yaml for MINUTES, evaluates it at look-backs
# 512, 2,048 and 8,192 and both baselines under the protocol (the model: the variant of the config
# with the best validation MSE, all variants trained at once on the machine's GPUs), draws the forecast and the
# look-back curve, and prints the table last.
#   bash benchmarks/gpu_ecg.sh [MINUTES [ECG OPTIONS]]    (repository root, on the GPU machine; OUT set)
# ECG OPTIONS go to benchmarks/ecg.py (e.g. --num_workers 3); CUDA_VISIBLE_DEVICES picks the GPUs.
# Wheels for packages the GPU image lacks travel in .whl/ (benchmarks/gpu_setup.sh).
set -uo pipefail
MINUTES=${1:-5}
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_setup.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
python3 -m benchmarks.ecg /tmp/ecg_out --minutes "$MINUTES" --run_dir /tmp/ecg_run "${@:2}" 2>&1 | tee /tmp/ecg_out.log | tail -n 40
# the device tool brings back at most 8 files: everything travels as one archive
cp /tmp/ecg_out.log /tmp/ecg_out/run.log
tar czf "$OUT/ecg.tar.gz" -C /tmp ecg_out
