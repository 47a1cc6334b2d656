#!/usr/bin/env bash
# The time-series figures on the GPU machine (repository root, OUT set; benchmarks/gpu_setup.sh: the setup), one phase
# per device call:
#   bash benchmarks/gpu_timeseries.sh ecg [ECG OPTIONS]   benchmarks/ecg.py: configs/ecg_8k_gpu.yaml trained for
#       --minutes beside both baselines, evaluated at look-backs 512 to 8,192 -> $OUT/ecg.json; e.g.
#       bash benchmarks/gpu_timeseries.sh ecg --minutes 5 --num_workers 3 --seeds 8 --ensemble 4 --variants config
#   bash benchmarks/gpu_timeseries.sh train       a forecaster per dataset for the eight datasets
#       (configs/timeseries_dataset_gpu.yaml) and one general forecaster across seven of them
#       (configs/timeseries_general_gpu.yaml, HELD_OUT left out for zero-shot), all at once, 6-7 minutes
#   bash benchmarks/gpu_timeseries.sh evaluate    `evaluate_forecast` of each under the protocol
#       -> $OUT/timeseries_gpu.tar.gz (< 8 min; runs/ keeps the checkpoints between the two calls)
# Then, on the CPU machine: tar xzf timeseries_gpu.tar.gz -C runs/gpu_timeseries and
#   python -m benchmarks.timeseries_datasets --out OUT --methods --models runs/gpu_timeseries/eval
# gives the model rows, joined to the baselines' result with --from (benchmarks/timeseries_datasets.py).
#
# Before: the stores, built on the CPU machine by `python -m benchmarks.timeseries_datasets`
# (runs/timeseries_datasets/stores, about 17 MB), travel with the call (device tool: carry
# ["runs/timeseries_datasets/stores"]); STORES=/elsewhere reads them from a copy made by an earlier
# call. The wheels gpu_setup.sh installs (.whl/, about 14 MB; pandas too if the GPU image
# lacked it) travel in a call of their own when the tree, the stores and the wheels together pass the
# tool's 64 MiB: `bash -c 'source benchmarks/gpu_setup.sh'` with carry [".whl"] first, on the same machine.
# SMOKE=1 runs every step on the CPU at tiny sizes (two steps, a tiny model, three small hourly
# stores): what was run to check this script without a GPU.
set -uo pipefail
PHASE=${1:-}
case "$PHASE" in
    ecg|train|evaluate) ;;
    *) echo "usage: bash benchmarks/gpu_timeseries.sh ecg [ECG OPTIONS]|train|evaluate"; exit 2 ;;
esac
source benchmarks/gpu_setup.sh || exit 1
[ "${SMOKE:-0}" = 1 ] || versions
if [ "$PHASE" = ecg ]; then
    "$PYTHON" -m benchmarks.ecg --out "$OUT" "${@:2}" 2>&1 | tee "$OUT/ecg.log" | tail -n 30
    exit "${PIPESTATUS[0]}"
fi
STORES=${STORES:-runs/timeseries_datasets/stores}
RUN=${RUN:-runs/gpu_timeseries}
HELD_OUT=${HELD_OUT:-sf_traffic}
SMOKE=${SMOKE:-0}
DATASETS=(ecg_mitbih208 ecg_biosignalsplux household_power bike_sharing traffic_volume beijing_pm25 electricity sf_traffic)
# series no model trains on (benchmarks/timeseries_datasets.py: unseen): the general forecaster zero-shot, where their stores are
UNSEEN=(solar_power wind_power energy_appliance yosemite_temps)
mkdir -p "$RUN/logs"
# nine processes at once: numpy's BLAS must not start a thread per core in each (the per-dataset
# AR fits took 480-505 s each that way on a 16-core host, against 20-50 s with two threads)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2} MKL_NUM_THREADS=${MKL_NUM_THREADS:-2}
# TRAIN_TIME=DD:HH:MM:SS caps every run's training (default: the configs' max_time)
TIME_CAP=()
[ -n "${TRAIN_TIME:-}" ] && TIME_CAP=(--trainer.max_time "$TRAIN_TIME")
if [ "$SMOKE" = 1 ]; then
    DATASETS=(electricity sf_traffic beijing_pm25)  # the general forecaster needs two stores besides the held-out one
    TINY=(--trainer.accelerator cpu --trainer.precision 32-true --trainer.max_steps 2 --trainer.val_check_interval 1
          --trainer.limit_val_batches 1 --model.init_args.linear_fit_batches 1 --model.init_args.warmup_steps 1
          --model.init_args.transformer.d_model 16 --model.init_args.transformer.n_layers 1
          --model.init_args.transformer.n_heads 2 --data.init_args.batch_size 4 --data.init_args.num_workers 0)
    DEVICE=(--device cpu)
