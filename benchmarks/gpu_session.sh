#!/usr/bin/env bash
# One GPU session for the Triton FlashAttention kernels: install, check, tune, time.
#
#   bash benchmarks/gpu_session.sh STEP...      (from the repository root, on the GPU machine)
#
# Steps, run in the order given:
#   tune     per-configuration timings of our forward / dK,dV / dQ kernels at L=16k, bf16,
#            causal, head dims 64 and 128, beside SDPA FlashAttention-2 (the numbers behind
#            kernels/triton_flash_configs.py)
#   tests    the GPU test sweep and the rest of tests/kernels/test_triton_*.py on CUDA
#   compile  the cross-compile / shared-memory test under this machine's Triton
#   quick    python -m benchmarks.attention --quick   (L = 16k only)
#   full     python -m benchmarks.attention           (L = 8k..64k, and peak memory)
#   headdims python -m benchmarks.head_dims: head dims 80 / 96 / 128 causal at 16k vs FA2, and the
#            GPU sweep of the padded head dims (24 ... 192); results in $OUT/head_dims (~3 min)
#   model    python -m benchmarks.train_step (training-step time of configs/genome_8k_gpu.yaml's
#            model per attention backend), then 40 steps of `genoformer fit` with that config
#   train    python -m benchmarks.train (end-to-end speed of the 85M reference model, 8k..128k,
#            eager and compiled, plain PyTorch anchors, profile, data module; TRAIN_BUDGET s)
#   train2   the same script's two-GPU DDP case beside its one-GPU twin (a machine with 2 GPUs)
#   round2   issue 11, one command (needs flash-attn-4 installed for its FA4 and Flex FLASH
#            columns; without it they are left out): python -m benchmarks.kernel_variants (every
#            launch configuration and sm_90 variant timed, ~2 min), then the full
#            python -m benchmarks.attention (flash-attn-4 and both Flex backends as columns,
#            ROUND2_BUDGET s, default 250); their files land in $OUT (copy them to
#            benchmarks/results/, then re-render BENCHMARKS.md with --render-from)
# Logs and result files go to $OUT (or ./gpu_out when OUT is unset); the benchmark keeps its
# working files in /tmp and copies only its JSON and error log there (the device tool brings
# back at most 8 files).
# Wheels for packages the GPU image lacks travel in .whl/ (copied from ../shared/wheels-cp312).
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GENOFORMER_TRITON_AUTOTUNE=${GENOFORMER_TRITON_AUTOTUNE:-1}
unset TRITON_INTERPRET

log() { echo "== $(date +%H:%M:%S) $*" | tee -a "$OUT/session.log"; }

setup() {
    log setup
    if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
        export PYTHONPATH=/tmp/site:$PWD
    fi
    python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2 \
        || python3 -m pip install -q --no-deps --no-build-isolation --no-index . 2>&1 | tail -2
    python3 -c "import genoformer.kernels.triton_flash as t, torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'interpreted', t.INTERPRETED)" \
        2>&1 | tee -a "$OUT/session.log"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee -a "$OUT/session.log"
}

tune() {
    log tune
    timeout 200 python3 - <<'EOF' 2>&1 | tee "$OUT/tune.log"
import json, os, torch, triton, triton.testing
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import genoformer.kernels.triton_flash as tf
from genoformer.kernels.triton_flash_configs import FwdConfig, BwdConfig

def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")

# ceilings (METHOD.md): bf16 matmul and device copy
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
ms = bench(lambda: a @ a)
print(f"ceiling matmul bf16 8192^3: {2 * 8192**3 / ms / 1e9:.0f} TFLOP/s")
x = torch.randn(2**30 // 2, device="cuda", dtype=torch.bfloat16); y = torch.empty_like(x)
ms = bench(lambda: y.copy_(x))
print(f"ceiling copy: {2 * x.numel() * 2 / ms / 1e9:.2f} TB/s (read + write)")
del a, x, y

FWD = [FwdConfig(128, 64, 8, 3), FwdConfig(128, 128, 8, 3), FwdConfig(128, 64, 4, 3), FwdConfig(128, 64, 8, 4),
       FwdConfig(64, 64, 4, 3), FwdConfig(128, 128, 8, 2)]
DKDV = [(64, 128, 8, 2), (32, 128, 4, 3), (64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 4, 3)]
DQ = [(128, 64, 8, 2), (128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2)]
results = []
L, dtype = 16384, torch.bfloat16
for D in (128, 64):
    H = 2048 // D
    q, k, v, do = (torch.randn(1, H, L, D, device="cuda", dtype=dtype) for _ in range(4))
    flops_fwd = 4 * H * L * L * D / 2
    for causal in (True,):
        f = flops_fwd * (1 if causal else 2)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fa_f = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
            qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            fa_b = bench(lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True))
        print(f"D={D} causal={causal} SDPA-FA2 fwd {fa_f:.3f} ms ({f/fa_f/1e9:.0f} TF/s) bwd {fa_b:.3f} ms ({2.5*f/fa_b/1e9:.0f} TF/s)")
        results.append(dict(D=D, causal=causal, impl="fa2", fwd_ms=fa_f, bwd_ms=fa_b))
        scale = D ** -0.5
        ref_o, lse = None, None
        for cfg in FWD:
            tf.fwd_candidates = lambda *a, cfg=cfg: (cfg,)
            try:
                t = bench(lambda: tf.flash_fwd(q, k, v, None, None, None, 0, causal, scale))
            except Exception as e:
                print(f"  fwd {cfg}: FAILED {type(e).__name__}: {str(e)[:200]}"); continue
            print(f"  fwd {cfg}: {t:.3f} ms ({f/t/1e9:.0f} TF/s, x{fa_f/t:.2f} of FA2)")
            results.append(dict(D=D, causal=causal, kind="fwd", cfg=str(cfg), ms=t))
        o, lse = tf.flash_fwd(q, k, v, None, None, None, 0, causal, scale)
        base = BwdConfig(*DKDV[0], *DQ[0])
        for part, options in (("dkdv", DKDV), ("dq", DQ)):
            for opt in options:
                cfg = BwdConfig(*opt, *DQ[0]) if part == "dkdv" else BwdConfig(*DKDV[0], *opt)
                if part == "dq" and opt == DQ[0]:
                    continue
                tf.bwd_candidates = lambda *a, cfg=cfg: (cfg,)
                try:
                    t = bench(lambda: tf.flash_bwd(do, q, k, v, o, lse, None, None, None, None, None, 0, causal, scale))
                except Exception as e:
                    print(f"  bwd {part} {opt}: FAILED {type(e).__name__}: {str(e)[:200]}"); continue
                print(f"  bwd {part} {opt} (other half default): {t:.3f} ms ({2.5*f/t/1e9:.0f} TF/s, x{fa_b/t:.2f} of FA2)")
                results.append(dict(D=D, causal=causal, kind="bwd-" + part, cfg=str(opt), ms=t))
    del q, k, v, do
json.dump(results, open(os.environ["OUT"] + "/tune.json", "w"), indent=1)
EOF
}

