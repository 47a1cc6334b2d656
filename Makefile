# Two commands set everything up on a fresh machine:
#   make quickstart   install into .venv, then train on the lambda-phage genome shipped in examples/
#   make test         install into .venv (with the test extras), then run the whole test suite
# PYTHON picks the interpreter (3.10 to 3.12); TORCH picks the torch build
# (the default is the CPU wheel; use e.g. TORCH='torch==2.13.0' --index-url of your CUDA build on a GPU box).

PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV ?= .venv
BIN := $(VENV)/bin
RUN_DIR ?= runs/quickstart

.PHONY: install install-dev quickstart test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e .

install-dev: $(BIN)/python
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"

quickstart: install
	$(BIN)/genoformer prepare --fasta examples/lambda_phage.fasta.gz --out $(RUN_DIR)/lambda.zarr --overwrite true
	$(BIN)/genoformer fit --config configs/quickstart.yaml
	$(BIN)/genoformer embed --checkpoint $(RUN_DIR)/checkpoints/last.ckpt --inputs examples/lambda_phage.fasta.gz --out $(RUN_DIR)/embeddings.npz

test: install-dev
	$(BIN)/python -m pytest tests -q -ra --timeout=900
