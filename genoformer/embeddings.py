"""Embeddings from a trained genoformer model: load a checkpoint, embed sequences, save them.

    embedder = Embedder.from_checkpoint("runs/last.ckpt")
    result = embedder.embed("genes.fa.gz", pooling="mean", layer=-1)
    save_embeddings(result, "genes.npz")

Sequences longer than the window (default: the context the model was trained on) are cut into
windows that overlap by `overlap` tokens, all of the same length (the last one ends at the
sequence end). Every position takes its vector from the window whose centre is nearest, i.e.
where it sits farthest from a window edge (centre-crop stitching). Pooled vectors are computed
over the stitched per-token vectors, so they do not depend on how a sequence was tiled or
batched. A batch only holds windows of one length: no padding, so results never depend on what
else is in the batch.

Shape legend: B batch, W window length, E model width, L sequence length.
"""

from __future__ import annotations

import dataclasses
import enum
import pickle
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
import zarr
from Bio.SeqRecord import SeqRecord
from tqdm.auto import tqdm

from genoformer.data.alphabet import TOKEN_CODES, encode
from genoformer.data.hints import option
from genoformer.data.seqfiles import SEQUENCE_FILE_SUFFIXES, is_sequence_file_name, read_records
from genoformer.data.storage import atomic_build
from genoformer.data.tiling import Keep, same_length_batches, tile_windows
from genoformer.kernels.dispatch import Backend
from genoformer.lightning_module import canonical_state_dict
from genoformer.model import Transformer, TransformerConfig

Inputs = Union[str, Path, SeqRecord, Iterable[Union[str, SeqRecord]]]


class Pooling(str, enum.Enum):
    """How per-token vectors of one sequence become its embedding."""

    MEAN = "mean"
    """Mean over all positions: (E,)."""
    MAX = "max"
    """Element-wise maximum over all positions: (E,)."""
    FIRST = "first"
    """The first position: (E,). With causal attention it has seen one base only."""
    LAST = "last"
    """The last position: (E,). With causal attention it has seen the whole window."""
    NONE = "none"
    """Every position: (L, E)."""


@dataclasses.dataclass(frozen=True)
class Embeddings:
    """Embeddings of named sequences, in input order."""

    names: list[str]
    arrays: list[np.ndarray]
    """float32: (E,) per sequence when pooled, (L_i, E) per sequence for Pooling.NONE."""
    pooling: Pooling
    layer: int
    """Hidden state the vectors come from (0 = token embeddings, -1 = last layer)."""

    def __len__(self) -> int:
        return len(self.names)

    def stack(self) -> np.ndarray:
        """Pooled embeddings as one float32 matrix (N, E)."""
        if self.pooling is Pooling.NONE:
            raise ValueError("per-token embeddings have different lengths; use .arrays (or pool them).")
        return np.stack(self.arrays)


