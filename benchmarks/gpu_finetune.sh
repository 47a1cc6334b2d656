# The fine-tuning benchmarks on the GPU machine (repository root), one stage per device call:
#   bash benchmarks/gpu_finetune.sh splice      # splice junctions, four variants
#   bash benchmarks/gpu_finetune.sh tf          # TF binding, four variants
#   bash benchmarks/gpu_finetune.sh genes       # gene annotation at 8k (exports the shipped gene model)
#   bash benchmarks/gpu_finetune.sh genes_more  # gene annotation at 1k, and from scratch at 8k
# Needs .whl/ (see gpu_setup.sh, plus peft and its dependencies for LoRA) and .device/data from
#   python -m benchmarks.finetune_bench prepare
# Results go to $OUT/results (copy them into benchmarks/results/), the exported model to $OUT.
set -euo pipefail
source benchmarks/gpu_setup.sh
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/results"
cp benchmarks/results/finetune_*.json "$OUT/results/" 2>/dev/null || true
run() { python3 -m benchmarks.finetune_bench run --out "$OUT/results" "$@"; }
case "$1" in
    splice|tf) run --tasks "$1" --steps "${STEPS:-1000}" ;;
    genes) run --tasks genes --gene_variants full_8k --gene_steps "${GENE_STEPS:-1000}" \
               --export "$OUT/genoformer_gene_annotator.ckpt" ;;
    genes_more) run --tasks genes --gene_variants full_1k from_scratch_8k --gene_steps "${GENE_STEPS:-1000}" ;;
    *) echo "usage: bash benchmarks/gpu_finetune.sh splice|tf|genes|genes_more" >&2; exit 2 ;;
esac
