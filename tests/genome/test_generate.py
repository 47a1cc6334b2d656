"""`genoformer generate` and `Generator`: greedy decoding equal to a hand loop over full forward
passes (inside and beyond the context), the cache equal to recomputing, seeds, only A/C/G/T
sampled, clear errors, the command end to end."""

from __future__ import annotations

import copy
import gzip

import numpy as np
import pytest
import torch
from cli_helpers import fails
from genoformer.data.genome.alphabet import decode, encode
from genoformer.data.genome.seqfiles import read_records
from model_helpers import random_tokens, tiny_model

from genoformer.cli import main
from genoformer.genome.generate import Generator, base_probabilities, check_sampling


@pytest.fixture(scope="module")
def generator() -> Generator:
    return Generator(tiny_model(seed=1), context=64, device="cpu")


def greedy_by_hand(model, prompt_L: np.ndarray, length: int, context: int, overlap: int) -> np.ndarray:
    """Greedy continuation from full forward passes over the window the module docstring
    describes: the last `context` bases, restarting on the last overlap + 1 past it."""
    tokens = list(prompt_L)
    start = max(0, len(tokens) - context)
    for _ in range(length):
        with torch.no_grad():
            logits_V = model(torch.tensor([tokens[start:]]))[0, -1]
        tokens.append(int(logits_V[:4].argmax()))
        if len(tokens) - start > context:
            start = len(tokens) - overlap - 1
    return np.array(tokens[len(prompt_L) :], dtype=np.uint8)


@pytest.mark.parametrize(
    ("prompt_length", "length", "context", "overlap"),
    [(10, 40, 64, None), (10, 100, 24, 8), (50, 30, 24, None), (1, 20, 8, 0), (5, 12, 6, 5)],
)
def test_greedy_equals_a_hand_loop_of_full_forward_passes(generator, prompt_length, length, context, overlap):
    prompt_L = random_tokens(1, prompt_length, seed=3)[0].numpy()
    kept = context // 2 if overlap is None else overlap
    expected_L = greedy_by_hand(generator.model, prompt_L, length, context, kept)
    for use_cache in (True, False):
        samples_ML = generator.generate(
            prompt_L, length, top_k=1, context=context, overlap=overlap, use_cache=use_cache, num_samples=2
        )
        assert samples_ML.shape == (2, length) and samples_ML.dtype == np.uint8
        np.testing.assert_array_equal(samples_ML[0], expected_L)
        np.testing.assert_array_equal(samples_ML[1], expected_L)


def test_sampling_with_the_cache_equals_recomputing_the_window(generator):
    prompt_L = random_tokens(1, 20, seed=4)[0].numpy()
    options = dict(temperature=1.5, seed=11, num_samples=3, context=32, overlap=10)
    cached_ML = generator.generate(prompt_L, 80, **options)
    recomputed_ML = generator.generate(prompt_L, 80, use_cache=False, **options)
    np.testing.assert_array_equal(cached_ML, recomputed_ML)


def test_a_seed_gives_the_same_samples_and_each_sample_its_own_stream(generator):
    prompt_L = random_tokens(1, 16, seed=5)[0].numpy()
    first_ML = generator.generate(prompt_L, 60, seed=3, num_samples=4)
    np.testing.assert_array_equal(generator.generate(prompt_L, 60, seed=3, num_samples=4), first_ML)
    assert len({row.tobytes() for row in first_ML}) == 4  # samples differ from each other
    assert not np.array_equal(generator.generate(prompt_L, 60, seed=4, num_samples=4), first_ML)
    # sample i draws from stream (seed, i), whichever batch it is decoded in
    np.testing.assert_array_equal(generator.generate(prompt_L, 60, seed=3, num_samples=4, batch_size=3), first_ML)
    np.testing.assert_array_equal(generator.generate(prompt_L, 60, seed=3, num_samples=2), first_ML[:2])


def test_only_a_c_g_t_are_sampled(generator):
    # The untrained model spreads its probability over all 8 tokens: half the draws would be N or
    # a special token if they were not dropped.
    with torch.no_grad():
        p_V = torch.softmax(generator.model(random_tokens(1, 20, seed=6).long())[0, -1], -1)
    assert p_V[4:].sum() > 0.3
    samples_ML = generator.generate(random_tokens(1, 20, seed=6)[0].numpy(), 150, temperature=3.0, num_samples=2)
    assert samples_ML.max() <= 3 and set(np.unique(samples_ML)) == {0, 1, 2, 3}


