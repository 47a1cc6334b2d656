"""Hugging Face-format export: transformers loads the directory offline and computes what
genoformer computes (logits, hidden states, per-base log2 p), the tokenizer uses genoformer's
codes, the directory reads back into genoformer with the same weights, and holds no pickle."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from model_helpers import WINDOW, fit_tiny, random_tokens
from safetensors.torch import load_file

from genoformer.core.checkpoints import FORMAT_VERSION, ModelKind
from genoformer.core.hf import export_hf, is_hf_directory, read_hf_checkpoint
from genoformer.core.loading import load_module_weights, read_model_checkpoint
from genoformer.core.transformer import Transformer, TransformerConfig
from genoformer.genome.lm import Objective
from genoformer.genome.scoring import LOG2E, Scorer

SHIPPED = Path(__file__).resolve().parents[2] / "examples" / "genoformer_dna.ckpt"
LOAD = dict(trust_remote_code=True, local_files_only=True)


@pytest.fixture(scope="module")
def dense_mlm_checkpoint(tmp_path_factory) -> Path:
    """A masked-LM checkpoint with dense attention (the shared `mlm_checkpoint` is block-sparse)."""
    root = tmp_path_factory.mktemp("dense_mlm_run")
    trainer, _ = fit_tiny(root, Objective.MASKED_LM)
    path = root / "final.ckpt"
    trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def exports(tmp_path_factory, causal_checkpoint, dense_mlm_checkpoint) -> dict[str, tuple[Path, Path]]:
    """objective -> (source checkpoint, exported directory), float32."""
    root = tmp_path_factory.mktemp("hf_exports")
    return {
        "CAUSAL_LM": (causal_checkpoint, export_hf(causal_checkpoint, root / "causal", dtype="float32")),
        "MASKED_LM": (dense_mlm_checkpoint, export_hf(dense_mlm_checkpoint, root / "masked", dtype="float32")),
    }


def genoformer_model(checkpoint: Path) -> Transformer:
    state, hparams = read_model_checkpoint(checkpoint, ModelKind.GENOME_LM)
    model = Transformer(TransformerConfig.from_dict(hparams["transformer"]))
    load_module_weights(model, state)
    return model.eval()


def auto_lm(objective: str, directory: Path):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    auto = AutoModelForCausalLM if objective == "CAUSAL_LM" else AutoModelForMaskedLM
    return auto.from_pretrained(directory, dtype=torch.float32, **LOAD).eval()


@pytest.mark.parametrize("objective", ["CAUSAL_LM", "MASKED_LM"])
def test_transformers_computes_what_genoformer_computes(exports, objective):
    from transformers import AutoConfig, AutoModel

    checkpoint, directory = exports[objective]
    config = AutoConfig.from_pretrained(directory, **LOAD)
    assert config.model_type == "genoformer" and config.causal == (objective == "CAUSAL_LM")
    assert config.genoformer["kind"] == "genome_lm" and config.genoformer["format_version"] == FORMAT_VERSION
    ours = genoformer_model(checkpoint)
    lm = auto_lm(objective, directory)
    assert type(lm).__name__ == json.loads((directory / "config.json").read_text())["architectures"][0]
    assert lm.head.weight.data_ptr() == lm.model.embed.weight.data_ptr()  # tied again on load
    tokens_BL = random_tokens(3, 77, seed=11, high=8).long()  # odd length, special tokens included
    with torch.no_grad():
        expected_BLV = ours(tokens_BL)
        got_BLV = lm(input_ids=tokens_BL).logits
        diff = (got_BLV - expected_BLV).abs().max().item()
        assert diff <= 1e-4, diff
        encoder = AutoModel.from_pretrained(directory, dtype=torch.float32, **LOAD).eval()
        hidden_BLE = encoder(input_ids=tokens_BL).last_hidden_state
        torch.testing.assert_close(hidden_BLE, ours.hidden_state(tokens_BL, layer=-1), rtol=0, atol=1e-4)
        states = encoder(input_ids=tokens_BL, output_hidden_states=True).hidden_states
        assert len(states) == ours.config.n_layers + 1
        for got, want in zip(states, ours.hidden_states(tokens_BL)):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
        # right padding: attention_mask masks keys as genoformer's lengths do
        lengths_B = torch.tensor([77, 50, 9])
        mask_BL = (torch.arange(77)[None] < lengths_B[:, None]).long()
        padded_BLV = lm(input_ids=tokens_BL, attention_mask=mask_BL).logits
        for b, n in enumerate(lengths_B.tolist()):
            torch.testing.assert_close(padded_BLV[b, :n], ours(tokens_BL[b : b + 1, :n])[0], rtol=0, atol=1e-4)


def test_plain_transformers_loads_the_export_in_the_checkouts_root(exports):
    """A script run in the clone's root (which Python puts first on sys.path, with the folder
    kernels/ in it) loads the export with transformers alone."""
    checkpoint, directory = exports["CAUSAL_LM"]
    code = (
        "import sys, torch; from transformers import AutoModelForCausalLM; "
        f"lm = AutoModelForCausalLM.from_pretrained({str(directory)!r}, trust_remote_code=True); "
        "print(lm(input_ids=torch.tensor([[0, 1, 2, 3]])).logits.shape[-1], "
        "sorted(name for name in sys.modules if name.startswith('genoformer.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=SHIPPED.parents[1], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    vocabulary, loaded = done.stdout.split(maxsplit=1)
    assert int(vocabulary) == genoformer_model(checkpoint).config.vocab_size and loaded.strip() == "[]"


def test_causal_log2_likelihood_equals_the_scorer(exports):
    checkpoint, directory = exports["CAUSAL_LM"]
    codes_L = random_tokens(1, WINDOW, seed=12)[0].numpy()
    expected_L = Scorer.from_checkpoint(checkpoint, device="cpu").log2_likelihood(codes_L, context=WINDOW)
    with torch.no_grad():
        logits_LV = auto_lm("CAUSAL_LM", directory)(input_ids=torch.from_numpy(codes_L).long()[None]).logits[0]
    log2p_LV = torch.log_softmax(logits_LV.double(), -1) * LOG2E
    got_L = np.concatenate([[np.nan], log2p_LV[:-1].gather(-1, torch.from_numpy(codes_L[1:]).long()[:, None])[:, 0]])
    assert np.isnan(expected_L[0]) and np.isfinite(expected_L[1:]).all()
    assert np.nanmax(np.abs(got_L - expected_L)) <= 2e-3


def test_tokenizer_uses_genoformer_codes(exports):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(exports["CAUSAL_LM"][1], **LOAD)
    assert tokenizer("ACGTN").input_ids == [0, 1, 2, 3, 4]
    assert tokenizer("acgtn").input_ids == [0, 1, 2, 3, 4]
    assert tokenizer("ACG\nTry").input_ids == [0, 1, 2, 3, 4, 4]  # line breaks dropped, R Y read as N
    assert (tokenizer.pad_token_id, tokenizer.mask_token_id, tokenizer.bos_token_id) == (5, 6, 7)
    assert tokenizer.convert_tokens_to_ids(["[PAD]", "[MASK]", "[BOS]"]) == [5, 6, 7]
    assert tokenizer("AC[MASK]G").input_ids == [0, 1, 6, 2]
    assert tokenizer.decode([0, 1, 2, 3, 4]) == "ACGTN"
    batch = tokenizer(["ACGT", "AC"], padding=True)
    assert batch.input_ids == [[0, 1, 2, 3], [0, 1, 5, 5]] and batch.attention_mask[1] == [1, 1, 0, 0]


@pytest.mark.parametrize("objective", ["CAUSAL_LM", "MASKED_LM"])
def test_read_hf_checkpoint_gives_back_the_weights_and_hparams(exports, objective):
    checkpoint, directory = exports[objective]
    assert is_hf_directory(directory) and not is_hf_directory(checkpoint) and not is_hf_directory(directory.parent)
    original, original_hparams = read_model_checkpoint(checkpoint, ModelKind.GENOME_LM)
    state, hparams = read_hf_checkpoint(directory)
    assert state["genoformer"] == {"kind": "genome_lm", "format_version": FORMAT_VERSION}
    assert state["alphabet"] == original["alphabet"] and state["trained_seq_len"] == original["trained_seq_len"]
    assert hparams == original_hparams and state["hyper_parameters"] == original_hparams
    assert hparams["objective"] == objective
    assert state["state_dict"].keys() == original["state_dict"].keys()
    for key, tensor in original["state_dict"].items():
        assert torch.equal(state["state_dict"][key], tensor), key
    # the existing loader accepts it
    model = Transformer(TransformerConfig.from_dict(hparams["transformer"]))
    load_module_weights(model, state)


def test_no_pickle_in_the_directory(exports):
    for _, directory in exports.values():
        names = sorted(path.name for path in directory.iterdir())
        assert names == [
            "README.md",
            "config.json",
            "genoformer_layout.py",
            "model.safetensors",
            "modeling_genoformer.py",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
        assert not [p for p in directory.rglob("*") if p.suffix in {".bin", ".pt", ".pth", ".ckpt", ".pkl"}]
        tensors = load_file(directory / "model.safetensors")
        assert "head.weight" not in tensors and all(t.dtype == torch.float32 for t in tensors.values())
        card = (directory / "README.md").read_text()
        assert card.startswith("---\nlibrary_name: genoformer\nlicense: apache-2.0\n")
        assert "- dna\n- genomics\n- genoformer\n" in card and "trust_remote_code=True" in card
    config = json.loads((exports["MASKED_LM"][1] / "config.json").read_text())
    assert config["auto_map"]["AutoModelForMaskedLM"] == "modeling_genoformer.GenoformerForMaskedLM"
    assert "AutoModelForCausalLM" not in config["auto_map"] and config["alphabet"]["BOS"] == 7


def test_shipped_model_exports_quickly_and_small(tmp_path):
    start = time.perf_counter()
    directory = export_hf(SHIPPED, tmp_path / "dna")  # auto: as stored, bfloat16
    seconds = time.perf_counter() - start
    tensors = load_file(directory / "model.safetensors")
    weights = sum(t.numel() * t.element_size() for t in tensors.values())
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    size = sum(path.stat().st_size for path in directory.iterdir())
    print(f"shipped model: export {seconds:.2f} s, {size / 1e6:.2f} MB for {weights / 1e6:.2f} MB of weights")
    assert seconds < 10
    assert size <= weights + 500_000
    card = (directory / "README.md").read_text()
    assert "32,768 bases trained" in card and f"{sum(t.numel() for t in tensors.values()):,}" in card


def test_bad_exports_and_existing_output(tmp_path, causal_checkpoint):
    from genoformer.kernels.layout import BlockLayout, LayoutSpec

    class OwnLayout(LayoutSpec):
        def build(self, seq_len, num_heads):
            return BlockLayout.dense(seq_len)

    own = torch.load(causal_checkpoint, map_location="cpu", weights_only=True)
    own["hyper_parameters"]["transformer"]["attention"] = [{"class_path": f"{__name__}.OwnLayout", "init_args": {}}]
    torch.save(own, tmp_path / "own.ckpt")
    globals()["OwnLayout"] = OwnLayout  # importable by its class_path, as a user's module would be
    with pytest.raises(
        ValueError, match="attention layout of its own class .*OwnLayout.*builds genoformer's layouts only"
    ):
        export_hf(tmp_path / "own.ckpt", tmp_path / "own")
    alibi = torch.load(causal_checkpoint, map_location="cpu", weights_only=True)
    alibi["hyper_parameters"]["transformer"].update(alibi=True, rope=False)
    torch.save(alibi, tmp_path / "alibi.ckpt")
    with pytest.raises(ValueError, match="uses ALiBi .*compute RoPE attention without ALiBi"):
        export_hf(tmp_path / "alibi.ckpt", tmp_path / "alibi")
    with pytest.raises(ValueError, match="dtype must be auto or one of"):
        export_hf(causal_checkpoint, tmp_path / "f16", dtype="float16")
    assert not any(tmp_path.glob("*/"))  # nothing half-written
    out = export_hf(causal_checkpoint, tmp_path / "model")
    with pytest.raises(FileExistsError):
        export_hf(causal_checkpoint, out)
    (out / "README.md").write_text("old")
    export_hf(causal_checkpoint, out, overwrite=True)
    assert (out / "README.md").read_text().startswith("---")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alibi.ckpt", "model", "own.ckpt"]  # no temporaries left
    assert math.isfinite(read_hf_checkpoint(out)[0]["state_dict"]["model.norm.weight"].sum().item())


def test_commands_read_the_export_as_they_read_the_checkpoint(causal_checkpoint, tmp_path):
    """`genoformer export --format hf` writes the directory; Scorer and Embedder load it (no
    pickle read) and give what they give from the .ckpt."""
    from genoformer.data.genome.alphabet import encode

    from genoformer.core.export import export
    from genoformer.genome.embeddings import Embedder
    from genoformer.genome.scoring import Scorer

    directory = export(checkpoint=causal_checkpoint, out=tmp_path / "hf", format="hf")
    sequence = "ACGTTGCAAGGCTTAACGGATCCA" * 4
    codes = encode(sequence)
    from_ckpt = Scorer.from_checkpoint(causal_checkpoint, device="cpu").log2_likelihood(codes)
    from_dir = Scorer.from_checkpoint(directory, device="cpu").log2_likelihood(codes)
    np.testing.assert_allclose(from_dir, from_ckpt, atol=1e-4, equal_nan=True)  # the first base has no prediction
    embedded = [
        Embedder.from_checkpoint(path, device="cpu").embed(sequence, progress=False).stack()
        for path in (causal_checkpoint, directory)
    ]
    np.testing.assert_allclose(embedded[0], embedded[1], atol=1e-5)
