"""Hugging Face-format export: a genoformer model as a directory that transformers loads.

    export_hf(Path("last.ckpt"), Path("my-model"))                # writes my-model/
    AutoModelForCausalLM.from_pretrained("my-model", trust_remote_code=True)

Every kind of model exports (`ModelKind`); the directory holds what the Hub expects of a custom
model, and no pickle:
    config.json          the architecture (a DNA model: GenoformerConfig, the TransformerConfig
                         fields and the alphabet's token codes; a forecaster: "transformer" and
                         "forecast"), "auto_map" to the modeling file's classes, "architectures",
                         and "genoformer": {"kind", "format_version", "trained_seq_len",
                         "hyper_parameters"} (the training hyperparameters, so that genoformer
                         rebuilds the model from the directory alone)
    model.safetensors    the weights (stored as the checkpoint stores them, or float32/bfloat16);
                         a tied output head is stored once, as the embedding, and tied again on load
    modeling file        DNA models: modeling_genoformer.py (genoformer.core.hf_modeling) with
                         genoformer_layout.py (genoformer.kernels.layout, for block-sparse layers):
                         torch and transformers only. Forecasters:
                         modeling_genoformer_forecaster.py (genoformer.timeseries.hf_modeling),
                         which runs genoformer's own time-series model and so needs genoformer.
    tokenizer files      DNA models: one token per base A C G T N plus PAD MASK BOS with
                         genoformer's codes (A 0 ... BOS 7); lowercase folds to uppercase, IUPAC
                         ambiguity letters read as N, whitespace is dropped
    README.md            a model card: Hub metadata, what the model is, its measured figures (the
                         run's validation and test metrics found beside the checkpoint, and any
                         `genoformer evaluate` / `baseline` JSON reports given), how to load it

Weight names: a language model keeps the network's names (`model.*`, the output head
`head.weight`); a fine-tuned model's head is `classifier.*` and its low-rank adapters (LoRA) are
merged into the trunk's weights (W + alpha / r * B A), so that the export is a plain network;
a forecaster keeps its module's names (`model.*`).

`read_hf_checkpoint` reads such a directory back as the (checkpoint, hyper_parameters) pair that
`genoformer.core.loading.read_model_checkpoint` returns for a .ckpt; it needs neither
transformers nor the modeling file.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

import torch
import yaml
from safetensors.torch import load_file, save_file

import genoformer.kernels.layout as layouts
from genoformer.core.checkpoints import (
    FORMAT_VERSION,
    TAG_KEY,
    ModelKind,
    canonical_state_dict,
    checkpoint_kind,
    read_checkpoint,
    regroup_hyperparameters,
)
from genoformer.core.transformer import TransformerConfig
from genoformer.data.genome.alphabet import BASES, IUPAC_AMBIGUOUS, SPECIAL_TOKENS, TOKEN_CODES
from genoformer.data.storage import atomic_build, refuse_existing

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
MODELING_FILE = "modeling_genoformer.py"
FORECASTER_MODELING_FILE = "modeling_genoformer_forecaster.py"
LAYOUT_FILE = "genoformer_layout.py"
LAYOUT_IMPORT = ("from genoformer.kernels.layout import", "from .genoformer_layout import")
"""The one line of hf_modeling.py that the export rewrites, so the copy imports the layout file beside it."""
MODEL_TYPE = "genoformer"
FORECASTER_MODEL_TYPE = "genoformer_forecaster"
SOURCE_PREFIX = "model."
"""Where the training modules keep the network in their state_dict (`self.model`)."""
HEAD_KEY = "head.weight"
"""The output head's key, in the network and in the HF classes (the trunk is under "model.")."""
FINETUNED_HEAD = ("head.", "classifier.")
"""A fine-tuned model's head: its prefix in FineTuner's state_dict and in the HF classes."""
SPECIAL_TOKEN_TEXT = {name: f"[{name}]" for name in SPECIAL_TOKENS}
"""The tokenizer's spelling of genoformer's special tokens: [PAD] [MASK] [BOS]."""
LORA_KEY = re.compile(r"^(?P<module>.+)\.base_layer\.weight$")
"""A peft LoRA layer's frozen weight; its adapters sit beside it as lora_A/lora_B.default.weight."""


@dataclass(frozen=True)
class Architecture:
    """The transformers class an export loads as."""

    name: str
    auto_class: str
    description: str


