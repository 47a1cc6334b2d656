"""Attention through the optional flash-attn packages (Dao et al.): flash-attn 2 and flash-attn-4.

Shape legend:
    B    batch     Hq   query heads     Hkv  key/value heads (Hq % Hkv == 0)
    L    query length      S   key length      D   head dim
    T    tokens of a packed (variable-length) batch: documents or unpadded rows one after another
    Mb, Nb   query / key blocks of a layout

Two installs a user may have, detected by what imports (the package name is the same):
    flash-attn 2   `from flash_attn import flash_attn_func, flash_attn_varlen_func`
                   (A100 and older: sm_80 and newer; pip install flash-attn --no-build-isolation)
    flash-attn-4   `import flash_attn.cute` (CuTe DSL kernels for Hopper and Blackwell;
                   pip install flash-attn-4). It installs `flash_attn` as a namespace package,
                   so `import flash_attn` succeeds while `from flash_attn import flash_attn_func`
                   does not: only the two imports above tell the installs apart.

How our inputs map (both take (B, L, H, D) tensors and handle GQA themselves):
    dense, causal or not     flash_attn_func(causal=...)
    key padding (kv_lens)    flash_attn_varlen_func: keys packed to (T, Hkv, D). Both libraries
                             align a causal mask to the bottom right when a query sequence is
                             longer than its keys, so causal with key padding runs in two calls:
                             the queries before kv_lens[b] causally against their equal-length
                             key prefix, the queries from kv_lens[b] on (which see every valid
                             key) without the causal flag.
    packed rows (cu_seqlens) flash_attn_varlen_func with the same cumulative lengths for queries
                             and keys: exactly its document semantics.
    block-sparse layouts     not run here: flash-attn 2 has no block sparsity, and flash-attn-4
                             4.0.0b36's block-sparse forward failed on an H200 with our block
                             lists (a TypeError inside its kernel's block-list loads,
                             docs/flash_attn.md); our Triton kernels run every layout.
    head dims                flash-attn-4 runs only those in FLASH_ATTN_4_HEAD_DIMS for the GPU's
                             compute capability: the ones a GPU sweep found right in output and
                             all three gradients (4.0.0b36 gave wrong gradients at others on an
                             H200); the rest run on `triton`.
    sliding windows          `window_size` is a token band (i - left <= j <= i + right). Our
                             layouts are block-granular: a band of blocks allows pairs whose
                             distance depends on where i lies in its block, so it equals a token
                             band only when it covers every block, which is dense attention (run
                             as such). Every other band is a block-sparse layout (see above).
    log-sum-exp (return_lse)  flash-attn 2 returns it with return_attn_probs=True, flash-attn-4 with
                             return_lse=True: natural log, (B, H, L), or (H, T) from the varlen
                             entry point, +inf for an empty row (ours is -inf). Neither gives
                             it a gradient (flash-attn-4 marks it non-differentiable, flash-attn 2's
                             backward drops it), so return_lse runs here only with grad mode off
                             (torch.no_grad, inference); under autograd `unsupported_reason` says so
                             and auto takes triton.
A layout whose blocks are all allowed is dense attention and runs as such.
Compiled models: flash-attn's kernels are not traceable, so both entry points here run outside
torch.compile graphs (`torch.compiler.disable`: the graph breaks around them, and the rest of
the block stays compiled); our Triton kernels are the backend that compiles into one graph.
`unsupported_reason` says why an input cannot run and what to do; nothing imports flash-attn
before that check.
"""

from __future__ import annotations

import enum
import functools
import importlib
import importlib.metadata

import torch
import torch.nn.functional as F
from genoformer.kernels.layout import BlockLayout

FA2_INSTALL = "pip install flash-attn --no-build-isolation"
FA4_INSTALL = "pip install flash-attn-4"


