"""Checkpoints: one reader and one writer's conventions for every model genoformer trains.

A genoformer checkpoint is a Lightning checkpoint (`torch.save` of plain values and tensors)
with these conventions, kept by `genoformer.core.training.TrainingModule` when it saves:

- `checkpoint["genoformer"] == {"kind": ..., "format_version": FORMAT_VERSION}`: what the file
  holds (`ModelKind`), so a command given the wrong kind says which command reads it instead of
  failing inside `load_state_dict`.
- `state_dict` keys are canonical: without torch.compile's `_orig_mod.` wrapper prefix, so a
  compiled model's checkpoint loads into a plain one and the other way round.
- `hyper_parameters` describe what the model is, never how it ran (`genoformer.core.runtime`).

Checkpoints written before the tag existed (format version 0) are recognised by their
hyperparameters once, here (`checkpoint_kind`), and nowhere else; so are hyperparameters that
older checkpoints saved at the top level and today's save in a group (`REGROUPED`): every read
moves them where today's code reads them (`regroup_hyperparameters`).

Every read checks the file first (`verify_checkpoint_file`): a .ckpt is a zip container whose
every record (the pickled values, each tensor's bytes) carries the CRC-32 torch wrote with it,
and a record whose bytes no longer match is refused with one error naming the file, before any
value reaches a model. Checking costs one pass over the file at several GB/s (about 4 ms for the
13 MB shipped model, against 10 ms for `torch.load`; benchmarks/integrity.py). Checkpoints are
written by `AtomicCheckpointIO` (the trainer's, set by the `genoformer` command) through the one
atomic writer (`genoformer.data.storage.atomic_build`): a save that fails, a full disk included,
leaves the previous file as it was.

Reading a .ckpt unpickles it, but only plain containers and tensors
(`torch.load(weights_only=True)`), so a checkpoint cannot run code when it is loaded. A Hugging
Face directory of `genoformer export --format hf` is read without unpickling anything
(safetensors and JSON), and so is a Hub model named by its id (`owner/name`, downloaded through
huggingface_hub): prefer those for models from other people.
"""

from __future__ import annotations

import enum
import mmap
import pickle
import re
import shlex
import struct
import sys
import types
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, Union

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from genoformer.data.storage import atomic_open

FORMAT_VERSION = 1
"""Version of the conventions above written into every checkpoint's "genoformer" entry."""
TAG_KEY = "genoformer"
COMPILED_PREFIX = "_orig_mod."
"""What torch.compile's wrapper module inserts into parameter names."""
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")
"""A Hugging Face Hub model id (owner/name), read when no local path of that name exists."""


class ModelKind(str, enum.Enum):
    """What a checkpoint holds; each kind names the commands that read it."""

    GENOME_LM = "genome_lm"
    """A DNA language model (genoformer.genome.lm.GenoformerLM)."""
    FORECASTER = "forecaster"
    """A time-series forecaster (genoformer.timeseries.module.TimeSeriesForecaster)."""
    GENOME_FINETUNED = "genome_finetuned"
    """A DNA model fine-tuned on labels: classifier, regressor or annotator (genoformer.genome.finetune.FineTuner)."""

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self][0]

    @property
    def readers(self) -> str:
        return _DESCRIPTIONS[self][1]


_DESCRIPTIONS = {
    ModelKind.GENOME_LM: (
        "a DNA language model",
        "genoformer embed, score, evaluate, variant_effect, mutagenesis, generate (Python: genoformer.genome.embeddings.Embedder)",
    ),
    ModelKind.GENOME_FINETUNED: (
        "a fine-tuned DNA model (classifier, regressor or gene annotator)",
        "genoformer classify, annotate (Python: genoformer.genome.predict.SequencePredictor, GeneAnnotator)",
    ),
    ModelKind.FORECASTER: (
        "a time-series forecaster",
        "genoformer forecast, evaluate_forecast (Python: genoformer.timeseries.forecaster.Forecaster)",
    ),
}

REGROUPED = {
    ModelKind.GENOME_FINETUNED: {
        "pooling": ("head", "pooling"),
        "layer": ("head", "layer"),
        "both_strands": ("head", "both_strands"),
        "head_dropout": ("head", "dropout"),
        "reverse_complement": ("strands", "reverse_complement"),
        "test_time_strands": ("strands", "test_time"),
    },
}
"""Per kind, the hyperparameters its checkpoints once saved at the top level, each with the group
and field it is saved as today (a fine-tuned model's head and strands:
genoformer.genome.heads.HeadSettings, StrandSettings)."""