_LM_ARCHITECTURES = {
    "CAUSAL_LM": Architecture("GenoformerForCausalLM", "AutoModelForCausalLM", "causal language model"),
    "MASKED_LM": Architecture("GenoformerForMaskedLM", "AutoModelForMaskedLM", "masked language model"),
}
_SEQUENCE_HEAD = Architecture(
    "GenoformerForSequenceClassification", "AutoModelForSequenceClassification", "model fine-tuned on sequence labels"
)
_BASE_HEAD = Architecture(
    "GenoformerForTokenClassification", "AutoModelForTokenClassification", "model fine-tuned on per-base labels"
)
_FORECASTER = Architecture("GenoformerForecaster", "AutoModel", "time-series forecaster")


def export_hf(
    checkpoint: Path,
    out: Path,
    *,
    dtype: Literal["auto", "float32", "bfloat16"] = "auto",
    reports: Sequence[Path] = (),
    overwrite: bool = False,
) -> Path:
    """Write a genoformer checkpoint as a Hugging Face-format directory.

    Args:
        checkpoint: A .ckpt file of any genoformer model (`genoformer fit`, `finetune` or `export`).
        out: The directory to write (built beside it, then renamed into place).
        dtype: Storage type of the weights; auto: as the checkpoint stores them (bfloat16 when all
            its floating-point weights are, else float32).
        reports: JSON reports of `genoformer evaluate` and `genoformer baseline` whose figures the
            model card shows.
        overwrite: Replace an existing `out`.
    """
    start = time.perf_counter()
    out = Path(out)
    refuse_existing(out, overwrite)
    if dtype not in ("auto", *DTYPES):
        raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {dtype!r}.")
    measured = [_read_report(Path(path)) for path in reports]
    state = read_checkpoint(checkpoint)
    kind = checkpoint_kind(state) if isinstance(state, dict) else None
    if kind is None:
        raise ValueError(
            f"{checkpoint} is not a genoformer model checkpoint (no model tag, hyperparameters or "
            "weights); pass a .ckpt file written by `genoformer fit`."
        )
    if kind is not ModelKind.FORECASTER:
        alphabet = state.get("alphabet", TOKEN_CODES)
        if alphabet != TOKEN_CODES:
            raise ValueError(
                f"{checkpoint}'s model reads the token codes {alphabet}, this genoformer's tokenizer "
                f"encodes {TOKEN_CODES}; export it with the genoformer version that trained it."
            )
    hparams = dict(state["hyper_parameters"])
    config = TransformerConfig.from_dict(hparams["transformer"])
    _check_exportable(config, checkpoint)
    if dtype == "auto":
        stored = {t.dtype for t in state["state_dict"].values() if t.is_floating_point()}
        dtype = "bfloat16" if stored == {torch.bfloat16} else "float32"
    if kind is ModelKind.GENOME_FINETUNED and hparams.get("targets") is None:
        raise ValueError(f"{checkpoint} holds no head (it was saved before its targets were known); fine-tune it again")
    if kind is ModelKind.GENOME_FINETUNED and hparams["targets"]["kind"] not in _PROBLEM_TYPES:
        raise ValueError(
            f"{checkpoint} predicts {hparams['targets']['kind']}, which the transformers classes of an export "
            f"(hf_modeling.py) do not read (they read {', '.join(_PROBLEM_TYPES)}); export it as a .ckpt "
            "(genoformer export without --format hf), which genoformer classify and annotate read"
        )
    state_dict = canonical_state_dict(state["state_dict"])
    if kind is ModelKind.GENOME_FINETUNED and hparams.get("lora_rank"):
        state_dict = merge_lora(state_dict, hparams["lora_rank"], hparams.get("lora_alpha"))
        hparams.update(lora_rank=0, lora_alpha=None)  # the export is a plain network
    tensors = hf_state_dict(state_dict, kind, config, DTYPES[dtype])
    trained_seq_len = int(state.get("trained_seq_len") or 0)
    architecture = export_architecture(kind, hparams)
    hf_config = hf_config_dict(config, kind, architecture, trained_seq_len, hparams, dtype)
    n_params = sum(tensor.numel() for tensor in tensors.values())
    metrics = run_metrics(Path(checkpoint), state.get("global_step"))
    training = training_record(Path(checkpoint), kind, hparams, state)
    with atomic_build(out, overwrite) as tmp:
        tmp.mkdir()
        (tmp / CONFIG_FILE).write_text(json.dumps(hf_config, indent=2) + "\n")
        save_file(tensors, tmp / WEIGHTS_FILE, metadata={"format": "pt"})
        (tmp / WEIGHTS_FILE).chmod(0o644)  # safetensors creates it readable by its owner only
        if kind is ModelKind.FORECASTER:
            source = Path(__file__).resolve().parents[1] / "timeseries" / "hf_modeling.py"
            shutil.copyfile(source, tmp / FORECASTER_MODELING_FILE)
        else:
            (tmp / MODELING_FILE).write_text(modeling_source())
            shutil.copyfile(layouts.__file__, tmp / LAYOUT_FILE)
            save_tokenizer(tmp, config.max_seq_len)
        card = model_card(
            out.name, config, kind, architecture, hparams, trained_seq_len, n_params, dtype, metrics, measured, training
        )
        (tmp / "README.md").write_text(card)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(
        f"wrote {out} (Hugging Face format, {kind.description}, {n_params:,} parameters, {dtype} weights, "
        f"{size / 2**20:.1f} MiB, {time.perf_counter() - start:.1f} s)"
    )
    return out