FLASH_ATTN_4_HEAD_DIMS: dict[tuple[int, int], frozenset[int]] = {
    # H200, flash-attn-4 4.0.0b36, bf16, ~1000 tokens: output, dQ, dK, dV against the float64
    # reference, causal and bidirectional, GQA, key padding and packed documents, 12 cases per head
    # dim (`python -m benchmarks.flash_attn_check`, benchmarks/results/flash_attn_head_dims.json).
    # Wrong gradients (dQ or dV 70-120x the bf16 allowance) at 16, 40, 48, 72, 80, 104 and
    # 112 (104 and 112 also raise an MLIR error with key padding); 240, 248 and 256 crashed the process.
    (9, 0): frozenset(
        {24, 32, 56, 64, 88, 96, 120, 128, 136, 144, 152, 160, 168, 176, 184, 192, 200, 208, 216, 224, 232}
    ),
}
"""Head dims flash-attn-4 is trusted with, per compute capability: only those a GPU sweep found
right. A generation without a row runs none (its inputs go to another backend, with the reason)."""


class FlashAttn(enum.Enum):
    """Which flash-attn install runs: the two have different entry points and GPU support."""

    V2 = "flash-attn 2"
    V4 = "flash-attn-4"


# ------------------------------------------------------------------------------- detection
@functools.cache
def import_error(version: FlashAttn) -> str | None:
    """None when `version` imports here, else the ImportError's message (cached per process).

    Import errors are reported, never hidden: `unsupported_reason` puts the message in its
    sentence, and the backends import again (raising) when they run.
    """
    try:
        _entry_points(version)
    except ImportError as error:
        return str(error)
    return None


ENTRY_POINTS = ("flash_attn_func", "flash_attn_varlen_func")


def _entry_points(version: FlashAttn):
    """(flash_attn_func, flash_attn_varlen_func) of `version`; ImportError saying what to
    reinstall when it is not installed, or installed without them."""
    if version is FlashAttn.V2:
        from flash_attn import flash_attn_func, flash_attn_varlen_func

        return flash_attn_func, flash_attn_varlen_func
    cute = importlib.import_module("flash_attn.cute")
    missing = [name for name in ENTRY_POINTS if not hasattr(cute, name)]
    if missing:
        raise ImportError(
            f"flash_attn.cute ({getattr(cute, '__file__', None) or 'a namespace package'}) has no "
            f"{' or '.join(missing)}: a partial flash-attn-4 install, or another package's flash_attn "
            f"in its place (installed: {_distributions()}); genoformer needs flash-attn-4 >= 4.0.0b36: "
            f"pip uninstall -y flash-attn-4 && {FA4_INSTALL}"
        )
    return tuple(getattr(cute, name) for name in ENTRY_POINTS)


