# The setup every GPU driver (benchmarks/gpu_AREA.sh STEP, from the repository root) sources first:
#   kernels      bash benchmarks/gpu_kernels.sh      attention kernels, flash-attn's parameters, plugins, doctor
#   genome       bash benchmarks/gpu_genome.sh       the DNA models: flagship, fine-tuning, the gene model
#   time series  bash benchmarks/gpu_timeseries.sh   ECG and the forecasting datasets
#   training     bash benchmarks/gpu_training.sh     training speed, a million tokens, the integrity checks' cost
# Each prints its steps when run without one. It sets OUT (default ./gpu_out, made), PYTHON and
# PYTHONUNBUFFERED, and on the GPU machine installs once per machine the wheels the GPU image lacks
# (carried in .whl/, copied from ../shared/wheels-cp312 plus vcfpy and pyBigWig, which scoring imports)
# and this package, so that genoformer.data and genoformer.kernels import. Fill .whl/ here first with
#   mkdir -p .whl && cp ../shared/wheels-cp312/*.whl .whl/ && pip download --no-deps --only-binary=:all: \
#        --python-version 3.12 --platform manylinux2014_x86_64 -d .whl vcfpy==0.14.2 pyBigWig==0.3.24
# Wheels staged by an earlier call of the same machine (too many for one call's carry) are in /tmp/staged.
# Scripts started together, or later calls on the warm machine (which then need not carry .whl/ again,
# leaving room in the call for data), find the marker and only set PYTHONPATH. SMOKE=1 installs
# nothing and runs .venv/bin/python on this CPU (the drivers' check at tiny sizes, where a step has one).
# The helpers it gives the drivers:
#   stamp TEXT          "== SECONDS s: TEXT" (seconds since the setup)
#   versions            the GPU, driver, memory, clock, torch and triton lines
#   step CAP CMD...     CMD for at most CAP seconds, fewer when the call's LIMIT seconds (default 450: the 8
#                       minutes of a call less its start and transfers) are spent; says when it timed out
#   tails LOG...        the last lines of each log
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LIMIT=${LIMIT:-450}
STARTED=$SECONDS
if [ "${SMOKE:-0}" = 1 ]; then
    PYTHON=${PYTHON:-.venv/bin/python}
else
    unset TRITON_INTERPRET
    PYTHON=python3
    if [ ! -f /tmp/site/.genoformer_installed ]; then
        if ! ls .whl/*.whl >/dev/null 2>&1 && ! python3 -c "import zarr, jsonargparse" 2>/dev/null; then
            echo "gpu_setup.sh: nothing installed on this machine yet and no wheels in .whl/: carry .whl (see above)"
            return 1 2>/dev/null || exit 1
        fi
        wheels=$(ls .whl/*.whl /tmp/staged/*.whl 2>/dev/null)
        [ -n "$wheels" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels 2>&1 | tail -2
        python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
        mkdir -p /tmp/site && touch /tmp/site/.genoformer_installed
    fi
    export PYTHONPATH=/tmp/site:$PWD
fi

stamp() { echo "== $((SECONDS - STARTED)) s: $*"; }

versions() {
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,temperature.gpu --format=csv,noheader 2>&1
    "$PYTHON" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1
}

step() {
    local cap=$1 left=$((LIMIT - (SECONDS - STARTED)))
    shift
    if [ "$left" -lt 30 ]; then
        stamp "SKIPPED, the call's $LIMIT s are spent: $*"
        return 1
    fi
    [ "$cap" -gt "$left" ] && cap=$left
    stamp "$* (at most $cap s)"
    timeout -k 10 "$cap" "$@"
    local code=$?
    [ "$code" -eq 124 ] && stamp "TIMED OUT after $cap s: $*"
    return "$code"
}

tails() { for log in "$@"; do echo "---- $log"; tr '\r' '\n' < "$log" | grep -v "^\s*$" | tail -n "${TAIL:-25}"; done; }
