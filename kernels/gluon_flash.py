"""The Gluon forward kernels (``gluon_fwd.py``, Hopper only) behind a launcher, custom ops and autograd.

Layers, in order:
  1. ``gluon_fwd_launch``: checks every input (``unsupported_reason``), builds the TMA descriptors
     and launches one of the two kernels with a ``GluonConfig`` (default: the faster kernel for the
     head dim and mask as measured, ``gluon_fwd.default_config``); returns o and the base-2 lse;
     ``_backward_kernels``: dq, dk, dv from the saved o and lse (the base-2 statistic and the +inf
     of an empty row that ``triton_flash.flash_bwd`` reads from the Triton forward);
  2. torch custom ops ``genoformer::gluon_flash_fwd`` / ``genoformer::gluon_flash_bwd`` with
     ``register_autograd`` and ``register_fake``, so torch.compile captures them without graph breaks,
     and ``_EagerGluonAttention``, an autograd Function around the same two implementations for eager
     calls (no custom-op dispatch on the host), as ``triton_flash`` does for the Triton kernels;
  3. ``gluon_attention(...)``: the public entry point, with ``return_lse`` as ``triton_attention``.
Behind ``dispatch.attention`` as ``backend="gluon"``, and auto's choice on sm_90 for the dense inputs it
runs (``dispatch.FASTEST_FIRST``).

Semantics: causal (j <= i) or bidirectional, GQA (query head h reads kv head h // (H // HKV)),
block-sparse layouts whose block size is a multiple of 128 (a program's 128 query rows and its
128-key tiles lie inside one layout block) and key padding (kv_lens); packed documents are the
Triton kernels' (the dispatcher refuses them here with the reason).  The float64
``genoformer.kernels.reference`` is the judge.

Legend: q (B, H, Lq, D); k, v (B, HKV, Lk, D); o (B, H, Lq, D); lse (B, H, Lq) fp32 (base 2 from
the launcher, natural log from ``gluon_attention(return_lse=True)``).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
from genoformer.kernels import gluon_fwd
from genoformer.kernels.gluon_fwd import GluonConfig
from genoformer.kernels.layout import BlockLayout
from genoformer.kernels.triton_flash import (
    LN2,
    csr_args,
    doc_args,
    doc_order,
    documents_reason,
    empty_like_rows,
    flash_bwd,
    layout_lists,
    merge_split_rows,
    placeholder,
    split_rows,
    tensor_reason,
)
from genoformer.kernels.triton_flash_fwd import LOG2E
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

MIN_TRITON = (3, 6)
"""The oldest Triton whose Gluon has what the kernels use (Hopper TMA, warpgroup_mma, warp_specialize
with register counts); 3.6 is the GPU image's, 3.9 CI's."""


def triton_version() -> tuple[int, int]:
    return tuple(int(x) for x in triton.__version__.split(".")[:2])


TILE = 128
"""Query rows of a program and keys of a tile in every warp-specialised configuration: a layout's
block size must be a multiple of it."""


def unsupported_reason(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    layout: BlockLayout | None = None,
    kv_lens: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> str | None:
    """None when the Gluon kernels can run these inputs here, else a sentence saying why and what to do."""
    if triton_version() < MIN_TRITON:
        return (
            f"the Gluon kernels need Triton {'.'.join(map(str, MIN_TRITON))} or newer, found {triton.__version__}: "
            f"upgrade triton (torch 2.11 ships 3.6) or use the triton backend"
        )
    reason = tensor_reason(q, k, v, "Gluon")
    if reason is not None:
        return reason
    B, H, Lq, D = q.shape
    if D not in gluon_fwd.HEAD_DIMS:
        return (
            f"head dim {D} is not supported by the Gluon kernels (only {', '.join(map(str, gluon_fwd.HEAD_DIMS))}): "
            f"use the triton backend, which takes the multiples of 8 from 16 to 256"
        )
    if k.shape[0] != B or k.shape[3] != D or k.shape != v.shape:
        return f"k and v must both be (B={B}, HKV, Lk, D={D}); got k {tuple(k.shape)}, v {tuple(v.shape)}"
    HKV, Lk = k.shape[1], k.shape[2]
    if HKV == 0 or H % HKV:
        return f"query heads ({H}) must be a multiple of key/value heads ({HKV})"
    if B == 0 or H == 0 or Lq == 0 or Lk == 0:
        return f"empty input (B={B}, H={H}, Lq={Lq}, Lk={Lk}): nothing for the kernels to do"
    if causal and Lq != Lk:
        return f"causal attention needs Lq == Lk, got {Lq} and {Lk}"
    if layout is not None:
        if layout.block_size % TILE:
            return (
                f"the Gluon kernels take layouts whose block size is a multiple of {TILE} (got "
                f"{layout.block_size}): build the layout with block_size={TILE}, or use the triton backend"
            )
        if (layout.q_len, layout.kv_len) != (Lq, Lk) or layout.num_heads not in (1, H):
            return (
                f"the layout was built for q_len={layout.q_len}, kv_len={layout.kv_len}, {layout.num_heads} "
                f"heads; the inputs have Lq={Lq}, Lk={Lk}, {H} query heads: build it for these"
            )
    if kv_lens is not None and (kv_lens.shape != (B,) or kv_lens.dtype.is_floating_point or kv_lens.device != q.device):
        return (
            f"kv_lens must be an integer tensor of shape ({B},) on {q.device}, got {kv_lens.dtype} "
            f"{tuple(kv_lens.shape)} on {kv_lens.device}"
        )
    if cu_seqlens is not None:
        if layout is not None:
            return "the Gluon kernels do not run a layout with packed documents (cu_seqlens): use the triton backend"
        if why := documents_reason(cu_seqlens, kv_lens, Lq, Lk, q.device):
            return why
    return device_reason(q.device)


def device_reason(device: torch.device) -> str | None:
    """None on an sm_90 GPU, else a sentence saying why the kernels cannot run on `device`."""
    if device.type != "cuda":
        return f"the Gluon kernels run on CUDA tensors, got a tensor on {device.type}: use the triton or sdpa backend"
    if torch.cuda.get_device_capability(device) != (9, 0):
        major, minor = torch.cuda.get_device_capability(device)
        return (
            f"the Gluon kernels are built for Hopper (sm_90: wgmma, TMA, setmaxnreg); "
            f"{torch.cuda.get_device_name(device)} is sm_{major}{minor}: use the triton backend"
        )
    return None


def _check(q, k, v, causal, layout=None, kv_lens=None, cu_seqlens=None) -> None:
    reason = unsupported_reason(q, k, v, causal=causal, layout=layout, kv_lens=kv_lens, cu_seqlens=cu_seqlens)
    if reason is not None:
        raise ValueError(f"gluon attention cannot run these inputs: {reason}")


def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """t itself when TMA can read it (16-byte aligned base, every stride but the last a multiple of
    16 bytes, the last dim contiguous), else a contiguous copy (which always can, for D of 64, 128)."""
    if t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1]):
        return t
    return t.contiguous()


def _descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A 4-D TMA descriptor over t (B, heads, L, D) with (1, 1, rows, D) boxes."""
    D = t.shape[-1]
    layout = gluon_fwd.descriptor_layout(rows, D, t.element_size() * 8)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, D], layout)


