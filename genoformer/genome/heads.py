"""Fine-tuning heads on the DNA trunk: what a sequence or each base is, read from hidden states.

The trunk gives per-base features; a head turns them into outputs:

- `SequenceHead`: one output vector per sequence (classes, labels or values), after pooling the
  bases (mean, last token, or attention pooling with a learned query);
- `BaseHead`: one output vector per base (a label track such as coding on each strand, or signal
  values).

`strand_features` reads a causal model on both strands: a causal model's state at base i has seen
bases 0..i only, so the model also reads the reverse complement, whose state at (its) position
L-1-i has seen bases i..L-1 of the forward strand, and the two are put side by side. Every base then
has the whole sequence as context, and the features of the reverse complement are those of the
sequence with the halves swapped. A bidirectional (masked-LM) model reads one strand.

`flip_within` reverses each row of a right-padded batch within its length (padding stays at the
end); with `COMPLEMENT` it gives the reverse complement of token rows.

`FineTunedNetwork` is a fine-tuned model as it runs: the trunk, its head and the reading of both
strands, built from a checkpoint's hyperparameters (what SequencePredictor and GeneAnnotator load),
without anything of training. Its forward pass and predictions (`HeadOnTrunk`) are the ones
genoformer.genome.finetune.FineTuner trains and evaluates with.

Shape legend: B batch, L sequence length (padded), E trunk width, F feature width (E or 2E),
K outputs.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional, Union

import torch
from torch import nn

from genoformer.core.runtime import RuntimeSettings
from genoformer.core.transformer import Transformer, TransformerConfig
from genoformer.data.genome.alphabet import COMPLEMENT
from genoformer.data.genome.targets import TargetSpace
from genoformer.genome.head_pooling import HeadPooling

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11

LORA_TARGETS = ("wq", "wk", "wv", "wo", "w_gate_up", "w_down")
"""The projections that get low-rank adapters: every linear layer of every block."""


def positions_within(lengths_B: torch.Tensor, seq_len: int) -> torch.Tensor:
    """(B, L) int64: for each row, the position of each base when the row's first `length` bases
    are reversed (L-1-i within the length, unchanged beyond it)."""
    position_L = torch.arange(seq_len, device=lengths_B.device)
    flipped_BL = lengths_B.long().unsqueeze(1) - 1 - position_L
    return torch.where(flipped_BL >= 0, flipped_BL, position_L)


def flip_within(x_BL: torch.Tensor, lengths_B: torch.Tensor) -> torch.Tensor:
    """Reverse each row of x (B, L, ...) within its length; positions beyond it stay as they are."""
    index_BL = positions_within(lengths_B, x_BL.shape[1])
    index = index_BL.view(*index_BL.shape, *([1] * (x_BL.ndim - 2))).expand_as(x_BL)
    return torch.gather(x_BL, 1, index)


def reverse_complement_rows(tokens_BL: torch.Tensor, lengths_B: torch.Tensor) -> torch.Tensor:
    """The reverse complement of each row of a right-padded token batch (padding stays PAD)."""
    complement = torch.as_tensor(COMPLEMENT, device=tokens_BL.device)
    return flip_within(complement[tokens_BL.long()], lengths_B)


def strand_features(
    trunk: Transformer, tokens_BL: torch.Tensor, lengths_B: torch.Tensor, *, both_strands: bool, layer: int = -1
) -> torch.Tensor:
    """Per-base features (B, L, F): the trunk's hidden state at `layer` (F = E), and with
    both_strands that of the reverse complement read back into forward positions beside it
    (F = 2E). Rows are right-padded; features at padded positions are meaningless."""
    # rows without padding need no key mask: the attention kernels then take their mask-free path
    key_lengths_B = None if bool((lengths_B == tokens_BL.shape[1]).all()) else lengths_B
    hidden_BLE = trunk.hidden_state(tokens_BL, key_lengths_B, layer=layer)
    if not both_strands:
        return hidden_BLE
    reverse_BLE = trunk.hidden_state(reverse_complement_rows(tokens_BL, lengths_B), key_lengths_B, layer=layer)
    return torch.cat([hidden_BLE, flip_within(reverse_BLE, lengths_B)], dim=-1)


def swap_strands(features_F: torch.Tensor) -> torch.Tensor:
    """Both-strand features (..., 2E) with the halves swapped. The features of the reverse
    complement of a sequence are those of the sequence, halves swapped and positions reversed:
    f(rc x)[L-1-i] = swap(f(x)[i]), so the other strand needs no second pass of the trunk."""
    half = features_F.shape[-1] // 2
    return torch.cat([features_F[..., half:], features_F[..., :half]], dim=-1)


def valid_mask(lengths_B: torch.Tensor, seq_len: int) -> torch.Tensor:
    """(B, L) bool: True at the real bases of each right-padded row."""
    return torch.arange(seq_len, device=lengths_B.device) < lengths_B.unsqueeze(1)


class SequenceHead(nn.Module):
    """Pooled features -> K outputs per sequence (logits or standardised values)."""

    def __init__(
        self, features: int, outputs: int, pooling: HeadPooling, *, both_strands: bool, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.pooling = HeadPooling(pooling)
        self.both_strands = both_strands
        self.query = nn.Parameter(torch.zeros(features)) if self.pooling is HeadPooling.ATTENTION else None
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(features, outputs)
        nn.init.normal_(self.out.weight, std=1.0 / math.sqrt(features))
        nn.init.zeros_(self.out.bias)

    def pool(self, features_BLF: torch.Tensor, lengths_B: torch.Tensor) -> torch.Tensor:
        """(B, F) pooled features of the real bases."""
        B, L, F = features_BLF.shape
        keep_BL = valid_mask(lengths_B, L)
        if self.pooling is HeadPooling.MEAN:
            keep_BL1 = keep_BL.unsqueeze(-1).to(features_BLF.dtype)
            return (features_BLF * keep_BL1).sum(1) / keep_BL1.sum(1).clamp(min=1.0)
        if self.pooling is HeadPooling.ATTENTION:
            scores_BL = (features_BLF.float() @ self.query.float()) / math.sqrt(F)
            weights_BL = torch.softmax(scores_BL.masked_fill(~keep_BL, float("-inf")), dim=1)
            return torch.einsum("bl,blf->bf", weights_BL.to(features_BLF.dtype), features_BLF)
        rows_B = torch.arange(B, device=features_BLF.device)
        last_BF = features_BLF[rows_B, (lengths_B.long() - 1).clamp(min=0)]
        if not self.both_strands:
            return last_BF
        # the reverse-complement reading has seen everything at forward position 0
        half = F // 2
        return torch.cat([last_BF[:, :half], features_BLF[:, 0, half:]], dim=-1)

    def forward(self, features_BLF: torch.Tensor, lengths_B: torch.Tensor, other_strand: bool = False) -> torch.Tensor:
        """(B, K) outputs; other_strand (both-strand features only): those of the reverse
        complement, computed from the features of the sequence (see `swap_strands`)."""
        if not other_strand:
            return self.out(self.drop(self.pool(features_BLF, lengths_B).float()))
        if self.pooling is HeadPooling.LAST:  # the two end states trade places
            pooled_BF = swap_strands(self.pool(features_BLF, lengths_B))
        else:  # order-free pooling of the swapped features
            pooled_BF = self.pool(swap_strands(features_BLF), lengths_B)
        return self.out(self.drop(pooled_BF.float()))


class BaseHead(nn.Module):
    """Per-base features -> K outputs per base, through a small MLP (a linear read-out of one
    base cannot combine evidence such as codon phase across neighbours; the trunk does that)."""

    def __init__(self, features: int, outputs: int, *, hidden: Optional[int] = None, dropout: float = 0.1) -> None:
        super().__init__()
        hidden = hidden or features
        self.net = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, outputs)
        )

    def forward(self, features_BLF: torch.Tensor) -> torch.Tensor:
        """(B, L, K) outputs."""
        return self.net(features_BLF.float())


@dataclasses.dataclass(frozen=True)
class SettingsGroup:
    """Base of a frozen dataclass that groups some of FineTuner's arguments (`model.init_args.head.pooling`,
    ...) and is saved with the model as a mapping of its fields. A dataclass itself, so that
    LightningCLI reads its subclasses as groups of options rather than as classes to choose."""

    @classmethod
    def from_mapping(cls, values: Union[SettingsGroup, Mapping[str, Any], None]) -> Self:
        """`values` as settings: settings as they are, a mapping of (some of) the fields, None the defaults."""
        if values is None:
            return cls()
        if isinstance(values, cls):
            return values
        names = [field.name for field in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(f"unknown {cls.__name__} {unknown}; its fields are {names}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain values, as the hyperparameters hold them (an enum as its value)."""
        return {
            name: value.value if isinstance(value, enum.Enum) else value
            for name, value in dataclasses.asdict(self).items()
        }


