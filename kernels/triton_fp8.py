"""FP8 attention forward for inference: e4m3 queries, keys and values with per-block scales (Hopper, Ada).

Layers, in order: the quantization (``quantize_blocks``, in PyTorch: one pass over each tensor),
the kernel ``fp8_fwd_kernel`` (online softmax over e4m3 tiles; both matmuls on the FP8 tensor
cores), the launcher ``fp8_fwd`` (checks, quantizes, picks a configuration, launches), the torch
custom op ``genoformer::triton_fp8_fwd`` with a fake implementation, ``emulated_fp8_attention``
(the same arithmetic in PyTorch, tile by tile: the CPU reference), and ``fp8_attention``, the
entry the dispatcher's ``fp8`` backend runs. There is no backward: FP8 is an inference option.

The arithmetic. The softmax scale and log2(e) are folded into q; k and v lose their mean over the
sequence per feature (``smoothed``: the softmax is unchanged by a shift of every key, and the
values' mean is added back to every output with a key); then every QB = 128 rows of q and every
KB = 128 rows of k and of v (per batch and head) are divided by their block's amax / 448 and
rounded to e4m3 (448 is e4m3's largest finite value): q8, k8, v8 and the scales qs, ks, vs (fp32). A key tile's base-2 scores are s2 = (q8 . k8) * qs * ks. The running max and
sum stay in fp32 (the house forward's online softmax); p = exp2(s2 - m) in [0, 1] is rounded to
e4m3 as p8 = e4m3(p * 448) (P_FP8; otherwise p runs in bf16) and the tile adds
(p8 . v8) * vs / 448 to the accumulator; the row sum adds the unrounded p. v8 is stored
transposed, (B, HKV, D, L) with the keys contiguous: the FP8 tensor cores take the second
operand of a matmul K-major.

What it runs: dense attention, causal or not, key padding (kv_lens), GQA; head dims 32, 64, 128
and 256; fp16 or bf16 in, the same dtype out. Not layouts, packed documents or the lse
(``unsupported_reason`` says so, and the dispatcher's fp8 backend refuses them with the reason).

Legend: q (B, H, Lq, D); k, v (B, HKV, Lk, D); q8 (B, H, Lq', D), k8 (B, HKV, Lk', D), v8t
(B, HKV, D, Lk') e4m3 with Lq', Lk' rounded up to QB, KB (zero rows past L); qs (B, H, Lq' / QB),
ks, vs (B, HKV, Lk' / KB) fp32; mu_v (B, HKV, 1, D) fp32 the values' mean.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from genoformer.kernels.triton_flash_fwd import LOG2E
from triton.runtime.interpreter import InterpretedFunction

E4M3_MAX = 448.0
"""The largest finite float8_e4m3fn value: a block's amax maps to it."""
P_SCALE = 448.0
"""p in [0, 1] is rounded to e4m3 as p * P_SCALE (its full range), divided out after the matmul."""
QB = 128
"""Query rows per scale."""
KB = 128
"""Key (and value) rows per scale; every key tile lies inside one such block."""
HEAD_DIMS = (32, 64, 128, 256)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


# --------------------------------------------------------------------------------------------
# Quantization
# --------------------------------------------------------------------------------------------


def smoothed(x_BHLD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x - mean, mean): x (fp32) less its mean over the sequence per batch, head and feature, and that
    mean (B, H, 1, D) fp32. Keys and values of a trained model share large per-feature offsets;
    without them the rounding to 3 mantissa bits falls on what varies between positions. A shift of
    every key changes each query's scores by one constant (the softmax is unchanged); a shift of
    every value shifts each output by it (added back after the softmax)."""
    mean_BH1D = x_BHLD.float().mean(dim=2, keepdim=True)
    return x_BHLD.float() - mean_BH1D, mean_BH1D


def quantize_blocks(
    x_BHLD: torch.Tensor, block: int, *, multiplier: float = 1.0, transpose: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x8, scales): x * multiplier in e4m3, every `block` rows (per batch and head) divided by their
    amax / E4M3_MAX; x8 (B, H, L', D) with L' = L rounded up to `block` (zero rows past L), or
    (B, H, D, L') contiguous with transpose; scales (B, H, L' / block) fp32."""
    B, H, L, D = x_BHLD.shape
    T = triton.cdiv(L, block)
    x_BHLD = x_BHLD.float() * multiplier
    if T * block != L:
        x_BHLD = torch.nn.functional.pad(x_BHLD, (0, 0, 0, T * block - L))
    blocks_BHTbD = x_BHLD.view(B, H, T, block, D)
    scales_BHT = blocks_BHTbD.abs().amax(dim=(-1, -2)).clamp_min(torch.finfo(torch.float32).tiny) / E4M3_MAX
    x8_BHLD = (blocks_BHTbD / scales_BHT[..., None, None]).to(torch.float8_e4m3fn).view(B, H, T * block, D)
    if transpose:
        return x8_BHLD.transpose(-1, -2).contiguous(), scales_BHT
    return x8_BHLD, scales_BHT


