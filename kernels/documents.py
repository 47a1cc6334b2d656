"""Packed variable-length sequences: documents given by `cu_seqlens`, as per-token bounds.

Shape legend:
    B    batch (rows)     L   row length (Lq == Lk)     N   documents in the whole batch
    cu_seqlens (N + 1,) int32: cumulative document lengths over the flattened B * L tokens, row
    after row (flash-attn's varlen convention); every row boundary (a multiple of L) is an entry,
    so no document crosses a row.

Query i may attend key j of the same row only if both lie in one document, i.e.
    starts_BL[b, i] <= j < ends_BL[b, i]
where starts_BL / ends_BL hold, for every token, the first and one-past-last position (within its
row) of its document. Both are non-decreasing along a row, so a tile of consecutive positions
[a, c) spans the keys [starts[a], ends[c - 1]) and is inside one document iff
starts[c - 1] <= a and c <= ends[a]. The reference, the PyTorch block-sparse code and the Triton
launcher all work from these two tensors.
"""

from __future__ import annotations

import torch


def check_cu_seqlens(cu_seqlens, *, batch: int, seq_len: int, device: torch.device) -> None:
    """Raise ValueError (TypeError for a non-tensor) saying what to fix when cu_seqlens is malformed.

    The value checks read the tensor on the host (one synchronisation); inside a compiled graph
    only dtype, shape and device are checked.
    """
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be an int32 tensor of shape (N+1,), got {type(cu_seqlens).__name__}.")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            f"cu_seqlens must be an int32 tensor of shape (N+1,) with N >= 1 documents, got {cu_seqlens.dtype} "
            f"{tuple(cu_seqlens.shape)}; e.g. torch.tensor([0, 100, 356], dtype=torch.int32) for documents "
            "of 100 and 256 tokens."
        )
    if cu_seqlens.device != device:
        raise ValueError(
            f"cu_seqlens is on {cu_seqlens.device} but q on {device}; move it with cu_seqlens.to(q.device)."
        )
    if torch.compiler.is_compiling():
        return  # the value checks read the tensor on the host: a graph break; eager calls make them
    total = batch * seq_len
    rows_R = torch.arange(0, total + 1, seq_len, device=device, dtype=torch.int32)
    first, last, increasing, rows_ok = torch.stack(
        [
            cu_seqlens[0],
            cu_seqlens[-1],
            (cu_seqlens[1:] > cu_seqlens[:-1]).all().to(torch.int32),
            torch.isin(rows_R, cu_seqlens).all().to(torch.int32),
        ]
    ).tolist()
    if first != 0 or last != total:
        raise ValueError(
            f"cu_seqlens must start at 0 and end at B*L = {batch}*{seq_len} = {total} (the flattened tokens of "
            f"the batch), got {first} and {last}."
        )
    if not increasing:
        raise ValueError("cu_seqlens must be strictly increasing (every document has at least one token).")
    if not rows_ok:
        raise ValueError(
            f"every row boundary (each multiple of L = {seq_len}) must be an entry of cu_seqlens, so that no "
            "document crosses a row; split such a document at the row end."
        )


def document_bounds(cu_seqlens: torch.Tensor, batch: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts_BL, ends_BL) int32 on cu_seqlens' device: each token's document span within its row.

    cu_seqlens must be valid (see `check_cu_seqlens`). Runs on the device without synchronising.
    """
    tokens_T = torch.arange(batch * seq_len, device=cu_seqlens.device, dtype=torch.int32)
    doc_T = torch.searchsorted(cu_seqlens, tokens_T, right=True) - 1  # document of each token
    row_start_T = tokens_T - tokens_T % seq_len
    starts_BL = (cu_seqlens[doc_T] - row_start_T).view(batch, seq_len).to(torch.int32)
    ends_BL = (cu_seqlens[doc_T + 1] - row_start_T).view(batch, seq_len).to(torch.int32)
    return starts_BL, ends_BL


def document_mask(cu_seqlens: torch.Tensor, batch: int, seq_len: int) -> torch.Tensor:
    """(B, 1, L, L) bool: query i and key j of row b lie in the same document."""
    starts_BL, ends_BL = document_bounds(cu_seqlens, batch, seq_len)
    keys_L = torch.arange(seq_len, device=cu_seqlens.device)
    same_BLL = (keys_L >= starts_BL.unsqueeze(-1)) & (keys_L < ends_BL.unsqueeze(-1))
    return same_BLL.unsqueeze(1)
