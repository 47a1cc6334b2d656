# Two commands set everything up on a fresh machine:
#   make quickstart   install into .venv, then train on the E. coli genome shipped in examples/
#                     and embed the lambda phage genome with the trained model (run it again:
#                     the run resumes from its last.ckpt, and the embeddings are replaced)
#   make test         install into .venv (with the test extras), then run the whole test suite in
#                     TEST_WORKERS processes (pytest-xdist, 2 by default; each test file in one)
# and for the house rules (make test runs them too):
#   make lint         ruff's lint and format check (pyproject.toml's [tool.ruff]) and the import contract
# and one more for the guides:
#   make docs         build the guides' site into site/ (mkdocs build --strict), then check it in
#                     headless Chromium (tests/docs), with screenshots in runs/site/
# PYTHON picks the interpreter (3.10 to 3.12); TORCH the torch requirement (pip configured for a
# CUDA index gives a CUDA build of the same version).

PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV ?= .venv
BIN := $(VENV)/bin
RUN_DIR ?= runs/quickstart
TEST_WORKERS ?= 2

.PHONY: install install-dev quickstart test lint docs

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
	$(BIN)/genoformer prepare --fasta examples/ecoli_k12_mg1655.fasta.gz --out $(RUN_DIR)/ecoli.zarr
	$(BIN)/genoformer fit --config configs/quickstart.yaml --trainer.default_root_dir $(RUN_DIR) --data.init_args.store $(RUN_DIR)/ecoli.zarr --ckpt_path last
	$(BIN)/genoformer embed --checkpoint $(RUN_DIR)/checkpoints/last.ckpt --inputs examples/lambda_phage.fasta.gz --out $(RUN_DIR)/embeddings.npz --overwrite

test: install-dev
	$(BIN)/python -m pytest tests -q -ra --timeout=900 -n $(TEST_WORKERS) --dist loadfile

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q tests/test_import_contract.py

docs: install-dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	GENOFORMER_SITE_SCREENSHOTS=runs/site $(BIN)/python -m pytest tests/docs -q -ra