def gluon_fwd_launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    config: GluonConfig | None = None,
    *,
    kv_lens: torch.Tensor | None = None,
    kv_counts: torch.Tensor | None = None,
    kv_indices: torch.Tensor | None = None,
    block_size: int = 0,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward launcher: o (B, H, Lq, D) in q's dtype and lse (B, H, Lq) fp32 in base 2 (the
    convention ``triton_flash.flash_bwd`` reads).  config: None for ``gluon_fwd.default_config``.
    kv_lens (B,): keys >= kv_lens[b] are padding.  kv_counts, kv_indices: a layout's CSR lists
    (``BlockLayout.kv_indices(device)``) of blocks of block_size tokens, a multiple of 128.
    cu_seqlens (N + 1,) int32: packed documents (valid: ``documents.check_cu_seqlens``; no layout).
    Only the warp-specialised kernel takes a layout, key padding or documents, and documents only
    in its default schedule (not qk_ahead)."""
    B, H, Lq, D = q.shape
    HKV, Lk = k.shape[1], k.shape[2]
    sparse = kv_counts is not None
    if sparse and (block_size % TILE or kv_indices is None or kv_counts.shape[-1] != triton.cdiv(Lq, block_size)):
        raise ValueError(
            f"a layout's CSR lists for Lq={Lq} (layout.kv_indices(device)) with a block size that is a "
            f"multiple of {TILE} are needed, got block_size={block_size}, counts "
            f"{None if kv_counts is None else tuple(kv_counts.shape)}"
        )
    if not scale > 0:
        raise ValueError(f"scale must be a positive float, got {scale}")
    docs = cu_seqlens is not None
    if docs and (sparse or Lq != Lk):
        raise ValueError(
            f"packed documents run without a layout and with Lq == Lk (got Lq={Lq}, Lk={Lk}, "
            f"{'a' if sparse else 'no'} layout)"
        )
    masked = sparse or kv_lens is not None or docs
    cfg = gluon_fwd.default_config(D, causal, masked=masked) if config is None else config
    if masked and not cfg.warp_specialized:
        raise ValueError(
            "layouts, key padding and documents run in the warp-specialised kernel only: pass a "
            "configuration of gluon_fwd.WS_CONFIGS (or AHEAD_CONFIGS, but for documents), or none"
        )
    if docs and cfg.qk_ahead:
        raise ValueError(
            "packed documents run in the default schedule only: pass a configuration of gluon_fwd.WS_CONFIGS, or none"
        )
    q, k, v = (_tma_ready(t) for t in (q, k, v))
    o = torch.empty((B, H, Lq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)
    q_desc, o_desc = _descriptor(q, cfg.block_m), _descriptor(o, cfg.block_m)
    k_desc, v_desc = _descriptor(k, cfg.block_n), _descriptor(v, cfg.block_n)
    scales = (H, H // HKV, Lq, Lk, scale * LOG2E)
    if cfg.warp_specialized:
        cnt, idx, order, scnt_h, sidx_h, sidx_m, sord_h = csr_args(kv_counts, kv_indices, q)
        # long rows (BigBird's global block) in chunks over several programs, as the Triton forward
        plan, items, sitems_h, po, pm, pl = split_rows(kv_counts, order, sord_h, q, block_size)
        if docs:  # each token's document span (B, Lq, 2), and the programs by descending span
            doc_start, doc_end = doc_args(cu_seqlens, B, Lq, q)
            spans = torch.stack((doc_start, doc_end), dim=-1).contiguous()
            programs = doc_order(doc_start, doc_end, cfg.rows, causal, keys=False)
        else:
            spans = programs = placeholder(q.device)
        if sparse:  # per layout row or plan item, block_size // 128 programs
            rows = (plan.items.shape[1] if plan is not None else kv_counts.shape[-1]) * (block_size // cfg.rows)
        else:
            rows = triton.cdiv(Lq, cfg.rows)
        gluon_fwd.attn_fwd_ws_kernel[(rows, B * H)](
            q_desc,
            k_desc,
            v_desc,
            o_desc,
            lse,
            kv_lens if kv_lens is not None else placeholder(q.device),
            cnt,
            idx,
            items,
            po,
            spans,
            programs,
            scnt_h,
            sidx_h,
            sidx_m,
            sitems_h,
            *scales,
            HEAD_DIM=D,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            STAGES=cfg.stages,
            CAUSAL=causal,
            PINGPONG=cfg.pingpong,
            QK_AHEAD=cfg.qk_ahead,
            CONSUMER_REGS=cfg.consumer_regs,
            PRODUCER_REGS=cfg.producer_regs,
            BS=block_size if sparse else 1,
            SPARSE=sparse,
            SPLIT=plan is not None,
            HAS_KV_LENS=kv_lens is not None,
            HAS_DOCS=docs,
            num_warps=4,
            maxnreg=cfg.maxnreg,
        )
        if plan is not None:
            merge_split_rows(plan, po, pm, pl, o, lse, block_size, align8=False)  # D 64, 128
    else:
        gluon_fwd.attn_fwd_tma_kernel[(triton.cdiv(Lq, cfg.rows), B * H)](
            q_desc,
            k_desc,
            v_desc,
            o_desc,
            lse,
            *scales,
            HEAD_DIM=D,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            STAGES=cfg.stages,
            CAUSAL=causal,
            num_warps=cfg.num_warps,
        )
    return o, lse


def _backward_kernels(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    kv_lens: torch.Tensor | None,
    kv_counts: torch.Tensor | None,
    kv_indices: torch.Tensor | None,
    q_counts: torch.Tensor | None,
    q_indices: torch.Tensor | None,
    block_size: int,
    causal: bool,
    scale: float,
    cu_seqlens: torch.Tensor | None,
    dlse: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward launcher: dq (B, H, Lq, D), dk, dv (B, HKV, Lk, D) from the forward's o and base-2
    lse; dlse: the gradient of that lse, None when nothing downstream used it; the layout's CSR
    lists both ways, kv_lens and cu_seqlens as the forward had them.  Our Triton backward: the Gluon one
    (``gluon_bwd``, dense only) took 1.29-1.87 times its time on the H200
    (benchmarks/results/gluon_bwd.json), so it is measured there and not used here yet."""
    read = [_tma_ready(t) for t in (q, k, v)]  # what the forward read
    grads = flash_bwd(
        do.contiguous(),
        *read,
        o,
        lse,
        kv_lens,
        kv_counts,
        kv_indices,
        q_counts,
        q_indices,
        block_size,
        causal,
        scale,
        cu_seqlens,
        dlse=dlse,
    )
    # laid out as empty_like_rows(input), which the fake promises torch.compile: flash_bwd lays each
    # gradient out like the tensor it read, so only where _tma_ready copied an input is it copied back
    return tuple(
        grad if t_read is t else empty_like_rows(t).copy_(grad) for grad, t_read, t in zip(grads, read, (q, k, v))
    )