# --------------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------------


@triton.jit
def rounded(x, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr):
    """x >= 0 rounded (half up) to a float format with MANTISSA mantissa bits whose normal range starts
    at 2^MIN_EXP, still in fp32 (e4m3: 3, -6; bf16: 7, -126). Only the interpreter path uses it
    (ROUND_P): Triton's CPU interpreter (3.9) rounds fp32 to e4m3 wrongly where rounding carries into
    the exponent (31.07 became 16, not 32), and to bf16 not to nearest; a value already on the
    format's grid converts exactly."""
    exponent = tl.floor(tl.math.log2(tl.maximum(x, 2.0**MIN_EXP)))
    step = tl.math.exp2(exponent - MANTISSA)
    return tl.floor(x / step + 0.5) * step


@triton.jit
def _fp8_steps(
    acc,
    l_i,
    m_i,
    q,
    qs,
    k_base,
    v_base,
    KS,
    VS,
    sk_l,
    sv_d,
    n_lo,
    n_hi,
    offs_m,
    kv_end,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KB_: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASK: tl.constexpr,
    P_FP8: tl.constexpr,
    P_SCALE_: tl.constexpr,
    ROUND_P: tl.constexpr,
):
    """Online softmax over the key tiles starting at n_lo .. n_hi (step BLOCK_N); MASK=False is the
    unmasked fast path (tiles wholly inside the allowed keys)."""
    offs_d = tl.arange(0, D)
    for start_n in range(n_lo, n_hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_base + offs_n[:, None] * sk_l + offs_d[None, :])  # (BLOCK_N, D) e4m3, zero rows past Lk
        scale = qs[:, None] * tl.load(KS + start_n // KB_)
        s = tl.dot(q, tl.trans(k)) * scale  # (BLOCK_M, BLOCK_N) base-2 scores
        if MASK:
            keep = offs_n[None, :] < kv_end
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            s = tl.where(keep, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing allowed yet: avoid inf - inf
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_sub = m_new
        p = tl.math.exp2(s - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        m_i = m_new
        v = tl.load(v_base + offs_d[:, None] * sv_d + offs_n[None, :])  # (D, BLOCK_N) e4m3, keys contiguous
        vs = tl.load(VS + start_n // KB_)
        if P_FP8:
            p_scaled = p * P_SCALE_
            if ROUND_P:
                p_scaled = rounded(p_scaled, 3, -6)
            acc += tl.dot(p_scaled.to(v.dtype), tl.trans(v)) * (vs / P_SCALE_)
        elif ROUND_P:  # the interpreter multiplies bf16 tiles wrongly (``triton_flash_fwd.mma``): in fp32
            acc += tl.dot(rounded(p, 7, -126), tl.trans(v).to(tl.float32)) * vs
        else:
            acc += tl.dot(p.to(tl.bfloat16), tl.trans(v).to(tl.bfloat16)) * vs
    return acc, l_i, m_i


@triton.jit
def fp8_fwd_kernel(
    Q8,
    K8,
    V8T,
    QS,
    KS,
    VS,
    MU_V,
    O,
    KV_LENS,
    sq_b,
    sq_h,
    sq_l,
    sk_b,
    sk_h,
    sk_l,
    sv_b,
    sv_h,
    sv_d,
    so_b,
    so_h,
    so_l,
    sqs_b,
    sqs_h,
    sks_b,
    sks_h,
    H,
    GROUP,
    Lq,
    Lk,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    QB_: tl.constexpr,
    KB_: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_KV_LENS: tl.constexpr,
    P_FP8: tl.constexpr,
    P_SCALE_: tl.constexpr,
    ROUND_P: tl.constexpr,
):
    # grid: (query tiles, B * H), the last tiles (the longest causal rows) launched first
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    kv_end = Lk
    if HAS_KV_LENS:
        kv_end = tl.minimum(tl.maximum(tl.load(KV_LENS + b).to(tl.int32), 0), Lk)
    q_base = Q8 + b.to(tl.int64) * sq_b + h.to(tl.int64) * sq_h
    q = tl.load(q_base + offs_m[:, None] * sq_l + offs_d[None, :])  # (BLOCK_M, D), zero rows past Lq
    qs = tl.load(QS + b * sqs_b + h * sqs_h + offs_m // QB_)  # (BLOCK_M,) every row's block scale
    k_base = K8 + b.to(tl.int64) * sk_b + hk.to(tl.int64) * sk_h
    v_base = V8T + b.to(tl.int64) * sv_b + hk.to(tl.int64) * sv_h
    ks_base = KS + b * sks_b + hk * sks_h
    vs_base = VS + b * sks_b + hk * sks_h

    # key tiles [0, full) need no mask; [full, end) hold the diagonal, the padding edge or the tail
    hi = kv_end
    full = kv_end
    if CAUSAL:
        hi = tl.minimum(start_m + BLOCK_M, kv_end)
        full = tl.minimum(start_m + 1, kv_end)
    full = (full // BLOCK_N) * BLOCK_N
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    acc, l_i, m_i = _fp8_steps(
        acc,
        l_i,
        m_i,
        q,
        qs,
        k_base,
        v_base,
        ks_base,
        vs_base,
        sk_l,
        sv_d,
        0,
        full,
        offs_m,
        kv_end,
        D,
        BLOCK_N,
        KB_,
        CAUSAL,
        False,
        P_FP8,
        P_SCALE_,
        ROUND_P,
    )
    acc, l_i, m_i = _fp8_steps(
        acc,
        l_i,
        m_i,
        q,
        qs,
        k_base,
        v_base,
        ks_base,
        vs_base,
        sk_l,
        sv_d,
        full,
        hi,
        offs_m,
        kv_end,
        D,
        BLOCK_N,
        KB_,
        CAUSAL,
        True,
        P_FP8,
        P_SCALE_,
        ROUND_P,
    )
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # a row with no allowed key: o = 0
    mu_v = tl.load(MU_V + (b * (H // GROUP) + hk).to(tl.int64) * D + offs_d)  # the values' mean, added back
    o = acc / l_safe[:, None] + tl.where(l_i > 0.0, 1.0, 0.0)[:, None] * mu_v[None, :]
    o_ptrs = O + b.to(tl.int64) * so_b + h.to(tl.int64) * so_h + offs_m[:, None] * so_l + offs_d[None, :]
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=offs_m[:, None] < Lq)


# --------------------------------------------------------------------------------------------
# Launcher
# --------------------------------------------------------------------------------------------

INTERPRETED = isinstance(fp8_fwd_kernel, InterpretedFunction)


@dataclasses.dataclass(frozen=True)
class Fp8Config:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def fp8_candidates(head_dim: int, interpreted: bool = False) -> tuple[Fp8Config, ...]:
    """Launch configurations on a GPU, the default first (the tuner times the rest); block_n divides
    KB. interpreted: the one small configuration Triton's CPU interpreter runs."""
    if interpreted:
        return (Fp8Config(32, 32, 4, 1),)
    if head_dim == 256:
        return (Fp8Config(64, 64, 4, 2), Fp8Config(128, 64, 8, 2))
    return (Fp8Config(128, 128, 8, 3), Fp8Config(128, 64, 4, 3), Fp8Config(128, 128, 8, 4), Fp8Config(64, 128, 4, 3))


def unsupported_reason(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, layout, kv_lens, cu_seqlens, return_lse: bool
) -> str | None:
    """None when the FP8 kernel can run these (valid) inputs here, else a sentence saying why and what to do."""
    if q.device.type == "cuda":
        if INTERPRETED:
            return (
                "the Triton kernels were loaded in interpreter mode (TRITON_INTERPRET=1) and cannot take CUDA "
                "tensors; unset TRITON_INTERPRET before importing genoformer"
            )
        capability = torch.cuda.get_device_capability(q.device)
        if capability < (8, 9):
            return (
                f"FP8 attention needs FP8 tensor cores (Ada sm_89, Hopper sm_90 or newer); "
                f"{torch.cuda.get_device_name(q.device)} is sm_{capability[0]}{capability[1]}: run in bf16"
            )
    elif not (q.device.type == "cpu" and INTERPRETED):
        return (
            f"the Triton FP8 kernel runs on CUDA tensors (or on the CPU under TRITON_INTERPRET=1), got {q.device.type}"
        )
    if q.dtype not in SUPPORTED_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"FP8 attention takes float16 or bfloat16 q, k, v (autocast), got {q.dtype}, {k.dtype}, {v.dtype}"
    if q.shape[-1] not in HEAD_DIMS:
        return f"the FP8 kernel takes head dims {HEAD_DIMS}, got {q.shape[-1]}; use backend 'triton'"
    return semantic_reason(q, layout=layout, cu_seqlens=cu_seqlens, return_lse=return_lse)


def semantic_reason(q: torch.Tensor, *, layout, cu_seqlens, return_lse: bool) -> str | None:
    """What FP8 attention (kernel and emulation alike) does not run: layouts, documents, the lse,
    gradients."""
    if layout is not None and (layout.window is not None or not bool(layout.mask.all())):
        return "FP8 attention runs dense attention only, not block-sparse layouts or windows; use backend 'triton'"
    if cu_seqlens is not None:
        return "FP8 attention does not run packed documents (cu_seqlens); use backend 'triton'"
    if return_lse:
        return "FP8 attention does not return the log-sum-exp; use backend 'triton'"
    if torch.is_grad_enabled() and q.requires_grad:
        return "FP8 attention is for inference (no backward): run under torch.no_grad() or inference_mode"
    return None


_TUNED: dict[tuple, Fp8Config] = {}


def fp8_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_lens: torch.Tensor | None,
    causal: bool,
    scale: float,
    p_fp8: bool = True,
    config: Fp8Config | None = None,
) -> torch.Tensor:
    """The launcher: o (B, H, Lq, D) in q's dtype. Quantizes q, k, v (``quantize_blocks``), then
    launches ``fp8_fwd_kernel``; p_fp8=False runs p . v in bf16 (the FP8 second matmul off).
    config: run this configuration instead of choosing one (the tuner of the Triton forward,
    ``triton_flash.choose_config``, times the candidates once per shape bucket on a GPU)."""
    B, H, Lq, D = q.shape
    HKV, Lk = k.shape[1], k.shape[2]
    if D not in HEAD_DIMS or k.shape != v.shape or H % HKV:
        raise ValueError(
            f"FP8 attention takes q (B, H, Lq, D), k, v (B, HKV, Lk, D) with D in {HEAD_DIMS} and "
            f"H % HKV == 0; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    q8, qs = quantize_blocks(q, QB, multiplier=scale * LOG2E)
    k8, ks = quantize_blocks(smoothed(k)[0], KB)
    v_smooth, mu_v = smoothed(v)
    v8t, vs = quantize_blocks(v_smooth, KB, transpose=True)
    o = torch.empty((B, H, Lq, D), dtype=q.dtype, device=q.device)
    lens = kv_lens if kv_lens is not None else qs

    def run(cfg: Fp8Config) -> None:
        fp8_fwd_kernel[(triton.cdiv(Lq, cfg.block_m), B * H)](
            q8,
            k8,
            v8t,
            qs,
            ks,
            vs,
            mu_v,
            o,
            lens,
            q8.stride(0),
            q8.stride(1),
            q8.stride(2),
            k8.stride(0),
            k8.stride(1),
            k8.stride(2),
            v8t.stride(0),
            v8t.stride(1),
            v8t.stride(2),
            o.stride(0),
            o.stride(1),
            o.stride(2),
            qs.stride(0),
            qs.stride(1),
            ks.stride(0),
            ks.stride(1),
            H,
            H // HKV,
            Lq,
            Lk,
            D=D,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            QB_=QB,
            KB_=KB,
            CAUSAL=causal,
            HAS_KV_LENS=kv_lens is not None,
            P_FP8=p_fp8,
            P_SCALE_=P_SCALE,
            ROUND_P=INTERPRETED,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )

    if config is None:
        from genoformer.kernels.triton_flash import _bucket, choose_config

        key = (
            "fp8",
            q.device.index,
            D,
            q.dtype,
            causal,
            kv_lens is not None,
            p_fp8,
            H // HKV,
            _bucket(Lq),
            _bucket(Lk),
        )
        candidates = fp8_candidates(D, interpreted=INTERPRETED)
        config = choose_config(key, candidates, run, q.device) if q.is_cuda else candidates[0]
    run(config)
    return o


_SCHEMA = "(Tensor q, Tensor k, Tensor v, Tensor? kv_lens, bool causal, float scale, bool p_fp8) -> Tensor"


def _impl(q, k, v, kv_lens, causal, scale, p_fp8):
    return fp8_fwd(q, k, v, kv_lens, causal, scale, p_fp8)


fp8_op = torch.library.custom_op("genoformer::triton_fp8_fwd", _impl, mutates_args=(), schema=_SCHEMA)


@fp8_op.register_fake
def _fake(q, k, v, kv_lens, causal, scale, p_fp8):
    return q.new_empty(q.shape)


# --------------------------------------------------------------------------------------------
# The emulation (CPU reference) and the entry point
# --------------------------------------------------------------------------------------------


def emulated_fp8_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    kv_lens: torch.Tensor | None,
    scale: float,
    p_fp8: bool = True,
    block_n: int = KB,
) -> torch.Tensor:
    """The kernel's arithmetic in PyTorch (fp32 matmuls of the e4m3 values), key tile by key tile of
    `block_n` keys (a divisor of KB): the same quantization, the same running max at which p is
    rounded to e4m3. Any device; cost O(B * H * Lq * block_n) memory per step. Returns q's dtype."""
    B, H, Lq, D = q.shape
    HKV, Lk = k.shape[1], k.shape[2]
    group = H // HKV
    q8, qs = quantize_blocks(q, QB, multiplier=scale * LOG2E)
    k8, ks = quantize_blocks(smoothed(k)[0], KB)
    v_smooth, mu_v = smoothed(v)
    v8, vs = quantize_blocks(v_smooth, KB)
    q8_BHLD = q8.float()[:, :, :Lq]
    qs_BHL1 = qs.repeat_interleave(QB, dim=-1)[:, :, :Lq, None]
    rows_L1 = torch.arange(Lq, device=q.device)[:, None]
    kv_end_B = torch.full((B,), Lk, device=q.device) if kv_lens is None else kv_lens.to(q.device).clamp(0, Lk)
    m_BHL = torch.full((B, H, Lq), float("-inf"), device=q.device)
    l_BHL = torch.zeros(B, H, Lq, device=q.device)
    acc_BHLD = torch.zeros(B, H, Lq, D, device=q.device)
    for start in range(0, Lk, block_n):
        keys_N = torch.arange(start, start + block_n, device=q.device)
        k_BHND = k8[:, :, start : start + block_n].float().repeat_interleave(group, 1)
        v_BHND = v8[:, :, start : start + block_n].float().repeat_interleave(group, 1)
        ks_BH11 = ks[..., start // KB].repeat_interleave(group, 1)[..., None, None]
        s_BHLN = (q8_BHLD @ k_BHND.transpose(-1, -2)) * (qs_BHL1 * ks_BH11)  # the kernel's order
        keep_B1LN = (keys_N < kv_end_B[:, None])[:, None, None, :]
        if causal:
            keep_B1LN = keep_B1LN & (keys_N[None, :] <= rows_L1)
        s_BHLN = s_BHLN.masked_fill(~keep_B1LN, float("-inf"))
        m_new = torch.maximum(m_BHL, s_BHLN.amax(-1))
        m_sub = torch.where(m_new == float("-inf"), 0.0, m_new)
        p_BHLN = torch.exp2(s_BHLN - m_sub[..., None])
        alpha = torch.exp2(m_BHL - m_sub)
        l_BHL = l_BHL * alpha + p_BHLN.sum(-1)
        m_BHL = m_new
        vs_BH11 = vs[..., start // KB].repeat_interleave(group, 1)[..., None, None]
        if p_fp8:
            p8 = (p_BHLN * P_SCALE).to(torch.float8_e4m3fn).float()
            acc_BHLD = acc_BHLD * alpha[..., None] + (p8 @ v_BHND) * (vs_BH11 / P_SCALE)
        else:
            acc_BHLD = acc_BHLD * alpha[..., None] + (p_BHLN.to(torch.bfloat16).float() @ v_BHND) * vs_BH11
    out = acc_BHLD / torch.where(l_BHL == 0, 1.0, l_BHL)[..., None] + (l_BHL > 0)[..., None] * mu_v.repeat_interleave(
        group, 1
    )
    return out.to(q.dtype)


def fp8_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    layout=None,
    kv_lens: torch.Tensor | None = None,
    scale: float | None = None,
    cu_seqlens=None,
    return_lse: bool = False,
) -> torch.Tensor:
    """FP8 attention (inference): the Triton kernel on a GPU with FP8 tensor cores, the emulation
    elsewhere (a CPU: slow, for tests and for measuring FP8's error). q (B, H, Lq, D), k, v
    (B, HKV, Lk, D); returns (B, H, Lq, D) in q's dtype. Call when the dispatcher's check passed:
    a layout then has every block allowed, dense attention."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if q.is_cuda:
        return fp8_op(q, k, v, kv_lens, causal, scale, True)
    return emulated_fp8_attention(q, k, v, causal=causal, kv_lens=kv_lens, scale=scale)
