"""Predictions of a fine-tuned model: labels of sequences, and genes of whole genomes.

    predictor = SequencePredictor.from_checkpoint("runs/splice/checkpoints/best.ckpt")
    result = predictor.predict(["ACGT...", "TTGA..."])        # or files, records, a LabelledSequences
    result.write_tsv("predictions.tsv")

    annotator = GeneAnnotator.from_checkpoint("examples/genoformer_gene_annotator.ckpt")
    contigs = annotator.predict("genome.fa.gz")               # per contig: probabilities and genes
    write_gff3("genes.gff3", [g for c in contigs for g in c.genes], contigs=[(c.name, c.length) for c in contigs])

Both run under the inference policy of genoformer.core.inference (CUDA when there is one, bfloat16
autocast there, float32 on the CPU) and average both strands when the model was fine-tuned to
(`strands.test_time`). `GeneAnnotator` cuts long contigs into windows with the shared tiler
(genoformer.data.tiling): each base takes its probabilities from the window in which it sits
farthest from an edge.

Shape legend: B batch, W window, L sequence length, K outputs (classes, labels or values).
"""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch

from genoformer.core.checkpoints import ModelKind
from genoformer.core.inference import InferenceModel, autocast
from genoformer.core.loading import LoadedModel
from genoformer.core.runtime import RuntimeSettings
from genoformer.data.genome.alphabet import PAD, check_alphabet
from genoformer.data.genome.annotations import Gene
from genoformer.data.genome.inputs import SequenceInputs, read_sequences
from genoformer.data.genome.labels import LabelledSequences
from genoformer.data.genome.regions import record_regions
from genoformer.data.genome.targets import TargetSpace
from genoformer.data.storage import write_text
from genoformer.data.tiling import Keep, same_length_batches, tile_windows
from genoformer.genome.genecalls import call_genes
from genoformer.genome.heads import FineTunedNetwork, HeadOnTrunk
from genoformer.progress import tqdm


class FineTunedModel(InferenceModel):
    """A fine-tuned model (trunk and head: genoformer.genome.heads.FineTunedNetwork, or the
    FineTuner training one) on its inference device, in eval mode: the base of SequencePredictor
    and GeneAnnotator."""

    kind = ModelKind.GENOME_FINETUNED
    prefix = ""  # the whole training module: trunk ("model.") and head ("head.")
    expected: tuple[bool, ...] = (False, True)
    """Which kinds of targets the class serves: per sequence (False) and/or per base (True)."""

    def __init__(
        self,
        network: HeadOnTrunk,
        *,
        device: Optional[Union[str, torch.device]] = None,
        autocast_dtype: Optional[torch.dtype] = None,
    ) -> None:
        if network.targets is None:
            raise ValueError("the model has no head: fine-tune it first (genoformer finetune)")
        if network.targets.kind.per_base not in self.expected:
            other = (
                "GeneAnnotator (genoformer annotate)"
                if network.targets.kind.per_base
                else "SequencePredictor (genoformer classify)"
            )
            raise ValueError(f"this model predicts {network.targets.kind.value}; run it with {other}")
        super().__init__(device, autocast_dtype)
        self.network = self.on_device(network)

    @property
    def targets(self) -> TargetSpace:
        return self.network.targets

    @classmethod
    def check(cls, checkpoint: dict[str, Any], name: str) -> None:
        check_alphabet(checkpoint, f"{name}: load it")
        if (checkpoint.get("hyper_parameters") or {}).get("targets") is None:
            raise ValueError(f"{name} holds no head (it was saved before its targets were known); fine-tune it again")

    @classmethod
    def build(cls, hparams: dict[str, Any], runtime: RuntimeSettings) -> FineTunedNetwork:
        return FineTunedNetwork.from_hparams(hparams, runtime)

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, **options: Any) -> FineTunedModel:
        return cls(loaded.network, **options)

    @torch.inference_mode()
    def _run(self, rows: list[np.ndarray]) -> np.ndarray:
        """Predictions for equal-or-different-length rows: float32 (B, K) or (B, W, K)."""
        lengths_B = torch.tensor([len(row) for row in rows], device=self.device)
        tokens_BL = np.full((len(rows), int(lengths_B.max())), PAD, dtype=np.uint8)
        for i, row in enumerate(rows):
            tokens_BL[i, : len(row)] = row
        with autocast(self.device, self.autocast_dtype):
            outputs = self.network.predict_outputs(torch.from_numpy(tokens_BL).to(self.device), lengths_B)
        return outputs.float().cpu().numpy()