# --------------------------------------------------------------------------------------------
# Custom ops (torch.compile sees one opaque node per pass) and autograd
# --------------------------------------------------------------------------------------------

_FWD_SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor? kv_lens, Tensor? kv_counts, Tensor? kv_indices, "
    "Tensor? q_counts, Tensor? q_indices, int block_size, bool causal, float scale, "
    "Tensor? cu_seqlens, int[] config) -> (Tensor, Tensor)"
)
_BWD_SCHEMA = (
    "(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor? kv_lens, "
    "Tensor? kv_counts, Tensor? kv_indices, Tensor? q_counts, Tensor? q_indices, int block_size, "
    "bool causal, float scale, Tensor? cu_seqlens, Tensor? dlse) -> (Tensor, Tensor, Tensor)"
)


def config_fields(config: GluonConfig | None) -> list[int]:
    """A launch configuration as the custom op's ``int[] config`` argument: its fields in order
    (booleans as 0 / 1), empty for the default."""
    return [] if config is None else [int(value) for value in dataclasses.astuple(config)]


def config_from_fields(fields: list[int]) -> GluonConfig | None:
    """The inverse of ``config_fields``."""
    if not fields:
        return None
    kinds = [f.type for f in dataclasses.fields(GluonConfig)]  # "bool" or "int" (postponed annotations)
    return GluonConfig(*(bool(x) if kind in ("bool", bool) else int(x) for x, kind in zip(fields, kinds, strict=True)))