def _distributions() -> str:
    """The versions of the distributions that install `flash_attn`, for messages."""
    found = []
    for name in ("flash-attn-4", "flash-attn"):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"no {name}")
    return ", ".join(found)


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """(major, minor) compute capability of a CUDA device, None for any other device."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)


def _install_line(version: FlashAttn) -> str:
    if version is FlashAttn.V2:
        return (
            f"flash-attn 2 is for A100 and older GPUs: {FA2_INSTALL} "
            f"(on Hopper or Blackwell install flash-attn-4 instead: {FA4_INSTALL})"
        )
    return (
        f"flash-attn-4 is for Hopper and Blackwell GPUs: {FA4_INSTALL} "
        f"(on an A100 or older install flash-attn 2 instead: {FA2_INSTALL})"
    )


def _arch(capability: tuple[int, int]) -> str:
    return f"sm_{capability[0]}{capability[1]}"


# ------------------------------------------------------------------------------ what it runs
@torch.compiler.disable
def unsupported_reason(
    versions: tuple[FlashAttn, ...],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    layout: BlockLayout | None,
    kv_lens: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None = None,
    return_lse: bool = False,
    alibi_slopes: torch.Tensor | None = None,
) -> str | None:
    """None when one of `versions` can run these (valid) inputs here, else why not and what to do."""
    if alibi_slopes is not None:
        return "genoformer's flash-attn adapter passes no ALiBi slopes; use backend 'triton', which runs them."
    if causal and q.shape[2] != k.shape[2] and kv_lens is not None:
        return (
            "genoformer's flash-attn adapter runs key padding with causal attention only for Lq == Lk; "
            "use backend 'triton'."
        )
    reasons = [
        _version_reason(
            version,
            q,
            k,
            v,
            causal=causal,
            layout=layout,
            kv_lens=kv_lens,
            cu_seqlens=cu_seqlens,
            return_lse=return_lse,
        )
        for version in versions
    ]
    if None in reasons:
        return None
    if len(reasons) == 1:
        return reasons[0]
    return "no flash-attn install here can run these inputs: " + " ".join(
        f"({i}) {reason}" for i, reason in enumerate(reasons, 1)
    )


def first_runnable(versions: tuple[FlashAttn, ...], q, k, v, **conditions) -> FlashAttn:
    """The first of `versions` that can run these inputs (call after `unsupported_reason` is None)."""
    return next(version for version in versions if _version_reason(version, q, k, v, **conditions) is None)


def _version_reason(
    version: FlashAttn,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    layout: BlockLayout | None,
    kv_lens: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None = None,
    return_lse: bool = False,
) -> str | None:
    """None when `version` can run these (valid) inputs here, else a sentence saying why and what to do."""
    error = import_error(version)
    if error is not None:
        importing = "from flash_attn import flash_attn_func" if version is FlashAttn.V2 else "import flash_attn.cute"
        return f"{version.value} does not import ({importing} failed: {error}); {_install_line(version)}."
    capability = device_capability(q.device)
    if capability is None:
        return f"{version.value} runs on CUDA GPUs only (inputs are on {q.device.type}); use backend 'sdpa' or 'torch'."
    if version is FlashAttn.V2 and capability < (8, 0):
        return (
            f"flash-attn 2 needs an Ampere or newer GPU (sm_80+), this one is {_arch(capability)}; "
            "use backend 'sdpa' or 'torch'."
        )
    if version is FlashAttn.V4 and capability[0] not in (9, 10, 11, 12):
        return (
            f"flash-attn-4 trains on Hopper and Blackwell GPUs (sm_90, sm_100 and newer), this one is "
            f"{_arch(capability)}; {_install_line(FlashAttn.V2)} and use backend 'flash_attn_2', or use 'triton'."
        )
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"{version.value} supports float16 and bfloat16 only (got {q.dtype}); cast q, k, v or use 'sdpa'."
    D = q.shape[-1]
    if version is FlashAttn.V4 and capability[0] != 9:
        head_dims_ok = D % 8 == 0 and (8 <= D <= 128 or D == 256)
        allowed = "a multiple of 8 from 8 to 128, or 256"
    else:
        head_dims_ok = D % 8 == 0 and 8 <= D <= 256
        allowed = "a multiple of 8 from 8 to 256"
    if not head_dims_ok:
        return f"{version.value} on {_arch(capability)} needs a head dim that is {allowed} (got {D}); use 'triton' or 'sdpa'."
    if version is FlashAttn.V4 and D not in FLASH_ATTN_4_HEAD_DIMS.get(capability, ()):
        proven = sorted(FLASH_ATTN_4_HEAD_DIMS.get(capability, ()))
        checked = f"only head dims {proven} were found right" if proven else "no head dim was checked"
        return (
            f"head dim {D} is not among those whose flash-attn-4 gradients were checked on {_arch(capability)} "
            f"({checked} by `python -m benchmarks.flash_attn_check`; 4.0.0b36 gave wrong gradients at "
            f"others on an H200); use backend 'triton', which auto takes for such inputs."
        )
    if return_lse and torch.is_grad_enabled():
        return (
            f"{version.value} returns the log-sum-exp without a gradient (its autograd drops it) and grad mode "
            "is on; use backend 'triton' (or 'torch'), which differentiate it, or call under torch.no_grad()."
        )
    if layout is None or (layout.window is None and bool(layout.mask.all())):
        return None
    return _layout_reason(version, layout)


def _layout_reason(version: FlashAttn, layout: BlockLayout) -> str:
    """Why this (not dense) layout does not run on `version`, and what does."""
    if layout.window is not None:
        return (
            "genoformer's flash-attn adapter runs no layout with a token window (exact=True); use backend "
            "'triton', which runs it tile by tile."
        )
    if version is FlashAttn.V4:
        return (
            "genoformer does not run block-sparse layouts on flash-attn-4 (its block-sparse forward failed on "
            "an H200 with our block lists, see docs/flash_attn.md); use backend 'triton', which runs them."
        )
    if is_block_band(layout):
        return (
            "flash-attn 2's window_size is a token band (i - left <= j <= i + right) and this layout is "
            "a band of blocks, which allows pairs whose distance depends on their place in the block: the two "
            "differ unless the band covers every block; use backend 'triton'."
        )
    return "flash-attn 2 has no block-sparse layouts; use backend 'triton' or 'torch'."


def is_block_band(layout: BlockLayout) -> bool:
    """True when every head's mask is {(m, n): -left <= n - m <= right} for some block radii."""
    Mb, Nb = layout.num_q_blocks, layout.num_kv_blocks
    offsets_MN = torch.arange(Nb).unsqueeze(0) - torch.arange(Mb).unsqueeze(1)  # n - m
    for mask_MN in layout.mask:
        if not mask_MN.any():
            return False
        allowed = offsets_MN[mask_MN]
        band_MN = (offsets_MN >= allowed.min()) & (offsets_MN <= allowed.max())
        if not torch.equal(band_MN, mask_MN):
            return False
    return True


