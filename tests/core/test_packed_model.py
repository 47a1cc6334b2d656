"""Packed documents through the model: a packed batch gives every document the logits (and, for
the causal LM, the loss) of that document run alone; RoPE positions restart at each document;
the compiled blocks take cu_seqlens without graph breaks; a short `genoformer fit` packs a FASTA
of short records."""

from __future__ import annotations

import csv
import gzip
import math
from pathlib import Path

import pytest
import torch
from genoformer.data import GenomeDataModule, SplitSpec, read_records
from genoformer.data.packing import cu_seqlens_of
from genoformer.kernels.dispatch import Backend
from genoformer.kernels.layout import SlidingWindow
from model_helpers import random_tokens, tiny_config, tiny_model
from torch._dynamo.utils import counters

from genoformer.cli import main
from genoformer.core.runtime import RuntimeSettings
from genoformer.core.transformer import Transformer, compile_blocks, document_positions
from genoformer.genome.lm import GenoformerLM, Objective

ROW = 96
DOCS = [[5, 40, 51], [96], [1, 94, 1]]
"""Document lengths per row: short and one-token documents, a row that is one document."""
REPO_ROOT = Path(__file__).resolve().parents[2]
LAMBDA = REPO_ROOT / "examples" / "lambda_phage.fasta.gz"


def packed_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    tokens_BL = random_tokens(len(DOCS), ROW, seed)
    return tokens_BL, cu_seqlens_of(torch.tensor([n for row in DOCS for n in row]))


def documents(tokens_BL: torch.Tensor):
    """(row, start, tokens (1, n)) of each document of the packed batch."""
    for row, lengths in enumerate(DOCS):
        start = 0
        for n in lengths:
            yield row, start, tokens_BL[row : row + 1, start : start + n]
            start += n


def test_document_positions_restart_at_every_document():
    _, cu_seqlens = packed_batch()
    positions_BL = document_positions(cu_seqlens, len(DOCS), ROW)
    assert positions_BL[0, :6].tolist() == [0, 1, 2, 3, 4, 0] and positions_BL[0, 45].item() == 0
    assert torch.equal(positions_BL[1], torch.arange(ROW))
    assert positions_BL[2, [0, 1, 94, 95]].tolist() == [0, 0, 93, 0]


@pytest.mark.parametrize("backend", ["reference", "torch", "sdpa"])
@pytest.mark.parametrize("causal", [True, False])
def test_packed_logits_equal_each_document_alone(backend, causal):
    model = tiny_model(attention_backend=backend, causal=causal, n_kv_heads=2)
    tokens_BL, cu_seqlens = packed_batch()
    with torch.no_grad():
        packed_BLV = model(tokens_BL, cu_seqlens=cu_seqlens)
        states = model.hidden_states(tokens_BL, cu_seqlens=cu_seqlens)
        for row, start, doc_1n in documents(tokens_BL):
            n = doc_1n.shape[1]
            torch.testing.assert_close(packed_BLV[row, start : start + n], model(doc_1n)[0], atol=2e-5, rtol=1e-5)
            alone = model.hidden_states(doc_1n)
            for layer, state_BLE in enumerate(states):
                torch.testing.assert_close(state_BLE[row, start : start + n], alone[layer][0], atol=2e-5, rtol=1e-5)