def _fwd_impl(
    q, k, v, kv_lens, kv_counts, kv_indices, q_counts, q_indices, block_size, causal, scale, cu_seqlens, config
):
    return gluon_fwd_launch(
        q,
        k,
        v,
        causal,
        scale,
        config_from_fields(config),
        kv_lens=kv_lens,
        kv_counts=kv_counts,
        kv_indices=kv_indices,
        block_size=block_size,
        cu_seqlens=cu_seqlens,
    )


def _bwd_impl(
    do,
    q,
    k,
    v,
    o,
    lse,
    kv_lens,
    kv_counts,
    kv_indices,
    q_counts,
    q_indices,
    block_size,
    causal,
    scale,
    cu_seqlens,
    dlse,
):
    return _backward_kernels(
        do,
        q,
        k,
        v,
        o,
        lse,
        kv_lens,
        kv_counts,
        kv_indices,
        q_counts,
        q_indices,
        block_size,
        causal,
        scale,
        cu_seqlens,
        dlse,
    )


_fwd_op = torch.library.custom_op("genoformer::gluon_flash_fwd", _fwd_impl, mutates_args=(), schema=_FWD_SCHEMA)
_bwd_op = torch.library.custom_op("genoformer::gluon_flash_bwd", _bwd_impl, mutates_args=(), schema=_BWD_SCHEMA)


@_fwd_op.register_fake
def _fwd_fake(
    q, k, v, kv_lens, kv_counts, kv_indices, q_counts, q_indices, block_size, causal, scale, cu_seqlens, config
):
    B, H, Lq, D = q.shape
    return q.new_empty((B, H, Lq, D)), q.new_empty((B, H, Lq), dtype=torch.float32)