# ---------------------------------------------------------------------------------- running
@torch.compiler.disable
def flash_attn_attention(
    versions: tuple[FlashAttn, ...],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    layout: BlockLayout | None = None,
    kv_lens: torch.Tensor | None = None,
    scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    return_lse: bool = False,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """flash-attn attention; q (B, Hq, L, D), k and v (B, Hkv, S, D) -> (B, Hq, L, D), and with
    return_lse (out, lse (B, Hq, L) float32, -inf for a row with no allowed key). alibi_slopes must be
    None (`unsupported_reason`).

    Runs the first of `versions` that can. Call only when `unsupported_reason(versions, ...)` is
    None (the entry point `attention` does): a layout then has every block allowed, dense attention.
    """
    version = versions[0]
    if len(versions) > 1:
        conditions = dict(causal=causal, layout=layout, kv_lens=kv_lens, cu_seqlens=cu_seqlens, return_lse=return_lse)
        version = first_runnable(versions, q, k, v, **conditions)
    func, varlen = (_out_and_lse(version, fn, return_lse) for fn in _entry_points(version))
    q_BLHD, k_BSHD, v_BSHD = (t.transpose(1, 2) for t in (q, k, v))
    if cu_seqlens is not None:
        out_BLHD, lse_BHL = _packed(varlen, q_BLHD, k_BSHD, v_BSHD, cu_seqlens=cu_seqlens, causal=causal, scale=scale)
    elif kv_lens is not None:
        out_BLHD, lse_BHL = _key_padding(varlen, q_BLHD, k_BSHD, v_BSHD, kv_lens=kv_lens, causal=causal, scale=scale)
    else:
        out_BLHD, lse_BHL = func(q_BLHD, k_BSHD, v_BSHD, softmax_scale=scale, causal=causal)
    if not return_lse:
        return out_BLHD.transpose(1, 2)
    # flash-attn's +inf of an empty row is our -inf
    return out_BLHD.transpose(1, 2), lse_BHL.float().masked_fill(lse_BHL == float("inf"), float("-inf"))


def _out_and_lse(version: FlashAttn, fn, return_lse: bool):
    """`fn` (a flash-attn entry point) made to return (out, lse), lse None without return_lse:
    flash-attn-4 returns (out, lse) (lse None unless asked for or needed by its backward),
    flash-attn 2 the output alone, or (out, lse, probabilities) with return_attn_probs."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if version is FlashAttn.V4:
            out, lse = fn(*args, **kwargs, **({"return_lse": True} if return_lse else {}))
            return out, lse if return_lse else None
        if not return_lse:
            return fn(*args, **kwargs), None
        out, lse, _ = fn(*args, **kwargs, return_attn_probs=True)
        return out, lse

    return call


def _cumulative(lens_N: torch.Tensor) -> torch.Tensor:
    """(N + 1,) int32 cumulative lengths starting at 0: flash-attn's cu_seqlens."""
    return F.pad(lens_N.cumsum(0, dtype=torch.int32), (1, 0))


def _packed(varlen, q_BLHD, k_BLHD, v_BLHD, *, cu_seqlens, causal, scale):
    """Documents packed along the flattened token axis: one varlen call, same lengths for q and k.
    Returns out (B, L, Hq, D) and lse (B, Hq, L) (None when `varlen` returns none)."""
    B, L, Hq, D = q_BLHD.shape
    Hkv = k_BLHD.shape[2]
    cu_N1 = cu_seqlens.to(torch.int32)
    longest = int((cu_N1[1:] - cu_N1[:-1]).max())
    out_THD, lse_HT = varlen(
        q=q_BLHD.reshape(B * L, Hq, D),
        k=k_BLHD.reshape(B * L, Hkv, D),
        v=v_BLHD.reshape(B * L, Hkv, D),
        cu_seqlens_q=cu_N1,
        cu_seqlens_k=cu_N1,
        max_seqlen_q=longest,
        max_seqlen_k=longest,
        softmax_scale=scale,
        causal=causal,
    )
    return out_THD.view(B, L, Hq, D), None if lse_HT is None else lse_HT.view(Hq, B, L).transpose(0, 1)


def _key_padding(varlen, q_BLHD, k_BSHD, v_BSHD, *, kv_lens, causal, scale):
    """Keys at positions >= kv_lens[b] masked: valid keys packed to (T, Hkv, D).

    A batch with no valid key is given one key and its output zeroed afterwards (0 output and
    zero gradients, as the semantics ask; lse -inf). Returns out (B, L, Hq, D) and lse (B, Hq, L)
    (None when `varlen` returns none).
    """
    B, L, Hq, D = q_BLHD.shape
    S = k_BSHD.shape[1]
    lens_B = kv_lens.clamp_min(1).to(torch.int32)
    keep_BS = torch.arange(S, device=q_BLHD.device) < lens_B.unsqueeze(1)
    k_THD, v_THD = k_BSHD[keep_BS], v_BSHD[keep_BS]
    cu_k = _cumulative(lens_B)
    longest_k = int(lens_B.max())
    lse_BLH = None
    if not causal:
        out_THD, lse_HT = varlen(
            q=q_BLHD.reshape(B * L, Hq, D),
            k=k_THD,
            v=v_THD,
            cu_seqlens_q=_cumulative(torch.full_like(lens_B, L)),
            cu_seqlens_k=cu_k,
            max_seqlen_q=L,
            max_seqlen_k=longest_k,
            softmax_scale=scale,
            causal=False,
        )
        out_BLHD = out_THD.view(B, L, Hq, D)
        if lse_HT is not None:
            lse_BLH = lse_HT.transpose(0, 1).reshape(B, L, Hq)
    else:
        # (L == S) queries i < kv_lens[b]: causal against the key prefix of the same length.
        # Queries i >= kv_lens[b] see every valid key (j < kv_lens[b] <= i): not causal.
        before_BL = keep_BS
        out_BLHD = q_BLHD.new_empty(B, L, Hq, D)
        out_BLHD[before_BL], lse_HT = varlen(
            q=q_BLHD[before_BL],
            k=k_THD,
            v=v_THD,
            cu_seqlens_q=cu_k,
            cu_seqlens_k=cu_k,
            max_seqlen_q=longest_k,
            max_seqlen_k=longest_k,
            softmax_scale=scale,
            causal=True,
        )
        if lse_HT is not None:
            lse_BLH = lse_HT.new_empty(B, L, Hq)
            lse_BLH[before_BL] = lse_HT.transpose(0, 1)
        after_B = L - lens_B
        if int(after_B.max()) > 0:
            out_BLHD[~before_BL], lse_HT = varlen(
                q=q_BLHD[~before_BL],
                k=k_THD,
                v=v_THD,
                cu_seqlens_q=_cumulative(after_B),
                cu_seqlens_k=cu_k,
                max_seqlen_q=int(after_B.max()),
                max_seqlen_k=longest_k,
                softmax_scale=scale,
                causal=False,
            )
            if lse_HT is not None:
                lse_BLH[~before_BL] = lse_HT.transpose(0, 1)
    has_keys_B = kv_lens > 0
    out_BLHD = out_BLHD * has_keys_B.view(B, 1, 1, 1).to(out_BLHD.dtype)
    if lse_BLH is None:
        return out_BLHD, None
    return out_BLHD, lse_BLH.masked_fill(~has_keys_B.view(B, 1, 1), float("-inf")).transpose(1, 2)