def test_without_cu_seqlens_documents_see_each_other():
    """The equality above can fail: the same row unpacked gives other logits from the second
    document on (and the same ones for the first, which sees only itself under causality)."""
    model = tiny_model(attention_backend="reference")
    tokens_BL, cu_seqlens = packed_batch()
    with torch.no_grad():
        packed_BLV = model(tokens_BL, cu_seqlens=cu_seqlens)
        unpacked_BLV = model(tokens_BL)
    assert not torch.allclose(packed_BLV[0, 5:45], unpacked_BLV[0, 5:45], atol=1e-3)
    torch.testing.assert_close(packed_BLV[0, :5], unpacked_BLV[0, :5], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("objective", [Objective.CAUSAL_LM, Objective.MASKED_LM])
def test_causal_loss_skips_first_tokens_and_equals_the_documents_alone(objective):
    torch.manual_seed(0)
    module = GenoformerLM(tiny_config(), objective=objective, runtime=RuntimeSettings(attention_backend="torch")).eval()
    tokens_BL, cu_seqlens = packed_batch(seed=3)
    with torch.no_grad():
        torch.manual_seed(1)
        loss, n_targets = module.loss(tokens_BL, cu_seqlens=cu_seqlens)
        if objective is Objective.MASKED_LM:  # masks are random: only check it runs and counts targets
            assert 0 < int(n_targets) < tokens_BL.numel() and math.isfinite(loss.item())
            return
        assert int(n_targets) == sum(n - 1 for row in DOCS for n in row)  # no first token is a target
        total = 0.0
        for _, _, doc_1n in documents(tokens_BL):
            if doc_1n.shape[1] > 1:
                doc_loss, doc_targets = module.loss(doc_1n)
                total += doc_loss.item() * int(doc_targets)
    assert loss.item() * int(n_targets) == pytest.approx(total, rel=1e-5)


def test_lengths_and_cu_seqlens_together_are_refused():
    model = tiny_model(attention_backend="torch")
    tokens_BL, cu_seqlens = packed_batch()
    with pytest.raises(ValueError, match="give lengths or cu_seqlens, not both"):
        model(tokens_BL, torch.full((3,), ROW), cu_seqlens)


@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_compiled_blocks_take_packed_batches_without_graph_breaks(backend):
    eager = tiny_model(attention_backend=backend)
    compiled = tiny_model(attention_backend=backend)
    compile_blocks(compiled, backend="aot_eager")
    tokens_BL, cu_seqlens = packed_batch()
    other_cu_seqlens = cu_seqlens_of(torch.tensor([96, 48, 48, 10, 20, 30, 36]))  # another number of documents
    counters.clear()
    with torch.no_grad():
        for cu in (cu_seqlens, other_cu_seqlens):
            torch.testing.assert_close(
                compiled(tokens_BL, cu_seqlens=cu), eager(tokens_BL, cu_seqlens=cu), atol=2e-5, rtol=1e-5
            )
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] >= 1


def test_compiled_blocks_run_packed_batches_on_the_triton_kernels_in_one_graph():
    """Sliding-window and dense layers on our kernels (interpreted on a CPU), packed: no graph
    break, the eager model's logits and gradients, and each document's logits as run alone."""
    config = tiny_config(
        n_layers=2,
        n_heads=2,
        max_seq_len=64,
        attention=[SlidingWindow(window=32, block_size=16), None],
    )
    torch.manual_seed(0)
    triton = RuntimeSettings(attention_backend=Backend.TRITON)
    eager = Transformer(config, triton).to(torch.bfloat16)
    compiled = Transformer(config, triton).to(torch.bfloat16)
    compiled.load_state_dict(eager.state_dict())
    compile_blocks(compiled, backend="aot_eager")
    tokens_BL = random_tokens(2, 64, seed=3)
    cu_seqlens = cu_seqlens_of(torch.tensor([20, 44, 7, 57]))
    counters.clear()
    results = []
    for model in (eager, compiled):
        logits_BLV = model(tokens_BL, cu_seqlens=cu_seqlens)
        logits_BLV.float().square().mean().backward()
        results.append((logits_BLV.detach(), {n: p.grad for n, p in model.named_parameters()}))
    assert dict(counters["graph_break"]) == {}
    torch.testing.assert_close(results[1][0], results[0][0], atol=0, rtol=0)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, atol=0, rtol=0, msg=name)
    # bf16 logits of magnitude < 1: 4 ulps apart at most, where letting documents see each other
    # moves them by 0.04 and more
    with torch.no_grad():
        for row, start, n in ((0, 0, 20), (0, 20, 44), (1, 0, 7), (1, 7, 57)):
            alone_1nV = eager(tokens_BL[row : row + 1, start : start + n])
            torch.testing.assert_close(results[0][0][row, start : start + n], alone_1nV[0], atol=1.6e-2, rtol=0)


def test_layouts_apply_to_positions_within_the_packed_row():
    """A layout sees the packed row as one sequence: with a window wider than every document,
    documents stay apart and each one's logits equal its own run."""
    spec = SlidingWindow(window=128, block_size=32)
    model = tiny_model(attention_backend="torch", attention=[spec])
    tokens_BL, cu_seqlens = packed_batch()
    with torch.no_grad():
        packed_BLV = model(tokens_BL, cu_seqlens=cu_seqlens)
        for row, start, doc_1n in documents(tokens_BL):
            n = doc_1n.shape[1]
            torch.testing.assert_close(packed_BLV[row, start : start + n], model(doc_1n)[0], atol=2e-5, rtol=1e-5)


