"""SequencePredictor and GeneAnnotator (the Python API of `classify` and `annotate`): loading a
fine-tuned checkpoint, input order and batch independence, the prediction table, tiling and
stitching of long contigs, strand symmetry, and the errors."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from genoformer.data.genome.alphabet import decode, encode, reverse_complement
from genoformer.data.genome.annotations import ANNOTATION_CLASSES, STRAND_SWAP, read_genes
from genoformer.data.genome.labels import read_unlabelled
from genoformer.data.genome.targets import TargetKind, TargetSpace
from genoformer.data.tiling import Keep, tile_windows
from model_helpers import random_tokens

from genoformer.cli import main
from genoformer.genome.finetune import FineTuner
from genoformer.genome.predict import GeneAnnotator, SequencePredictions, SequencePredictor

CLASSES = TargetSpace(TargetKind.SEQUENCE_CLASSES, ("donor", "acceptor", "neither"))
BASES = TargetSpace(TargetKind.BASE_CLASSES, ANNOTATION_CLASSES, strand_swap=STRAND_SWAP)


def save_tuned(pretrained: Path, space: TargetSpace, path: Path, **options) -> Path:
    torch.manual_seed(0)
    module = FineTuner(pretrained=str(pretrained), targets=space.to_dict(), **options)
    with torch.no_grad():  # a head that is not near zero, so predictions differ between inputs
        for param in module.head.parameters():
            param.normal_(0.0, 0.5)
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.strategy.connect(module)
    trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def classifier_ckpt(causal_checkpoint, tmp_path_factory) -> Path:
    return save_tuned(causal_checkpoint, CLASSES, tmp_path_factory.mktemp("clf") / "clf.ckpt")


@pytest.fixture(scope="module")
def annotator_ckpt(causal_checkpoint, tmp_path_factory) -> Path:
    return save_tuned(causal_checkpoint, BASES, tmp_path_factory.mktemp("ann") / "ann.ckpt")


def dna(length: int, seed: int) -> str:
    return decode(random_tokens(1, length, seed=seed)[0].numpy())


# ------------------------------------------------------------------ sequences
def test_predict_strings_in_input_order_independent_of_batching(classifier_ckpt):
    predictor = SequencePredictor.from_checkpoint(classifier_ckpt, device="cpu")
    assert predictor.targets == CLASSES and not predictor.network.training
    sequences = [dna(n, seed) for seed, n in enumerate([30, 90, 12, 64, 30])]
    result = predictor.predict(sequences, batch_size=2, progress=False)
    assert result.names == [f"seq{i}" for i in range(5)]
    assert result.outputs.shape == (5, 3) and result.outputs.dtype == np.float32
    np.testing.assert_allclose(result.outputs.sum(1), 1.0, atol=1e-6)
    for i, sequence in enumerate(sequences):
        alone = predictor.predict([sequence], progress=False).outputs[0]
        np.testing.assert_allclose(result.outputs[i], alone, atol=1e-5)
    assert not np.allclose(result.outputs[0], result.outputs[1], atol=1e-4)
    # the same as the module's own predictions
    with torch.no_grad():
        direct = predictor.network.predict_outputs(torch.from_numpy(encode(sequences[3]))[None], torch.tensor([64]))
    np.testing.assert_allclose(result.outputs[3], direct[0].numpy(), atol=1e-5)
    assert result.predicted() == [CLASSES.names[int(k)] for k in result.outputs.argmax(1)]


def test_predictions_are_strand_symmetric(classifier_ckpt):
    predictor = SequencePredictor.from_checkpoint(classifier_ckpt, device="cpu")
    sequence = dna(50, 7)
    reverse = decode(reverse_complement(encode(sequence)))
    both = predictor.predict([sequence, reverse], progress=False).outputs
    np.testing.assert_allclose(both[0], both[1], atol=1e-5)


def test_predict_a_table_carries_its_columns(classifier_ckpt, tmp_path):
    table = tmp_path / "in.tsv"
    table.write_text(
        "id\tsequence\tlabel\tnote\n" + "".join(f"r{i}\t{dna(20 + 7 * i, i)}\tdonor\tn{i}\n" for i in range(4))
    )
    predictor = SequencePredictor.from_checkpoint(classifier_ckpt, device="cpu")
    result = predictor.predict(read_unlabelled([str(table)]), progress=False)
    rows = list(csv.DictReader(io.StringIO(result.table()), delimiter="\t"))
    assert list(rows[0]) == [
        "name",
        "id",
        "sequence",
        "label",
        "note",
        "prediction",
        "p_donor",
        "p_acceptor",
        "p_neither",
    ]
    assert [r["label"] for r in rows] == ["donor"] * 4 and rows[2]["sequence"] == dna(34, 2)
    assert [r["id"] for r in rows] == ["r0", "r1", "r2", "r3"] and [r["note"] for r in rows] == ["n0", "n1", "n2", "n3"]
    out = result.write_tsv(tmp_path / "out.tsv")
    assert out.read_text() == result.table()
    with pytest.raises(FileExistsError):
        result.write_tsv(tmp_path / "out.tsv")
    result.write_tsv(tmp_path / "out.tsv", overwrite=True)


def test_tables_for_labels_and_values():
    labels = SequencePredictions(
        ["a", "b"],
        np.array([[0.9, 0.2], [0.1, 0.6]], dtype=np.float32),
        TargetSpace(TargetKind.SEQUENCE_LABELS, ("x", "y")),
    )
    lines = labels.table().splitlines()
    assert lines[0].split("\t") == ["name", "prediction", "p_x", "p_y"]
    assert lines[1].split("\t") == ["a", "x", "0.9", "0.2"] and lines[2].split("\t")[:2] == ["b", "y"]
    values = SequencePredictions(
        ["a"],
        np.array([[1.5, -2.25]], dtype=np.float32),
        TargetSpace(TargetKind.SEQUENCE_VALUES, ("u", "v"), mean=(0, 0), std=(1, 1)),
        columns={"name": ["A"], "prediction": ["old"], "sequence": ["ACGT"]},
    )
    lines = values.table().splitlines()
    assert lines[0].split("\t") == [
        "name",
        "sequence",
        "prediction",
        "y_u",
        "y_v",
    ]  # the output's own column replaces "prediction"
    assert lines[1].split("\t") == ["A", "ACGT", "1.5,-2.25", "1.5", "-2.25"]


def test_sequence_predictor_errors(classifier_ckpt, annotator_ckpt, causal_checkpoint):
    predictor = SequencePredictor.from_checkpoint(classifier_ckpt, device="cpu")
    with pytest.raises(ValueError, match="longer than the model's context of 512"):
        predictor.predict([dna(600, 1)], progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        predictor.predict(["ACGT"], batch_size=0, progress=False)
    with pytest.raises(ValueError, match="run it with GeneAnnotator"):
        SequencePredictor.from_checkpoint(annotator_ckpt, device="cpu")
    with pytest.raises(ValueError, match="run it with SequencePredictor"):
        GeneAnnotator.from_checkpoint(classifier_ckpt, device="cpu")
    with pytest.raises(ValueError, match="a DNA language model"):
        SequencePredictor.from_checkpoint(causal_checkpoint, device="cpu")
    headless = FineTuner(pretrained=str(causal_checkpoint))
    with pytest.raises(ValueError, match="no head"):
        SequencePredictor(headless, device="cpu")


# ------------------------------------------------------------------ genomes
def test_annotate_one_window_equals_the_module_and_is_strand_symmetric(annotator_ckpt):
    annotator = GeneAnnotator.from_checkpoint(annotator_ckpt, device="cpu")
    sequence = dna(400, 3)
    [contig] = annotator.predict([sequence], progress=False)
    assert contig.name == "seq0" and contig.length == 400
    assert contig.probabilities.shape == (400, 5) and contig.probabilities.dtype == np.float32
    np.testing.assert_allclose(contig.probabilities.sum(1), 1.0, atol=1e-5)
    with torch.no_grad():
        direct = annotator.network.predict_outputs(torch.from_numpy(encode(sequence))[None], torch.tensor([400]))[0]
    np.testing.assert_allclose(contig.probabilities, direct.numpy(), atol=1e-5)
    assert all(g.contig == "seq0" and g.kind in ("CDS", "rRNA", "tRNA") for g in contig.genes)
    [reverse] = annotator.predict([decode(reverse_complement(encode(sequence)))], progress=False)
    np.testing.assert_allclose(reverse.probabilities[::-1][:, list(STRAND_SWAP)], contig.probabilities, atol=1e-5)


def test_long_contigs_are_tiled_and_stitched(annotator_ckpt, tmp_path):
    annotator = GeneAnnotator.from_checkpoint(annotator_ckpt, device="cpu")
    codes = encode(dna(700, 4))
    stitched = annotator.probabilities(codes, window=128, overlap=32, batch_size=3)
    expected = np.zeros_like(stitched)
    for tile in tile_windows(700, 128, 32, Keep.CENTRE):
        with torch.no_grad():
            window = annotator.network.predict_outputs(
                torch.from_numpy(codes[tile.start : tile.end])[None], torch.tensor([tile.length])
            )[0].numpy()
        expected[tile.keep_start : tile.keep_end] = window[tile.keep_start - tile.start : tile.keep_end - tile.start]
    np.testing.assert_allclose(stitched, expected, atol=1e-5)
    fasta = tmp_path / "g.fa"
    fasta.write_text(f">chrA\n{decode(codes)}\n>chrB\n{dna(90, 5)}\n")
    contigs = annotator.predict(str(fasta), window=128, overlap=32, progress=False)
    assert [c.name for c in contigs] == ["chrA", "chrB"] and [c.length for c in contigs] == [700, 90]
    np.testing.assert_allclose(contigs[0].probabilities, stitched, atol=1e-6)
    with pytest.raises(ValueError, match="window must be in"):
        annotator.probabilities(codes, window=1024)


@pytest.fixture(scope="module")
def coding_annotator_ckpt(annotator_ckpt, tmp_path_factory) -> Path:
    """The annotator made to say CDS+ almost everywhere (read on one strand, its head's weights
    nearly zero, its bias for CDS+), so that it calls genes on random DNA."""
    checkpoint = torch.load(annotator_ckpt, map_location="cpu", weights_only=False)
    checkpoint["hyper_parameters"]["strands"]["test_time"] = False
    checkpoint["state_dict"]["head.net.3.weight"] *= 0.01
    checkpoint["state_dict"]["head.net.3.bias"][:] = torch.tensor([0.0, 3.0, 0.0, -3.0, -3.0])  # other, CDS+, CDS-, ...
    path = tmp_path_factory.mktemp("coding") / "coding.ckpt"
    torch.save(checkpoint, path)
    return path


def test_annotate_regions_are_in_contig_coordinates(coding_annotator_ckpt, tmp_path):
    """`annotate --regions ctg1:5001-7000` reads the region with 3,000 bases on either side and
    writes the genes that overlap it, in the coordinates of the whole contig: the genes of the
    piece [2000, 10000) cut out by hand, moved by 2,000 bases; the GFF3 header and the bedGraph
    are the whole contig's too."""
    sequence = dna(12_000, 6)
    fasta, piece = tmp_path / "g.fa", tmp_path / "piece.fa"
    fasta.write_text(f">ctg1\n{sequence}\n>ctg2\n{dna(500, 7)}\n")
    piece.write_text(f">ctg1\n{sequence[2000:10000]}\n")
    options = ["--window", "256", "--device", "cpu", "--min_gene_length", "61"]
    main(
        [
            "annotate",
            "--checkpoint",
            str(coding_annotator_ckpt),
            "--inputs",
            str(piece),
            "--out",
            str(tmp_path / "piece.gff3"),
            *options,
        ]
    )
    by_hand = [
        (g.start + 2000, g.end + 2000, g.strand, g.kind)
        for g in read_genes(tmp_path / "piece.gff3")
        if g.start + 2000 < 7000 and g.end + 2000 > 5000
    ]
    out, tracks = tmp_path / "region.gff3", tmp_path / "region.bedgraph"
    main(
        [
            "annotate",
            "--checkpoint",
            str(coding_annotator_ckpt),
            "--inputs",
            str(fasta),
            "--regions",
            "ctg1:5001-7000",
            "--out",
            str(out),
            "--tracks",
            str(tracks),
            *options,
        ]
    )
    genes = read_genes(out)
    assert by_hand and [(g.start, g.end, g.strand, g.kind) for g in genes] == by_hand
    assert "##sequence-region ctg1 1 12000" in out.read_text() and "ctg2" not in out.read_text()
    rows = [line.split("\t") for line in tracks.read_text().splitlines() if not line.startswith("track")]
    assert {row[0] for row in rows} == {"ctg1"}
    assert min(int(row[1]) for row in rows) == 5000 and max(int(row[2]) for row in rows) == 7000