def test_base_probabilities_drop_other_tokens_and_keep_the_top_k():
    logits_BV = torch.tensor([[1.0, 3.0, 2.0, 0.0, 9.0, 9.0, 9.0, 9.0], [0.5, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0]])
    p_BS = base_probabilities(logits_BV, 1.0, None)
    torch.testing.assert_close(p_BS[0], torch.softmax(logits_BV[0, :4], -1))
    torch.testing.assert_close(p_BS[1], torch.full((4,), 0.25))
    p_BS = base_probabilities(logits_BV, 0.5, 2)
    expected_S = torch.zeros(4)
    expected_S[1:3] = torch.softmax(torch.tensor([3.0, 2.0]) / 0.5, -1)  # C and G, at temperature 0.5
    torch.testing.assert_close(p_BS[0], expected_S)
    assert (p_BS[1] > 0).sum() == 2  # exactly k kept, even among ties
    assert base_probabilities(logits_BV, 1.0, 1).argmax(-1).tolist() == [1, 0]


@pytest.mark.parametrize(
    ("temperature", "top_k", "message"),
    [
        (0.0, None, "temperature must be a positive number"),
        (-1.0, None, "temperature must be a positive number"),
        (float("nan"), None, "temperature must be a positive number"),
        (1.0, 0, "top_k must be 1 to 4"),
        (1.0, 5, "top_k must be 1 to 4"),
    ],
)
def test_bad_sampling_options_raise(generator, temperature, top_k, message):
    with pytest.raises(ValueError, match=message):
        check_sampling(temperature, top_k)
    with pytest.raises(ValueError, match=message):
        generator.generate(encode("ACGT"), 5, temperature=temperature, top_k=top_k)


def test_bad_generate_arguments_raise(generator):
    with pytest.raises(ValueError, match="at least one base"):
        generator.generate(np.zeros(0, dtype=np.uint8), 5)
    with pytest.raises(ValueError, match="codes 0..4"):
        generator.generate(np.array([0, 7], dtype=np.uint8), 5)
    with pytest.raises(ValueError, match="length must be an integer of at least 1"):
        generator.generate(encode("ACGT"), 0)
    with pytest.raises(ValueError, match="overlap must be 0 to context - 1 = 7"):
        generator.generate(encode("ACGT"), 5, context=8, overlap=8)
    with pytest.raises(ValueError, match="context must be 1 to the model's max_seq_len 512"):
        generator.generate(encode("ACGT"), 5, context=513)


def test_a_masked_model_is_refused(mlm_checkpoint):
    with pytest.raises(ValueError, match="masked language model"):
        Generator.from_checkpoint(mlm_checkpoint, device="cpu")
    with pytest.raises(ValueError, match="masked language model"):
        Generator(tiny_model(causal=False), context=32)


# ------------------------------------------------------------------------------- the command
def read_fasta(path) -> list[tuple[str, str]]:
    """(header after '>', sequence) of every record."""
    records, header = [], None
    for line in path.read_text().splitlines():
        if line.startswith(">"):
            header = line[1:]
            records.append([header, ""])
        else:
            records[-1][1] += line
    return [tuple(record) for record in records]


def test_generate_command_writes_the_samples_of_the_api(causal_checkpoint, tmp_path, capsys):
    out = tmp_path / "samples.fasta"
    args = [
        "generate",
        "--checkpoint",
        str(causal_checkpoint),
        "--prompt",
        "acgtNACGGT",
        "--length",
        "90",
        "--num_samples",
        "3",
        "--seed",
        "7",
        "--temperature",
        "0.9",
        "--top_k",
        "3",
        "--out",
        str(out),
    ]
    main(args)
    assert f"wrote 3 samples of 90 bases to {out}" in capsys.readouterr().out
    records = read_fasta(out)
    assert [header.split()[0] for header, _ in records] == ["sample_1", "sample_2", "sample_3"]
    assert records[0][0].split()[1:] == ["prompt=acgtNACGGT", "prompt_bases=10", "temperature=0.9", "top_k=3", "seed=7"]
    expected_ML = Generator.from_checkpoint(causal_checkpoint, device="cpu").generate(
        encode("ACGTNACGGT"), 90, temperature=0.9, top_k=3, seed=7, num_samples=3
    )
    assert [sequence for _, sequence in records] == [decode(row) for row in expected_ML]
    assert max(len(line) for line in out.read_text().splitlines()) == 80

    err = fails(capsys, args)
    assert "--overwrite" in err
    main([*args, "--overwrite"])  # the hint, as typed
    assert read_fasta(out) == records


