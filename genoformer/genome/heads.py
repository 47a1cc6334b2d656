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

Shape legend: B batch, L sequence length (padded), E trunk width, F feature width (E or 2E),
K outputs.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from genoformer.core.transformer import Transformer
from genoformer.data.genome.alphabet import COMPLEMENT
from genoformer.genome.head_pooling import HeadPooling


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