_UNREADABLE_ERRORS = (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, OSError)
"""What torch.load raises for a file that is not a complete checkpoint of plain values and tensors."""


def canonical_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state_dict` with torch.compile's `_orig_mod.` left out of every key."""
    return {key.replace(COMPILED_PREFIX, ""): value for key, value in state_dict.items()}


def tag(checkpoint: dict[str, Any], kind: ModelKind) -> None:
    """Mark `checkpoint` (as Lightning is about to save it) as holding `kind`, with canonical keys."""
    checkpoint[TAG_KEY] = {"kind": ModelKind(kind).value, "format_version": FORMAT_VERSION}
    checkpoint["state_dict"] = canonical_state_dict(checkpoint["state_dict"])


def checkpoint_kind(checkpoint: Mapping[str, Any]) -> ModelKind | None:
    """The kind a checkpoint holds: its tag, or for an untagged one (format version 0) what its
    hyperparameters show; None when neither tells."""
    tagged = checkpoint.get(TAG_KEY)
    if isinstance(tagged, Mapping):
        version = tagged.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ValueError(
                f"the checkpoint has genoformer checkpoint format {version!r}; this genoformer reads formats up to "
                f"{FORMAT_VERSION}: upgrade genoformer to read it"
            )
        try:
            return ModelKind(tagged.get("kind"))
        except ValueError:
            return None
    hparams = checkpoint.get("hyper_parameters")
    if not isinstance(hparams, Mapping) or "state_dict" not in checkpoint:
        return None
    if "forecast" in hparams and "transformer" in hparams:
        return ModelKind.FORECASTER
    if "objective" in hparams and "transformer" in hparams:
        return ModelKind.GENOME_LM
    return None


def regroup_hyperparameters(checkpoint: Any) -> Any:
    """`checkpoint` (as read) with the hyperparameters that its kind once saved at the top level
    moved into their groups (`REGROUPED`), in place; a checkpoint of today's layout, or one that is
    not a tagged genoformer checkpoint, is left as it is."""
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get(TAG_KEY), Mapping):
        return checkpoint
    hparams = checkpoint.get("hyper_parameters")
    moves = {kind.value: renamed for kind, renamed in REGROUPED.items()}.get(checkpoint[TAG_KEY].get("kind"))
    if not isinstance(hparams, dict) or not moves:
        return checkpoint
    for old, (group, field) in moves.items():
        if old in hparams:
            hparams[group] = {**(hparams.get(group) or {}), field: hparams.pop(old)}
    return checkpoint


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
        raise _unreadable_error(path)
    return path


_LOCAL_HEADER = struct.Struct("<4s22xHH")
"""A zip local file header: signature, then (after 22 bytes) the name's and the extra field's lengths."""


def _record_damage(data: memoryview, info: zipfile.ZipInfo) -> Optional[str]:
    """Why a stored record of a zip container does not hold what its central directory says
    (its header, its name or its CRC-32 over its bytes), or None when it does."""
    start = info.header_offset
    if start + _LOCAL_HEADER.size > len(data):
        return "its header lies past the end of the file"
    signature, name_length, extra_length = _LOCAL_HEADER.unpack_from(data, start)
    name_at = start + _LOCAL_HEADER.size
    if signature != b"PK\x03\x04" or bytes(data[name_at : name_at + name_length]) != info.orig_filename.encode():
        return "its header is damaged"
    begin = name_at + name_length + extra_length
    if begin + info.compress_size > len(data):
        return "its bytes run past the end of the file"
    if zlib.crc32(data[begin : begin + info.compress_size]) != info.CRC:
        return "its bytes do not match the CRC-32 written with them"
    return None


def verify_checkpoint_file(path: Union[str, Path]) -> Path:
    """`path` when every record of the checkpoint file matches the CRC-32 written with it (see the
    module docstring); FileNotFoundError or ValueError, in our words, otherwise."""
    path = check_checkpoint_file(path)
    try:
        with open(path, "rb") as file, zipfile.ZipFile(file) as archive:
            infos = archive.infolist()
            if any(info.compress_type != zipfile.ZIP_STORED for info in infos):
                damage = archive.testzip()  # not torch's layout: zipfile decompresses and checks each record
                if damage is not None:
                    raise _damaged_error(path, damage, "its bytes do not match the CRC-32 written with them")
                return path
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                data = memoryview(mapped)
                try:
                    for info in infos:
                        damage = _record_damage(data, info)
                        if damage is not None:
                            raise _damaged_error(path, info.filename, damage)
                finally:
                    data.release()
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as error:
        raise _unreadable_error(path) from error
    return path


def read_checkpoint(path: Union[str, Path], *, mmap: bool = False) -> dict:
    """The contents of a checkpoint file (tensors on the CPU; with `mmap`, mapped from the file and
    read only when used), unpickling plain values only, its hyperparameters in today's layout
    (`regroup_hyperparameters`).

    FileNotFoundError for a missing file; `DamagedCheckpointError` for a damaged one
    (`verify_checkpoint_file`); ValueError, in our words, for a file torch cannot read (truncated,
    or not a checkpoint) or one that holds objects other than plain values and tensors.
    """
    path = verify_checkpoint_file(path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except _UNREADABLE_ERRORS as exc:
        raise _unreadable_error(path) from exc
    return regroup_hyperparameters(checkpoint)


RUN_KEYWORDS = ("best", "last")
"""The checkpoints of a run named by keyword: `RUN_DIR/best`, `RUN_DIR/last` (or alone: the run in
the working directory)."""
_LAST_NAME = re.compile(r"^last(-v\d+)?\.ckpt$")
"""Lightning's names of a ModelCheckpoint's last checkpoint (last.ckpt; last-v1.ckpt when two share a folder)."""


def resolve_checkpoint(spec: Union[str, Path]) -> Path:
    """The file or directory a checkpoint argument names; every command that reads a checkpoint
    (and `--init_weights`, `--pretrained`) passes its argument through here. In order:

    1. a file that exists: itself (a .ckpt);
    2. a directory of `genoformer export --format hf` (it holds config.json): itself;
    3. a run directory (`trainer.default_root_dir`, or its checkpoints/ folder): its best checkpoint,
       the one its ModelCheckpoint recorded as best by its monitor (the validation loss in the
       shipped recipes); a run that records none (no validation monitor) gives its last.ckpt;
    4. `RUN_DIR/best` or `RUN_DIR/last` (`best` or `last` alone: the run in the working directory):
       that checkpoint of the run;
    5. a pretrained model's name (`genoformer.shipped.PRETRAINED`: genoformer-dna,
       genoformer-gene-annotator, genoformer-forecaster): the file in a clone's examples/, else in
       the local model cache (`genoformer.shipped.model_cache()`: $GENOFORMER_HOME or
       ~/.cache/genoformer), else its Hugging Face Hub repository;
    6. a Hub model id (owner/name): downloaded (or found in the local Hub cache) through huggingface_hub.

    Forms 3 to 5 print the file they chose on stderr. FileNotFoundError for anything else, saying
    what to pass."""
    path = Path(spec)
    if path.is_file():
        return path
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        return _run_checkpoint(path, spec, None)
    if path.name in RUN_KEYWORDS and not path.suffix:
        return _run_checkpoint(path.parent, spec, path.name)
    from genoformer.shipped import PRETRAINED  # what ships, without torch

    if str(spec) in PRETRAINED:
        return _pretrained(str(spec))
    if HUB_ID.match(str(spec)) and not str(spec).endswith(".ckpt"):
        return _hub_snapshot(str(spec), f"{spec}: no such checkpoint file or directory here, and ")
    shipped = [model.name for model in PRETRAINED.values() if model.file == path.name]
    if shipped:
        raise FileNotFoundError(
            f"checkpoint not found: {path}; the shipped model {path.name} is named {shipped[0]}: pass that name "
            "instead, found wherever you run (a clone's examples/, ~/.cache/genoformer, the Hugging Face Hub)"
        )
    raise FileNotFoundError(
        f"checkpoint not found: {path}; pass a .ckpt file written by training (e.g. <run dir>/checkpoints/last.ckpt), "
        "a run directory (its best checkpoint), RUN_DIR/best or RUN_DIR/last, a directory of `genoformer export "
        f"--format hf`, a pretrained model's name ({', '.join(PRETRAINED)}) or a Hugging Face Hub id (owner/name)."
    )


