# The gene model trained longer (configs/finetune_genes_gpu.yaml) and measured against pyrodigal on
# a genome held out whole (benchmarks/gene_model.py), on the GPU machine from the repository root,
# in about 7 minutes on one H100 (training is bounded by TRAIN_TIME, 5 minutes):
#   bash benchmarks/gpu_gene_model.sh
# Carry .whl/ (see gpu_setup.sh) with pyrodigal's wheel added:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl pyrodigal==3.7.1
# and .device/genes/ with the two annotated genomes of ../shared/data/fetch-more.sh:
#   mkdir -p .device/genes && cp ../shared-extra/genomes/{ecoli_draft_prokka.gff3.gz,leptospira_kirschneri_h1.gbk.gz} .device/genes/
# Writes to $OUT: genes_table.tsv and .json (genoformer compare_genes on the Leptospira genome: the
# new model, the shipped examples/genoformer_gene_annotator.ckpt and pyrodigal meta), the new model
# as genoformer_gene_annotator.ckpt (bf16, the shipped format), metrics.csv of its training, and
# the three GFF3 files.
set -euo pipefail
source benchmarks/gpu_setup.sh
OUT=${OUT:-/tmp/out}
DATA=.device/genes
mkdir -p "$OUT"
# correctness first: a GPU, the data and pyrodigal are there (the pipeline itself is tested on the
# CPU at tiny size: tests/benchmarks/test_gene_model.py)
python3 - "$DATA" <<'PY'
import sys
from pathlib import Path
import torch
assert torch.cuda.is_available(), "no CUDA GPU"
import pyrodigal  # noqa: F401  (carried in .whl/)
for name in ("ecoli_draft_prokka.gff3.gz", "leptospira_kirschneri_h1.gbk.gz"):
    assert (Path(sys.argv[1]) / name).is_file(), f"{sys.argv[1]}/{name} is missing: carry .device/genes"
print("gpu_gene_model.sh:", torch.cuda.get_device_name(), "pyrodigal", pyrodigal.__version__)
PY
python3 -m benchmarks.gene_model --train "$DATA/ecoli_draft_prokka.gff3.gz" \
    --test "$DATA/leptospira_kirschneri_h1.gbk.gz" --out "$OUT" --run /tmp/gene_model_run \
    --max_steps "${GENE_STEPS:-1500}" --max_time "${TRAIN_TIME:-00:00:05:00}"
