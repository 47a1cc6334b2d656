"""The `genoformer` command (also `python cli.py`).

Training verbs come from LightningCLI and read YAML configs from `configs/`:

    genoformer fit --config configs/quickstart.yaml
    genoformer validate | test | predict --config ... --ckpt_path ...
    genoformer fit --config configs/genome_8k_gpu.yaml --print_config

Configs are parsed in jsonargparse's "omegaconf+" mode: `${...model.init_args.transformer.max_seq_len}`
style interpolation is resolved after the command line is applied, so overriding one value on
the command line updates everything that refers to it.

Data and inference verbs are typed functions whose `--help` comes from their docstrings:

    genoformer prepare --fasta genome.fa.gz --out genome.zarr
    genoformer prepare_timeseries --inputs ecg.csv --out ecg.zarr --time_column t_seconds
    genoformer embed --checkpoint last.ckpt --inputs genome.fa.gz --out embeddings.npz
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import Literal, Optional, Sequence, Union

from jsonargparse import CLI
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

from genoformer.data.genome_store import DEFAULT_CHUNK_SIZE, prepare_genome_store
from genoformer.data.timeseries_store import MissingPolicy, prepare_timeseries_store
from genoformer.evaluate import evaluate
from genoformer.export import export
from genoformer.embeddings import Embedder, Embeddings, Pooling, is_sequence_file_name, save_embeddings
from genoformer.kernels.dispatch import Backend
from genoformer.lightning_module import GenoformerLM
from genoformer.markov import baseline
from genoformer.timeseries_commands import evaluate_forecast, forecast

TRAINING_COMMANDS = ("fit", "validate", "test", "predict")

# The command line takes the enums' values (mean, triton), as the Python API does.
PoolingName = Literal[tuple(member.value for member in Pooling)]
BackendName = Literal[tuple(member.value for member in Backend)]


def prepare(
    *,
    fasta: Union[str, list[str]],
    out: Path,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    compressor: Literal["blosclz", "lz4", "zstd"] = "blosclz",
    compression_level: int = 3,
    keep_softmask: bool = True,
    overwrite: bool = False,
) -> Path:
    """Build a chunked zarr genome store from FASTA or GenBank files (plain, .gz, .xz, .bz2).

    The store is written under a temporary name, verified, then renamed: an interrupted run
    leaves nothing that reads as complete, and re-running with the same inputs is a no-op.

    Args:
        fasta: Input file, or several as a list ("[a.fa,b.fa.gz]" or --fasta a.fa --fasta+ b.fa). Record names
            must be unique across all files.
        out: Store directory to create, conventionally ending in .zarr.
        chunk_size: Bases per chunk, the unit of decoding and caching (16 Ki suits windows of
            8 Ki to 128 Ki bases).
        compressor: Blosc compressor after bit-shuffling: blosclz decodes fastest (about 0.27
            bytes per base); zstd is about 4% smaller and 2.5 times slower to decode.
        compression_level: Compression level, 1 (fastest) to 9 (smallest).
        keep_softmask: Keep lowercase (soft-masked) positions as a separate mask.
        overwrite: Always rebuild. Without it, a complete store built from the same files with the
            same options is kept as it is, and any other existing `out` is an error.
    """
    path = prepare_genome_store(
        [fasta] if isinstance(fasta, str) else fasta,
        out,
        chunk_size=chunk_size,
        compressor=compressor,
        compression_level=compression_level,
        keep_softmask=keep_softmask,
        overwrite=overwrite,
    )
    print(f"genome store ready: {path}")
    return path


def prepare_timeseries(
    *,
    inputs: Union[str, list[str]],
    out: Path,
    sampling_rate: Optional[float] = None,
    time_column: Optional[str] = None,
    missing: MissingPolicy = "error",
    npy_channels_first: bool = False,
    overwrite: bool = False,
) -> Path:
    """Build a chunked zarr time-series store from CSV or .npy files (one series per file).

    Args:
        inputs: Input file (.csv with a header row, or .npy), or several as a list ("[a.csv,b.csv]");
            all must have the same channels.
        out: Store directory to create, conventionally ending in .zarr.
        sampling_rate: Samples per second; required unless time_column gives the times.
        time_column: CSV column with the time in seconds (not stored as a channel).
        missing: What to do with empty or NaN values: error, ffill, zero or linear.
        npy_channels_first: .npy arrays are (channels, time) instead of (time, channels).
        overwrite: Replace an existing store.
    """
    path = prepare_timeseries_store(
        [inputs] if isinstance(inputs, str) else inputs,
        out,
        sampling_rate=sampling_rate,
        time_column=time_column,
        missing=missing,
        npy_channels_first=npy_channels_first,
        overwrite=overwrite,
    )
    print(f"time-series store ready: {path}")
    return path


def embed(
    *,
    checkpoint: Path,
    inputs: Union[str, list[str]],
    out: Path,
    pooling: PoolingName = "mean",
    layer: int = -1,
    batch_size: int = 8,
    window: Optional[int] = None,
    overlap: Optional[int] = None,
    device: Optional[str] = None,
    backend: BackendName = "auto",
) -> Path:
    """Embed sequences with a trained checkpoint and write them, with their names, to a file.

    The output is .npz (numpy.load) or .zarr (zarr.open_group): `names`, `embeddings` (N, E)
    when pooled, or all tokens (sum of lengths, E) with `offsets` when pooling is none.

    Args:
        checkpoint: A .ckpt file written by `genoformer fit`.
        inputs: A FASTA/GenBank file or a literal DNA string, or several as a list ("[a.fa,ACGT]").
            Outputs keep the input order; a string is named seqI after its place I in the list,
            a record by its id; names must be unique.
        out: Output file, ending in .npz or .zarr.
        pooling: One vector per sequence (mean, max, first, last) or per token (none).
        layer: Hidden state to read: 0 is the token embeddings, -1 the last block.
        batch_size: Windows per forward pass.
        window: Window length for long sequences; default the trained context.
        overlap: Tokens shared by neighbouring windows; default window // 4.
        device: cpu, cuda or cuda:N; default CUDA when available.
        backend: Attention backend; auto picks the fastest for the device (on CUDA the model runs
            under bfloat16 autocast, which the Triton kernels need).
    """
    embedder = Embedder.from_checkpoint(checkpoint, device=device, backend=Backend(backend))
    options = dict(pooling=Pooling(pooling), layer=layer, batch_size=batch_size, window=window, overlap=overlap)
    items = [inputs] if isinstance(inputs, str) else list(inputs)
    names: list[str] = []
    arrays: list = []
    start = 0
    while start < len(items):
        if is_sequence_file_name(items[start]):
            part = embedder.embed(Path(items[start]), **options)
            names += part.names
            end = start + 1
        else:  # a run of literal strings goes through in one call, so they share batches
            end = start
            while end < len(items) and not is_sequence_file_name(items[end]):
                end += 1
            part = embedder.embed(items[start:end], **options)
            names += [f"seq{index}" for index in range(start, end)]
        arrays += part.arrays
        start = end
    repeated = sorted(name for name, count in Counter(names).items() if count > 1)
    if repeated:
        raise ValueError(f"sequence names must be unique in one output file; repeated: {repeated[:5]}. "
                         "Rename the records, or embed the files into separate outputs.")
    result = Embeddings(names, arrays, Pooling(pooling), layer)
    path = save_embeddings(result, out)
    print(f"wrote {len(result)} embeddings to {path}")
    return path


TOOL_COMMANDS = {
    "prepare": prepare,
    "prepare_timeseries": prepare_timeseries,
    "embed": embed,
    "evaluate": evaluate,
    "baseline": baseline,
    "export": export,
    "forecast": forecast,
    "evaluate_forecast": evaluate_forecast,
}


class GenoformerCLI(LightningCLI):
    """LightningCLI whose validate, test and predict runs log beside the training run.

    The shipped configs log straight into `trainer.default_root_dir` (a CSVLogger with an empty
    name and version), which is where `fit` writes metrics.csv, config.yaml, loss.png and the
    checkpoints. Run with the same config, `validate`, `test` and `predict` would overwrite those
    files, so their logger version becomes the subcommand: `<run dir>/test/metrics.csv`,
    `<run dir>/predict/predictions.npz`, each with its own config.yaml.
    """

    def add_arguments_to_parser(self, parser) -> None:
        # A config without model.class_path trains a GenoformerLM; time-series configs name
        # genoformer.timeseries_module.TimeSeriesForecaster.
        parser.set_defaults({"model": {"class_path": f"{GenoformerLM.__module__}.{GenoformerLM.__qualname__}"}})

    def before_instantiate_classes(self) -> None:
        if self.subcommand in (None, "fit"):
            return
        logger = self.config[self.subcommand].trainer.logger
        init_args = getattr(logger, "init_args", None)
        if init_args is not None and "version" in init_args and not init_args.version:
            init_args.version = self.subcommand


def training_cli(args: Optional[Sequence[str]] = None, run: bool = True) -> LightningCLI:
    """LightningCLI for GenoformerLM or another LightningModule named by model.class_path (such as
    TimeSeriesForecaster); the data module is chosen in the config by class_path.

    `args` None reads the command line (sys.argv), as a console command does. With run=False
    the args take no subcommand: the model, data module and trainer are only instantiated.
    """
    return GenoformerCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        parser_kwargs={"parser_mode": "omegaconf+"},
        save_config_kwargs={"overwrite": True},
        args=None if args is None else list(args),
        run=run,
    )


def _usage() -> str:
    lines = [
        "usage: genoformer COMMAND [options]   (python cli.py COMMAND ... is the same)",
        "",
        "Training (LightningCLI; every option can come from a YAML file with --config):",
    ]
    for name in TRAINING_COMMANDS:
        lines.append(f"  {name:<20}{_TRAINING_HELP[name]}")
    lines += ["", "Data and inference:"]
    for name, function in TOOL_COMMANDS.items():
        lines.append(f"  {name:<20}{function.__doc__.strip().splitlines()[0]}")
    lines += ["", "Run `genoformer COMMAND --help` for the options of one command."]
    return "\n".join(lines)


_TRAINING_HELP = {
    "fit": "Train a model (e.g. --config configs/quickstart.yaml).",
    "validate": "Run one evaluation epoch on the validation split.",
    "test": "Run one evaluation epoch on the test split.",
    "predict": "Run inference on the predict split.",
}


def main(args: Optional[Sequence[str]] = None) -> None:
    """Entry point of `genoformer` and `python cli.py`."""
    argv = list(sys.argv[1:] if args is None else args)
    from_command_line = args is None
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return
    command = argv[0]
    if command not in TOOL_COMMANDS and command not in TRAINING_COMMANDS:
        print(f"genoformer: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        raise SystemExit(2)
    try:
        if command in TOOL_COMMANDS:
            CLI(TOOL_COMMANDS[command], args=argv[1:], as_positional=False)
        else:
            training_cli(None if from_command_line else argv)
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        # Bad input (a missing or malformed file, a wrong option value): its message says what to
        # do, so show that rather than a traceback, unless asked for the traceback.
        if os.environ.get("GENOFORMER_TRACEBACK"):
            raise
        print(f"genoformer {command}: error: {error}\n(set GENOFORMER_TRACEBACK=1 to see the traceback)", file=sys.stderr)
        raise SystemExit(1) from error
