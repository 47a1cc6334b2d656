"""What the integrity checks cost: `genoformer evaluate` and a training step with them and without.

    python -m benchmarks.integrity --out benchmarks/results/integrity_cpu          # CPU, about 5 minutes
    python -m benchmarks.integrity --device cuda --out $OUT/integrity              # GPU: benchmarks/gpu_integrity.sh

The checks (docs/reliability.md): every checkpoint read is verified against its zip CRC-32s, every
chunk read from a genome store against its CRC32C, and every checkpoint is saved through the one
atomic writer (a temporary beside the file, fsync, rename). Measured with them and without, in
interleaved rounds (the best of each, `benchmarks.common.interleaved_rounds`), on the same data;
on a CPU in one thread, timed by the process's CPU time (on a shared machine the wall clock moves
with the other processes' load by more than the checks cost), on a GPU by the wall clock; saves
always by the wall clock (they wait for the disk):

- evaluate: the `evaluate` command's function, the shipped DNA model on a genome store, against
  the same genome in a store of the format before chunk checksums (format 1, still read) with
  the checkpoint's CRC check switched off;
- a training step: a random window read from the store without a chunk cache (every read
  decodes, and checks, its chunks; a cache would hide the cost) and one optimizer step of the
  quick-start model, against the same on the format-1 store;
- saving: the training checkpoint of that model through `AtomicCheckpointIO` against Lightning's
  own `TorchCheckpointIO`, per save and spread over the steps between two saves (`--save_every`);
- loading: the CRC check alone, `torch.load`, and a SHA-256 of the weights (the other way to check
  a checkpoint: a digest recorded at save), to choose the cheaper.

Writes OUT/integrity.json and OUT/integrity.md; the target is at most 3% on the CPU for evaluate
and for a training step (checks, plus saves spread over the save interval).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from benchmarks.common import (
    TrainStep,
    command_line,
    describe_environment,
    environment_markdown,
    format_number,
    interleaved_rounds,
    markdown_table,
    publish,
    synchronize,
    write_json_file,
)
from genoformer.core import checkpoints
from genoformer.core.transformer import TransformerConfig
from genoformer.data.genome import store as genome_store
from genoformer.data.genome.datasets import RandomWindowDataset
from genoformer.genome.evaluate import evaluate
from genoformer.genome.lm import GenoformerLM, Objective
from genoformer.kernels.layout import SlidingWindow

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = REPO_ROOT / "examples"
MODEL = EXAMPLES / "genoformer_dna.ckpt"


def first_bases(fasta: Path, bases: int | None, folder: Path) -> Path:
    """`fasta` itself, or a FASTA of its first `bases` bases (record by record) in `folder`."""
    if bases is None:
        return fasta
    from genoformer.data.genome.alphabet import decode
    from genoformer.data.genome.inputs import read_sequences

    lines, left = [], bases
    for record in read_sequences(fasta):
        if left <= 0:
            break
        lines += [f">{record.name}", decode(record.codes[:left])]
        left -= record.codes.size
    path = folder / f"first_{bases}.fa"
    path.write_text("\n".join(lines) + "\n")
    return path


def build_stores(fasta: Path, folder: Path) -> dict[str, Path]:
    """The genome of `fasta` as a store with chunk checksums (format 2) and without (format 1)."""
    from zarr.codecs import BloscCodec

    folder.mkdir(parents=True, exist_ok=True)
    checked = genome_store.prepare_genome_store([fasta], folder / "checked.zarr", progress=False)
    with patched(genome_store, GENOME_FORMAT_VERSION=1,
                           _codecs=lambda name, level: (BloscCodec(cname=name, clevel=level, shuffle="bitshuffle",
                                                                   typesize=2),)):
        unchecked = genome_store.prepare_genome_store([fasta], folder / "unchecked.zarr", progress=False)
    return {"with": checked, "without": unchecked}


@contextlib.contextmanager
def patched(module: object, **values: object) -> Iterator[None]:
    """Set module attributes for the block, then put them back."""
    old = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(module, name, value)


def checkpoint_checks(on: bool) -> contextlib.AbstractContextManager:
    """The checkpoint CRC check as shipped (on) or reduced to the check that existed before it (off)."""
    if on:
        return contextlib.nullcontext()
    return patched(checkpoints, verify_checkpoint_file=checkpoints.check_checkpoint_file)


CLOCK = {"clock": time.perf_counter}
"""What `timed` reads: the wall clock on a GPU; on a CPU the process's CPU time (`main` sets it), which
the other processes of a shared machine do not inflate."""


def timed(fn) -> float:
    clock = CLOCK["clock"]
    began = clock()
    fn()
    return clock() - began


def detection(stores: dict[str, Path], folder: Path) -> dict[str, bool]:
    """The checks work here before they are timed: a byte flipped in a copy of the model and in a
    chunk of a copy of the checked store is refused."""
    import shutil

    from genoformer.data.storage import CorruptStoreError

    flipped = folder / "flipped.ckpt"
    data = bytearray(MODEL.read_bytes())
    data[len(data) // 2] ^= 0x40  # inside the largest tensors' bytes
    flipped.write_bytes(bytes(data))
    try:
        checkpoints.read_checkpoint(flipped)
        checkpoint_refused = False
    except ValueError:
        checkpoint_refused = True
    copy = folder / "flipped.zarr"
    shutil.copytree(stores["with"], copy)
    shard = copy / "contigs" / "0" / "c" / "0"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0x40  # inside the first chunk
    shard.write_bytes(bytes(data))
    try:
        genome_store.GenomeStore(copy, cache_bytes=0).read(0, 0, 1000)
        chunk_refused = False
    except CorruptStoreError:
        chunk_refused = True
    return {"flipped_checkpoint_refused": checkpoint_refused, "flipped_store_chunk_refused": chunk_refused}


# ------------------------------------------------------------------------------ evaluate
def evaluate_seconds(store: Path, checks: bool, device: str, context: int | None) -> float:
    with checkpoint_checks(checks):
        return timed(lambda: evaluate(checkpoint=MODEL, inputs=[str(store)], device=device, context=context))


# ------------------------------------------------------------------------------ training
class Training:
    """The quick-start model (configs/quickstart.yaml) and one step on a window of a store."""

    def __init__(self, device: torch.device, window: int, batch: int, stores: dict[str, Path]) -> None:
        torch.manual_seed(0)
        config = TransformerConfig(vocab_size=8, d_model=128, n_layers=2, n_heads=4, max_seq_len=window,
                                   attention=[SlidingWindow(window=1024, block_size=128)])
        self.device = device
        self.module = GenoformerLM(config, objective=Objective.CAUSAL_LM).to(device)
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=1e-4)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.batch = batch
        self.datasets = {name: RandomWindowDataset(path, window, 10_000, cache_bytes=0)
                         for name, path in stores.items()}
        self.index = 0
        self.tokens_BL: torch.Tensor | None = None
        self.step = TrainStep(lambda: self.module.loss(self.tokens_BL)[0], self.optimizer, device, dtype)

    def one_step(self, which: str) -> None:
        dataset = self.datasets[which]
        windows = [dataset[(0, (self.index + b) % len(dataset))]["tokens"] for b in range(self.batch)]
        self.index += self.batch
        self.tokens_BL = torch.stack(windows).long().to(self.device)
        self.step.step()
        synchronize(self.device)

    def read_seconds(self, which: str, windows: int = 2000) -> float:
        """Seconds per window read alone (the part of a step the chunk checks touch)."""
        dataset = self.datasets[which]
        return timed(lambda: [dataset[(1, i)] for i in range(windows)]) / windows

    def training_checkpoint(self) -> dict:
        """What a training checkpoint holds: the weights and the optimizer's state."""
        return {"state_dict": self.module.state_dict(), "optimizer_states": [self.optimizer.state_dict()],
                "global_step": self.index}


