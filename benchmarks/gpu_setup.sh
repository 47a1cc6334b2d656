# Sourced by the benchmarks/gpu_*.sh scripts (repository root, on the GPU machine): installs the wheels
# the GPU image lacks (carried in .whl/, copied from ../shared/wheels-cp312 plus vcfpy and pyBigWig, a dependency that
# scoring imports) and this
# package, so that genoformer.data and genoformer.kernels import. Fill .whl/ here first with
#   mkdir -p .whl && cp ../shared/wheels-cp312/*.whl .whl/ && pip download --no-deps --only-binary=:all: \
#        --python-version 3.12 --platform manylinux2014_x86_64 -d .whl vcfpy==0.14.2 pyBigWig==0.3.24
# Wheels staged by an earlier call of the same machine (too many for one call's carry) are in /tmp/staged.
# Once per machine: scripts started together, or later calls on the warm machine (which then need not
# carry .whl/ again, leaving room in the call for data), find the marker and only set PYTHONPATH.
if [ ! -f /tmp/site/.genoformer_installed ]; then
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        echo "gpu_setup.sh: nothing installed on this machine yet and no wheels in .whl/: carry .whl (see above)"
        return 1 2>/dev/null || exit 1
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl $(ls /tmp/staged/*.whl 2>/dev/null) 2>&1 | tail -2
    python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
    touch /tmp/site/.genoformer_installed
fi
export PYTHONPATH=/tmp/site:$PWD
