"""FlexAttention's compiled kernels as PTX files, to read beside ours on a CPU.

On a GPU machine this compiles FlexAttention (`static_flex`: its Triton backend, one compile
per shape) forward and backward for one pattern of benchmarks/attention.py at one shape, exactly
as the attention benchmark builds it (the same BlockMask from the same BlockLayout), with Inductor's and
Triton's caches in a fresh folder. It then copies the PTX of every kernel built into --out, with
`flex_ptx.json` recording the case and the versions. Then, on any machine (ptxas and nvdisasm ship
with Triton):

    python -m benchmarks.flex_ptx --out OUT --pattern custom --head-dim 128 --seq-len 16384   # GPU
    python -m benchmarks.spills --ptx OUT/*.ptx --per-loop                                    # CPU
    python -m benchmarks.spills --cases custom-128 --kernels dkdv dq --per-loop --all-candidates   # ours

The second command reports registers, spills and each step loop's instruction mix of Flex's
kernels; the third, those of ours for the same case. Read them with the same Triton version as the
GPU's (its wheel on PYTHONPATH) and with a CUDA 13 ptxas: Inductor assembles Flex's kernels with
torch's own ptxas, whose PTX version Triton's ptxas refuses (benchmarks/spills.py says how).

Shape legend: B batch, H heads, L sequence length, D head dim.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.attention import FULL, Pattern, flex_block_mask, static_flex
from benchmarks.common import command_line, describe_environment
from genoformer.kernels.layout import BlockLayout


def compile_flex(pattern: Pattern, head_dim: int, seq_len: int) -> None:
    """One forward and one backward of compiled Flex on random bf16 inputs (B = 1, H = 2048 / D)."""
    device = torch.device("cuda")
    heads = FULL.width // head_dim
    layout = pattern.layout(FULL, seq_len) or BlockLayout.dense(seq_len, block_size=FULL.block_size)
    block_mask = flex_block_mask(layout, pattern.causal, heads, device, index_only=True)
    q, k, v, dout = (torch.randn(1, heads, seq_len, head_dim, device=device, dtype=torch.bfloat16)
                     for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    out = static_flex()(q, k, v, block_mask=block_mask)
    out.backward(dout)
    torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flex_ptx", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="write the PTX files and flex_ptx.json here")
    parser.add_argument("--pattern", type=Pattern, default=Pattern.CUSTOM,
                        help=f"a pattern of benchmarks/attention.py: {', '.join(p.value for p in Pattern)} "
                             "(default custom)")
    parser.add_argument("--head-dim", type=int, default=128, help="D (default 128; H = 2048 / D)")
    parser.add_argument("--seq-len", type=int, default=16384, help="L (default 16384)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("no CUDA device here: Inductor generates FlexAttention's kernels on a GPU only. Run this on "
                 "the GPU machine, then `python -m benchmarks.spills --ptx OUT/*.ptx --mix` anywhere.")
    with tempfile.TemporaryDirectory() as cache:
        # fresh caches: every kernel found afterwards was built for this case
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(cache, "inductor"))
        os.environ["TRITON_CACHE_DIR"] = str(Path(cache, "triton"))
        compile_flex(args.pattern, args.head_dim, args.seq_len)
        args.out.mkdir(parents=True, exist_ok=True)
        written = []
        for ptx in sorted(Path(cache).rglob("*.ptx")):
            target = args.out / f"{ptx.stem}-{ptx.parent.name[:8]}.ptx"  # the cache key tells same-named kernels apart
            shutil.copyfile(ptx, target)
            written.append(target)
    if not written:
        sys.exit(f"no PTX file in Inductor's or Triton's cache after compiling Flex (torch {torch.__version__}); "
                 "look for the kernels with TORCH_LOGS=output_code")
    record = {"environment": describe_environment(torch.device("cuda")), "command": command_line(),
              "case": {"pattern": args.pattern.value, "head_dim": args.head_dim, "seq_len": args.seq_len},
              "files": [path.name for path in written]}
    (args.out / "flex_ptx.json").write_text(json.dumps(record, indent=1))
    print("\n".join(str(path) for path in written), flush=True)
    return written


if __name__ == "__main__":
    main()