@_bwd_op.register_fake
def _bwd_fake(
    do,
    q,
    k,
    v,
    o,
    lse,
    kv_lens,
    kv_counts,
    kv_indices,
    q_counts,
    q_indices,
    block_size,
    causal,
    scale,
    cu_seqlens,
    dlse,
):
    return empty_like_rows(q), empty_like_rows(k), empty_like_rows(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, kv_lens, kv_counts, kv_indices, q_counts, q_indices, block_size, causal, scale, cu_seqlens, config = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, kv_lens, kv_counts, kv_indices, q_counts, q_indices, cu_seqlens)
    ctx.block_size, ctx.causal, ctx.scale = block_size, causal, scale
    # an unused output's gradient arrives as None (eager and in AOT autograd's traced backward)
    ctx.set_materialize_grads(False)


def _backward(ctx, do, dlse, bwd=_bwd_op):
    # as triton_flash._backward: dlse is the base-2 lse's gradient (None when unused), do is None
    # when only the lse was used; the custom op's autograd calls the backward op, the eager
    # Function the implementation
    q, k, v, o, lse, kv_lens, kv_counts, kv_indices, q_counts, q_indices, cu_seqlens = ctx.saved_tensors
    if do is None:
        do = torch.zeros_like(o)
    dq, dk, dv = bwd(
        do,
        q,
        k,
        v,
        o,
        lse,
        kv_lens,
        kv_counts,
        kv_indices,
        q_counts,
        q_indices,
        ctx.block_size,
        ctx.causal,
        ctx.scale,
        cu_seqlens,
        dlse,
    )
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


_fwd_op.register_autograd(_backward, setup_context=_setup_context)


class _EagerGluonAttention(torch.autograd.Function):
    """The custom ops' forward and backward without the custom-op dispatch, for eager calls (as
    ``triton_flash._EagerAttention``: the dispatch costs host time a short sequence's kernels do not)."""

    @staticmethod
    def forward(
        ctx, q, k, v, kv_lens, kv_counts, kv_indices, q_counts, q_indices, block_size, causal, scale, cu_seqlens, config
    ):
        inputs = (
            q,
            k,
            v,
            kv_lens,
            kv_counts,
            kv_indices,
            q_counts,
            q_indices,
            block_size,
            causal,
            scale,
            cu_seqlens,
            config,
        )
        output = _fwd_impl(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, do, dlse):
        return _backward(ctx, do, dlse, bwd=_bwd_impl)


def gluon_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    layout: BlockLayout | None = None,
    kv_lens: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    scale: float | None = None,
    return_lse: bool = False,
    config: GluonConfig | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention forward in Gluon (Hopper), backward by ``_backward_kernels``.

    q: (B, H, Lq, D), k and v: (B, HKV, Lk, D), fp16 or bf16, D 64 or 128, H % HKV == 0, on an
    sm_90 GPU.  Strided views are read in place when TMA can (16-byte aligned strides), else copied.
    causal: j <= i (Lq == Lk).  layout: a BlockLayout over (Lq, Lk) whose block size is a multiple
    of 128; only its listed blocks are visited.  kv_lens: (B,) int, keys >= kv_lens[b] are padding.
    cu_seqlens: (N + 1,) int32, packed documents (flash-attn's varlen convention,
    ``genoformer.kernels.documents``; its values are checked by ``dispatch.attention``, not here):
    a token attends only within its document; not with a layout or kv_lens.
    Returns (B, H, Lq, D) in q's dtype; with return_lse also the lse (B, H, Lq) fp32 in natural log
    (the convention of ``genoformer.kernels.dispatch``), differentiable.  config: a
    ``GluonConfig`` (default ``gluon_fwd.default_config(D, causal)``).  Under torch.compile the
    custom ops are traced (no graph break).  Raises ValueError saying what to change
    when the kernels cannot run the inputs (``unsupported_reason``).
    """
    _check(q, k, v, causal, layout, kv_lens, cu_seqlens)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    block_size, kv_counts, kv_indices, q_counts, q_indices = layout_lists(layout, q.device)
    forward = _fwd_op if torch.compiler.is_compiling() else _EagerGluonAttention.apply
    o, lse2 = forward(
        q,
        k,
        v,
        kv_lens,
        kv_counts,
        kv_indices,
        q_counts,
        q_indices,
        block_size,
        causal,
        scale,
        cu_seqlens,
        config_fields(config),
    )
    if not return_lse:
        return o
    # base 2 -> natural log; an empty row's +inf (a layout row or key padding with no allowed key) -> -inf
    return o, torch.where(lse2 == float("inf"), float("-inf"), lse2 * LN2)