@dataclasses.dataclass(frozen=True)
class SequencePredictions:
    """Predictions for named sequences, in input order."""

    names: list[str]
    outputs: np.ndarray
    """float32 (N, K): class probabilities, label probabilities or values."""
    targets: TargetSpace
    columns: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    """The input's other columns, carried into the output file."""

    def predicted(self) -> list[str]:
        """Per sequence, what the model predicts, in words (`TargetSpace.predicted`)."""
        return self.targets.predicted(self.outputs)

    def table(self) -> str:
        """Tab-separated text: the input's columns (all of them, labels and sequence included; a
        `name` column first when the input has none), `prediction`, then `p_<class>` per class (or
        label), or `y_<target>` per regression target. An input column with the name of an output
        column is replaced by it."""
        prefix = self.targets.kind.column_prefix
        written = {"prediction", *(prefix + name for name in self.targets.names)}
        passed = {key: values for key, values in self.columns.items() if key not in written}
        if "name" not in passed:
            passed = {"name": self.names, **passed}
        buffer = io.StringIO()
        writer = csv.writer(buffer, delimiter="\t", lineterminator="\n")
        writer.writerow([*passed, "prediction", *(prefix + name for name in self.targets.names)])
        predicted = self.predicted()
        for i in range(len(self.names)):
            writer.writerow(
                [*(values[i] for values in passed.values()), predicted[i], *(f"{v:.6g}" for v in self.outputs[i])]
            )
        return buffer.getvalue()

    def write_tsv(self, path: Union[str, Path], *, overwrite: bool = False) -> Path:
        """Write `table()` to `path` (atomically; an existing file needs overwrite)."""
        return write_text(Path(path), self.table(), overwrite=overwrite)


class SequencePredictor(FineTunedModel):
    """Runs a model fine-tuned to classify or regress whole sequences."""

    expected = (False,)

    def predict(
        self, inputs: Union[SequenceInputs, LabelledSequences], *, batch_size: int = 32, progress: bool = True
    ) -> SequencePredictions:
        """Predict every sequence of `inputs`: what genoformer.data.genome.inputs.read_sequences
        reads (files, stores, records, DNA strings) or a LabelledSequences (from
        genoformer.data.genome.labels.read_unlabelled, e.g. a TSV's sequences with its columns)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if isinstance(inputs, LabelledSequences):
            names, sequences, columns = list(inputs.names), list(inputs.codes), dict(inputs.columns)
        else:
            named = list(read_sequences(inputs, literals=True))
            names, sequences, columns = [r.name for r in named], [r.codes for r in named], {}
        if not sequences:
            raise ValueError("no sequences to predict: the input is empty")
        limit = self.network.model.config.max_seq_len
        too_long = [name for name, codes in zip(names, sequences) if len(codes) > limit]
        if too_long:
            raise ValueError(
                f"{len(too_long)} sequence(s) are longer than the model's context of {limit:,} bases "
                f"({', '.join(too_long[:3])}); cut them first"
            )
        order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))  # similar lengths batch together
        outputs = np.zeros((len(sequences), self.targets.outputs), dtype=np.float32)
        with tqdm(total=len(order), unit="seq", disable=not progress, desc="predicting") as bar:
            for first in range(0, len(order), batch_size):
                chunk = order[first : first + batch_size]
                outputs[chunk] = self._run([sequences[i] for i in chunk])
                bar.update(len(chunk))
        return SequencePredictions(names, outputs, self.targets, columns)


ANNOTATE_FLANK = 3000
"""Bases on each side of a region that `GeneAnnotator.predict` also reads, so that a gene which
crosses the region's edge is called whole when it ends within this many bases of it."""


@dataclasses.dataclass(frozen=True)
class AnnotatedSequence:
    """Per-base class probabilities of one contig (or of a region of it) and the genes called
    from them, in the contig's coordinates."""

    name: str
    codes: np.ndarray
    probabilities: np.ndarray
    """float32 (L, K) over the model's classes, L the bases from `start` on."""
    genes: list[Gene]
    start: int = 0
    """Where `codes` start in the contig (0-based; 0 for a whole contig)."""
    contig_length: Optional[int] = None
    """The whole contig's length (None: `codes` are the whole contig)."""

    @property
    def length(self) -> int:
        return len(self.codes)