def modeling_source() -> str:
    """hf_modeling.py as the export ships it: importing the layouts from the file beside it."""
    source = Path(__file__).with_name("hf_modeling.py").read_text()
    if source.count(LAYOUT_IMPORT[0]) != 1:
        raise RuntimeError(f"hf_modeling.py must name the layouts in exactly one line starting {LAYOUT_IMPORT[0]!r}")
    return source.replace(LAYOUT_IMPORT[0], LAYOUT_IMPORT[1])


def _check_exportable(config: TransformerConfig, checkpoint: Path) -> None:
    """Only what the modeling files compute exports: genoformer's own layout specs (the modeling file
    builds those), RoPE, no ALiBi."""
    if config.alibi or not config.rope:
        raise ValueError(
            f"{checkpoint}'s model uses {'ALiBi' if config.alibi else 'no RoPE'} (transformer.alibi: "
            f"{config.alibi}, rope: {config.rope}); the Hugging Face modeling files compute RoPE attention "
            f"without ALiBi. `genoformer export` writes a portable .ckpt."
        )
    for spec in config.attention:
        if spec is not None and type(spec).__module__ != layouts.__name__:
            raise ValueError(
                f"{checkpoint} has an attention layout of its own class {type(spec).__qualname__} "
                f"(module {type(spec).__module__}); the Hugging Face export builds genoformer's layouts "
                f"only ({', '.join(layouts.__all__[2:])}). `genoformer export` writes a portable .ckpt."
            )


def export_architecture(kind: ModelKind, hparams: Mapping[str, Any]) -> Architecture:
    """The transformers class a checkpoint of `kind` exports as."""
    if kind is ModelKind.FORECASTER:
        return _FORECASTER
    if kind is ModelKind.GENOME_FINETUNED:
        return _BASE_HEAD if str(hparams["targets"]["kind"]).startswith("base_") else _SEQUENCE_HEAD
    objective = str(hparams.get("objective"))
    if objective not in _LM_ARCHITECTURES:
        raise ValueError(f"unknown objective {objective!r}; expected one of {', '.join(_LM_ARCHITECTURES)}.")
    return _LM_ARCHITECTURES[objective]


def merge_lora(state_dict: Mapping[str, torch.Tensor], rank: int, alpha: Optional[float]) -> dict[str, torch.Tensor]:
    """The state_dict with every peft LoRA layer folded into a plain weight W + alpha / rank * B A
    (in float32, cast back to W's dtype); alpha None is 2 * rank, as FineTuner sets it."""
    scale = (2.0 * rank if alpha is None else float(alpha)) / rank
    merged = {}
    for key, tensor in state_dict.items():
        if ".lora_A." in key or ".lora_B." in key:
            continue
        found = LORA_KEY.match(key)
        if found is None:
            merged[key] = tensor
            continue
        module = found["module"]
        a_RI, b_OR = state_dict[f"{module}.lora_A.default.weight"], state_dict[f"{module}.lora_B.default.weight"]
        merged[f"{module}.weight"] = (tensor.float() + scale * (b_OR.float() @ a_RI.float())).to(tensor.dtype)
    return merged


