"""What the integrity checks cost: `genoformer evaluate` and a training step with them and without.

    python -m benchmarks.integrity --out benchmarks/results                # CPU, about 4 CPU-minutes
    python -m benchmarks.integrity --device cuda --name integrity_gpu --out $OUT   # GPU: gpu_training.sh integrity

The checks (docs/reliability.md): every checkpoint read is verified against its zip CRC-32s, every
chunk read from a genome store against its CRC32C, and every checkpoint is saved through the one
atomic writer (a temporary beside the file, fsync, rename). First a flipped byte in a checkpoint
and in a store chunk must be refused here (else the run fails before timing anything). Then each
is measured with the checks and without, in rotating rounds (`benchmarks.common.rotating_rounds`;
the best of each, and its spread over the rounds), on the same data; on a CPU in one thread, timed by the
process's CPU time (on a shared machine the wall clock moves with the other processes' load by
more than the checks cost), on a GPU by the wall clock; saves always by the wall clock (they wait
for the disk):

- evaluate: the `evaluate` command's function, the shipped DNA model on a genome store, against
  the same genome in a store of the format before chunk checksums (format 1, still read) with
  the checkpoint's CRC check switched off;
- a training step: a random window read from the store without a chunk cache (every read
  decodes, and checks, its chunks; a cache would hide the cost) and one optimizer step of the
  quick-start model, against the same on the format-1 store;
- saving: the training checkpoint of that model through `AtomicCheckpointIO` against Lightning's
  own `TorchCheckpointIO`, per save and spread over the steps between two saves (`--save_every`);
- the parts the checks touch, timed alone many times over (the whole runs differ by less than
  the noise of timing them on a shared machine; the parts do not): the checkpoint's CRC check,
  reading the evaluated genome from each store, one window read from each store;
- loading: the CRC check alone, `torch.load`, and a SHA-256 of the weights (the other way to check
  a checkpoint: a digest recorded at save), to choose the cheaper.

The targets (at most 3% of evaluate's time and of a training step's, saves spread over the save
interval included) are judged on the parts' cost against the time without the checks; the whole
runs' ratio with/without is the cross-check beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from genoformer.data.genome import store as genome_store
from genoformer.data.genome.datasets import RandomWindowDataset
from genoformer.kernels.layout import SlidingWindow

from benchmarks.common import Benchmark, Summary, TrainStep, at_most, rotating_rounds, synchronize, table
from genoformer.core import checkpoints
from genoformer.core.transformer import TransformerConfig
from genoformer.genome.evaluate import evaluate
from genoformer.genome.lm import GenoformerLM, Objective

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
    with patched(
        genome_store,
        GENOME_FORMAT_VERSION=1,
        _codecs=lambda name, level: (BloscCodec(cname=name, clevel=level, shuffle="bitshuffle", typesize=2),),
    ):
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


Clock = Callable[[], float]


def timed(fn: Callable[[], object], clock: Clock, repeats: int = 1) -> float:
    """Seconds per call of `fn` by `clock`, over `repeats` calls."""
    began = clock()
    for _ in range(repeats):
        fn()
    return (clock() - began) / repeats


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
    except checkpoints.DamagedCheckpointError:
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
def evaluate_seconds(store: Path, checks: bool, device: str, context: int | None, clock: Clock) -> float:
    with checkpoint_checks(checks):
        return timed(lambda: evaluate(checkpoint=MODEL, inputs=[str(store)], device=device, context=context), clock)


def genome_read_seconds(store: Path, clock: Clock, repeats: int = 20) -> float:
    """Seconds to read every contig of a store whole without a chunk cache (what evaluate reads)."""
    genome = genome_store.GenomeStore(store, cache_bytes=0)
    return timed(lambda: [genome.read(c.index, 0, c.length) for c in genome.contigs], clock, repeats)


# ------------------------------------------------------------------------------ training
class Training:
    """The quick-start model (configs/quickstart.yaml) and one step on a window of a store."""

    def __init__(self, device: torch.device, window: int, batch: int, stores: dict[str, Path], clock: Clock) -> None:
        torch.manual_seed(0)
        config = TransformerConfig(
            vocab_size=8,
            d_model=128,
            n_layers=2,
            n_heads=4,
            max_seq_len=window,
            attention=[SlidingWindow(window=min(1024, window), block_size=128)],
        )
        self.device, self.batch, self.clock = device, batch, clock
        self.module = GenoformerLM(config, objective=Objective.CAUSAL_LM).to(device)
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=1e-4)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.datasets = {
            name: RandomWindowDataset(path, window, 10_000, cache_bytes=0) for name, path in stores.items()
        }
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

    def step_seconds(self, which: str, steps: int) -> float:
        """Seconds per step (window reads + optimizer step), after one untimed step: what ran before
        (the other measurements) leaves no trace."""
        self.one_step(which)
        return timed(lambda: self.one_step(which), self.clock, steps)

    def read_seconds(self, which: str, windows: int) -> float:
        """Seconds per window read alone (the part of a step the chunk checks touch)."""
        dataset = self.datasets[which]
        reads = iter(range(10**9))
        return timed(lambda: dataset[(1, next(reads) % len(dataset))], self.clock, windows)

    def training_checkpoint(self) -> dict:
        """What a training checkpoint holds: the weights and the optimizer's state."""
        return {
            "state_dict": self.module.state_dict(),
            "optimizer_states": [self.optimizer.state_dict()],
            "global_step": self.index,
        }


