#!/usr/bin/env bash
# The training figures of BENCHMARKS.md on the GPU machine: from the repository root, OUT set,
#
#   bash benchmarks/gpu_training.sh STEP...        (steps run in the order given)
#
#   step     python -m benchmarks.train_step (the training step of configs/genome_8k_gpu.yaml's
#            model per attention backend), then 40 steps of `genoformer fit` with that config on
#            real E. coli windows (its metrics.csv and loss.png)
#   speed    python -m benchmarks.train (end-to-end speed of the 85M reference model, 8k..128k,
#            eager and compiled, plain-PyTorch anchors, profile, data module); TRAIN_BUDGET
#            seconds (default 330)
#   ddp      the same script's two-GPU DDP case beside its one-GPU twin (a machine with 2 GPUs);
#            join it to the one-GPU run with `python -m benchmarks.train --from ONE.json TWO.json`
#
# Result files go to $OUT (./gpu_out when OUT is unset), one folder per step; the tail of each
# log is printed. Wheels for packages the GPU image lacks travel in .whl/ (gpu_setup.sh).
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
source benchmarks/gpu_setup.sh
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv,noheader

log() { echo "== $(date -u +%H:%M:%S) $*"; }

step() {
    log "training step per backend"
    timeout ${STEP_TIMEOUT:-200} python3 -m benchmarks.train_step --out "$OUT/train_step" > "$OUT/train_step.log" 2>&1
    tail -n 20 "$OUT/train_step.log"
    log "genoformer fit, configs/genome_8k_gpu.yaml, 40 steps"
    timeout ${FIT_TIMEOUT:-200} python3 cli.py fit --config configs/genome_8k_gpu.yaml --trainer.max_steps 40 \
        --trainer.val_check_interval 40 --trainer.limit_val_batches 2 --trainer.log_every_n_steps 5 \
        --trainer.enable_progress_bar false --trainer.default_root_dir /tmp/fit8k \
        --data.init_args.store /tmp/fit8k/ecoli.zarr > "$OUT/fit_genome_8k.log" 2>&1
    tail -n 20 "$OUT/fit_genome_8k.log"
    mkdir -p "$OUT/fit_genome_8k"
    cp /tmp/fit8k/metrics.csv /tmp/fit8k/loss.png "$OUT/fit_genome_8k/"
}

speed() {
    log "end-to-end training speed, budget ${TRAIN_BUDGET:-330} s"
    timeout $(( ${TRAIN_BUDGET:-330} + 60 )) python3 -m benchmarks.train --out "$OUT/train" \
        --budget-s ${TRAIN_BUDGET:-330} > "$OUT/train.log" 2>&1
    tail -n 45 "$OUT/train.log"
}

ddp() {
    log "two GPUs with DDP against one"
    timeout ${DDP_TIMEOUT:-300} python3 -m benchmarks.train --out "$OUT/train_ddp" \
        --cases 'fit-synthetic-8k,ddp-synthetic-8k-x2' --budget-s 240 > "$OUT/train_ddp.log" 2>&1
    tail -n 25 "$OUT/train_ddp.log"
}

for name in "$@"; do
    case "$name" in
        step) step ;;
        speed) speed ;;
        ddp) ddp ;;
        *) echo "unknown step $name (step, speed, ddp)"; exit 2 ;;
    esac
done
log done
