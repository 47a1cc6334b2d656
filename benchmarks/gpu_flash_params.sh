#!/usr/bin/env bash
# flash-attn's parameters in our kernels, on one GPU (H100 or H200; about 8 minutes), from the repository
# root with OUT set:
#   bash benchmarks/gpu_flash_params.sh
# Before the call, on the CPU side (once): flash-attn's tests/test_flash_attn.py into .flash_attn_suite/, a folder
# git ignores (the file is read and run, never committed; from a clone of Dao-AILab/flash-attention, or a mirror:
# `fetch github:Dao-AILab/flash-attention` gives /work/.mirror/Dao-AILab+flash-attention/repo), and the wheels the
# GPU image lacks, einops for flash-attn's test file:
#   mkdir -p .flash_attn_suite && echo /.flash_attn_suite/ >> "$(git rev-parse --git-common-dir)/info/exclude"
#   git -C /work/.mirror/Dao-AILab+flash-attention/repo show HEAD:tests/test_flash_attn.py > .flash_attn_suite/test_flash_attn.py
#   mkdir -p .whl && cp ../shared/wheels-cp312/*.whl .whl/ && pip download --no-deps -d .whl einops==0.8.2
# then carry .flash_attn_suite and .whl (and flash-attn-4's staged wheels for the FA4 column: docs/flash_attn.md,
# "flash-attn-4 on this project's lent GPU machine"; without them FA4 is skipped with the reason).
# Steps, their results in $OUT (8 files):
#   1. our GPU tests of the new parameters (tests/kernels/test_flash_params.py: its GPU sweep and its CPU cases at
#      real tile sizes, the in-kernel dropout mask against PyTorch's; test_flash_attn_compat.py) -> flash_params_tests.log
#   2. flash-attn's own test file, unmodified, a seeded stratified sample of its cases against
#      genoformer.kernels.flash_attn_compat (benchmarks/flash_attn_suite.py) -> flash_attn_suite.{json,log}
#      (steps 1 and 2 run side by side: both mostly compile kernels, on the machine's 16 cores)
#   3. the timings: each parameter against its absence, FlexAttention and flash-attn-4, bf16 at 16k
#      (benchmarks/flash_params.py) -> flash_params.json, flash_params.log
# The result files (NAME.json, benchmarks/common.py's format) go to benchmarks/results/ to publish them
# (python -m benchmarks.report rebuilds BENCHMARKS.md).
# versions.log holds the GPU, torch, triton and flash-attn-4 lines. The tails print last.
# TESTS_S, SUITE_S and TIMINGS_S (default 290, 270, 210 seconds) bound the three steps, to fit a shorter call.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
TESTS_S=${TESTS_S:-290}; SUITE_S=${SUITE_S:-270}; TIMINGS_S=${TIMINGS_S:-210}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
source benchmarks/gpu_setup.sh
began=$(date +%s)
stamp() { echo "== $(( $(date +%s) - began )) s: $*"; }
{
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    python3 -c "import flash_attn.cute; print('flash-attn-4 imports')" 2>&1 | tail -n 1
} > "$OUT/versions.log" 2>&1

stamp "our GPU tests and flash-attn's suite, side by side"
(
    timeout "$TESTS_S" python3 -m pytest -v -rfs --tb=short -p no:cacheprovider -n 6 \
        tests/kernels/test_flash_params.py tests/kernels/test_flash_attn_compat.py > "$OUT/flash_params_tests.log" 2>&1
    echo "pytest exit status $?" >> "$OUT/flash_params_tests.log"
) &
tests=$!
python3 -m benchmarks.flash_attn_suite --out "$OUT" --workers 8 --budget "$SUITE_S" > "$OUT/flash_attn_suite.txt" 2>&1
wait "$tests"

stamp "timings"
timeout "$TIMINGS_S" python3 -m benchmarks.flash_params --out "$OUT" > "$OUT/flash_params.log" 2>&1
stamp "done"
grep -E "passed|failed|exit status" "$OUT/flash_params_tests.log" | tail -n 3
tail -n 30 "$OUT/flash_attn_suite.txt" "$OUT/flash_params.log"