@dataclasses.dataclass(frozen=True)
class HeadSettings(SettingsGroup):
    """What the head reads and how it is built (YAML: `model.init_args.head`).

    Attributes:
        pooling: Sequence heads: MEAN, LAST (the state that has seen the whole sequence) or
            ATTENTION (a learned query); a per-base head reads every base.
        layer: The trunk's hidden state the head reads (-1: the last block).
        both_strands: Read each sequence on both strands and put the two readings side by side
            (every base then sees the whole sequence under causal attention); None: for causal models.
        dropout: Dropout before the head (in training).
    """

    pooling: HeadPooling = HeadPooling.MEAN
    layer: int = -1
    both_strands: Optional[bool] = None
    dropout: float = 0.1

    def __post_init__(self) -> None:
        object.__setattr__(self, "pooling", HeadPooling(self.pooling))


@dataclasses.dataclass(frozen=True)
class StrandSettings(SettingsGroup):
    """How training and prediction use the two strands of DNA (YAML: `model.init_args.strands`).

    Attributes:
        reverse_complement: Train on a random strand of each sequence (per-base targets flip with
            it and swap strand classes).
        test_time: Evaluate and predict with the mean over both strands.
    """

    reverse_complement: bool = True
    test_time: bool = True


class HeadOnTrunk:
    """A DNA trunk (`self.model`) with a fine-tuning head (`self.head`, built once the targets are
    known): the forward pass and the predictions of `FineTunedNetwork` and of
    genoformer.genome.finetune.FineTuner, which trains one. The class that mixes it in is an
    nn.Module and calls `put_trunk` first."""

    model: Transformer
    head: Optional[nn.Module]
    targets: Optional[TargetSpace]
    value_mean: torch.Tensor
    value_std: torch.Tensor

    def put_trunk(self, trunk: Transformer, head: HeadSettings, strands: StrandSettings) -> None:
        """Take `trunk`, to be read as `head` and `strands` say; no head until `set_targets`."""
        self.model = trunk
        self.both_strands = trunk.config.causal if head.both_strands is None else head.both_strands
        self.layer = trunk.resolve_layer(head.layer)
        self.pooling = head.pooling
        self.head_dropout = head.dropout
        self.test_time_strands = strands.test_time
        self.targets = None
        self.head = None

    def set_targets(self, targets: TargetSpace) -> None:
        """Build the head for `targets` (once); a different target space later is an error."""
        if self.targets is not None:
            if targets != self.targets:
                raise ValueError(
                    f"the model predicts {self.targets.kind.value} {list(self.targets.names)}, the data has "
                    f"{targets.kind.value} {list(targets.names)}; fine-tune a new model for these labels "
                    "(a new run directory) instead of resuming this one"
                )
            return
        self.targets = targets
        width = self.model.config.d_model * (2 if self.both_strands else 1)
        if targets.kind.per_base:
            self.head = BaseHead(width, targets.outputs, dropout=self.head_dropout)
        else:
            self.head = SequenceHead(
                width, targets.outputs, self.pooling, both_strands=self.both_strands, dropout=self.head_dropout
            )
        self.register_buffer("value_mean", torch.tensor(targets.mean or [0.0] * targets.outputs), persistent=False)
        self.register_buffer("value_std", torch.tensor(targets.std or [1.0] * targets.outputs), persistent=False)

    def features(self, tokens_BL: torch.Tensor, lengths_B: torch.Tensor) -> torch.Tensor:
        """Per-base features (B, L, F) the head reads (see `strand_features`)."""
        return strand_features(
            self.model, tokens_BL.long(), lengths_B, both_strands=self.both_strands, layer=self.layer
        )

    def _head(self, features_BLF: torch.Tensor, lengths_B: torch.Tensor, other_strand: bool = False) -> torch.Tensor:
        if self.targets.kind.per_base:
            return self.head(swap_strands(features_BLF) if other_strand else features_BLF)
        return self.head(features_BLF, lengths_B, other_strand)

    def forward(self, tokens_BL: torch.Tensor, lengths_B: torch.Tensor) -> torch.Tensor:
        """Head outputs: (B, K) per sequence, (B, L, K) per base (logits, or standardised values)."""
        return self._head(self.features(tokens_BL, lengths_B), lengths_B)

    def predict_outputs(self, tokens_BL: torch.Tensor, lengths_B: torch.Tensor) -> torch.Tensor:
        """Predictions: class probabilities, label probabilities or values in the data's units;
        (B, K) per sequence, (B, L, K) per base; averaged over both strands with `strands.test_time`.

        Read on both strands, the features of the reverse complement are those of the sequence
        with the two halves swapped (and positions reversed), so the second strand costs one more
        pass of the head only, not of the trunk."""
        return self._predictions(self.features(tokens_BL, lengths_B), tokens_BL, lengths_B)

    def _predictions(
        self, features_BLF: torch.Tensor, tokens_BL: torch.Tensor, lengths_B: torch.Tensor
    ) -> torch.Tensor:
        """`predict_outputs` from the trunk's features of `tokens_BL`, already computed."""
        outputs = self._readout(self._head(features_BLF, lengths_B))
        if not self.test_time_strands:
            return outputs
        if self.both_strands:  # per base: already in forward positions
            reverse = self._readout(self._head(features_BLF, lengths_B, other_strand=True))
        else:
            reverse = self._readout(self(reverse_complement_rows(tokens_BL, lengths_B), lengths_B))
            if self.targets.kind.per_base:
                reverse = flip_within(reverse, lengths_B)
        if self.targets.kind.per_base:
            reverse = reverse[..., list(self.targets.swap())]
        return 0.5 * (outputs + reverse)

    def _readout(self, outputs: torch.Tensor) -> torch.Tensor:
        return self.targets.kind.readout(outputs, self.value_mean, self.value_std)