def hf_state_dict(
    state_dict: Mapping[str, torch.Tensor], kind: ModelKind, config: TransformerConfig, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """The weights under the HF classes' names (module docstring), contiguous, floating point cast
    to `dtype`; a tied head is left out, and so is a fine-tuned model's unused language-model head."""
    state_dict = canonical_state_dict(state_dict)
    head, embed = state_dict.get(SOURCE_PREFIX + HEAD_KEY), state_dict.get(SOURCE_PREFIX + "embed.weight")
    tied = config.tie_embeddings and kind is not ModelKind.FORECASTER  # a forecaster's head reads no tokens
    if tied and head is not None and not torch.equal(head, embed):
        raise ValueError(
            "the config ties the output head to the embedding, but the checkpoint's head and embedding "
            "weights differ; the checkpoint is inconsistent, so it is not exported."
        )
    tensors = {}
    for key, tensor in state_dict.items():
        name = key
        if kind is ModelKind.GENOME_LM and key == SOURCE_PREFIX + HEAD_KEY:
            if config.tie_embeddings:
                continue
            name = HEAD_KEY
        elif kind is ModelKind.GENOME_FINETUNED:
            if key == SOURCE_PREFIX + HEAD_KEY:
                continue
            if key.startswith(FINETUNED_HEAD[0]):
                name = FINETUNED_HEAD[1] + key[len(FINETUNED_HEAD[0]) :]
        if not name.startswith((SOURCE_PREFIX, HEAD_KEY, FINETUNED_HEAD[1])):
            continue
        tensors[name] = (tensor.to(dtype) if tensor.is_floating_point() else tensor).contiguous().clone()
    return tensors


def hf_config_dict(
    config: TransformerConfig,
    kind: ModelKind,
    architecture: Architecture,
    trained_seq_len: int,
    hparams: Mapping[str, Any],
    dtype: str,
) -> dict[str, Any]:
    """config.json of the export (the modeling file's config fields and transformers' own keys)."""
    tag = {
        "kind": kind.value,
        "format_version": FORMAT_VERSION,
        "trained_seq_len": trained_seq_len,
        "hyper_parameters": {key: value for key, value in hparams.items() if key != "transformer"},
    }
    if kind is ModelKind.FORECASTER:
        module = Path(FORECASTER_MODELING_FILE).stem
        return {
            "model_type": FORECASTER_MODEL_TYPE,
            "architectures": [architecture.name],
            "auto_map": {
                "AutoConfig": f"{module}.GenoformerForecasterConfig",
                "AutoModel": f"{module}.{architecture.name}",
            },
            "transformer": config.to_dict(),
            "forecast": dict(hparams["forecast"]),
            "dtype": dtype,
            TAG_KEY: tag,
        }
    module = Path(MODELING_FILE).stem
    values = {
        "model_type": MODEL_TYPE,
        "architectures": [architecture.name],
        "auto_map": {
            "AutoConfig": f"{module}.GenoformerConfig",
            "AutoModel": f"{module}.GenoformerModel",
            architecture.auto_class: f"{module}.{architecture.name}",
        },
        **config.to_dict(),
        "alphabet": dict(TOKEN_CODES),
        "pad_token_id": TOKEN_CODES["PAD"],
        "mask_token_id": TOKEN_CODES["MASK"],
        "bos_token_id": TOKEN_CODES["BOS"],
        "tie_word_embeddings": config.tie_embeddings,
        "dtype": dtype,
        TAG_KEY: {**tag, "objective": hparams.get("objective")},
    }
    if kind is ModelKind.GENOME_FINETUNED:
        values["head"] = head_config(config, hparams)
        names = [str(name) for name in hparams["targets"]["names"]]
        values["id2label"] = dict(enumerate(names))
        values["label2id"] = {name: index for index, name in enumerate(names)}
        values["problem_type"] = _PROBLEM_TYPES[hparams["targets"]["kind"]]
    return values


_PROBLEM_TYPES = {
    "sequence_classes": "single_label_classification",
    "sequence_labels": "multi_label_classification",
    "sequence_values": "regression",
    "base_classes": "single_label_classification",
    "base_values": "regression",
}
"""transformers' problem_type of each TargetKind value that the exported classes (hf_modeling.py) read."""


def head_config(config: TransformerConfig, hparams: Mapping[str, Any]) -> dict[str, Any]:
    """config.head of a fine-tuned model: what GenoformerFor*Classification builds."""
    targets, head = hparams["targets"], hparams.get("head") or {}
    both_strands = head.get("both_strands")
    layer = int(head.get("layer", -1)) % (config.n_layers + 1)
    return {
        "kind": targets["kind"],
        "outputs": len(targets["names"]),
        "names": [str(name) for name in targets["names"]],
        "pooling": str(head.get("pooling", "MEAN")).upper(),
        "both_strands": config.causal if both_strands is None else bool(both_strands),
        "layer": layer,
        "mean": list(targets.get("mean") or []),
        "std": list(targets.get("std") or []),
        "strand_swap": list(targets.get("strand_swap") or range(len(targets["names"]))),
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

    vocab = {
        **{base: TOKEN_CODES[base] for base in BASES},
        **{SPECIAL_TOKEN_TEXT[name]: code for name, code in SPECIAL_TOKENS.items()},
    }
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
    name: str,
    config: TransformerConfig,
    kind: ModelKind,
    architecture: Architecture,
    hparams: Mapping[str, Any],
    trained_seq_len: int,
    n_params: int,
    dtype: str,
    metrics: Mapping[str, float],
    reports: Sequence[tuple[str, dict]],
    training: Sequence[str] = (),
) -> str:
    """README.md with Hub metadata, what the model is, what it was trained on (`training`: lines of
    `training_record`), its measured figures, its limitations, and how to load it."""
    context = trained_seq_len or config.max_seq_len
    if kind is ModelKind.FORECASTER:
        forecast = hparams["forecast"]
        tags, pipeline = ["time-series", "forecasting", "genoformer"], "time-series-forecasting"
        what = (
            f"A genoformer time-series forecaster: patches of {forecast['patch_len']} samples as tokens, "
            f"a look-back of up to {forecast['context']:,} samples and a horizon of {forecast['horizon']:,}, "
            "on a pre-norm transformer (RMSNorm, rotary position embeddings, SwiGLU MLP)."
        )
        rows = [
            ("context", f"{forecast['context']:,} samples"),
            ("horizon", f"{forecast['horizon']:,} samples"),
            ("channels", str(forecast.get("n_channels"))),
            ("quantiles", str(forecast.get("quantiles") or "none")),
        ]
    else:
        tags = ["dna", "genomics", "genoformer"]
        objective = hparams.get("objective")
        if kind is ModelKind.GENOME_FINETUNED:
            targets = hparams["targets"]
            pipeline = "token-classification" if architecture is _BASE_HEAD else "text-classification"
            what = (
                f"A genoformer DNA {architecture.description}: a pre-norm transformer over single nucleotides "
                f"with a {targets['kind'].replace('_', ' ')} head ({', '.join(map(str, targets['names']))})."
            )
            rows = [
                ("targets", f"{targets['kind']}: {', '.join(map(str, targets['names']))}"),
                (
                    "pooling",
                    head_config(config, hparams)["pooling"].lower() if architecture is _SEQUENCE_HEAD else "per base",
                ),
                (
                    "strands",
                    "both (reverse complement read beside the sequence)"
                    if head_config(config, hparams)["both_strands"]
                    else "one",
                ),
            ]
        else:
            pipeline = "text-generation" if objective == "CAUSAL_LM" else "fill-mask"
            task = "next-base prediction" if objective == "CAUSAL_LM" else "masked bases, bidirectional attention"
            what = (
                f"A genoformer DNA {architecture.description}: a pre-norm transformer (RMSNorm, rotary position "
                "embeddings, SwiGLU MLP, grouped-query attention) over single nucleotides."
            )
            rows = [("objective", f"{objective} ({task})")]
    sparse = sorted({type(spec).__name__ for spec in config.attention if spec is not None})
    rows += [
        ("parameters", f"{n_params:,}"),
        (
            "context length",
            f"{context:,} {'samples' if kind is ModelKind.FORECASTER else 'bases'} trained "
            f"(at most {config.max_seq_len:,} tokens per forward pass)",
        ),
        (
            "layers x width",
            f"{config.n_layers} x {config.d_model}, {config.n_heads} heads ({config.kv_heads} key/value heads)",
        ),
        (
            "attention",
            "dense"
            if not sparse
            else f"block-sparse ({', '.join(sparse)}) and dense layers"
            if None in config.attention
            else f"block-sparse ({', '.join(sparse)})",
        ),
        ("weights", f"{dtype} safetensors"),
    ]
    table = "\n".join(f"| {key} | {value} |" for key, value in rows)
    tag_lines = "\n".join(f"- {tag}" for tag in tags)
    return f"""---
library_name: genoformer
license: apache-2.0
tags:
{tag_lines}
pipeline_tag: {pipeline}
---

# {name}

{what}

| | |
|---|---|
{table}

{_training_section(training)}{_measured_section(metrics, reports)}{_limitations_section(kind, architecture, hparams, context)}{_loading_section(name, config, kind, architecture, hparams)}"""


TRAINING_DATA_KEYS = ("fasta", "store", "train", "val", "test", "genome", "task", "sources", "inputs", "columns")
"""The data module options a model card lists under "Training data", where the run's config.yaml has them."""


def training_record(
    checkpoint: Path, kind: ModelKind, hparams: Mapping[str, Any], state: Mapping[str, Any]
) -> list[str]:
    """What a checkpoint was trained on, as lines for the model card: the data options of its run's
    config.yaml (beside <run dir>/checkpoints/), the model it was fine-tuned from, the steps and
    the window; a line saying that the data was not recorded when there is no config.yaml."""
    lines = []
    if kind is ModelKind.GENOME_FINETUNED and hparams.get("pretrained"):
        lines.append(f"fine-tuned from `{hparams['pretrained']}`")
    if state.get("global_step"):
        lines.append(f"{int(state['global_step']):,} optimizer steps")
    if state.get("trained_seq_len"):
        lines.append(f"training windows of up to {int(state['trained_seq_len']):,} tokens")
    config = checkpoint.resolve().parent.parent / "config.yaml"
    data = None
    if checkpoint.resolve().parent.name == "checkpoints" and config.is_file():
        loaded = yaml.safe_load(config.read_text()) or {}
        data = (loaded.get("data") or {}) if isinstance(loaded, dict) else {}
    if data is None:
        lines.append(
            "the training data is not recorded beside this checkpoint (no config.yaml of its run): "
            "say here what it was trained on before sharing it"
        )
        return lines
    options = data.get("init_args", data) if isinstance(data, dict) else {}
    if data.get("class_path"):
        lines.append(f"data module `{str(data['class_path']).rpartition('.')[2]}`")
    for key in TRAINING_DATA_KEYS:
        value = options.get(key) if isinstance(options, dict) else None
        if value not in (None, [], ""):
            shown = ", ".join(f"`{item}`" for item in value) if isinstance(value, list) else f"`{value}`"
            lines.append(f"{key}: {shown}")
    return lines


def _training_section(training: Sequence[str]) -> str:
    if not training:
        return ""
    return "## Training data\n\n" + "\n".join(f"- {line}" for line in training) + "\n\n"


def _limitations_section(kind: ModelKind, architecture: Architecture, hparams: Mapping[str, Any], context: int) -> str:
    """What the model cannot be trusted for, by kind (its scope, context, strands and precision)."""
    if kind is ModelKind.FORECASTER:
        forecast = hparams["forecast"]
        points = [
            "It forecasts series like those it was trained on (their sampling, scale after z-scoring and "
            "seasonality); other series need checking against a seasonal-naive and an AR baseline "
            "(`genoformer evaluate_forecast`).",
            f"Look-back at most {forecast['context']:,} samples and horizon at most {forecast['horizon']:,}: longer "
            "forecasts are not made.",
            "No exogenous inputs (calendar, weather) beyond the series' own channels.",
        ]
    else:
        points = [
            "It has seen only the data listed above: sequences unlike it (other kingdoms, GC contents, repeats, "
            "organelles) are scored, embedded or classified without any check that they are in its domain.",
            f"At most {context:,} bases of context: longer sequences are read in overlapping windows, so no base "
            "sees more than that.",
            "Letters other than A, C, G and T are read as N and never scored.",
            "On a GPU it runs under bfloat16 autocast; figures differ slightly from a CPU's float32.",
        ]
        if kind is ModelKind.GENOME_FINETUNED:
            targets = hparams["targets"]
            points.append(
                f"Its outputs are {targets['kind'].replace('_', ' ')} ({', '.join(map(str, targets['names']))}) "
                "learned from the labels above; its probabilities are not calibrated."
            )
            if architecture is _BASE_HEAD and "CDS+" in targets["names"]:
                points.append(
                    "Gene calls are prokaryotic open reading frames (translation table 11, no introns): "
                    "eukaryotic genes are not modelled."
                )
        elif hparams.get("objective") == "CAUSAL_LM":
            points.append(
                "A causal model scores each base from the bases before it only; a variant's log-likelihood "
                "ratio says how expected a sequence is, not what the variant does to the organism."
            )
    return "## Limitations\n\n" + "\n".join(f"- {point}" for point in points) + "\n\n"


def _measured_section(metrics: Mapping[str, float], reports: Sequence[tuple[str, dict]]) -> str:
    if not metrics and not reports:
        return ""
    lines = ["## Measured", ""]
    if metrics:
        lines += [
            "The training run's validation figures at this checkpoint's step (else the last logged) and its "
            "test figures:",
            "",
            "| metric | value |",
            "|---|---|",
        ]
        lines += [f"| {key} | {value:.4g} |" for key, value in metrics.items()]
        lines.append("")
    if reports:
        lines += [
            "Bits per base (lower is better) from `genoformer evaluate` and `genoformer baseline` reports:",
            "",
            "| report | model | records | bases | bits per base |",
            "|---|---|---|---|---|",
        ]
        for file_name, report in reports:
            model = (
                f"order-{report['model']['order']} Markov baseline"
                if isinstance(report.get("model"), Mapping)
                else f"genoformer, {report.get('context', '?'):,}-base context"
                if "checkpoint" in report
                else "?"
            )
            records = ", ".join(str(r.get("name")) for r in report.get("records", [])[:4])
            more = len(report.get("records", [])) - 4
            records += f" and {more} more" if more > 0 else ""
            total = report["total"]
            cells = [file_name, model, records, f"{total['bases']:,}", f"{total['bits_per_base']:.4f}"]
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _loading_section(
    name: str, config: TransformerConfig, kind: ModelKind, architecture: Architecture, hparams: Mapping[str, Any]
) -> str:
    if kind is ModelKind.FORECASTER:
        return f"""## Load with genoformer

```python
from genoformer.timeseries.forecaster import Forecaster

forecaster = Forecaster.from_checkpoint("{name}")   # a genoformer checkpoint path or this directory
result = forecaster.forecast(values)                 # values: (L,), (C, L) or (N, C, L)
```

## Load with transformers

```python
from transformers import AutoModel

model = AutoModel.from_pretrained("{name}", trust_remote_code=True).eval()
out = model(past_values)                             # past_values (B, C, L) -> out.point (B, C, H)
```

The modeling code (`{FORECASTER_MODELING_FILE}`) runs genoformer's own time-series model:
`pip install genoformer` first.
"""
    tokens = """Tokens: A 0, C 1, G 2, T 3, N 4, [PAD] 5, [MASK] 6, [BOS] 7, one per base. Lowercase folds to
uppercase and the IUPAC ambiguity letters read as N.
"""
    if kind is ModelKind.GENOME_FINETUNED:
        per_base = architecture is _BASE_HEAD
        python = (
            "annotator = GeneAnnotator.from_checkpoint" if per_base else "predictor = SequencePredictor.from_checkpoint"
        )
        cls = "GeneAnnotator" if per_base else "SequencePredictor"
        shape = "(1, L, K) per base" if per_base else "(1, K)"
        return f"""## Load with genoformer

```python
from genoformer.genome.predict import {cls}

{python}("{name}")   # a genoformer checkpoint path or this directory
```

## Load with transformers

```python
from transformers import AutoTokenizer, {architecture.auto_class}

tokenizer = AutoTokenizer.from_pretrained("{name}", trust_remote_code=True)
model = {architecture.auto_class}.from_pretrained("{name}", trust_remote_code=True).eval()
inputs = tokenizer("ACGTACGTACGT", return_tensors="pt")
logits = model(**inputs).logits                      # {shape}; the labels are model.config.id2label
probabilities = model.predict(**inputs)              # averaged over both strands, as genoformer reports
```

{tokens}"""
    objective = hparams.get("objective")
    if objective == "CAUSAL_LM":
        use = (
            "logits = model(**inputs).logits          # (1, L, 8): position i predicts base i + 1\n"
            "log2p = logits[0, :-1].log_softmax(-1)[range(11), inputs.input_ids[0, 1:]] / math.log(2)"
        )
    else:
        use = (
            "inputs.input_ids[0, 5] = tokenizer.mask_token_id\n"
            "logits = model(**inputs).logits          # (1, L, 8): predictions at every position"
        )
    return f"""## Load with genoformer

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
from transformers import AutoModel, AutoTokenizer, {architecture.auto_class}

tokenizer = AutoTokenizer.from_pretrained("{name}", trust_remote_code=True)
model = {architecture.auto_class}.from_pretrained("{name}", trust_remote_code=True, dtype=torch.float32).eval()
inputs = tokenizer("ACGTACGTACGT", return_tensors="pt")
with torch.no_grad():
    {use.replace(chr(10), chr(10) + "    ")}

encoder = AutoModel.from_pretrained("{name}", trust_remote_code=True)  # hidden states (1, L, {config.d_model})
```

{tokens}
The modeling code (`{MODELING_FILE}`, with `{LAYOUT_FILE}`) runs attention with PyTorch's
scaled_dot_product_attention and needs only torch and transformers.
"""


def run_metrics(checkpoint: Path, step: Optional[int] = None) -> dict[str, float]:
    """The val/ and test/ metrics of the run a checkpoint belongs to: the metrics.csv of <run dir>
    and of <run dir>/test when the checkpoint sits in <run dir>/checkpoints (none otherwise). The
    validation metrics are those of the validation after optimizer step `step` (the checkpoint's:
    a best checkpoint's own, not the last validation's; Lightning logs it at step - 1), else the
    last logged value of each."""
    if checkpoint.resolve().parent.name != "checkpoints":
        return {}
    run_dir = checkpoint.resolve().parent.parent
    found: dict[str, float] = {}
    at_step: dict[str, float] = {}
    for path in (run_dir / "metrics.csv", run_dir / "test" / "metrics.csv"):
        if not path.is_file():
            continue
        with path.open(newline="") as handle:
            for row in csv.DictReader(handle):
                for key, value in row.items():
                    if key and key.startswith(("val/", "test/")) and value not in ("", None):
                        found[key] = float(value)
                        if step and key.startswith("val/") and row.get("step") == str(step - 1):
                            at_step[key] = float(value)
    return dict(sorted({**found, **at_step}.items()))


def _read_report(path: Path) -> tuple[str, dict]:
    """(file name, content) of a `genoformer evaluate` or `baseline` JSON report."""
    if not path.is_file():
        raise FileNotFoundError(
            f"report not found: {path}; pass JSON files written by `genoformer evaluate --out` "
            "or `genoformer baseline --out`."
        )
    try:
        report = json.loads(path.read_text())
    except ValueError as error:
        raise ValueError(
            f"{path} is not JSON ({error}); pass a report of `genoformer evaluate` or `baseline`."
        ) from error
    total = report.get("total") if isinstance(report, dict) else None
    if not isinstance(total, dict) or "bits_per_base" not in total or "bases" not in total:
        raise ValueError(
            f"{path} has no total bits per base; pass a report of `genoformer evaluate --out` or "
            "`genoformer baseline --out`."
        )
    return path.name, report


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
    return isinstance(config, dict) and config.get("model_type") in (MODEL_TYPE, FORECASTER_MODEL_TYPE)


def read_hf_checkpoint(path: Union[str, Path]) -> tuple[dict, dict]:
    """(checkpoint, hyper_parameters) of a directory written by `export_hf`, in the layout that
    `read_model_checkpoint` returns for a .ckpt: "state_dict" in the training module's names (a
    tied head shares the embedding's tensor), the "genoformer" tag, "alphabet" (DNA models) and
    "trained_seq_len"; the hyperparameters with "transformer" (TransformerConfig.to_dict layout)."""
    path = Path(path)
    if not is_hf_directory(path):
        raise ValueError(
            f"{path} is not a genoformer Hugging Face directory (config.json with model_type "
            f"{MODEL_TYPE!r} or {FORECASTER_MODEL_TYPE!r}, and {WEIGHTS_FILE}); write one with "
            "`genoformer export --format hf`."
        )
    hf_config = json.loads((path / CONFIG_FILE).read_text())
    tagged = hf_config.get(TAG_KEY)
    if not isinstance(tagged, Mapping):
        raise ValueError(
            f"{path / CONFIG_FILE} has no {TAG_KEY!r} entry; it was not written by `genoformer export --format hf`."
        )
    version = tagged.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(
            f"{path} has genoformer checkpoint format {version!r}; this genoformer reads formats up to "
            f"{FORMAT_VERSION}: upgrade genoformer to read it"
        )
    try:
        kind = ModelKind(tagged.get("kind"))
    except ValueError as error:
        raise ValueError(
            f"{path / CONFIG_FILE} names an unknown kind of model {tagged.get('kind')!r}; upgrade genoformer to read it"
        ) from error
    if kind is ModelKind.FORECASTER:
        config = TransformerConfig.from_dict(hf_config["transformer"])
    else:
        fields = TransformerConfig.__dataclass_fields__
        config = TransformerConfig.from_dict({name: hf_config[name] for name in fields if name in hf_config})
    state_dict = {}
    for name, tensor in load_file(path / WEIGHTS_FILE).items():
        if kind is ModelKind.GENOME_FINETUNED and name.startswith(FINETUNED_HEAD[1]):
            name = FINETUNED_HEAD[0] + name[len(FINETUNED_HEAD[1]) :]
        elif kind is not ModelKind.FORECASTER and not name.startswith(SOURCE_PREFIX):
            name = SOURCE_PREFIX + name
        state_dict[name] = tensor
    head = SOURCE_PREFIX + HEAD_KEY
    if kind is not ModelKind.FORECASTER and head not in state_dict:
        embed = state_dict[SOURCE_PREFIX + "embed.weight"]
        # an untied head of a fine-tuned model was left out: it is not used there
        state_dict[head] = embed if config.tie_embeddings else torch.zeros_like(embed)
    hparams = {"transformer": config.to_dict(), **dict(tagged.get("hyper_parameters") or {})}
    if kind is ModelKind.GENOME_LM:
        hparams["objective"] = tagged.get("objective")
    checkpoint = {
        "state_dict": state_dict,
        "hyper_parameters": hparams,
        TAG_KEY: {"kind": kind.value, "format_version": version},
        "trained_seq_len": int(tagged.get("trained_seq_len") or 0),
    }
    if kind is not ModelKind.FORECASTER:
        checkpoint["alphabet"] = dict(hf_config.get("alphabet") or TOKEN_CODES)
    regroup_hyperparameters(checkpoint)
    return checkpoint, dict(hparams)
