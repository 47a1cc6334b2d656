"""Embedder: checkpoint loading, inputs, pooling, tiling and stitching, saving, errors."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from Bio.Seq import Seq
from Bio.SeqRecord import SeqRecord
from genoformer.data.genome.alphabet import decode
from genoformer.data.tiling import tile_windows
from genoformer.kernels.layout import SlidingWindow
from model_helpers import WINDOW, random_tokens, tiny_model

from genoformer.genome.embeddings import Embedder, Embeddings, Pooling, load_embeddings, save_embeddings


def random_sequence(length: int, seed: int) -> str:
    return decode(random_tokens(1, length, seed=seed)[0].numpy())


@pytest.fixture(scope="module")
def embedder(mlm_checkpoint) -> Embedder:
    return Embedder.from_checkpoint(mlm_checkpoint, device="cpu")


def test_from_checkpoint_restores_the_trained_model(embedder):
    assert embedder.window == WINDOW  # the trained context
    config = embedder.model.config
    assert not config.causal and config.n_layers == 2 and isinstance(config.attention[0], SlidingWindow)
    assert not embedder.model.training


def test_per_token_and_pooled_shapes_and_consistency(embedder):
    sequences = [random_sequence(300, 1), random_sequence(50, 2), "acgtnRY"]
    per_token = embedder.embed(sequences, pooling="none", progress=False)
    assert per_token.names == ["seq0", "seq1", "seq2"]
    assert [a.shape for a in per_token.arrays] == [(300, 32), (50, 32), (7, 32)]
    assert all(a.dtype == np.float32 for a in per_token.arrays)
    for pooling, reduce in [
        ("mean", lambda a: a.mean(0)),
        ("max", lambda a: a.max(0)),
        ("first", lambda a: a[0]),
        ("last", lambda a: a[-1]),
    ]:
        pooled = embedder.embed(sequences, pooling=pooling, progress=False)
        assert pooled.stack().shape == (3, 32)
        for vector, tokens in zip(pooled.arrays, per_token.arrays):
            np.testing.assert_allclose(vector, reduce(tokens), rtol=1e-5, atol=1e-6)


def test_layers_and_window_limits(embedder):
    sequence = random_sequence(40, 3)
    first = embedder.embed(sequence, pooling="none", layer=0, progress=False).arrays[0]
    tokens_BL = torch.from_numpy(random_tokens(1, 40, seed=3).numpy())
    np.testing.assert_allclose(first, embedder.model.embed(tokens_BL.long())[0].detach().numpy())
    middle = embedder.embed(sequence, layer=1, progress=False)
    assert middle.layer == 1 and middle.arrays[0].shape == (32,)
    with pytest.raises(IndexError, match="out of range"):
        embedder.embed(sequence, layer=3, progress=False)
    with pytest.raises(ValueError, match="overlap"):
        embedder.embed(sequence, window=64, overlap=64, progress=False)
    with pytest.raises(ValueError, match="window must be at least 1 token"):
        embedder.embed(sequence, window=0, progress=False)


@pytest.mark.parametrize("pooling", ["none", "mean", "last"])
def test_a_record_longer_than_max_seq_len_embeds_in_one_window_in_chunks(mlm_checkpoint, monkeypatch, pooling):
    from genoformer.genome import embeddings

    sequence = random_sequence(700, 11)  # past the model's max_seq_len of 512
    whole = Embedder.from_checkpoint(mlm_checkpoint, device="cpu")
    whole.model.runtime.sequence_chunk = None
    reference = whole.embed(sequence, pooling=pooling, window=700, progress=False).arrays[0]
    chunked = Embedder.from_checkpoint(mlm_checkpoint, device="cpu")
    chunked.model.runtime.sequence_chunk = 64  # the model's position-wise work, 64 positions at a time
    monkeypatch.setattr(embeddings, "INFERENCE_CHUNK", 50)  # and the host transfers, 50 at a time
    result = chunked.embed(sequence, pooling=pooling, window=700, progress=False).arrays[0]
    assert chunked.model.config.max_seq_len == 700 and result.shape == reference.shape
    np.testing.assert_allclose(result, reference, rtol=1e-5, atol=1e-5)


def test_deterministic_and_independent_of_batching(embedder):
    sequences = [random_sequence(n, seed) for seed, n in enumerate([500, 96, 96, 33, 250])]
    runs = [embedder.embed(sequences, pooling="none", batch_size=b, progress=False) for b in (1, 1, 3)]
    for a, b in zip(runs[0].arrays, runs[1].arrays):
        assert np.array_equal(a, b)
    for a, b in zip(runs[0].arrays, runs[2].arrays):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    alone = embedder.embed(sequences[3], pooling="none", progress=False).arrays[0]
    np.testing.assert_allclose(alone, runs[2].arrays[3], rtol=1e-5, atol=1e-6)


def test_tiled_embedding_equals_untiled_for_a_local_model():
    """Two sliding-window layers reach < 64 tokens; windows of 256 overlapping by 128 keep >= 64
    tokens of context around every kept position, and window starts are block-aligned, so
    stitched per-token vectors equal those of one pass over the whole sequence."""
    model = tiny_model(n_layers=2, causal=False, max_seq_len=1024, attention=[SlidingWindow(window=16, block_size=16)])
    embedder = Embedder(model, window=256, device="cpu")
    sequence = random_sequence(688, 5)  # starts 0, 128, 256, 384 and 432: multiples of 16
    assert len(tile_windows(688, 256, 128)) == 5
    tiled = embedder.embed(sequence, pooling="none", overlap=128, progress=False).arrays[0]
    whole = embedder.embed(sequence, pooling="none", window=688, progress=False).arrays[0]
    np.testing.assert_allclose(tiled, whole, rtol=1e-4, atol=1e-5)
    pooled = embedder.embed(sequence, pooling="mean", overlap=128, progress=False).arrays[0]
    np.testing.assert_allclose(pooled, whole.mean(0), rtol=1e-4, atol=1e-5)


def test_inputs_from_records_and_fasta_files(embedder, tmp_path):
    a, b = random_sequence(120, 7), random_sequence(61, 8)
    expected = embedder.embed([a, b], progress=False).stack()
    fasta = tmp_path / "two.fa.gz"
    fasta.write_bytes(gzip.compress(f">chrA some description\n{a[:60]}\n{a[60:]}\n>chrB\n{b.lower()}\n".encode()))
    for inputs in (fasta, str(fasta), [SeqRecord(Seq(a), id="chrA"), SeqRecord(Seq(b), id="chrB")]):
        result = embedder.embed(inputs, progress=False)
        assert result.names == ["chrA", "chrB"]
        np.testing.assert_allclose(result.stack(), expected, rtol=1e-5, atol=1e-6)
    single = embedder.embed(SeqRecord(Seq(a), id="only"), progress=False)
    assert single.names == ["only"] and len(single) == 1


def test_real_genome_fasta(embedder, repo_root):
    result = embedder.embed(
        repo_root / "examples" / "lambda_phage.fasta.gz",
        pooling="mean",
        window=96,
        overlap=0,
        batch_size=64,
        progress=False,
    )
    assert len(result) == 1 and result.stack().shape == (1, 32) and np.isfinite(result.stack()).all()


def test_bad_inputs_raise_clear_errors(embedder, tmp_path, mlm_checkpoint):
    with pytest.raises(ValueError, match=r"sequence 'seq1', base 3 \(1-based\): invalid character 'X'"):
        embedder.embed(["ACGT", "ACXT"], progress=False)
    with pytest.raises(ValueError, match="read as a sequence unless"):
        embedder.embed("genes.txt", progress=False)
    with pytest.raises(FileNotFoundError, match="input not found: .*missing.fasta"):
        embedder.embed(str(tmp_path / "missing.fasta"), progress=False)
    with pytest.raises(ValueError, match="empty"):
        embedder.embed(["ACGT", ""], progress=False)
    with pytest.raises(ValueError, match="no input given"):
        embedder.embed([], progress=False)
    with pytest.raises(TypeError, match="item 1 of the inputs is a int"):
        embedder.embed(["ACGT", 5], progress=False)
    with pytest.raises(ValueError, match="Pooling"):
        embedder.embed("ACGT", pooling="avg", progress=False)
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        Embedder.from_checkpoint(tmp_path / "nope.ckpt")
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_text("not a checkpoint")
    with pytest.raises(ValueError, match="not a readable genoformer checkpoint") as error:
        Embedder.from_checkpoint(garbage)
    assert "weights_only" not in str(error.value)
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(mlm_checkpoint.read_bytes()[:1000])
    with pytest.raises(ValueError, match="truncated") as error:
        Embedder.from_checkpoint(truncated)
    assert "weights_only" not in str(error.value)
    other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {}}, other)
    with pytest.raises(ValueError, match="not a genoformer model checkpoint"):
        Embedder.from_checkpoint(other)


@pytest.mark.parametrize("suffix", [".npz", ".zarr"])
@pytest.mark.parametrize("pooling", [Pooling.MEAN, Pooling.NONE])
def test_save_and_load_round_trip(embedder, tmp_path, suffix, pooling):
    result = embedder.embed(
        [random_sequence(130, 9), random_sequence(20, 10)], pooling=pooling, layer=1, progress=False
    )
    path = save_embeddings(result, tmp_path / f"out{suffix}")
    loaded = load_embeddings(path)
    assert isinstance(loaded, Embeddings) and loaded.names == result.names
    assert loaded.pooling is pooling and loaded.layer == 1
    for a, b in zip(loaded.arrays, result.arrays):
        assert np.array_equal(a, b) and a.dtype == np.float32
    with pytest.raises(ValueError, match="npz or"):
        save_embeddings(result, tmp_path / "out.csv")
    with pytest.raises(FileNotFoundError, match="embeddings not found"):
        load_embeddings(tmp_path / "missing.npz")


def test_bfloat16_autocast_stays_close_to_float32(mlm_checkpoint):
    """On CUDA the Embedder runs under bfloat16 autocast by default (the Triton kernels need it);
    the same path on the CPU must give float32 outputs close to the full-precision ones."""
    full = Embedder.from_checkpoint(mlm_checkpoint, device="cpu")
    half = Embedder.from_checkpoint(mlm_checkpoint, device="cpu", autocast_dtype=torch.bfloat16)
    assert full.autocast_dtype is None and half.autocast_dtype is torch.bfloat16
    sequence = random_sequence(300, seed=3)
    a = full.embed(sequence, pooling="none", progress=False).arrays[0]
    b = half.embed(sequence, pooling="none", progress=False).arrays[0]
    assert b.dtype == np.float32
    assert np.abs(a - b).max() / np.abs(a).max() < 0.05


def test_save_embeddings_is_atomic_and_refuses_to_replace(embedder, tmp_path, monkeypatch):
    """A write that fails leaves neither a partial file nor a temporary; an existing output is
    replaced only with overwrite=True, and only once the new one is complete."""
    first = embedder.embed(["ACGTACGT", "TTTTGGGG"], progress=False)
    second = embedder.embed(["CCCCAAAA"], progress=False)
    for suffix in (".npz", ".zarr"):
        out = tmp_path / f"emb{suffix}"
        save_embeddings(first, out)
        with pytest.raises(FileExistsError, match="overwrite=True"):
            save_embeddings(second, out)
        assert load_embeddings(out).names == ["seq0", "seq1"]

        def fail_half_way(target, *args, **kwargs):
            if not isinstance(target, zarr.Group):  # numpy.savez(file, ...): leave a partial file
                Path(target).write_bytes(b"PK partial")
            raise OSError("disk full")

        with monkeypatch.context() as patch:
            patch.setattr(np, "savez", fail_half_way)
            patch.setattr(zarr.Group, "create_array", fail_half_way)
            with pytest.raises(OSError, match="disk full"):
                save_embeddings(second, out, overwrite=True)
        assert load_embeddings(out).names == ["seq0", "seq1"]  # the old output, untouched
        save_embeddings(second, out, overwrite=True)
        assert load_embeddings(out).names == ["seq0"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["emb.npz", "emb.zarr"]  # no temporaries


def test_repeated_names_are_an_error_in_the_python_api(embedder):
    records = [SeqRecord(Seq("ACGTACGT"), id="chr1"), SeqRecord(Seq("GGGGCCCC"), id="chr1")]
    with pytest.raises(ValueError, match=r"'chr1' appears twice"):
        embedder.embed(records, progress=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_device_without_cuda_is_a_clear_error(mlm_checkpoint):
    with pytest.raises(ValueError, match="sees none; pass device='cpu'"):
        Embedder.from_checkpoint(mlm_checkpoint, device="cuda")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [50, 90, 64 + 3 * 48])
def test_both_strands_embed_a_sequence_and_its_reverse_complement_alike(causal, length):
    """With both strands, the per-token result for the reverse complement is the result for the
    sequence, flipped: exactly so when the tiling is symmetric (one window; or windows of 64 with
    an even overlap of 16, where the tiles of the reverse complement mirror those of the sequence)."""
    from genoformer.data.genome.alphabet import reverse_complement

    embedder = Embedder(tiny_model(seed=3, causal=causal), window=64, device="cpu")
    codes = random_tokens(1, length, seed=length)[0].numpy()
    options = dict(pooling="none", overlap=16, both_strands=True, progress=False)
    forward = embedder.embed(decode(codes), **options).arrays[0]
    backward = embedder.embed(decode(reverse_complement(codes)), **options).arrays[0]
    np.testing.assert_allclose(forward, backward[::-1], rtol=1e-5, atol=1e-6)
    # one strand alone has no such symmetry (a causal model reads left to right)
    alone = embedder.embed(decode(codes), pooling="none", overlap=16, progress=False).arrays[0]
    alone_back = embedder.embed(decode(reverse_complement(codes)), pooling="none", overlap=16, progress=False).arrays[0]
    assert not np.allclose(alone, alone_back[::-1], atol=1e-3)
    # the mean of the two strands, token by token, then pooled
    np.testing.assert_allclose(forward, (alone + alone_back[::-1]) / 2, rtol=1e-5, atol=1e-6)
    pooled = embedder.embed(decode(codes), pooling="mean", overlap=16, both_strands=True, progress=False).arrays[0]
    np.testing.assert_allclose(pooled, forward.mean(0), rtol=1e-5, atol=1e-6)


def test_regions_embed_the_cut_stretches_under_their_region_names(embedder, tmp_path):
    a, b = random_sequence(300, 9), random_sequence(100, 10)
    fasta = tmp_path / "two.fa"
    fasta.write_text(f">chrA\n{a}\n>chrB\n{b}\n")
    bed = tmp_path / "r.bed"
    bed.write_text("chrA\t10\t110\tgene1\nchrB\t0\t100\n")
    result = embedder.embed(fasta, regions=[bed, "chrA:201-300"], progress=False)
    assert result.names == ["gene1", "chrB:1-100", "chrA:201-300"]
    expected = embedder.embed([a[10:110], b, a[200:300]], progress=False).stack()
    np.testing.assert_allclose(result.stack(), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="record 'chrC' is not in the genome, which holds 2 record"):
        embedder.embed(fasta, regions="chrC:1-10", progress=False)