class FineTunedNetwork(HeadOnTrunk, nn.Module):
    """A fine-tuned model's trunk and head, to run (see the module docstring). Its state_dict is
    that of the FineTuner that trained it: the trunk under "model.", the head under "head."."""

    def __init__(
        self,
        transformer: TransformerConfig,
        targets: TargetSpace,
        *,
        head: HeadSettings = HeadSettings(),
        strands: StrandSettings = StrandSettings(),
        lora_rank: int = 0,
        lora_alpha: Optional[float] = None,
        runtime: Optional[RuntimeSettings] = None,
    ) -> None:
        """
        Args:
            transformer: the trunk's architecture.
            targets: what the head predicts.
            head, strands: how the head reads the trunk.
            lora_rank, lora_alpha: the low-rank adapters the trunk was fine-tuned with (rank 0: none;
                alpha None: 2 * rank), see `add_lora`.
            runtime: how to run (genoformer.core.runtime.RuntimeSettings).
        """
        super().__init__()
        trunk = Transformer(transformer, runtime or RuntimeSettings())
        if lora_rank:
            add_lora(trunk, lora_rank, 2.0 * lora_rank if lora_alpha is None else lora_alpha)
        self.put_trunk(trunk, head, strands)
        self.set_targets(targets)

    @classmethod
    def from_hparams(cls, hparams: Mapping[str, Any], runtime: RuntimeSettings) -> FineTunedNetwork:
        """The network of a fine-tuned checkpoint with these hyperparameters (its weights are not loaded)."""
        return cls(
            TransformerConfig.from_dict(hparams["transformer"]),
            TargetSpace.from_dict(hparams["targets"]),
            head=HeadSettings.from_mapping(hparams.get("head")),
            strands=StrandSettings.from_mapping(hparams.get("strands")),
            lora_rank=int(hparams.get("lora_rank") or 0),
            lora_alpha=hparams.get("lora_alpha"),
            runtime=runtime,
        )


def add_lora(trunk: Transformer, rank: int, alpha: float) -> None:
    """Low-rank adapters (peft LoRA) on every block projection of `trunk`, in place; everything
    else in the trunk is frozen. peft is imported here, by the only code that needs it."""
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(LORA_TARGETS))
    inject_adapter_in_model(config, trunk)
    for name, param in trunk.named_parameters():
        param.requires_grad_("lora_" in name)
