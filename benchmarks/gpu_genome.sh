#!/usr/bin/env bash
# The genome models on the GPU machine (repository root, OUT set; benchmarks/gpu_setup.sh: the setup), one phase per
# device call of under 10 minutes on one warm machine (/tmp keeps the runs between calls):
#   bash benchmarks/gpu_genome.sh stage1     the flagship, configs/genome_dna_gpu.yaml from the shipped model, ~8 min;
#                                            its bf16 weights in $OUT/flagship8k.ckpt (stage 2 can start from them)
#   bash benchmarks/gpu_genome.sh stage2     configs/genome_dna_32k_gpu.yaml from stage 1, RoPE base 500,000, ~4.5 min;
#                                            then the score stage: $OUT/flagship_final/flagship_score.json and the
#                                            models and per-base scores as flagship_scores.tar.part* (cat | tar x)
#   bash benchmarks/gpu_genome.sh sweep      how the recipe was chosen: four 8k runs at once, ~7 min (needs the model
#                                            shipped before: git show 4576bed:examples/genoformer_bacteria_8k.ckpt > it)
#   bash benchmarks/gpu_genome.sh long       stage 2 from the sweep's `warm` at two RoPE bases, then the score stage
#   bash benchmarks/gpu_genome.sh finetune TASK   benchmarks/finetune_bench.py: splice, tf, genes (exports the shipped
#                                            gene model to $OUT), genes_more (1k window, from scratch)
#   bash benchmarks/gpu_genome.sh gene_model the gene model trained longer (configs/finetune_genes_gpu.yaml) and
#                                            measured against pyrodigal on a genome held out whole
#                                            (benchmarks/gene_model.py), ~7 min (training: TRAIN_TIME, 4.5 minutes)
# Before: .device/dna/genomes.zarr (`python -m benchmarks.flagship store`), .device/dna/heldout
# (`python -m benchmarks.flagship heldout`), .device/data (`python -m benchmarks.finetune_bench prepare`) and
# .whl (benchmarks/gpu_setup.sh) travel with the call (carry [".whl", ".device"]).
# gene_model needs .device/genes (7.4 MiB: the two annotated genomes of ../shared/data/fetch-more.sh and pyrodigal's
# wheel; and the shipped DNA and gene models, 25 MiB more, when the working tree lacks them), filled on this side once
# with `bash benchmarks/gpu_genome.sh gene_model stage [EXTRA]` (EXTRA: fetch-more.sh's folder, ../shared-extra).
# It writes to $OUT (7 files): gene_model.json (the result file, with the targets' verdicts: copy it into
# benchmarks/results/ and run python -m benchmarks.report) and genes_table.tsv (genoformer compare_genes on the
# Leptospira genome: the new model, the shipped examples/genoformer_gene_annotator.ckpt and pyrodigal meta), the new
# model as genoformer_gene_annotator.ckpt (bf16, the shipped format), metrics.csv of its training, and the three GFF3.
# SMOKE=1 runs the flagship phases on the CPU at tiny sizes (what was run to check this script).
set -uo pipefail
usage="usage: bash benchmarks/gpu_genome.sh stage1|stage2|sweep|long|finetune TASK|gene_model [stage [EXTRA]]"
PHASE=${1:-}
case "$PHASE" in
    stage1|stage2|sweep|long|finetune|gene_model) ;;
    *) echo "$usage"; exit 2 ;;
esac
GENES=.device/genes
GENOMES=(ecoli_draft_prokka.gff3.gz leptospira_kirschneri_h1.gbk.gz)
MODELS=(genoformer_dna.ckpt genoformer_gene_annotator.ckpt)  # the model fine-tuned, the baseline
if [ "$PHASE" = gene_model ] && [ "${2:-}" = stage ]; then  # on the CPU machine, from the repository root
    set -e
    mkdir -p "$GENES"
    for name in "${GENOMES[@]}"; do cp "${3:-../shared-extra}/genomes/$name" "$GENES"/; done
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$GENES" pyrodigal==3.7.1
    for model in "${MODELS[@]}"; do  # from git when the working tree lacks them (it travels without them)
        [ -f "examples/$model" ] || git show "HEAD:examples/$model" > "$GENES/$model"
    done
    du -sh "$GENES"; ls "$GENES"
    exit 0