def _said(spec: Union[str, Path], path: Path, why: str) -> Path:
    print(f"genoformer: checkpoint {spec} is {path} ({why})", file=sys.stderr)
    return path


def _run_checkpoint(run: Path, spec: Union[str, Path], which: str | None) -> Path:
    """The `which` ("best", "last"; None: best where recorded, else last) checkpoint of the run in `run`."""
    folder = run / "checkpoints" if (run / "checkpoints").is_dir() else run
    files = sorted(folder.glob("*.ckpt")) if folder.is_dir() else []
    if not files:
        where = "the working directory" if str(run) == "." else str(run)
        raise FileNotFoundError(
            f"checkpoint not found: {spec}: {where} holds no run (no .ckpt file in {folder}); pass a run directory "
            "(trainer.default_root_dir of `genoformer fit`, or --out of `genoformer finetune`), RUN_DIR/best, "
            "RUN_DIR/last or a .ckpt file"
        )
    lasts = sorted((path for path in files if _LAST_NAME.match(path.name)), key=lambda path: path.stat().st_mtime)
    if which == "last":
        if not lasts:
            raise FileNotFoundError(
                f"checkpoint not found: {spec}: the run in {run} has no last.ckpt (its checkpoints: "
                f"{', '.join(path.name for path in files)}); pass one of them"
            )
        return _said(spec, lasts[-1], "the run's last checkpoint")
    best = best_checkpoint(folder)
    if best is not None:
        path, monitor, score = best
        return _said(
            spec,
            path,
            f"the run's best checkpoint, {monitor} {score:.4g}"
            if score is not None
            else f"the run's best checkpoint by {monitor}",
        )
    if which is None and lasts:
        return _said(spec, lasts[-1], "the run's last checkpoint: it records no best one (no validation monitor)")
    raise FileNotFoundError(
        f"checkpoint not found: {spec}: the run in {run} recorded no best checkpoint (its ModelCheckpoint has no "
        f"monitor, or saved none yet; its checkpoints: {', '.join(path.name for path in files)}); pass "
        f"{run / 'last'} or one of the files"
    )