class Embedder:
    """Runs a `Transformer` in eval mode over sequences of any length (see the module docstring)."""

    def __init__(
        self,
        model: Transformer,
        *,
        window: int,
        device: Optional[Union[str, torch.device]] = None,
        autocast_dtype: Optional[torch.dtype] = None,
    ) -> None:
        """
        Args:
            model: the trained network.
            window: default window length in tokens (at most model.config.max_seq_len).
            device: where to run; None: CUDA when available, else CPU.
            autocast_dtype: run the model under torch.autocast with this dtype; None: bfloat16 on
                CUDA (as training does, and as the Triton kernels need), full float32 on the CPU.
                Outputs are float32 either way.
        """
        if not 0 < window <= model.config.max_seq_len:
            raise ValueError(f"window must be in [1, max_seq_len={model.config.max_seq_len}], got {window}.")
        self.device = inference_device(device)
        self.model = model.to(self.device).eval()
        self.window = window
        self.autocast_dtype = default_autocast_dtype(self.device, autocast_dtype)

    @classmethod
    def from_checkpoint(
        cls,
        path: Union[str, Path],
        device: Optional[Union[str, torch.device]] = None,
        backend: Backend = Backend.AUTO,
        autocast_dtype: Optional[torch.dtype] = None,
    ) -> Embedder:
        """Load a GenoformerLM Lightning checkpoint (.ckpt) for embedding.

        Args:
            path: the checkpoint file.
            device: where to run; None: CUDA when available, else CPU.
            backend: attention backend to run with (the training backend may not exist here);
                AUTO picks per device.
            autocast_dtype: see `Embedder`; None: bfloat16 autocast on CUDA, float32 on the CPU.
        """
        checkpoint, hparams = read_model_checkpoint(
            path, "transformer", "GenoformerLM",
            "pass a checkpoint written by training a genoformer.lightning_module.GenoformerLM.",
        )
        config = dataclasses.replace(
            TransformerConfig.from_dict(hparams["transformer"]),
            attention_backend=Backend(backend),
            activation_checkpointing=False,
        )
        alphabet = checkpoint.get("alphabet", TOKEN_CODES)
        if alphabet != TOKEN_CODES:
            raise ValueError(f"{path}: the model reads the token codes {alphabet}, this genoformer encodes "
                             f"{TOKEN_CODES}; embed with the genoformer version that trained it")
        model = Transformer(config)
        prefix = "model."
        state_dict = canonical_state_dict(checkpoint["state_dict"])
        model.load_state_dict({k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)})
        window = min(checkpoint.get("trained_seq_len") or config.max_seq_len, config.max_seq_len)
        return cls(model, window=window, device=device, autocast_dtype=autocast_dtype)

    @torch.inference_mode()
    def embed(
        self,
        inputs: Inputs,
        *,
        pooling: Union[Pooling, str] = Pooling.MEAN,
        layer: int = -1,
        batch_size: int = 8,
        overlap: Optional[int] = None,
        window: Optional[int] = None,
        progress: bool = True,
    ) -> Embeddings:
        """Embed sequences.

        Args:
            inputs: a sequence string; a path (str ending in .fa/.fasta/.fna/... optionally .gz,
                or any pathlib.Path) to a FASTA/GenBank file; a Bio SeqRecord; or a list of
                strings / SeqRecords. Strings are named seq0, seq1, ...; records by their id.
            pooling: "mean", "max", "first", "last" (one (E,) vector per sequence) or "none"
                (an (L, E) array per sequence).
            layer: hidden state to read: 0 = token embeddings, i = after block i, -1 = last
                block (after the final norm); negative values count from the end.
            batch_size: windows per forward pass.
            overlap: tokens shared by neighbouring windows; default window // 4. Each position
                keeps at least overlap // 2 tokens of context on both sides (except at sequence ends).
            window: window length; default the trained context (at most max_seq_len).
            progress: show a tqdm progress bar over windows.
        """
        pooling = Pooling(pooling)
        window = self.window if window is None else window
        if not 0 < window <= self.model.config.max_seq_len:
            raise ValueError(f"window must be in [1, max_seq_len={self.model.config.max_seq_len}], got {window}.")
        overlap = window // 4 if overlap is None else overlap
        if not 0 <= overlap < window:
            raise ValueError(f"overlap must be in [0, window={window}), got {overlap}.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
        self.model.resolve_layer(layer)  # IndexError now rather than after reading the inputs

        named = list(read_sequences(inputs))
        if not named:
            raise ValueError("no sequences to embed: the input is empty.")
        names = [name for name, _ in named]
        check_unique_names(names)
        sequences = [codes for _, codes in named]
        pools = [_Pool(pooling, len(codes), self.model.config.d_model) for codes in sequences]

        tiles = [
            (index, tile)
            for index, codes in enumerate(sequences)
            for tile in tile_windows(len(codes), window, overlap, Keep.CENTRE)
        ]
        tiles.sort(key=lambda item: -item[1].length)  # stable: equal lengths keep input order
        with tqdm(total=len(tiles), unit="window", disable=not progress, desc="embedding") as bar:
            for batch in same_length_batches(tiles, batch_size):
                tokens_BW = torch.from_numpy(np.stack([sequences[i][t.start : t.end] for i, t in batch]))
                with torch.autocast(
                    self.device.type, dtype=self.autocast_dtype or torch.float32, enabled=self.autocast_dtype is not None
                ):
                    hidden_BWE = self.model.hidden_state(tokens_BW.to(self.device), layer=layer)
                hidden_BWE = hidden_BWE.float().cpu().numpy()
                for (index, tile), hidden_WE in zip(batch, hidden_BWE):
                    pools[index].add(tile.keep_start, hidden_WE[tile.keep_start - tile.start : tile.keep_end - tile.start])
                bar.update(len(batch))
        return Embeddings(names, [pool.result() for pool in pools], pooling, layer)


_UNREADABLE_CHECKPOINT_ERRORS = (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, OSError)
"""What torch.load raises for a file that is not a complete checkpoint of plain values and tensors."""


def check_checkpoint_file(path: Union[str, Path]) -> Path:
    """`path` as a Path when it looks like a checkpoint file (exists, complete zip container, as
    torch.save writes); FileNotFoundError or ValueError, in our words, otherwise. Cheap: reads the
    end of the file only."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"checkpoint not found: {path}; pass the .ckpt file written by training "
            "(e.g. <run dir>/checkpoints/last.ckpt)."
        )
    if not zipfile.is_zipfile(path):
        raise _unreadable_checkpoint_error(path)
    return path


def inference_device(device: Optional[Union[str, torch.device]]) -> torch.device:
    """The device to run a trained model on: `device`, or CUDA when available, else the CPU; a
    clear error when CUDA is asked for and this torch build sees no GPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device {str(device)!r} asks for a CUDA GPU, but this torch build ({torch.__version__}) sees "
            f"none; pass {option('device', 'cpu')} to run on the CPU, or leave device unset to pick CUDA "
            "when it is available."
        )
    return resolved


