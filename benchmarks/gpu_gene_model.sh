# The gene model trained longer (configs/finetune_genes_gpu.yaml) and measured against pyrodigal on
# a genome held out whole (benchmarks/gene_model.py), on the GPU machine from the repository root,
# in about 7 minutes on one H100 or H200 (training is bounded by TRAIN_TIME, 4.5 minutes):
#   bash benchmarks/gpu_gene_model.sh
# It needs, beside the git tree, .device/genes (7.4 MiB: the two annotated genomes of
# ../shared/data/fetch-more.sh and pyrodigal's wheel; and the shipped DNA and gene models, 25 MiB
# more, when the working tree lacks them), filled on this side once with
#   bash benchmarks/gpu_gene_model.sh stage [EXTRA]      (EXTRA: fetch-more.sh's folder, ../shared-extra)
# and either a machine where gpu_setup.sh has already installed the wheels (/tmp/site) or .whl/.
# Writes to $OUT (7 files): gene_model.json (the result file, with the targets' verdicts: copy it
# into benchmarks/results/ and run python -m benchmarks.report) and genes_table.tsv (genoformer
# compare_genes on the Leptospira genome: the new model, the shipped
# examples/genoformer_gene_annotator.ckpt and pyrodigal meta),
# the new model as genoformer_gene_annotator.ckpt (bf16, the shipped format), metrics.csv of its
# training, and the three GFF3 files.
set -euo pipefail
DATA=.device/genes
GENOMES=(ecoli_draft_prokka.gff3.gz leptospira_kirschneri_h1.gbk.gz)
MODELS=(genoformer_dna.ckpt genoformer_gene_annotator.ckpt)  # the model fine-tuned, the baseline
if [ "${1:-}" = stage ]; then  # on the CPU machine, from the repository root
    mkdir -p "$DATA"
    for name in "${GENOMES[@]}"; do cp "${2:-../shared-extra}/genomes/$name" "$DATA"/; done
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$DATA" pyrodigal==3.7.1
    for model in "${MODELS[@]}"; do  # from git when the working tree lacks them (it travels without them)
        [ -f "examples/$model" ] || git show "HEAD:examples/$model" > "$DATA/$model"
    done
    du -sh "$DATA"; ls "$DATA"
    exit 0
fi
export PYTHONUNBUFFERED=1
source benchmarks/gpu_setup.sh
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if ! python3 -c "import pyrodigal" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_genes "$DATA"/pyrodigal-*.whl 2>&1 | tail -2
    export PYTHONPATH=/tmp/site_genes:$PYTHONPATH
fi
# correctness first: a GPU, the data and pyrodigal are there (the pipeline itself is tested on the
# CPU at tiny size: tests/benchmarks/test_gene_model.py)
model() { if [ -f "examples/$1" ]; then echo "examples/$1"; else echo "$DATA/$1"; fi; }
python3 - "${GENOMES[@]/#/$DATA/}" "$(model "${MODELS[0]}")" "$(model "${MODELS[1]}")" <<'PY'
import sys
from pathlib import Path
import torch
assert torch.cuda.is_available(), "no CUDA GPU"
import pyrodigal
for path in sys.argv[1:]:
    assert Path(path).is_file(), f"{path} is missing: run 'bash benchmarks/gpu_gene_model.sh stage' and carry .device/genes"
print("gpu_gene_model.sh:", torch.cuda.get_device_name(), "pyrodigal", pyrodigal.__version__, flush=True)
PY
python3 -m benchmarks.gene_model --train "$DATA/${GENOMES[0]}" --test "$DATA/${GENOMES[1]}" --out "$OUT" \
    --pretrained "$(model "${MODELS[0]}")" --baseline "$(model "${MODELS[1]}")" --run /tmp/gene_model_run --max_steps "${GENE_STEPS:-1200}" --max_time "${TRAIN_TIME:-00:00:04:30}"