fi
source benchmarks/gpu_setup.sh || exit 1
STORE=${STORE:-.device/dna/genomes.zarr}
HELDOUT=${HELDOUT:-.device/dna/heldout}
RUN=${RUN:-/tmp/flagship}
SMOKE=${SMOKE:-0}
SHIPPED=examples/genoformer_dna.ckpt
PREVIOUS=examples/genoformer_bacteria_8k.ckpt
BACTERIA=(examples/ecoli_k12_mg1655.fasta.gz examples/saureus_col.fasta.gz examples/hpylori_els37.fasta.gz examples/vcholerae_o395.fasta.gz)
mkdir -p "$RUN/logs"
if [ "$SMOKE" = 1 ]; then
    TINY=(--trainer.accelerator cpu --trainer.precision 32-true --trainer.max_steps 2 --trainer.val_check_interval 1
          --trainer.limit_val_batches 1 --model.init_args.runtime.compile false --data.init_args.batch_size 2
          --model.init_args.transformer.max_seq_len 256)
    FRESH_TINY=(--model.init_args.transformer.d_model 32 --model.init_args.transformer.n_layers 2 --model.init_args.transformer.n_heads 2)
    LONG_TINY=(--model.init_args.transformer.max_seq_len 512)
    SCORE=(--contexts 128 256 512 --max_bases 4000 --device cpu)
    WORKERS=0
else
    TINY=(); FRESH_TINY=(); LONG_TINY=(); SCORE=()
    WORKERS=2
    versions
fi
fit() {  # name, then fit options; two loader workers each: four runs share 16 cores
    local name=$1; shift
    "$PYTHON" cli.py fit "$@" --data.init_args.num_workers "$WORKERS" --trainer.default_root_dir "$RUN/$name" > "$RUN/logs/$name.log" 2>&1
}
score() {  # prefix of the runs, result folder
    "$PYTHON" -m benchmarks.flagship --out "$OUT/$2" --stage score --runs "$RUN" --prefix "$1" --heldout "$HELDOUT" "${SCORE[@]}"
}
if [ "$PHASE" = finetune ]; then
    TASK=${2:?usage: bash benchmarks/gpu_genome.sh finetune splice|tf|genes|genes_more}
    run() { "$PYTHON" -m benchmarks.finetune_bench --out "$OUT" "$@"; }
    case "$TASK" in
        splice|tf) run --task "$TASK" --steps "${STEPS:-1000}" ;;
        genes) run --task genes --variants full_8k --gene_steps "${GENE_STEPS:-1000}" --export "$OUT/genoformer_gene_annotator.ckpt" ;;
        genes_more) run --task genes --variants full_1k from_scratch_8k --gene_steps "${GENE_STEPS:-1000}" --name finetune_genes_more ;;
        *) echo "unknown fine-tuning task $TASK: splice, tf, genes or genes_more"; exit 2 ;;
    esac
    exit $?
fi
if [ "$PHASE" = gene_model ]; then
    if ! "$PYTHON" -c "import pyrodigal" 2>/dev/null; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_genes "$GENES"/pyrodigal-*.whl 2>&1 | tail -2
        export PYTHONPATH=/tmp/site_genes:$PYTHONPATH
    fi
    # correctness first: a GPU, the data and pyrodigal are there (the pipeline itself is tested on the
    # CPU at tiny size: tests/benchmarks/test_gene_model.py)
    model() { if [ -f "examples/$1" ]; then echo "examples/$1"; else echo "$GENES/$1"; fi; }
    "$PYTHON" - "${GENOMES[@]/#/$GENES/}" "$(model "${MODELS[0]}")" "$(model "${MODELS[1]}")" <<'PY' || exit 1
import sys
from pathlib import Path
import torch
assert torch.cuda.is_available(), "no CUDA GPU"
import pyrodigal
for path in sys.argv[1:]:
    assert Path(path).is_file(), f"{path} is missing: run 'bash benchmarks/gpu_genome.sh gene_model stage' and carry .device/genes"