def default_autocast_dtype(device: torch.device, autocast_dtype: Optional[torch.dtype]) -> Optional[torch.dtype]:
    """`autocast_dtype`, or bfloat16 on CUDA (as training runs, and as the Triton kernels need),
    None (full float32) elsewhere."""
    if autocast_dtype is None and device.type == "cuda":
        return torch.bfloat16
    return autocast_dtype


def read_checkpoint(path: Union[str, Path]) -> dict:
    """The contents of a checkpoint file written by `genoformer fit` (tensors on the CPU).

    Raises FileNotFoundError for a missing file and ValueError, in our words, for a file that
    torch cannot read (truncated, or not a checkpoint) or that holds objects other than plain
    values and tensors.
    """
    path = check_checkpoint_file(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except _UNREADABLE_CHECKPOINT_ERRORS as exc:
        raise _unreadable_checkpoint_error(path) from exc


def read_model_checkpoint(path: Union[str, Path], hparams_key: str, kind: str, hint: str) -> tuple[dict, dict]:
    """(checkpoint, its hyper_parameters) of a checkpoint whose hyperparameters hold `hparams_key`
    and which has a state_dict; otherwise ValueError naming the `kind` expected, then `hint`."""
    checkpoint = read_checkpoint(path)
    hparams = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    if not isinstance(hparams, dict) or hparams_key not in hparams or "state_dict" not in checkpoint:
        raise ValueError(
            f"{path} is not a {kind} checkpoint (no '{hparams_key}' hyperparameters or no state_dict); {hint}"
        )
    return checkpoint, hparams


def _unreadable_checkpoint_error(path: Path) -> ValueError:
    """Our message for a checkpoint file torch cannot read (rather than torch's own advice)."""
    return ValueError(
        f"{path} is not a readable genoformer checkpoint: the file is truncated (an interrupted copy or "
        "save) or was not written by `genoformer fit`. Pass a .ckpt file written by training, e.g. "
        "<run dir>/checkpoints/last.ckpt."
    )


def check_unique_names(names: list[str]) -> None:
    """Raise ValueError naming the repeated ones; outputs are keyed by sequence name."""
    repeated = sorted(name for name, count in Counter(names).items() if count > 1)
    if repeated:
        raise ValueError(f"sequence names must be unique in one result; repeated: {repeated[:5]}. "
                         "Rename the records, or embed them in separate calls.")


class _Pool:
    """Accumulates the stitched per-token vectors (L, E) of one sequence into its embedding."""

    def __init__(self, pooling: Pooling, length: int, width: int) -> None:
        self.pooling = pooling
        self.length = length
        if pooling is Pooling.NONE:
            self.value = np.empty((length, width), dtype=np.float32)
        elif pooling is Pooling.MEAN:
            self.value = np.zeros(width, dtype=np.float64)
        elif pooling is Pooling.MAX:
            self.value = np.full(width, -np.inf, dtype=np.float32)
        else:
            self.value = np.empty(width, dtype=np.float32)

    def add(self, start: int, vectors_PE: np.ndarray) -> None:
        """Positions [start, start + P) of the sequence."""
        if self.pooling is Pooling.NONE:
            self.value[start : start + len(vectors_PE)] = vectors_PE
        elif self.pooling is Pooling.MEAN:
            self.value += vectors_PE.sum(axis=0, dtype=np.float64)
        elif self.pooling is Pooling.MAX:
            np.maximum(self.value, vectors_PE.max(axis=0), out=self.value)
        elif self.pooling is Pooling.FIRST and start == 0:
            self.value[:] = vectors_PE[0]
        elif self.pooling is Pooling.LAST and start + len(vectors_PE) == self.length:
            self.value[:] = vectors_PE[-1]

    def result(self) -> np.ndarray:
        if self.pooling is Pooling.MEAN:
            return (self.value / self.length).astype(np.float32)
        return self.value


# ----------------------------------------------------------------------------------- inputs
def read_sequences(inputs: Inputs) -> Iterator[tuple[str, np.ndarray]]:
    """(name, uint8 codes) for every sequence in `inputs` (see `Embedder.embed`), in order.
    Raises ValueError naming the sequence, the bad character and its position."""
    if isinstance(inputs, Path) or (isinstance(inputs, str) and is_sequence_file_name(inputs)):
        path = Path(inputs)
        if not path.is_file():
            raise FileNotFoundError(f"sequence file not found: {path}")
        for record in read_records(path):
            yield record.name, _encode(record.name, record.sequence)
    elif isinstance(inputs, (str, SeqRecord)):
        yield _named(0, inputs)
    elif isinstance(inputs, Iterable):
        for index, item in enumerate(inputs):
            if not isinstance(item, (str, SeqRecord)):
                raise TypeError(
                    f"item {index} of the inputs is a {type(item).__name__}; a list may hold sequence "
                    "strings or Bio.SeqRecord objects (pass a file path on its own)."
                )
            yield _named(index, item)
    else:
        raise TypeError(
            f"cannot embed a {type(inputs).__name__}; pass a sequence string, a FASTA path, a "
            "Bio.SeqRecord or a list of strings / SeqRecords."
        )


def _named(index: int, item: Union[str, SeqRecord]) -> tuple[str, np.ndarray]:
    if isinstance(item, SeqRecord):
        return item.id, _encode(item.id, str(item.seq))
    return f"seq{index}", _encode(f"seq{index}", item)


def _encode(name: str, sequence: Union[str, bytes]) -> np.ndarray:
    try:
        codes = encode(sequence)
    except ValueError as exc:
        hint = ""
        if isinstance(sequence, str) and ("/" in sequence or "." in sequence):
            hint = (
                f" (a string is read as a sequence unless it ends in {', '.join(SEQUENCE_FILE_SUFFIXES)}, "
                "optionally plus .gz/.xz/.bz2; pass a pathlib.Path for other file names)"
            )
        raise ValueError(f"sequence {name!r}: {exc}{hint}") from exc
    if codes.size == 0:
        raise ValueError(f"sequence {name!r} is empty; remove it from the inputs.")
    return codes


# ----------------------------------------------------------------------------------- saving
def save_embeddings(result: Embeddings, path: Union[str, Path], *, overwrite: bool = False) -> Path:
    """Write embeddings to `path`: a .npz file or a .zarr directory.

    The output is written under a temporary name beside `path` and renamed when complete, so an
    interrupted write never leaves a partial file at `path`. An existing `path` is an error
    unless `overwrite` (then it is replaced only once the new output is complete).

    Layout (both formats): `names` (N,) strings; `embeddings` float32, (N, E) when pooled or,
    for per-token results, all sequences concatenated (sum L_i, E) with `offsets` (N + 1,) int64
    so that sequence i is embeddings[offsets[i]:offsets[i + 1]]; `pooling` and `layer`
    (npz: 0-d arrays; zarr: group attributes).
    """
    path = Path(path)
    if path.suffix not in (".npz", ".zarr"):
        raise ValueError(f"cannot tell the format of {path}: name it *.npz or *.zarr.")
    arrays = {"names": np.array(result.names, dtype=str)}
    if result.pooling is Pooling.NONE:
        arrays["embeddings"] = np.concatenate(result.arrays).astype(np.float32, copy=False)
        arrays["offsets"] = np.concatenate([[0], np.cumsum([len(a) for a in result.arrays])]).astype(np.int64)
    else:
        arrays["embeddings"] = result.stack().astype(np.float32, copy=False)
    with atomic_build(path, overwrite) as tmp:
        if path.suffix == ".npz":
            np.savez(tmp, pooling=np.array(result.pooling.value), layer=np.array(result.layer), **arrays)
        else:
            group = zarr.open_group(tmp, mode="w-")
            group.attrs.update({"pooling": result.pooling.value, "layer": result.layer})
            names = group.create_array("names", shape=arrays["names"].shape, dtype=str)
            names[:] = arrays.pop("names")
            for name, array in arrays.items():
                group.create_array(name, data=array)
    return path


def load_embeddings(path: Union[str, Path]) -> Embeddings:
    """Read what `save_embeddings` wrote."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"embeddings not found: {path}")
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as stored:
            data = {key: stored[key] for key in stored.files}
        pooling, layer = Pooling(str(data.pop("pooling"))), int(data.pop("layer"))
    elif path.suffix == ".zarr":
        group = zarr.open_group(path, mode="r")
        data = {key: group[key][:] for key in ("names", "embeddings", "offsets") if key in group}
        pooling, layer = Pooling(group.attrs["pooling"]), int(group.attrs["layer"])
    else:
        raise ValueError(f"cannot tell the format of {path}: expected *.npz or *.zarr.")
    names = [str(name) for name in data["names"]]
    if pooling is Pooling.NONE:
        offsets = data["offsets"]
        arrays = [data["embeddings"][a:b] for a, b in zip(offsets, offsets[1:])]
    else:
        arrays = list(data["embeddings"])
    return Embeddings(names, arrays, pooling, layer)
