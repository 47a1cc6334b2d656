"""Embeddings from a trained genoformer model: load a checkpoint, embed sequences, save them.

    embedder = Embedder.from_checkpoint("runs/last.ckpt")
    result = embedder.embed("genes.fa.gz", pooling="mean", layer=-1)
    save_embeddings(result, "genes.npz")

Sequences longer than the window (default: the context the model was trained on; any length up
to a whole chromosome may be asked for, see `Embedder.embed`) are cut into windows that overlap
by `overlap` tokens, all of the same length (the last one ends at the
sequence end). Every position takes its vector from the window whose centre is nearest, i.e.
where it sits farthest from a window edge (centre-crop stitching). Pooled vectors are computed
over the stitched per-token vectors, so they do not depend on how a sequence was tiled or
batched. A batch only holds windows of one length: no padding, so results never depend on what
else is in the batch.

With ``both_strands`` every window is also read as its reverse complement, and each token's
vector is the mean of its vector on the two strands (the reverse-complement reading flipped back
onto forward positions, as `genoformer.genome.heads.strand_features` reads it): the result for
the reverse complement of a sequence is then the result for the sequence, flipped, wherever the
tiling is symmetric (a sequence that fits one window; or an even overlap and a length that
exceeds the window by a multiple of window - overlap).

With ``regions`` only those stretches of the inputs' records are embedded, each cut out as a
sequence of its own and named by its region (the BED name, else ``chrom:start-end``).

Shape legend: B batch, W window length, E model width, F features (E, or 2E for both strands), L sequence length.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch
import zarr

from genoformer.core.inference import INFERENCE_CHUNK, PoolAccumulator, Pooling, autocast
from genoformer.core.loading import LoadedModel
from genoformer.core.transformer import Transformer
from genoformer.data.genome.inputs import NamedSequence, SequenceInputs, read_sequences
from genoformer.data.genome.regions import record_regions
from genoformer.data.storage import atomic_build
from genoformer.data.tiling import Keep, same_length_batches, tile_windows
from genoformer.genome.heads import strand_features
from genoformer.genome.inference import LanguageModelRunner
from genoformer.progress import tqdm


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


class Embedder(LanguageModelRunner):
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
        super().__init__(device, autocast_dtype)
        self.model = self.on_device(model)
        self.window = window

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, **options: Any) -> Embedder:
        """The default window is the context the model was trained at."""
        return cls(loaded.network, window=loaded.context, **options)

    @torch.inference_mode()
    def embed(
        self,
        inputs: SequenceInputs,
        *,
        pooling: Union[Pooling, str] = Pooling.MEAN,
        layer: int = -1,
        batch_size: int = 8,
        overlap: Optional[int] = None,
        window: Optional[int] = None,
        both_strands: bool = False,
        regions: Optional[Union[str, list[str]]] = None,
        progress: bool = True,
    ) -> Embeddings:
        """Embed sequences.

        Args:
            inputs: what `genoformer.data.genome.inputs.read_sequences` reads: FASTA/GenBank
                files, genome stores, folders, globs, Bio SeqRecords and DNA strings, alone or in
                a list. A string is read as a sequence unless it names an existing path or ends in
                a FASTA/GenBank suffix; strings are named seqI after their place I in the list,
                records by their id.
            pooling: "mean", "max", "first", "last" (one (E,) vector per sequence) or "none"
                (an (L, E) array per sequence).
            layer: hidden state to read: 0 = token embeddings, i = after block i, -1 = last
                block (after the final norm); negative values count from the end.
            batch_size: windows per forward pass.
            overlap: tokens shared by neighbouring windows; default window // 4. Each position
                keeps at least overlap // 2 tokens of context on both sides (except at sequence ends).
            window: window length; default the trained context. Longer windows (up to a whole
                record) run too: the model reaches them (`TransformerTrunk.reach`; positions past
                the trained context rely on RoPE extrapolating), in memory linear in the window.
            both_strands: average each token's vector with its vector in the reverse complement
                (see the module docstring); twice the work.
            regions: embed only these stretches of the records, each as its own sequence: a BED
                file or regions chrom:start-end (1-based, inclusive), see
                `genoformer.data.genome.regions`.
            progress: show a tqdm progress bar over windows.
        """
        pooling = Pooling(pooling)
        window = self.window if window is None else window
        if window < 1:
            raise ValueError(
                f"window must be at least 1 token (this model was trained at {self.window}), got {window}."
            )
        self.model.reach(window)
        overlap = window // 4 if overlap is None else overlap
        if not 0 <= overlap < window:
            raise ValueError(f"overlap must be in [0, window={window}), got {overlap}.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
        self.model.resolve_layer(layer)  # IndexError now rather than after reading the inputs

        named = list(read_sequences(inputs, literals=True))
        if not named:
            raise ValueError("no sequences to embed: the input is empty.")
        if regions is not None:
            named = [
                NamedSequence(region.name, named[index].source, named[index].codes[region.start : region.end])
                for index, region in record_regions(named, regions)
            ]
        names = [record.name for record in named]
        check_unique_names(names)
        sequences = [record.codes for record in named]
        width = self.model.config.d_model
        pools = [PoolAccumulator(pooling, len(codes), width) for codes in sequences]

        tiles = [
            (index, tile)
            for index, codes in enumerate(sequences)
            for tile in tile_windows(len(codes), window, overlap, Keep.CENTRE)
        ]
        tiles.sort(key=lambda item: -item[1].length)  # stable: equal lengths keep input order
        with tqdm(total=len(tiles), unit="window", disable=not progress, desc="embedding") as bar:
            for batch in same_length_batches(tiles, batch_size):
                tokens_BW = torch.from_numpy(np.stack([sequences[i][t.start : t.end] for i, t in batch])).to(
                    self.device
                )
                lengths_B = torch.full((len(batch),), tokens_BW.shape[1], device=self.device)
                with autocast(self.device, self.autocast_dtype):
                    hidden_BWF = strand_features(
                        self.model, tokens_BW, lengths_B, both_strands=both_strands, layer=layer
                    )
                for (index, tile), hidden_WF in zip(batch, hidden_BWF):
                    # to the host a chunk at a time: no float32 copy of a whole-chromosome window on the device
                    for lo in range(tile.keep_start, tile.keep_end, INFERENCE_CHUNK):
                        hi = min(lo + INFERENCE_CHUNK, tile.keep_end)
                        hidden_CF = hidden_WF[lo - tile.start : hi - tile.start]
                        pools[index].add(lo, hidden_CF.float().unflatten(-1, (-1, width)).mean(-2).cpu().numpy())
                bar.update(len(batch))
        return Embeddings(names, [pool.result() for pool in pools], pooling, layer)


def check_unique_names(names: list[str]) -> None:
    """Raise ValueError naming the repeated ones; outputs are keyed by sequence name."""
    repeated = sorted(name for name, count in Counter(names).items() if count > 1)
    if repeated:
        raise ValueError(
            f"sequence names must be unique in one result; repeated: {repeated[:5]}. "
            "Rename the records, or embed them in separate calls."
        )


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