def save_seconds(checkpoint: dict, folder: Path, atomic: bool) -> float:
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    plugin = checkpoints.AtomicCheckpointIO() if atomic else TorchCheckpointIO()
    began = time.perf_counter()  # the wall clock: a save waits for the disk (fsync), which is no CPU time
    plugin.save_checkpoint(checkpoint, folder / ("atomic.ckpt" if atomic else "lightning.ckpt"))
    return time.perf_counter() - began


def load_seconds(path: Path) -> dict[str, float]:
    state = torch.load(path, map_location="cpu", weights_only=True)

    def digest() -> None:
        h = hashlib.sha256()
        for tensor in state["state_dict"].values():
            h.update(tensor.contiguous().view(torch.uint8).numpy())
    return {"load_crc_check": timed(lambda: checkpoints.verify_checkpoint_file(path)),
            "load_torch": timed(lambda: torch.load(path, map_location="cpu", weights_only=True)),
            "load_sha256_of_weights": timed(digest)}


# ------------------------------------------------------------------------------ report
def overhead(with_checks: float, without: float) -> float:
    return 100.0 * (with_checks - without) / without


def from_parts(seconds: dict[str, float], batch: int, save_every: int) -> dict[str, float]:
    """The checks' cost as a percentage of the work without them, from the parts they touch
    (timed on their own, many times over): for evaluate the checkpoint's CRC check (its one store
    read of the genome adds a few microseconds); for a training step the window reads, and the
    saves spread over the steps between two. The whole runs with and without differ by less than
    the noise of timing them on a shared machine; the parts do not."""
    reads = (seconds["read_with"] - seconds["read_without"]) * batch
    saves = (seconds["save_atomic"] - seconds["save_lightning"]) / save_every
    return {"evaluate": 100.0 * seconds["load_crc_check"] / seconds["evaluate_without"],
            "training_step": 100.0 * reads / seconds["step_without"],
            "training_step_with_saves": 100.0 * (reads + saves) / seconds["step_without"]}