tests() {
    log tests
    timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -ra -p no:cacheprovider -n 8 tests/kernels/test_triton_attention.py \
        2>&1 | tee "$OUT/tests.log" | tail -40
}

compile_test() {
    log compile
    timeout 90 python3 -m pytest -q -ra -p no:cacheprovider tests/kernels/test_triton_compile.py \
        2>&1 | tee "$OUT/compile.log" | tail -15
}

bench() {
    log "benchmark $*"
    mkdir -p /tmp/bench
    timeout ${BENCH_TIMEOUT:-400} python3 -m benchmarks.attention --out /tmp/bench "$@" 2>&1 | tee -a "$OUT/session.log" | tail -60
    cp /tmp/bench/attention.json "$OUT/"
    cp /tmp/bench/attention_errors.log "$OUT/" 2>/dev/null
}

headdims() {
    log "padded head dims"
    timeout ${HEADDIMS_TIMEOUT:-280} python3 -m benchmarks.head_dims --out "$OUT/head_dims" 2>&1 | tee -a "$OUT/session.log" | tail -25
}

model() {
    log "model: training step per backend"
    timeout ${MODEL_TIMEOUT:-200} python3 -m benchmarks.train_step --out /tmp/train_step 2>&1 | tee -a "$OUT/session.log" | tail -25
    cp /tmp/train_step/train_step.json "$OUT/"
    log "model: genoformer fit, configs/genome_8k_gpu.yaml, 40 steps"
    timeout ${FIT_TIMEOUT:-200} python3 cli.py fit --config configs/genome_8k_gpu.yaml --trainer.max_steps 40 \
        --trainer.val_check_interval 40 --trainer.limit_val_batches 2 --trainer.log_every_n_steps 5 \
        --trainer.enable_progress_bar false --trainer.default_root_dir /tmp/fit8k \
        --data.init_args.store /tmp/fit8k/ecoli.zarr 2>&1 | tee -a "$OUT/session.log" | tail -25
    cp /tmp/fit8k/metrics.csv "$OUT/fit8k_metrics.csv"
    cp /tmp/fit8k/loss.png "$OUT/fit8k_loss.png"
}

train() {
    log "train: end-to-end training speed, budget ${TRAIN_BUDGET:-330} s"
    timeout $(( ${TRAIN_BUDGET:-330} + 60 )) python3 -m benchmarks.train --out "$OUT/train" \
        --budget-s ${TRAIN_BUDGET:-330} 2>&1 | tee -a "$OUT/session.log" | tail -45
}

round2() {
    log "round2: kernel variants"
    timeout ${VARIANTS_TIMEOUT:-200} python3 -m benchmarks.kernel_variants --out "$OUT" 2>&1 \
        | tee -a "$OUT/session.log" | tail -45
    log "round2: attention benchmark, budget ${ROUND2_BUDGET:-250} s"
    mkdir -p /tmp/bench
    timeout $(( ${ROUND2_BUDGET:-250} + 70 )) python3 -m benchmarks.attention --out /tmp/bench \
        --budget-s ${ROUND2_BUDGET:-250} 2>&1 | tee -a "$OUT/session.log" | tail -75
    cp /tmp/bench/attention.json /tmp/bench/attention.md /tmp/bench/attention.png "$OUT/"
    cp /tmp/bench/attention_errors.log "$OUT/" 2>/dev/null
}

train2() {
    log "train2: two GPUs, DDP, against one"
    timeout ${TRAIN2_TIMEOUT:-300} python3 -m benchmarks.train --out "$OUT/train2" \
        --cases 'fit-synthetic-8k,ddp-synthetic-8k-x2' --budget-s 240 2>&1 | tee -a "$OUT/session.log" | tail -25
}

setup
for step in "$@"; do
    case "$step" in
        tune) tune ;;
        tests) tests ;;
        compile) compile_test ;;
        quick) bench --quick --budget-s 200 ;;
        full) bench --budget-s ${BENCH_BUDGET:-330} ;;
        headdims) headdims ;;
        model) model ;;
        train) train ;;
        train2) train2 ;;
        round2) round2 ;;
        *) echo "unknown step $step (tune, tests, compile, quick, full, headdims, model, train, train2, round2)"; exit 2 ;;
    esac
done
log done
