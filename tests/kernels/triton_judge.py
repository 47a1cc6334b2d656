"""The float64 judge of the Triton kernels, shared by their test files (imported as
``triton_judge``: its folder is on sys.path under pytest, as for ``gluon_harness``).

Criterion (as in flash-attention's tests): for each of out, dq, dk, dv the kernel's largest error
against the float64 reference is at most twice the error of the same computation done densely in
PyTorch at the same precision (fp16/bf16; ``conftest.naive_attention``), plus one unit in the last
place of the largest reference value of the four (a tensor exactly 0 in the reference, such as dq
over a single key, is judged against the magnitudes that its rounding comes from); NaN never passes.

Shape legend: q (B, Hq, L, D), k and v (B, Hkv, S, D), dout (B, Hq, L, D).
"""

from __future__ import annotations

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def inputs(B, Hq, Hkv, L, S, D, dtype, seed):
    """q, k, v, dout in float64 on DEVICE (cast them to `dtype` to run a kernel); dtype is unused
    but kept in the signature the tests write their cases with."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, Hq, L, D), (B, Hkv, S, D), (B, Hkv, S, D), (B, Hq, L, D)]
    return [torch.randn(s, generator=g, dtype=torch.float64).to(DEVICE) for s in shapes]


def on_cpu(kwargs: dict) -> dict:
    """kwargs with every tensor (a Varlen's too) moved to the CPU."""

    def move(value):
        if isinstance(value, torch.Tensor):
            return value.cpu()
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple (Varlen)
            return type(value)(*(move(item) for item in value))
        return value

    return {name: move(value) for name, value in kwargs.items()}


def max_errors(attn, fn, q, k, v, dout, dtype, **kwargs):
    """{name: (kernel error, same-precision PyTorch error, floor)} of `fn` against the float64
    reference, and `fn`'s result (out and the gradients).

    The reference and the same-precision PyTorch baseline run on CPU copies (the conftest helpers
    build their masks on the CPU); only `fn` runs on DEVICE.
    """
    low = [t.to(dtype) for t in (q, k, v, dout)]
    got = attn.run_with_grads(fn, *low, **kwargs)
    exact = attn.reference(*(t.cpu() for t in (q, k, v, dout)), **on_cpu(kwargs))
    naive = attn.run_with_grads(attn.naive_attention, *(t.cpu() for t in low), **on_cpu(kwargs))
    out = {}
    largest = max(ref.abs().max().item() for ref in exact.tensors().values())
    for name, ref in exact.tensors().items():
        value = got.tensors()[name].cpu()
        assert value.dtype == dtype, f"{name} has dtype {value.dtype}, expected {dtype}"
        assert not value.isnan().any(), f"{name} has NaN"
        err = (value.double() - ref).abs().max().item()
        base = (naive.tensors()[name].double() - ref).abs().max().item()
        floor = torch.finfo(dtype).eps * largest
        out[name] = (err, base, floor)
    return out, got


def assert_close_to_reference(attn, fn, q, k, v, dout, dtype, **kwargs):
    """Asserts the criterion above for out, dq, dk and dv; returns `fn`'s result."""
    errors, got = max_errors(attn, fn, q, k, v, dout, dtype, **kwargs)
    for name, (err, base, floor) in errors.items():
        assert err <= 2 * base + floor, (
            f"{name}: error {err:.3e} > 2 x same-precision PyTorch error {base:.3e} + {floor:.1e}"
        )
    return got
