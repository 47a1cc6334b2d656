"""Hugging Face-format export: a DNA language model as a directory that transformers loads.

    export_hf(Path("last.ckpt"), Path("my-model"))                # writes my-model/
    AutoModelForCausalLM.from_pretrained("my-model", trust_remote_code=True)

The directory holds what the Hub expects of a custom model, and no pickle:
    config.json          GenoformerConfig: the TransformerConfig fields, the alphabet's token codes,
                         "auto_map" to the classes of modeling_genoformer.py, "architectures", and
                         "genoformer": {"kind", "format_version", "objective", "trained_seq_len",
                         "hyper_parameters"} (the rest of the training hyperparameters)
    model.safetensors    the weights (float32 or bfloat16); a tied output head is stored once, as
                         the embedding, and tied again on load
    modeling_genoformer.py  genoformer.core.hf_modeling, which imports only torch and transformers
    tokenizer files      one token per base A C G T N plus PAD MASK BOS with genoformer's codes
                         (A 0 ... BOS 7); lowercase folds to uppercase, IUPAC ambiguity letters
                         read as N, whitespace is dropped
    README.md            a model card with Hub metadata and loading snippets

`read_hf_checkpoint` reads such a directory back as the (checkpoint, hyper_parameters) pair that
`genoformer.core.checkpoints.read_model_checkpoint` returns for a .ckpt; it needs neither
transformers nor the modeling file.

Only DNA language models (ModelKind.GENOME_LM) with dense attention export for now: the modeling
file has no block-sparse layouts, and fine-tuned heads and forecasters have no HF classes yet.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Union

import torch
from safetensors.torch import load_file, save_file

from genoformer.core.checkpoints import (
    FORMAT_VERSION, TAG_KEY, ModelKind, canonical_state_dict, checkpoint_kind, read_checkpoint,
)
from genoformer.core.transformer import TransformerConfig
from genoformer.data.genome.alphabet import BASES, IUPAC_AMBIGUOUS, SPECIAL_TOKENS, TOKEN_CODES
from genoformer.data.storage import atomic_build, refuse_existing

EXPORTABLE_KINDS = (ModelKind.GENOME_LM,)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
MODELING_FILE = "modeling_genoformer.py"
MODEL_TYPE = "genoformer"
SOURCE_PREFIX = "model."
"""Where GenoformerLM keeps the network in its state_dict (`self.model`)."""
HEAD_KEY = "head.weight"
"""The output head's key, in the network and in the HF classes (the trunk is under "model.")."""
SPECIAL_TOKEN_TEXT = {name: f"[{name}]" for name in SPECIAL_TOKENS}
"""The tokenizer's spelling of genoformer's special tokens: [PAD] [MASK] [BOS]."""
_ARCHITECTURES = {"CAUSAL_LM": ("GenoformerForCausalLM", "AutoModelForCausalLM", "causal language model"),
                  "MASKED_LM": ("GenoformerForMaskedLM", "AutoModelForMaskedLM", "masked language model")}