def best_checkpoint(folder: Path) -> tuple[Path, str, float | None] | None:
    """(path, monitor, score) of the best checkpoint in a run's checkpoint folder, or None where
    none is recorded: the ModelCheckpoint record (best_model_path) of the newest checkpoint there,
    read by file name inside `folder` (so a moved or copied run still finds it); without a record,
    the one checkpoint there that is not a last.ckpt, if there is exactly one. The newest file is
    verified before its record is read (`read_checkpoint`): a damaged one is its
    `DamagedCheckpointError`, a truncated one is passed over for the next newest."""
    files = sorted(folder.glob("*.ckpt"), key=lambda path: (path.stat().st_mtime, bool(_LAST_NAME.match(path.name))))
    for newest in reversed(files):
        try:
            states = read_checkpoint(newest, mmap=True).get("callbacks") or {}
        except DamagedCheckpointError:
            raise  # its record cannot be trusted, nor can an older one be known to be the best
        except ValueError:
            continue  # a truncated file says nothing; an older one may
        for key, state in states.items():
            recorded = state.get("best_model_path") if isinstance(state, Mapping) else None
            if str(key).startswith("ModelCheckpoint") and state.get("monitor") and recorded:
                path = folder / Path(recorded).name
                if path.is_file():
                    score = state.get("best_model_score")
                    return path, str(state["monitor"]), None if score is None else float(score)
        break
    kept = [path for path in files if not _LAST_NAME.match(path.name)]
    return (kept[0], "its file name (the one checkpoint kept besides last.ckpt)", None) if len(kept) == 1 else None


def _pretrained(name: str) -> Path:
    """A pretrained model by name: a clone's examples/, then the model cache, then the Hub."""
    from genoformer.shipped import PRETRAINED, checkout_root, examples_dir, model_cache

    model = PRETRAINED[name]
    places = ([examples_dir() / model.file] if checkout_root() is not None else []) + [model_cache() / model.file]
    for place in places:
        if place.is_file():
            return _said(name, place, model.description)
    looked = " nor ".join(map(str, places))
    return _said(
        name,
        _hub_snapshot(
            model.hub_id,
            f"{name}: the pretrained model ({model.description}) is not at {looked}, and ",
            f" Put the file {model.file} (examples/ of the genoformer repository) at {model_cache() / model.file}, "
            "or set GENOFORMER_HOME to the folder that holds it.",
        ),
        f"{model.description}, from the Hugging Face Hub {model.hub_id}",
    )