def render(summary: dict) -> str:
    """The markdown report of a summary `main` wrote (integrity.json)."""
    m = summary["seconds"]
    save_every = summary["save_every"]
    step_with = m["step_with"] + m["save_atomic"] / save_every
    step_without = m["step_without"] + m["save_lightning"] / save_every

    def row(what: str, without: float, with_checks: float, unit: str, scale: float, digits: int = 1) -> dict:
        return {"measured": what, "without checks": f"{without * scale:.{digits}f} {unit}",
                "with checks": f"{with_checks * scale:.{digits}f} {unit}",
                "overhead": f"{overhead(with_checks, without):+.2f}%"}

    parts = summary["overhead_percent_from_parts"]
    reads_us = (m["read_with"] - m["read_without"]) * 1e6 * summary["batch"]
    from_the_parts = [
        {"measured": "evaluate", "the checks' cost": f"{m['load_crc_check'] * 1e3:.1f} ms (the checkpoint's CRCs)",
         "share": f"{parts['evaluate']:.3f}%"},
        {"measured": "training step",
         "the checks' cost": f"{reads_us:.1f} us (the chunk CRCs of {summary['batch']} window(s))",
         "share": f"{parts['training_step']:.4f}%"},
        {"measured": f"training step, a save every {save_every} steps",
         "the checks' cost": f"+ {(m['save_atomic'] - m['save_lightning']) * 1e3 / save_every:.2f} ms per step "
                             "(fsync and rename)",
         "share": f"{parts['training_step_with_saves']:.4f}%"},
    ]
    rows = [
        row("evaluate", m["evaluate_without"], m["evaluate_with"], "s", 1, 2),
        row("training step (window reads + step)", m["step_without"], m["step_with"], "ms", 1e3),
        row(f"training step + a checkpoint save every {save_every} steps", step_without, step_with, "ms", 1e3),
        row("one window read (no chunk cache)", m["read_without"], m["read_with"], "us", 1e6),
        row("one checkpoint save (Lightning's / atomic)", m["save_lightning"], m["save_atomic"], "ms", 1e3),
    ]
    loading = [{"reading a checkpoint": what, "time": f"{m[key] * 1e3:.2f} ms"}
               for what, key in (("CRC-32 of every record (the check used)", "load_crc_check"),
                                 ("torch.load itself", "load_torch"),
                                 ("SHA-256 of the weights (the other way, not used)", "load_sha256_of_weights"))]
    detected = ", ".join(f"{key.replace('_', ' ')}: {value}" for key, value in summary["detection"].items())
    return "\n\n".join([
        environment_markdown(summary["environment"], summary["command"]),
        f"{summary['setting']}. Best of {summary['rounds']} interleaved rounds. Checked first: {detected}.",
        "Whole runs, with the checks and without (the difference is within the noise of a shared machine):",
        markdown_table(rows),
        "The checks' cost from the parts they touch, timed on their own, against the time without them:",
        markdown_table(from_the_parts),
        f"The checkpoint is {summary['checkpoint_mib']:.1f} MiB ({MODEL.name}):",
        markdown_table(loading),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for integrity.json and integrity.md")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--genome", type=Path, help="FASTA to evaluate and train on (default: lambda phage on a "
                                                    "CPU, E. coli on a GPU, both in examples/)")
    parser.add_argument("--bases", type=int, help="evaluate and train on the genome's first BASES bases (default "
                                                   "6,000 on a CPU, all on a GPU; 0: all)")
    parser.add_argument("--context", type=int, help="evaluate's context (default: the command's own default)")
    parser.add_argument("--window", type=int, default=8192, help="training window (default 8192, the quick start's)")
    parser.add_argument("--batch", type=int, help="windows per training step (default 1 on a CPU, 8 on a GPU)")
    parser.add_argument("--steps", type=int, default=3, help="training steps timed per round (default 3)")
    parser.add_argument("--save_every", type=int, default=10,
                        help="steps between two checkpoint saves (default 10, the quick start's; most configs "
                             "save less often)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here; run with --device cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)
        CLOCK["clock"] = time.process_time
    genome = args.genome or EXAMPLES / ("ecoli_k12_mg1655.fasta.gz" if device.type == "cuda"
                                        else "lambda_phage.fasta.gz")
    batch = args.batch or (8 if device.type == "cuda" else 1)
    bases = None if args.bases == 0 else args.bases or (None if device.type == "cuda" else 6_000)
    with tempfile.TemporaryDirectory(prefix="genoformer-integrity-") as tmp:
        folder = Path(tmp)
        stores = build_stores(genome, folder / "whole")
        evaluated = stores if bases is None else build_stores(first_bases(genome, bases, folder), folder / "part")
        detected = detection(stores, folder)
        print(detected)
        if not all(detected.values()):
            raise SystemExit(f"a check missed the damage it exists for: {detected}")
        training = Training(device, args.window, batch, stores)
        for which in ("with", "without"):  # warm-up: first reads, first steps
            training.one_step(which)

        def steps(which: str) -> float:
            training.one_step(which)  # untimed: what ran before (the other measurements) leaves no trace
            return timed(lambda: [training.one_step(which) for _ in range(args.steps)]) / args.steps

        checkpoint = training.training_checkpoint()
        measures = {
            "evaluate_with": lambda: evaluate_seconds(evaluated["with"], True, args.device, args.context),
            "evaluate_without": lambda: evaluate_seconds(evaluated["without"], False, args.device, args.context),
            "step_with": lambda: steps("with"),
            "step_without": lambda: steps("without"),
            "read_with": lambda: training.read_seconds("with"),
            "read_without": lambda: training.read_seconds("without"),
            "save_atomic": lambda: save_seconds(checkpoint, folder, atomic=True),
            "save_lightning": lambda: save_seconds(checkpoint, folder, atomic=False),
            "load": lambda: load_seconds(MODEL),
        }
        seconds = interleaved_rounds(measures, args.rounds, best=min)
    part = "" if bases is None else f" (its first {bases:,} bases)"
    summary = {
        "environment": describe_environment(device), "command": command_line(), "rounds": args.rounds,
        "save_every": args.save_every, "checkpoint_mib": MODEL.stat().st_size / 2**20, "seconds": seconds,
        "detection": detected,
        "setting": (f"evaluate: {MODEL.name} on {genome.name}{part} "
                    f"({args.device}, context "
                    f"{args.context or 'default'}); training: the quick-start model (d_model 128, 2 layers, "
                    f"sliding window 1024) at {args.window} tokens on the whole genome, {batch} window(s) per step, "
                    f"{'bfloat16' if device.type == 'cuda' else 'float32'}; window reads without a chunk cache; "
                    + ("wall clock" if device.type == "cuda" else "CPU time of the process, one thread")),
    }
    summary["batch"] = batch
    summary["overhead_percent_from_parts"] = from_parts(seconds, batch, args.save_every)
    summary["overhead_percent"] = {
        "evaluate": overhead(seconds["evaluate_with"], seconds["evaluate_without"]),
        "training_step": overhead(seconds["step_with"], seconds["step_without"]),
        "training_step_with_saves": overhead(seconds["step_with"] + seconds["save_atomic"] / args.save_every,
                                             seconds["step_without"] + seconds["save_lightning"] / args.save_every),
    }
    write_json_file(args.out / "integrity.json", summary)  # kept, whatever happens to the rendering
    publish(args.out, "integrity", summary, render(summary))
    print({key: format_number(value) for key, value in summary["overhead_percent"].items()})


if __name__ == "__main__":
    main()