def save_seconds(checkpoint: dict, folder: Path, atomic: bool, repeats: int) -> float:
    """Seconds per save by the wall clock (a save waits for the disk, fsync included, which is no CPU
    time), over `repeats` saves replacing the file of the one before."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    plugin = checkpoints.AtomicCheckpointIO() if atomic else TorchCheckpointIO()
    return timed(
        lambda: plugin.save_checkpoint(checkpoint, folder / ("atomic.ckpt" if atomic else "lightning.ckpt")),
        time.perf_counter,
        repeats,
    )


def load_seconds(path: Path, clock: Clock, repeats: int) -> dict[str, float]:
    """Per read of the checkpoint: its CRC check, torch.load, and a SHA-256 of its weights."""
    state = torch.load(path, map_location="cpu", weights_only=True)

    def digest() -> None:
        h = hashlib.sha256()
        for tensor in state["state_dict"].values():
            h.update(tensor.contiguous().view(torch.uint8).numpy())

    return {
        "load_crc_check": timed(lambda: checkpoints.verify_checkpoint_file(path), clock, repeats),
        "load_torch": timed(lambda: torch.load(path, map_location="cpu", weights_only=True), clock, repeats),
        "load_sha256_of_weights": timed(digest, clock, repeats),
    }


# ------------------------------------------------------------------------------ measure
def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="device to measure (default cpu)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5; 1 with --smoke)")
    parser.add_argument(
        "--genome",
        type=Path,
        help="FASTA to evaluate and train on (default: lambda phage on a CPU, E. coli on a GPU, both in examples/)",
    )
    parser.add_argument(
        "--bases",
        type=int,
        help="evaluate the genome's first BASES bases (default 6,000 on a "
        "CPU, 1,000,000 on a GPU; 0: all); training reads the whole genome",
    )
    parser.add_argument("--context", type=int, help="evaluate's context (default: the command's own default)")
    parser.add_argument("--window", type=int, help="training window (default 8192, the quick start's)")
    parser.add_argument("--batch", type=int, help="windows per training step (default 1 on a CPU, 8 on a GPU)")
    parser.add_argument("--steps", type=int, default=3, help="training steps timed per round (default 3)")
    parser.add_argument(
        "--save_every",
        type=int,
        default=10,
        help="steps between two checkpoint saves (default 10, the quick start's; most configs save less often)",
    )


def measure(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    clock: Clock = time.perf_counter
    if device.type == "cpu":
        torch.set_num_threads(1)
        clock = time.process_time
    genome = args.genome or EXAMPLES / (
        "ecoli_k12_mg1655.fasta.gz" if device.type == "cuda" else "lambda_phage.fasta.gz"
    )
    batch = args.batch or (8 if device.type == "cuda" else 1)
    bases = (
        None
        if args.bases == 0
        else args.bases or (1_000_000 if device.type == "cuda" else 2_000 if args.smoke else 6_000)
    )
    window = args.window or (512 if args.smoke else 8192)
    context = args.context or (512 if args.smoke else None)
    rounds = args.rounds or (1 if args.smoke else 5)
    steps = 1 if args.smoke else args.steps
    repeats = 2 if args.smoke else 20  # of the parts timed alone
    with tempfile.TemporaryDirectory(prefix="genoformer-integrity-") as tmp:
        folder = Path(tmp)
        part = None if bases is None else first_bases(genome, bases, folder)
        stores = build_stores(part if args.smoke and part else genome, folder / "whole")
        evaluated = stores if part is None or args.smoke else build_stores(part, folder / "part")
        detected = detection(stores, folder)
        print(detected, flush=True)
        if not all(detected.values()):
            return {"detection": detected}
        training = Training(device, window, batch, stores, clock)
        for which in ("with", "without"):  # warm-up: first reads, first steps
            training.one_step(which)
        checkpoint = training.training_checkpoint()
        measures = {
            "evaluate_with": lambda: evaluate_seconds(evaluated["with"], True, args.device, context, clock),
            "evaluate_without": lambda: evaluate_seconds(evaluated["without"], False, args.device, context, clock),
            "genome_read_with": lambda: genome_read_seconds(evaluated["with"], clock, repeats),
            "genome_read_without": lambda: genome_read_seconds(evaluated["without"], clock, repeats),
            "step_with": lambda: training.step_seconds("with", steps),
            "step_without": lambda: training.step_seconds("without", steps),
            "read_with": lambda: training.read_seconds("with", 100 * repeats),
            "read_without": lambda: training.read_seconds("without", 100 * repeats),
            "save_atomic": lambda: save_seconds(checkpoint, folder, True, max(1, repeats // 4)),
            "save_lightning": lambda: save_seconds(checkpoint, folder, False, max(1, repeats // 4)),
            "load": lambda: load_seconds(MODEL, clock, repeats),
        }
        every_round = by_round(rotating_rounds(measures, rounds))
    return {
        "detection": detected,
        "seconds": {key: min(values) for key, values in every_round.items()},
        "rounds_seconds": every_round,
        "device": device.type,
        "rounds": rounds,
        "batch": batch,
        "save_every": args.save_every,
        "checkpoint_mib": MODEL.stat().st_size / 2**20,
        "setting": (
            f"evaluate: {MODEL.name} on {genome.name}"
            + ("" if bases is None else f" (its first {bases:,} bases)")
            + f", context {context or 'default'}; training: the quick-start model (d_model 128, 2 layers, "
            f"sliding window {min(1024, window)}) at {window} tokens on the "
            + ("same bases" if args.smoke and part else "whole genome")
            + f", {batch} window(s) per step, {'bfloat16' if device.type == 'cuda' else 'float32'}; window "
            "reads without a chunk cache; timed by "
            + ("the wall clock" if device.type == "cuda" else "the process's CPU time, one thread")
            + " (saves by the wall clock)"
        ),
    }


def by_round(kept: dict[str, list]) -> dict[str, list[float]]:
    """`rotating_rounds`' results with the measurements that return several values split by name."""
    values: dict[str, list[float]] = {}
    for name, results in kept.items():
        for result in results:
            for key, value in result.items() if isinstance(result, dict) else [(name, result)]:
                values.setdefault(key, []).append(value)
    return values