@pytest.mark.slow
def test_fit_with_pack_on_a_fasta_of_short_records(tmp_path):
    """Lambda cut into 40 records of 300 to 2,000 bases, all shorter than the 2,048-token window:
    unpacked, no record would give a training window; packed, a short fit runs and validates."""
    sequence = list(read_records(LAMBDA))[0].sequence.decode("ascii")
    cuts, lengths = [0], [300, 2000, 700, 1200, 450, 1800, 999]
    while cuts[-1] < len(sequence):
        cuts.append(min(len(sequence), cuts[-1] + lengths[len(cuts) % len(lengths)]))
    fasta = tmp_path / "pieces.fa.gz"
    fasta.write_bytes(
        gzip.compress("".join(f">piece{i}\n{sequence[a:b]}\n" for i, (a, b) in enumerate(zip(cuts, cuts[1:]))).encode())
    )
    run_dir = tmp_path / "run"
    main(
        [
            "fit",
            "--config",
            str(REPO_ROOT / "configs" / "quickstart.yaml"),
            "--trainer.default_root_dir",
            str(run_dir),
            "--trainer.max_steps",
            "4",
            "--trainer.val_check_interval",
            "4",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.log_every_n_steps",
            "1",
            "--model.transformer.d_model",
            "32",
            "--model.transformer.n_layers",
            "1",
            "--model.transformer.n_heads",
            "2",
            "--model.transformer.max_seq_len",
            "2048",
            "--model.transformer.attention",
            "[{class_path: genoformer.kernels.layout.SlidingWindow, init_args: {window: 256, block_size: 64}}]",
            "--data.init_args.store",
            str(tmp_path / "pieces.zarr"),
            "--data.init_args.fasta",
            f"[{fasta}]",
            "--data.init_args.pack",
            "true",
            "--data.init_args.batch_size",
            "2",
            "--data.init_args.num_workers",
            "0",
            "--data.init_args.split",
            "{by: contigs, val: [piece3, piece4]}",
        ]
    )
    with open(run_dir / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    train = [float(row["train/loss"]) for row in rows if row.get("train/loss")]
    val = [float(row["val/loss"]) for row in rows if row.get("val/loss")]
    assert len(train) == 4 and all(math.isfinite(x) for x in train)
    assert len(val) == 1 and 0 < val[0] < math.log(8)
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    unpacked = GenomeDataModule(str(tmp_path / "pieces.zarr"), window=2048, num_workers=0)
    with pytest.raises(ValueError, match="no interval of .* is at least 2048 bases long"):
        unpacked.setup("fit")


def test_packed_validation_scores_every_tile_as_unpacked(tmp_path):
    """Evaluation packs the usual tiles, one document each: the summed loss and the number of
    predicted bases equal those of the padded, one-tile-per-row batches."""
    from genoformer.data import prepare_genome_store

    records = list(read_records(LAMBDA))[0].sequence.decode("ascii")
    fasta = tmp_path / "short.fa"
    fasta.write_text(
        "".join(
            f">r{i}\n{records[a : a + n]}\n"
            for i, (a, n) in enumerate([(0, 97), (500, 300), (1000, 700), (2000, 257), (3000, 1500)])
        )
    )
    store = prepare_genome_store([fasta], tmp_path / "short.zarr", progress=False)
    torch.manual_seed(0)
    module = GenoformerLM(
        tiny_config(), objective=Objective.CAUSAL_LM, runtime=RuntimeSettings(attention_backend="torch")
    ).eval()
    totals = {}
    for pack in (False, True):
        dm = GenomeDataModule(
            str(store),
            window=256,
            batch_size=3,
            num_workers=0,
            pack=pack,
            split=SplitSpec(by="contigs", val=["r0", "r1", "r2", "r3", "r4"]),
        )
        dm.setup("validate")
        loss_sum, count = 0.0, 0
        with torch.no_grad():
            for batch in dm.val_dataloader():
                loss, n = module.loss(batch["tokens"], batch.get("length"), batch.get("cu_seqlens"))
                loss_sum, count = loss_sum + loss.item() * int(n), count + int(n)
        totals[pack] = (loss_sum, count, len(dm.val_dataloader()))
    assert totals[True][1] == totals[False][1] == 97 + 300 + 700 + 257 + 1500 - 14  # 14 tiles of <= 256 bases
    assert totals[True][0] == pytest.approx(totals[False][0], rel=1e-5)
    assert totals[True][2] < totals[False][2]  # fewer, fuller batches