class GeneAnnotator(FineTunedModel):
    """Runs a model fine-tuned for per-base gene classes over whole genomes and calls genes."""

    expected = (True,)

    def probabilities(
        self,
        codes: np.ndarray,
        *,
        window: Optional[int] = None,
        overlap: Optional[int] = None,
        batch_size: int = 8,
        bar: Optional[tqdm] = None,
    ) -> np.ndarray:
        """Per-base probabilities (L, K) of one contig's codes, tiled (see the module docstring)."""
        limit = self.network.model.config.max_seq_len
        window = window or limit
        overlap = window // 4 if overlap is None else overlap
        if not 0 < window <= limit:
            raise ValueError(f"window must be in [1, max_seq_len={limit}], got {window}")
        result = np.zeros((len(codes), self.targets.outputs), dtype=np.float32)
        tiles = [(0, tile) for tile in tile_windows(len(codes), window, overlap, Keep.CENTRE)]
        for batch in same_length_batches(tiles, batch_size):
            outputs_BWK = self._run([codes[t.start : t.end] for _, t in batch])
            for (_, tile), outputs_WK in zip(batch, outputs_BWK):
                result[tile.keep_start : tile.keep_end] = outputs_WK[
                    tile.keep_start - tile.start : tile.keep_end - tile.start
                ]
            if bar is not None:
                bar.update(sum(t.keep_end - t.keep_start for _, t in batch))
        return result

    def predict(
        self,
        inputs: SequenceInputs,
        *,
        regions: Optional[Union[str, list[str]]] = None,
        window: Optional[int] = None,
        overlap: Optional[int] = None,
        batch_size: int = 8,
        min_gene_length: int = 90,
        progress: bool = True,
    ) -> list[AnnotatedSequence]:
        """Probabilities and gene calls for every contig of `inputs` (FASTA/GenBank files, stores,
        records, DNA strings), or for each of `regions` (a BED file or chrom:start-end, as
        genoformer.data.genome.regions reads them); genes come from
        genoformer.genome.genecalls.call_genes and are in contig coordinates. A region is read
        with ANNOTATE_FLANK bases on each side (within the contig), and the genes that overlap it
        are kept whole."""
        named = list(read_sequences(inputs, literals=True))
        if not named:
            raise ValueError("no sequences to annotate: the input is empty")
        chosen = record_regions(named, regions)
        stretches = []
        for index, region in chosen:
            length = len(named[index].codes)
            whole = region.start == 0 and region.end == length
            stretches.append(
                (
                    index,
                    region,
                    0 if whole else max(0, region.start - ANNOTATE_FLANK),
                    length if whole else min(length, region.end + ANNOTATE_FLANK),
                )
            )
        results = []
        with tqdm(
            total=sum(hi - lo for _, _, lo, hi in stretches),
            unit="base",
            unit_scale=True,
            disable=not progress,
            desc="annotating",
        ) as bar:
            for index, region, lo, hi in stretches:
                record = named[index]
                codes = record.codes[lo:hi]
                probabilities = self.probabilities(
                    codes, window=window, overlap=overlap, batch_size=batch_size, bar=bar
                )
                genes = [
                    _shifted(gene, lo)
                    for gene in call_genes(codes, probabilities, contig=record.name, min_length=min_gene_length)
                ]
                genes = [gene for gene in genes if gene.start < region.end and gene.end > region.start]
                whole = lo == 0 and hi == len(record.codes) and region.start == 0 and region.end == hi
                results.append(
                    AnnotatedSequence(
                        record.name,
                        record.codes[region.start : region.end],
                        probabilities[region.start - lo : region.end - lo],
                        genes,
                        start=region.start,
                        contig_length=None if whole else len(record.codes),
                    )
                )
        return results


def _shifted(gene: Gene, offset: int) -> Gene:
    """`gene` moved `offset` bases right (from a stretch's coordinates into its contig's)."""
    if not offset:
        return gene
    return dataclasses.replace(
        gene,
        start=gene.start + offset,
        end=gene.end + offset,
        segments=tuple((start + offset, end + offset) for start, end in gene.segments),
    )
