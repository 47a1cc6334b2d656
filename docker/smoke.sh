#!/bin/sh
# The container's smoke run: the quick start's steps, a few training steps, in a fresh folder.
#   docker run --rm genoformer:cpu genoformer-smoke
set -eu
cd "$(mktemp -d)"
genoformer examples
genoformer prepare --fasta examples/ecoli_k12_mg1655.fasta.gz --out runs/quickstart/ecoli.zarr
genoformer fit --config quickstart --trainer.max_steps "${SMOKE_STEPS:-4}" --model.transformer.max_seq_len 1024 \
    --trainer.enable_progress_bar false
genoformer embed --checkpoint runs/quickstart --inputs examples/lambda_phage.fasta.gz --out embeddings.npz
genoformer embed --checkpoint genoformer-dna --inputs examples/lambda_phage.fasta.gz \
    --regions "gi|9626243|ref|NC_001416.1|:1-4000" --out shipped.npz
echo "genoformer smoke run: the quick start passed in $(pwd)"