def _hub_snapshot(hub_id: str, context: str, remedy: str = "") -> Path:
    """A Hub model's directory, downloaded (or found in the local Hub cache) through huggingface_hub."""
    from huggingface_hub import snapshot_download  # only a Hub id needs it
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id=hub_id))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as error:
        detail = str(error).splitlines()[0] if str(error) else "no network?"
        raise FileNotFoundError(
            f"{context}the Hugging Face Hub gave no model {hub_id} ({type(error).__name__}: {detail}).{remedy or ' '}"
            + (
                ""
                if remedy
                else "Pass a .ckpt file, a run directory, a directory of `genoformer export --format hf`, "
                "or a Hub id (owner/name) with a network."
            )
        ) from error


def _record_description(record: str) -> str:
    """A zip record of torch.save as a reader knows it: `<archive>/data/7` is tensor 7's bytes."""
    folder, _, name = record.rpartition("/")
    if folder.endswith("/data") or folder == "data":
        return f"the bytes of tensor {name}"
    return "the table of its values" if name == "data.pkl" else f"its record {name}"


class DamagedCheckpointError(ValueError):
    """A checkpoint file whose bytes changed after it was written (`verify_checkpoint_file`)."""


def _damaged_error(path: Path, record: str, damage: str) -> DamagedCheckpointError:
    """Our message for a checkpoint whose bytes changed after it was written."""
    return DamagedCheckpointError(
        f"{path} is damaged: {_record_description(record)} changed after it was written ({damage}; a disk, copy "
        f"or transfer error), so the checkpoint cannot be trusted. Use another copy, or an earlier checkpoint of "
        f"the run; `genoformer verify {shlex.quote(str(path.parent))}` checks every checkpoint in its folder"
    )


def write_checkpoint(checkpoint: dict[str, Any], path: Path, *, overwrite: bool) -> Path:
    """`torch.save(checkpoint)` to `path` through the one atomic writer (see the module
    docstring); an existing file is replaced only with `overwrite`. A full disk raises
    `genoformer.data.storage.DiskFullError` naming `path`, which is left as it was."""
    with atomic_open(Path(path), "wb", overwrite=overwrite) as file:
        failed: list[OSError] = []

        def write(data: Any) -> int:
            try:
                return file.write(data)
            except OSError as error:  # torch reports it as a RuntimeError of its own: keep it
                failed.append(error)
                raise

        try:
            torch.save(checkpoint, types.SimpleNamespace(write=write, flush=file.flush))
        except RuntimeError:
            if failed:
                raise failed[0] from None
            raise
    return Path(path)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch.save/torch.load checkpoint plugin, saving through the one atomic writer
    and verifying every checkpoint it loads (see the module docstring).

    Lightning's own save writes a temporary file in $TMPDIR and moves it over the checkpoint; on
    a cluster, where $TMPDIR and the run directory are two file systems, the move copies into
    the checkpoint, and a full disk truncates it. Here the temporary lies beside the checkpoint,
    is flushed to the disk and renamed over it. Remote paths (``s3://...``) keep Lightning's own
    behaviour.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Union[str, Path], storage_options: Optional[Any] = None
    ) -> None:
        if _remote(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        write_checkpoint(checkpoint, Path(path), overwrite=True)

    def load_checkpoint(self, path: Union[str, Path], *args: Any, **kwargs: Any) -> dict[str, Any]:
        if not _remote(path):
            verify_checkpoint_file(path)
        return super().load_checkpoint(path, *args, **kwargs)


def _remote(path: Union[str, Path]) -> bool:
    return "://" in str(path)


def _unreadable_error(path: Path) -> ValueError:
    """Our message for a checkpoint file torch cannot read (rather than torch's own advice)."""
    return ValueError(
        f"{path} is not a readable genoformer checkpoint: the file is truncated (an interrupted copy or "
        "save) or was not written by `genoformer fit`. Pass a .ckpt file written by training, e.g. "
        "<run dir>/checkpoints/last.ckpt."
    )