def export_hf(
    checkpoint: Path,
    out: Path,
    *,
    dtype: Literal["float32", "bfloat16"] = "float32",
    overwrite: bool = False,
) -> Path:
    """Write a DNA language model checkpoint as a Hugging Face-format directory.

    Args:
        checkpoint: A .ckpt file of a DNA language model (`genoformer fit` or `genoformer export`).
        out: The directory to write (built beside it, then renamed into place).
        dtype: Storage type of the weights.
        overwrite: Replace an existing `out`.
    """
    start = time.perf_counter()
    out = Path(out)
    refuse_existing(out, overwrite)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}.")
    state = read_checkpoint(checkpoint)
    kind = checkpoint_kind(state) if isinstance(state, dict) else None
    if kind is None:
        raise ValueError(f"{checkpoint} is not a genoformer model checkpoint (no model tag, hyperparameters or "
                         "weights); pass a .ckpt file written by `genoformer fit`.")
    if kind not in EXPORTABLE_KINDS:
        names = ", ".join(f"{k.description} ({k.value})" for k in EXPORTABLE_KINDS)
        raise ValueError(f"{checkpoint} holds {kind.description} ({kind.value}); Hugging Face export is not "
                         f"supported yet for that kind. Kinds that export: {names}. `genoformer export` writes "
                         "a portable .ckpt of any kind.")
    alphabet = state.get("alphabet", TOKEN_CODES)
    if alphabet != TOKEN_CODES:
        raise ValueError(f"{checkpoint}'s model reads the token codes {alphabet}, this genoformer's tokenizer "
                         f"encodes {TOKEN_CODES}; export it with the genoformer version that trained it.")
    hparams = dict(state["hyper_parameters"])
    config = TransformerConfig.from_dict(hparams.pop("transformer"))
    if any(spec is not None for spec in config.attention):
        raise ValueError(f"{checkpoint} has block-sparse attention layers (attention: "
                         f"{[type(s).__name__ if s else None for s in config.attention]}); sparse layouts are not "
                         "exported yet: the Hugging Face modeling file runs dense attention only.")
    objective = str(hparams.pop("objective"))
    tensors = hf_state_dict(state["state_dict"], config, DTYPES[dtype])
    trained_seq_len = int(state.get("trained_seq_len") or 0)
    hf_config = hf_config_dict(config, objective, kind, trained_seq_len, hparams, dtype)
    n_params = sum(tensor.numel() for tensor in tensors.values())
    with atomic_build(out, overwrite) as tmp:
        tmp.mkdir()
        (tmp / CONFIG_FILE).write_text(json.dumps(hf_config, indent=2) + "\n")
        save_file(tensors, tmp / WEIGHTS_FILE, metadata={"format": "pt"})
        (tmp / WEIGHTS_FILE).chmod(0o644)  # safetensors creates it readable by its owner only
        shutil.copyfile(Path(__file__).with_name("hf_modeling.py"), tmp / MODELING_FILE)
        save_tokenizer(tmp, config.max_seq_len)
        (tmp / "README.md").write_text(model_card(out.name, config, objective, trained_seq_len, n_params, dtype))
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out} (Hugging Face format, {kind.description}, {n_params:,} parameters, {dtype} weights, "
          f"{size / 2**20:.1f} MiB, {time.perf_counter() - start:.1f} s)")
    return out