def test_generate_command_reads_prompts_from_fasta(causal_checkpoint, tmp_path, capsys):
    prompts = tmp_path / "prompts.fa.gz"
    with gzip.open(prompts, "wt") as handle:
        handle.write(">first\nACGTACGTAC\n>second\n" + "GGATCCA" * 30 + "\n")
    out = tmp_path / "samples.fasta"
    main(
        [
            "generate",
            "--checkpoint",
            str(causal_checkpoint),
            "--prompt_fasta",
            str(prompts),
            "--length",
            "20",
            "--num_samples",
            "2",
            "--top_k",
            "1",
            "--context",
            "64",
            "--include_prompt",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert "prompt second: 210 bases, more than the context of 64; the model reads its last 64" in printed
    records = read_fasta(out)
    assert [header.split()[0] for header, _ in records] == [
        "first_sample_1",
        "first_sample_2",
        "second_sample_1",
        "second_sample_2",
    ]
    assert records[2][0].split()[1:3] == ["prompt=second", "prompt_bases=210"]
    assert records[0][1].startswith("ACGTACGTAC") and len(records[0][1]) == 30
    generator = Generator.from_checkpoint(causal_checkpoint, device="cpu")
    cut = generator.generate(encode("GGATCCA" * 30)[-64:], 20, top_k=1, context=64)
    assert records[2][1] == "GGATCCA" * 30 + decode(cut[0])
    assert next(read_records(out)).name == "first_sample_1"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--prompt", "ACGXT"], "--prompt: base 4 (1-based): invalid character 'X'"),
        ([], "give the prompt one way"),
        (["--prompt", "ACGT", "--prompt_fasta", "p.fa"], "not both"),
        (["--prompt", "ACGT", "--temperature", "0"], "pass --top_k 1"),
        (["--prompt", "ACGT", "--top_k", "6"], "top_k must be 1 to 4"),
        (["--prompt", "ACGT", "--prompt_fasta", "p.fa"], "--prompt SEQUENCE"),
    ],
)
def test_generate_command_errors(causal_checkpoint, tmp_path, capsys, extra, message):
    err = fails(
        capsys,
        [
            "generate",
            "--checkpoint",
            str(causal_checkpoint),
            "--length",
            "5",
            "--out",
            str(tmp_path / "s.fasta"),
            *extra,
        ],
    )
    assert message in err
    assert not (tmp_path / "s.fasta").exists()


def test_generate_command_refuses_a_masked_model_and_a_compressed_out(mlm_checkpoint, tmp_path, capsys):
    base = ["generate", "--checkpoint", str(mlm_checkpoint), "--prompt", "ACGT", "--length", "5"]
    assert "masked language model" in fails(capsys, [*base, "--out", str(tmp_path / "s.fasta")])
    assert "plain FASTA text; name it" in fails(capsys, [*base, "--out", str(tmp_path / "s.fasta.gz")])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_cuda_graph_steps_give_the_eager_steps_bases():
    """On a GPU each one-token step replays a captured CUDA graph (the decoding kernel over the
    whole cache): the same samples as the steps launched one by one, across window restarts, and
    greedy bases equal to a hand loop of full forward passes in float32."""
    model = tiny_model(seed=1, n_heads=2)  # head dim 16: the decoding kernel runs it
    prompt_L = random_tokens(1, 30, seed=5)[0].numpy()
    options = dict(temperature=1.2, seed=3, num_samples=4, context=48, overlap=12)
    graphs = Generator(model, context=64, device="cuda").generate(prompt_L, 120, **options)
    eager = Generator(model, context=64, device="cuda", cuda_graphs=False).generate(prompt_L, 120, **options)
    np.testing.assert_array_equal(graphs, eager)
    exact = Generator(model, context=64, device="cuda", autocast_dtype=torch.float32)
    expected_L = greedy_by_hand(copy.deepcopy(model).float().cpu(), prompt_L, 40, 48, 12)
    np.testing.assert_array_equal(exact.generate(prompt_L, 40, top_k=1, context=48, overlap=12)[0], expected_L)