else
    TINY=()
    DEVICE=()
fi
"$PYTHON" -c "import pandas" || { echo "pandas is missing: put its wheel in .whl/ (see the header)"; exit 1; }
for name in "${DATASETS[@]}"; do
    [ -d "$STORES/$name.zarr" ] || { echo "$STORES/$name.zarr not found: run python -m benchmarks.timeseries_datasets first and carry $STORES"; exit 1; }
done
TRAIN_STORES=()
for name in "${DATASETS[@]}"; do [ "$name" = "$HELD_OUT" ] || TRAIN_STORES+=("$STORES/$name.zarr"); done
GENERAL_STORES="[$(IFS=,; echo "${TRAIN_STORES[*]}")]"

if [ "$PHASE" = train ]; then
    pids=()
    for name in "${DATASETS[@]}"; do
        "$PYTHON" cli.py fit --config configs/timeseries_dataset_gpu.yaml --data.init_args.store "$STORES/$name.zarr" \
            --trainer.default_root_dir "$RUN/$name" "${TIME_CAP[@]}" "${TINY[@]}" > "$RUN/logs/$name.log" 2>&1 &
        pids+=($!)
    done
    "$PYTHON" cli.py fit --config configs/timeseries_general_gpu.yaml --data.init_args.store "$GENERAL_STORES" \
        --trainer.default_root_dir "$RUN/general" "${TIME_CAP[@]}" "${TINY[@]}" > "$RUN/logs/general.log" 2>&1 &
    pids+=($!)
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=1; done
    TAIL=3 tails "$RUN"/logs/*.log
    ls -la "$RUN"/*/checkpoints/best*.ckpt
elif [ "$PHASE" = evaluate ]; then
    # Every evaluation at once, each capped (EVAL_SECONDS) so that the archive is written inside the
    # call whatever happens: on 2026-12-02 the general model's 415k household-power windows took
    # over 6 minutes beside a training run, the call timed out before its archive and every result
    # was lost with the machine. A capped evaluation leaves its dataset out and says so in its log.
    EVAL_SECONDS=${EVAL_SECONDS:-420}
    mkdir -p "$RUN/eval/dataset_model" "$RUN/eval/general"
    pids=()
    for name in "${DATASETS[@]}"; do
        for model in dataset_model general; do
            checkpoint="$RUN/$name/checkpoints/best.ckpt"
            [ "$model" = general ] && checkpoint="$RUN/general/checkpoints/best.ckpt"
            timeout "$EVAL_SECONDS" "$PYTHON" cli.py evaluate_forecast --store "$STORES/$name.zarr" --checkpoint "$checkpoint" \
                --baseline "[]" --batch_size 2048 --out "$RUN/eval/$model/$name.json" --overwrite "${DEVICE[@]}" > "$RUN/logs/eval_${model}_$name.log" 2>&1 &
            pids+=($!)
        done
    done
    for name in "${UNSEEN[@]}"; do
        [ -d "$STORES/$name.zarr" ] || { echo "$STORES/$name.zarr not found: $name not scored"; continue; }
        timeout "$EVAL_SECONDS" "$PYTHON" cli.py evaluate_forecast --store "$STORES/$name.zarr" --checkpoint "$RUN/general/checkpoints/best.ckpt" \
            --baseline "[]" --batch_size 2048 --out "$RUN/eval/general/$name.json" --overwrite "${DEVICE[@]}" > "$RUN/logs/eval_general_$name.log" 2>&1 &
        pids+=($!)
    done
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=1; done
    for log in "$RUN"/logs/eval_*.log; do echo "== $log"; grep -E "horizon|skipped|error" "$log" | tail -n 10; done
    echo "held out of the general forecaster: $HELD_OUT" > "$RUN/eval/held_out.txt"
    # the general forecaster as shipped (examples/genoformer_forecaster.ckpt): weights only
    "$PYTHON" cli.py export --checkpoint "$RUN/general/checkpoints/best.ckpt" --out "$RUN/eval/genoformer_forecaster.ckpt" \
        --overwrite true || status=1
    # the device tool brings back few files: everything travels as one archive
    tar czf "$OUT/timeseries_gpu.tar.gz" -C "$RUN" eval logs $(cd "$RUN" && ls -d */metrics.csv 2>/dev/null)
fi
exit $status