def hf_state_dict(
    state_dict: Mapping[str, torch.Tensor], config: TransformerConfig, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """The network's weights under the HF classes' names (the trunk stays under "model.", the head
    is "head.weight"), contiguous, floating point cast to `dtype`; a tied head is left out."""
    state_dict = canonical_state_dict(state_dict)
    head, embed = state_dict.get(SOURCE_PREFIX + HEAD_KEY), state_dict.get(SOURCE_PREFIX + "embed.weight")
    if config.tie_embeddings and head is not None and not torch.equal(head, embed):
        raise ValueError("the config ties the output head to the embedding, but the checkpoint's head and embedding "
                         "weights differ; the checkpoint is inconsistent, so it is not exported.")
    tensors = {}
    for key, tensor in state_dict.items():
        if not key.startswith(SOURCE_PREFIX):
            continue
        name = key[len(SOURCE_PREFIX):]
        if name == HEAD_KEY:
            if config.tie_embeddings:
                continue
        else:
            name = SOURCE_PREFIX + name
        tensors[name] = (tensor.to(dtype) if tensor.is_floating_point() else tensor).contiguous().clone()
    return tensors


def hf_config_dict(
    config: TransformerConfig, objective: str, kind: ModelKind, trained_seq_len: int, hparams: Mapping[str, Any],
    dtype: str,
) -> dict[str, Any]:
    """config.json of the export (GenoformerConfig's fields and transformers' own keys)."""
    if objective not in _ARCHITECTURES:
        raise ValueError(f"unknown objective {objective!r}; expected one of {', '.join(_ARCHITECTURES)}.")
    architecture, auto_class, _ = _ARCHITECTURES[objective]
    module = Path(MODELING_FILE).stem
    return {
        "model_type": MODEL_TYPE,
        "architectures": [architecture],
        "auto_map": {"AutoConfig": f"{module}.GenoformerConfig", "AutoModel": f"{module}.GenoformerModel",
                     auto_class: f"{module}.{architecture}"},
        **config.to_dict(),
        "alphabet": dict(TOKEN_CODES),
        "pad_token_id": TOKEN_CODES["PAD"],
        "mask_token_id": TOKEN_CODES["MASK"],
        "bos_token_id": TOKEN_CODES["BOS"],
        "tie_word_embeddings": config.tie_embeddings,
        "dtype": dtype,
        TAG_KEY: {"kind": kind.value, "format_version": FORMAT_VERSION, "objective": objective,
                  "trained_seq_len": trained_seq_len, "hyper_parameters": dict(hparams)},
    }


def save_tokenizer(directory: Path, max_len: int) -> None:
    """Write the tokenizer files into `directory`. tokenizer_config.json names the class
    PreTrainedTokenizerFast, which transformers 4 and 5 both read (5 saves its own new name)."""
    build_tokenizer(max_len).save_pretrained(directory)
    config_path = directory / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config.pop("backend", None)
    config_path.write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def build_tokenizer(max_len: int):
    """A transformers fast tokenizer with genoformer's ids: one token per base and [PAD] [MASK] [BOS]."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {**{base: TOKEN_CODES[base] for base in BASES},
             **{SPECIAL_TOKEN_TEXT[name]: code for name, code in SPECIAL_TOKENS.items()}}
    tokenizer = Tokenizer(WordLevel(vocab))  # no unknown token: a letter outside the alphabet is an error
    folds = [normalizers.Replace(Regex(r"\s"), "")]
    folds += [normalizers.Replace(base.lower(), base) for base in BASES]
    folds += [normalizers.Replace(Regex(f"[{IUPAC_AMBIGUOUS}{IUPAC_AMBIGUOUS.lower()}]"), "N")]
    tokenizer.normalizer = normalizers.Sequence(folds)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=SPECIAL_TOKEN_TEXT["PAD"],
        mask_token=SPECIAL_TOKEN_TEXT["MASK"],
        bos_token=SPECIAL_TOKEN_TEXT["BOS"],
        model_max_length=max_len,
        padding_side="right",
        model_input_names=["input_ids", "attention_mask"],
    )


def model_card(
    name: str, config: TransformerConfig, objective: str, trained_seq_len: int, n_params: int, dtype: str
) -> str:
    """README.md with Hub metadata, what the model is, and how to load it."""
    architecture, auto_class, description = _ARCHITECTURES[objective]
    context = trained_seq_len or config.max_seq_len
    task = "next-base prediction" if objective == "CAUSAL_LM" else "masked bases, bidirectional attention"
    if objective == "CAUSAL_LM":
        use = ("logits = model(**inputs).logits          # (1, L, 8): position i predicts base i + 1\n"
               "log2p = logits[0, :-1].log_softmax(-1)[range(11), inputs.input_ids[0, 1:]] / math.log(2)")
    else:
        use = ("inputs.input_ids[0, 5] = tokenizer.mask_token_id\n"
               "logits = model(**inputs).logits          # (1, L, 8): predictions at every position")
    return f"""---
library_name: genoformer
license: apache-2.0
tags:
- dna
- genomics
- genoformer
pipeline_tag: {"text-generation" if objective == "CAUSAL_LM" else "fill-mask"}
---

# {name}

A genoformer DNA {description}: a pre-norm transformer (RMSNorm, rotary position embeddings,
SwiGLU MLP, grouped-query attention) over single nucleotides.

| | |
|---|---|
| objective | {objective} ({task}) |
| parameters | {n_params:,} |
| context length | {context:,} bases trained (at most {config.max_seq_len:,} per forward pass) |
| layers x width | {config.n_layers} x {config.d_model}, {config.n_heads} heads ({config.kv_heads} key/value heads) |
| weights | {dtype} safetensors |

Tokens: A 0, C 1, G 2, T 3, N 4, [PAD] 5, [MASK] 6, [BOS] 7, one per base. Lowercase folds to
uppercase and the IUPAC ambiguity letters read as N.

## Load with genoformer

```python
from genoformer.genome.embeddings import Embedder
from genoformer.genome.scoring import Scorer

embedder = Embedder.from_checkpoint("{name}")     # a genoformer checkpoint path or this directory
scorer = Scorer.from_checkpoint("{name}")
```

## Load with transformers

```python
import math
import torch
from transformers import AutoModel, AutoTokenizer, {auto_class}

tokenizer = AutoTokenizer.from_pretrained("{name}", trust_remote_code=True)
model = {auto_class}.from_pretrained("{name}", trust_remote_code=True, dtype=torch.float32).eval()
inputs = tokenizer("ACGTACGTACGT", return_tensors="pt")
with torch.no_grad():
    {use.replace(chr(10), chr(10) + "    ")}

encoder = AutoModel.from_pretrained("{name}", trust_remote_code=True)  # hidden states (1, L, {config.d_model})
```

The modeling code (`modeling_genoformer.py`) runs dense attention with PyTorch's
scaled_dot_product_attention and needs only torch and transformers.
"""


def is_hf_directory(path: Union[str, Path]) -> bool:
    """True when `path` is a directory written by `export_hf` (a genoformer config.json and weights)."""
    path = Path(path)
    config_path = path / CONFIG_FILE
    if not (path.is_dir() and config_path.is_file() and (path / WEIGHTS_FILE).is_file()):
        return False
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == MODEL_TYPE


def read_hf_checkpoint(path: Union[str, Path]) -> tuple[dict, dict]:
    """(checkpoint, hyper_parameters) of a directory written by `export_hf`, in the layout that
    `read_model_checkpoint` returns for a .ckpt: "state_dict" keyed "model.<name>" (a tied head
    shares the embedding's tensor), the "genoformer" tag, "alphabet" and "trained_seq_len"; the
    hyperparameters with "transformer" (TransformerConfig.to_dict layout) and "objective"."""
    path = Path(path)
    if not is_hf_directory(path):
        raise ValueError(f"{path} is not a genoformer Hugging Face directory (config.json with model_type "
                         f"{MODEL_TYPE!r} and {WEIGHTS_FILE}); write one with `genoformer export --format hf`.")
    hf_config = json.loads((path / CONFIG_FILE).read_text())
    tagged = hf_config.get(TAG_KEY)
    if not isinstance(tagged, Mapping):
        raise ValueError(f"{path / CONFIG_FILE} has no {TAG_KEY!r} entry; it was not written by "
                         "`genoformer export --format hf`.")
    version = tagged.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(f"{path} has genoformer checkpoint format {version!r}; this genoformer reads formats up to "
                         f"{FORMAT_VERSION}: upgrade genoformer to read it")
    fields = TransformerConfig.__dataclass_fields__
    architecture = {name: hf_config[name] for name in fields if name in hf_config}
    config = TransformerConfig.from_dict(architecture)
    tensors = load_file(path / WEIGHTS_FILE)
    state_dict = {}
    for name, tensor in tensors.items():
        key = name if name.startswith(SOURCE_PREFIX) else SOURCE_PREFIX + name
        state_dict[key] = tensor
    head = SOURCE_PREFIX + HEAD_KEY
    if config.tie_embeddings and head not in state_dict:
        state_dict[head] = state_dict[SOURCE_PREFIX + "embed.weight"]
    hparams = {"transformer": config.to_dict(), "objective": tagged.get("objective"),
               **dict(tagged.get("hyper_parameters") or {})}
    checkpoint = {
        "state_dict": state_dict,
        "hyper_parameters": hparams,
        TAG_KEY: {"kind": tagged.get("kind"), "format_version": version},
        "alphabet": dict(hf_config.get("alphabet") or TOKEN_CODES),
        "trained_seq_len": int(tagged.get("trained_seq_len") or 0),
    }
    return checkpoint, dict(hparams)