# ------------------------------------------------------------------------------ summarize
def spread(values: list[float]) -> float:
    """How far a measurement moved over the rounds: (slowest - fastest) / fastest, in %."""
    return 100.0 * (max(values) - min(values)) / min(values)


def percent(with_checks: float, without: float) -> float:
    return 100.0 * (with_checks - without) / without


def from_parts(seconds: dict[str, float], batch: int, save_every: int) -> dict[str, float]:
    """The checks' cost in % of the work without them, from the parts they touch: for evaluate
    the checkpoint's CRC check and the chunk CRCs of reading the evaluated genome; for a training
    step the chunk CRCs of its window reads, and with saves the atomic save's extra time spread
    over the steps between two saves."""
    evaluate_cost = seconds["load_crc_check"] + seconds["genome_read_with"] - seconds["genome_read_without"]
    reads = (seconds["read_with"] - seconds["read_without"]) * batch
    saves = (seconds["save_atomic"] - seconds["save_lightning"]) / save_every
    return {
        "evaluate": 100.0 * evaluate_cost / seconds["evaluate_without"],
        "training_step": 100.0 * reads / seconds["step_without"],
        "training_step_with_saves": 100.0 * (reads + saves) / seconds["step_without"],
    }


def summarize(data: dict) -> Summary:
    detected = data["detection"]
    caught = ", ".join(f"{key.replace('_', ' ')}: {'yes' if value else 'NO'}" for key, value in detected.items())
    if not all(detected.values()):
        return Summary(notes=[f"A check missed the damage it exists for, nothing timed ({caught})."], failed=True)
    m, batch, save_every = data["seconds"], data["batch"], data["save_every"]
    parts = from_parts(m, batch, save_every)
    step_with = m["step_with"] + m["save_atomic"] / save_every
    step_without = m["step_without"] + m["save_lightning"] / save_every

    every_round = data.get("rounds_seconds", {})

    def whole(what: str, without: float, with_checks: float, scale: float, unit: str, key: str = "") -> dict:
        moved = [
            spread(every_round[f"{key}_{which}"]) for which in ("with", "without") if f"{key}_{which}" in every_round
        ]
        return {
            "measured": what,
            "without checks": f"{without * scale:.4g} {unit}",
            "with checks": f"{with_checks * scale:.4g} {unit}",
            "with / without": with_checks / without,
            "overhead %": percent(with_checks, without),
            "spread over the rounds %": max(moved) if moved else None,
        }

    wholes = [
        whole("evaluate", m["evaluate_without"], m["evaluate_with"], 1, "s", "evaluate"),
        whole("training step (window reads + step)", m["step_without"], m["step_with"], 1e3, "ms", "step"),
        whole(f"training step + a checkpoint save every {save_every} steps", step_without, step_with, 1e3, "ms"),
        whole(
            "reading the evaluated genome (no chunk cache)",
            m["genome_read_without"],
            m["genome_read_with"],
            1e3,
            "ms",
            "genome_read",
        ),
        whole("one window read (no chunk cache)", m["read_without"], m["read_with"], 1e6, "us", "read"),
        whole("one checkpoint save (Lightning's / atomic)", m["save_lightning"], m["save_atomic"], 1e3, "ms"),
    ]
    genome_us = (m["genome_read_with"] - m["genome_read_without"]) * 1e6
    reads_us = (m["read_with"] - m["read_without"]) * 1e6 * batch
    shares = [
        {
            "measured": "evaluate",
            "the checks' cost": f"{m['load_crc_check'] * 1e3:.2f} ms (the checkpoint's CRCs) + {genome_us:.0f} us "
            "(the genome's chunk CRCs)",
            "of the time without": f"{m['evaluate_without']:.3g} s",
            "share %": parts["evaluate"],
        },
        {
            "measured": "training step",
            "the checks' cost": f"{reads_us:.1f} us (the chunk CRCs of {batch} window(s))",
            "of the time without": f"{m['step_without'] * 1e3:.4g} ms",
            "share %": parts["training_step"],
        },
        {
            "measured": f"training step, a save every {save_every} steps",
            "the checks' cost": f"{(m['save_atomic'] - m['save_lightning']) * 1e3 / save_every:+.2f} ms per step (the "
            f"atomic save against Lightning's, {m['save_atomic'] * 1e3:.1f} against "
            f"{m['save_lightning'] * 1e3:.1f} ms, over {save_every} steps)",
            "of the time without": f"{m['step_without'] * 1e3:.4g} ms",
            "share %": parts["training_step_with_saves"],
        },
    ]
    loading = [
        {"reading a checkpoint": what, "ms": m[key] * 1e3}
        for what, key in (
            ("CRC-32 of every record (the check used)", "load_crc_check"),
            ("torch.load itself", "load_torch"),
            ("SHA-256 of the weights (the other way, not used)", "load_sha256_of_weights"),
        )
    ]
    on = "on the GPU" if data["device"] == "cuda" else "on the CPU"
    return Summary(
        tables=[
            table(
                shares,
                "The checks' cost from the parts they touch, timed alone, against the time without "
                "them (what the targets judge):",
                digits=3,
            ),
            table(
                wholes,
                "Whole runs with the checks and without, same data, same run, the best of each (a "
                "difference below the spread of the same measurement over the rounds is noise of "
                "the shared machine):",
                digits=4,
            ),
            table(loading, f"Reading the {data['checkpoint_mib']:.1f} MiB checkpoint {MODEL.name}:", headline=False),
        ],
        targets=[
            at_most(f"the checks cost at most 3% of evaluate's time {on}", parts["evaluate"], 3.0, unit="%"),
            at_most(
                f"the checks cost at most 3% of a training step's time {on}, saves included",
                parts["training_step_with_saves"],
                3.0,
                unit="%",
            ),
        ],
        notes=[f"{data['setting']}. Best of {data['rounds']} rotating rounds.", f"Checked first: {caught}."],
    )


BENCHMARK = Benchmark(
    "integrity",
    "Integrity checks: what they cost",
    __doc__,
    measure,
    summarize,
    baseline="the same work without the checks: a store without chunk checksums (format 1), "
    "no checkpoint CRC check, Lightning's own checkpoint save",
    arguments=arguments,
)

if __name__ == "__main__":
    BENCHMARK.main()