print("gene_model:", torch.cuda.get_device_name(), "pyrodigal", pyrodigal.__version__, flush=True)
PY
    "$PYTHON" -m benchmarks.gene_model --train "$GENES/${GENOMES[0]}" --test "$GENES/${GENOMES[1]}" --out "$OUT" \
        --pretrained "$(model "${MODELS[0]}")" --baseline "$(model "${MODELS[1]}")" --run /tmp/gene_model_run \
        --max_steps "${GENE_STEPS:-1200}" --max_time "${TRAIN_TIME:-00:00:04:30}"
    exit $?
fi
[ -d "$STORE" ] || { echo "$STORE not found: python -m benchmarks.flagship store, then carry .device"; exit 1; }
status=0
case "$PHASE" in
    stage1)
        fit flagship8k --config configs/genome_dna_gpu.yaml --data.init_args.store "$STORE" --init_weights "$SHIPPED" \
            --model.init_args.warmup_steps 50 "${TINY[@]}" || status=1
        TAIL=3 tails "$RUN/logs/flagship8k.log"
        "$PYTHON" cli.py export --checkpoint "$RUN/flagship8k/checkpoints/last.ckpt" --out "$OUT/flagship8k.ckpt" \
            --dtype bfloat16 --overwrite true || status=1 ;;
    stage2)
        START=${START:-$RUN/flagship8k/checkpoints/last.ckpt}  # or stage 1's weights, carried to a new machine
        [ -f "$START" ] || { echo "$START not found: run stage1 first (or START=flagship8k.ckpt)"; exit 1; }
        fit flagship32k --config configs/genome_dna_32k_gpu.yaml --data.init_args.store "$STORE" --init_weights "$START" \
            --model.init_args.transformer.max_seq_len 32768 --model.init_args.transformer.rope_theta 500000 \
            "${TINY[@]}" "${LONG_TINY[@]}" || status=1
        TAIL=3 tails "$RUN/logs/flagship32k.log"
        score flagship flagship_final || status=1 ;;
    sweep)
        [ -f "$PREVIOUS" ] || { echo "$PREVIOUS not found: git show 4576bed:$PREVIOUS > $PREVIOUS"; exit 1; }
        weights=$(printf '%s: 1, ' "${BACTERIA[@]##*/}")
        C=(--config configs/genome_dna_gpu.yaml --trainer.max_steps 600 --trainer.max_time 00:00:07:00)
        fit warm "${C[@]}" --data.init_args.store "$STORE" --init_weights "$PREVIOUS" --model.init_args.warmup_steps 50 "${TINY[@]}" &
        fit bacteria "${C[@]}" --data.init_args.store "$RUN/bacteria.zarr" --data.init_args.fasta "[$(IFS=,; echo "${BACTERIA[*]}")]" \
            --data.init_args.source_weights "{${weights%, }}" --init_weights "$PREVIOUS" --model.init_args.warmup_steps 50 "${TINY[@]}" &
        fit w256_d8 "${C[@]}" --data.init_args.store "$STORE" "${TINY[@]}" "${FRESH_TINY[@]}" &
        fit w384_d6 "${C[@]}" --data.init_args.store "$STORE" --model.init_args.transformer.d_model 384 \
            --model.init_args.transformer.n_heads 6 "${TINY[@]}" "${FRESH_TINY[@]}" &
        for job in $(jobs -p); do wait "$job" || status=1; done
        TAIL=3 tails "$RUN"/logs/*.log ;;
    long)
        C=(--config configs/genome_dna_32k_gpu.yaml --data.init_args.store "$STORE" --init_weights "$RUN/warm/checkpoints/last.ckpt"
           --model.init_args.transformer.max_seq_len 32768 --trainer.max_steps 300 --trainer.max_time 00:00:04:00)
        fit long_rope10k "${C[@]}" "${TINY[@]}" "${LONG_TINY[@]}" &
        fit long_rope500k "${C[@]}" --model.init_args.transformer.rope_theta 500000 "${TINY[@]}" "${LONG_TINY[@]}" &
        for job in $(jobs -p); do wait "$job" || status=1; done
        TAIL=3 tails "$RUN"/logs/long_*.log
        score long flagship_long || status=1 ;;
esac
exit $status
