"""Classical baselines that a fine-tuned genoformer model must beat, on real labelled data, on a CPU.

    python -m benchmarks.finetune_baselines --tasks splice tf genes --out OUT      # the 2-core CPU

Three tasks; each is skipped, with the reason printed and recorded, when its files are absent:

- **splice**: StatLog primate splice junctions (60 nt windows; donor, acceptor or neither).
  5-fold stratified cross-validation whose folds keep identical sequences (and reverse
  complements) together (`splice_folds`, which the transformer benchmark imports so that both
  see the same folds); fold 0 is also the fixed 80/20 split; mean and sample sd (ddof 1) over
  the folds. Three logistic regressions: on canonical k-mer frequencies (k = 1..6, position-free),
  on stranded ones (the windows are oriented, so GT and AC differ) and on the one-hot bases
  (positional, the strong classical baseline on aligned windows).
- **tf**: Oct4 (label 1) against MafK (label 0) ChIP-seq peaks, 200 bp, on the data set's own
  train and test split; k-mer logistic regression, test AUROC and accuracy.
- **genes**: Prodigal (pyrodigal) in metagenomic mode and in single mode trained on the genome
  itself, on whole annotated genomes, scored against the annotation with
  `genoformer.genome.genecalls` (per-base coding MCC, agreement of stops and starts).

Every logistic regression standardises its features on the training set and chooses C from a
log grid by an inner cross-validation on the training set only (log loss); the test set is seen
once. scikit-learn and pyrodigal are needed by this script and its test only, not by the package:
`pip install scikit-learn pyrodigal`.

Shapes: S sequences, F features, L bases.
"""

from __future__ import annotations

import csv
import importlib
import importlib.metadata
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Union

import numpy as np
from genoformer.data.genome.alphabet import N, T, decode, encode

from benchmarks.common import Benchmark, Summary, table

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
SHARED_EXTRA = REPO.parent / "shared-extra"
SPLICE_TABLE = SHARED / "labeled" / "splice_junctions_statlog.tsv"
TF_DIR = SHARED_EXTRA / "labeled" / "tf_binding"
GENOMES = (
    SHARED_EXTRA / "genomes" / "leptospira_kirschneri_h1.gbk.gz",
    SHARED_EXTRA / "genomes" / "ecoli_draft_prokka.gff3.gz",
)
TASKS = ("splice", "tf", "genes")
#: The C grid of every logistic regression (inverse L2 strength on standardised features), half a
#: decade apart: the k-mer models choose C near 0.001 and the one-hot model near 0.03.
CS = tuple(float(c) for c in np.logspace(-5, 1, 13))

SequenceLike = Union[str, bytes, np.ndarray]


# ------------------------------------------------------------------------------------ features
def _kmer_columns(k: int, canonical: bool) -> tuple[np.ndarray, int]:
    """(4**k,) column of each k-mer index (base 4, first base most significant) and the number of
    columns: with `canonical`, a k-mer and its reverse complement share the column of the
    lexicographically smaller one (which has the smaller index, as A<C<G<T is 0<1<2<3)."""
    index = np.arange(4**k)
    if not canonical:
        return index, 4**k
    weights = 4 ** np.arange(k - 1, -1, -1)
    digits_K = (index[:, None] // weights) % 4  # (4**k, k) bases, first base first
    reverse_complement = ((3 - digits_K[:, ::-1]) * weights).sum(axis=1)
    kept, columns = np.unique(np.minimum(index, reverse_complement), return_inverse=True)
    return columns, len(kept)


def kmer_names(ks: Sequence[int] = (1, 2, 3, 4, 5, 6), canonical: bool = True) -> list[str]:
    """The k-mer each column of `kmer_features(..., ks, canonical)` counts (the canonical one is
    the lexicographically smaller of a k-mer and its reverse complement)."""
    names = []
    for k in ks:
        columns, n = _kmer_columns(k, canonical)
        first = np.full(n, 4**k)
        np.minimum.at(first, columns, np.arange(4**k))  # the smallest k-mer index of each column
        names += ["".join("ACGT"[(i // 4**p) % 4] for p in range(k - 1, -1, -1)) for i in first]
    return names


def _codes(sequence: SequenceLike) -> np.ndarray:
    return encode(sequence) if isinstance(sequence, (str, bytes)) else np.asarray(sequence, dtype=np.uint8)


def kmer_features(
    sequences: Sequence[SequenceLike], ks: Sequence[int] = (1, 2, 3, 4, 5, 6), canonical: bool = True
) -> np.ndarray:
    """(S, F) float32 k-mer frequencies of each sequence, one block of columns per k in `ks`
    (columns named by `kmer_names`).

    A k-mer's count is divided by the number of k-mer positions of its sequence (L - k + 1), so
    that sequences of different lengths compare. A k-mer holding an N (or an ambiguity letter,
    which reads as N) is not counted. With `canonical`, a k-mer and its reverse complement count
    in one column, so a sequence and its reverse complement have the same features.

    Sequences are strings (any case, IUPAC letters read as N) or code arrays (A=0 .. T=3, N=4).
    All sequences are joined with an N between them and every k-mer index is computed at once:
    a rolling base-4 number over the joined codes, then one bincount over (sequence, column).
    """
    codes = [_codes(s) for s in sequences]
    S = len(codes)
    lengths_S = np.array([len(c) for c in codes], dtype=np.int64)
    joined = np.concatenate([np.append(c, np.uint8(N)) for c in codes]) if S else np.zeros(0, np.uint8)
    owner = np.repeat(np.arange(S), lengths_S + 1)  # (sum L + S,) sequence of each joined position
    bad_prefix = np.concatenate([[0], np.cumsum(joined > T)])  # N and special tokens break k-mers
    digits = np.minimum(joined, T).astype(np.int64)
    blocks = []
    for k in ks:
        if k < 1:
            raise ValueError(f"k-mer sizes must be positive, got {k} in ks={tuple(ks)}")
        columns, n = _kmer_columns(k, canonical)
        starts = max(len(joined) - k + 1, 0)
        index = np.zeros(starts, dtype=np.int64)
        for j in range(k):
            index = index * 4 + digits[j : j + starts]
        valid = bad_prefix[k : k + starts] == bad_prefix[:starts]
        counts_SF = np.bincount(owner[:starts][valid] * n + columns[index[valid]], minlength=S * n).reshape(S, n)
        blocks.append(counts_SF / np.maximum(lengths_S - k + 1, 1)[:, None])
    return np.hstack(blocks).astype(np.float32) if blocks else np.zeros((S, 0), np.float32)


def onehot_features(sequences: Sequence[SequenceLike]) -> np.ndarray:
    """(S, 4 L) float32 one-hot bases of sequences of one length L (aligned windows: the
    positional baseline); an N is all zeros."""
    codes = [_codes(s) for s in sequences]
    if len({len(c) for c in codes}) > 1:
        raise ValueError("one-hot features need sequences of one length; use kmer_features for others")
    codes_SL = np.stack(codes).astype(np.int64)
    onehot_SL4 = (codes_SL[:, :, None] == np.arange(4)).astype(np.float32)
    return onehot_SL4.reshape(len(codes), -1)


# ------------------------------------------------------------------------- logistic regression
def fit_logistic_regression(
    train_X: np.ndarray,
    train_labels: Sequence,
    test_X: np.ndarray,
    test_labels: Sequence,
    *,
    Cs: Sequence[float] = CS,
    inner_folds: int = 3,
    train_groups: Sequence | None = None,
    seed: int = 0,
    max_iter: int = 2000,
    n_jobs: int | None = None,
) -> dict:
    """Standardise, choose C by an inner `inner_folds`-fold CV on the training set (grouped by
    `train_groups` when given, log loss), refit on the whole training set, score the test set.

    Returns accuracy, balanced_accuracy, auroc (binary: of the larger label; multi-class: macro
    one-vs-rest), mcc, C, fit_seconds (scaler and CV), predict_seconds, the largest iteration count
    (against max_iter), sizes, classes and the confusion matrix (rows: true, columns: predicted).
    """
    from sklearn.linear_model import LogisticRegressionCV
    from sklearn.metrics import (
        accuracy_score,
        balanced_accuracy_score,
        confusion_matrix,
        matthews_corrcoef,
        roc_auc_score,
    )
    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold
    from sklearn.preprocessing import StandardScaler

    train_y, test_y = np.asarray(train_labels), np.asarray(test_labels)
    classes = np.unique(train_y)
    if len(classes) < 2:
        raise ValueError(f"the training set holds one class only ({classes.tolist()}); nothing to learn")
    unseen = set(np.unique(test_y).tolist()) - set(classes.tolist())
    if unseen:
        raise ValueError(f"test labels {sorted(unseen)} do not occur in the training set")
    if train_groups is None:
        inner = list(StratifiedKFold(inner_folds, shuffle=True, random_state=seed).split(train_X, train_y))
    else:
        inner = list(
            StratifiedGroupKFold(inner_folds, shuffle=True, random_state=seed).split(
                train_X, train_y, np.asarray(train_groups)
            )
        )

    began = time.perf_counter()
    scaler = StandardScaler().fit(train_X)
    model = LogisticRegressionCV(
        Cs=list(Cs),
        l1_ratios=(0.0,),
        cv=inner,
        scoring="neg_log_loss",
        max_iter=max_iter,
        n_jobs=n_jobs,
        use_legacy_attributes=False,
    )
    model.fit(scaler.transform(train_X), train_y)
    fit_seconds = time.perf_counter() - began
    began = time.perf_counter()
    probabilities = model.predict_proba(scaler.transform(test_X))
    predict_seconds = time.perf_counter() - began
    predicted = model.classes_[probabilities.argmax(axis=1)]
    if len(classes) == 2:
        auroc = roc_auc_score(test_y == model.classes_[1], probabilities[:, 1])
    else:
        auroc = roc_auc_score(test_y, probabilities, labels=model.classes_, multi_class="ovr", average="macro")
    return {
        "accuracy": float(accuracy_score(test_y, predicted)),
        "balanced_accuracy": float(balanced_accuracy_score(test_y, predicted)),
        "auroc": float(auroc),
        "mcc": float(matthews_corrcoef(test_y, predicted)),
        "C": float(model.C_),
        "fit_seconds": fit_seconds,
        "predict_seconds": predict_seconds,
        "max_iterations_used": int(np.max(model.n_iter_)),
        "max_iter": max_iter,
        "n_train": int(len(train_y)),
        "n_test": int(len(test_y)),
        "n_features": int(train_X.shape[1]),
        "classes": model.classes_.tolist(),
        "confusion": confusion_matrix(test_y, predicted, labels=model.classes_).tolist(),
    }


def kmer_logistic_regression(
    train_seqs: Sequence[SequenceLike],
    train_labels: Sequence,
    test_seqs: Sequence[SequenceLike],
    test_labels: Sequence,
    *,
    ks: Sequence[int] = (1, 2, 3, 4, 5, 6),
    canonical: bool = True,
    **fit_options,
) -> dict:
    """`fit_logistic_regression` on `kmer_features` of the sequences (their time as
    feature_seconds); `fit_options` go to it (Cs, inner_folds, train_groups, seed, n_jobs)."""
    began = time.perf_counter()
    train_X, test_X = kmer_features(train_seqs, ks, canonical), kmer_features(test_seqs, ks, canonical)
    feature_seconds = time.perf_counter() - began
    result = fit_logistic_regression(train_X, train_labels, test_X, test_labels, **fit_options)
    return {**result, "feature_seconds": feature_seconds, "ks": list(ks), "canonical": canonical}


# ------------------------------------------------------------------------------ splice junctions
_IUPAC_COMPLEMENT = str.maketrans("ACGTRYKMSWBDHVN", "TGCAYRMKSWVHDBN")


def canonical_sequence(sequence: str) -> str:
    """The smaller of a sequence (upper case) and its reverse complement (IUPAC letters too)."""
    upper = sequence.upper()
    return min(upper, upper.translate(_IUPAC_COMPLEMENT)[::-1])


def splice_folds(
    seqs: Sequence[str], labels: Sequence, folds: int = 5, seed: int = 0
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train_idx, test_idx) of each of `folds` stratified folds in which identical sequences and
    reverse complements (one canonical sequence) always fall in the same fold: sklearn's
    StratifiedGroupKFold, shuffled with `seed`. Fold 0 is the fixed 80/20 split."""
    from sklearn.model_selection import StratifiedGroupKFold

    _, groups = np.unique([canonical_sequence(s) for s in seqs], return_inverse=True)
    splitter = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed)
    return list(splitter.split(np.zeros(len(seqs)), np.asarray(labels), groups))


def read_splice_table(path: Path) -> tuple[list[str], list[str]]:
    """The `sequence` and `label` columns of the tab-separated splice table."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t")
        missing = {"sequence", "label"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: no column {sorted(missing)}; its columns are {reader.fieldnames}")
        rows = list(reader)
    return [row["sequence"] for row in rows], [row["label"] for row in rows]


def _summary(folds: list[dict]) -> dict:
    keys = ("accuracy", "balanced_accuracy", "auroc", "mcc")
    summary = {f"{key}_mean": float(np.mean([f[key] for f in folds])) for key in keys}
    summary.update({f"{key}_sd": float(np.std([f[key] for f in folds], ddof=1)) for key in keys})
    summary["fit_seconds_total"] = float(sum(f["fit_seconds"] for f in folds))
    return summary


def splice_task(
    path: Path, folds: int, seed: int, n_jobs: int | None, Cs: Sequence[float] = CS, kmers_too: bool = True
) -> dict:
    seqs, labels = read_splice_table(path)
    groups = np.unique([canonical_sequence(s) for s in seqs], return_inverse=True)[1]
    splits = splice_folds(seqs, labels, folds, seed)
    labels_array = np.asarray(labels)

    def kmers(canonical: bool):
        features = kmer_features(seqs, canonical=canonical)
        return lambda tr, te: fit_logistic_regression(
            features[tr],
            labels_array[tr],
            features[te],
            labels_array[te],
            train_groups=groups[tr],
            seed=seed,
            n_jobs=n_jobs,
            Cs=Cs,
        )

    # the windows are oriented (the transcript's strand), so stranded k-mers keep GT apart from AC
    models = (
        {"kmer_logistic_regression": kmers(canonical=True), "stranded_kmer_logistic_regression": kmers(canonical=False)}
        if kmers_too
        else {}
    )
    onehot_X = onehot_features(seqs)
    models["onehot_logistic_regression"] = lambda tr, te: fit_logistic_regression(
        onehot_X[tr],
        labels_array[tr],
        onehot_X[te],
        labels_array[te],
        train_groups=groups[tr],
        seed=seed,
        n_jobs=n_jobs,
        Cs=Cs,
    )
    result = {
        "data": str(path),
        "sequences": len(seqs),
        "length": len(seqs[0]),
        "class_counts": {c: int(n) for c, n in zip(*np.unique(labels, return_counts=True))},
        "distinct_canonical_sequences": int(groups.max() + 1),
        "protocol": f"{folds}-fold StratifiedGroupKFold (groups: canonical sequence), shuffle seed {seed}; "
        "fold 0 is the fixed 80/20 split; C chosen by 3-fold grouped CV inside each training set",
        "features": {
            "kmer_logistic_regression": "canonical k-mer frequencies, k = 1..6 (2,772)",
            "stranded_kmer_logistic_regression": "k-mer frequencies, k = 1..6 (5,460)",
            "onehot_logistic_regression": "one-hot bases by position (240)",
        },
        "C_grid": list(Cs),
        "fold_sizes": [[int(len(tr)), int(len(te))] for tr, te in splits],
        "models": {},
    }
    for name, fit in models.items():
        per_fold = []
        for fold, (tr, te) in enumerate(splits):
            per_fold.append(fit(tr, te))
            print(
                f"splice {name} fold {fold}: accuracy {per_fold[-1]['accuracy']:.4f} "
                f"(C {per_fold[-1]['C']:.3g}, {per_fold[-1]['fit_seconds']:.1f} s)",
                flush=True,
            )
        result["models"][name] = {**_summary(per_fold), "fold0": per_fold[0], "folds": per_fold}
    return result


# ---------------------------------------------------------------------------------- TF binding
def tf_task(folder: Path, seed: int, n_jobs: int | None) -> dict:
    from genoformer.data.genome.inputs import read_sequences

    def read(name: str) -> list[np.ndarray]:
        return [record.codes for record in read_sequences([folder / f"{name}.fasta"])]

    split = {}
    for part in ("train", "test"):
        positives, negatives = read(f"oct4_{part}"), read(f"mafk_{part}")
        split[part] = (positives + negatives, [1] * len(positives) + [0] * len(negatives))
    result = kmer_logistic_regression(*split["train"], *split["test"], seed=seed, n_jobs=n_jobs)
    print(
        f"tf kmer_logistic_regression: test AUROC {result['auroc']:.4f}, accuracy {result['accuracy']:.4f}", flush=True
    )
    return {
        "data": str(folder),
        "labels": {"oct4": 1, "mafk": 0},
        "protocol": "the data set's own train/test split; C chosen by 3-fold CV on the training set",
        "features": "canonical k-mer frequencies, k = 1..6 (2,772)",
        "C_grid": list(CS),
        "models": {"kmer_logistic_regression": result},
    }


# ------------------------------------------------------------------------------ gene annotation
class PredictedGene(NamedTuple):
    """One gene call: 0-based half-open [start, end) on the forward strand of `contig`, strand +1
    or -1, and whether it runs off the contig's left (`partial_begin`) or right (`partial_end`)
    edge."""

    contig: str
    start: int
    end: int
    strand: int
    partial_begin: bool
    partial_end: bool


@dataclass(frozen=True)
class GeneFinderRun:
    """What `pyrodigal_genes` found and how long it took (training only in single mode)."""

    genes: list[PredictedGene]
    mode: str
    bases: int
    train_seconds: float
    find_seconds: float

    @property
    def seconds(self) -> float:
        return self.train_seconds + self.find_seconds

    @property
    def bases_per_second(self) -> float:
        """Bases per second of the whole run, training included."""
        return self.bases / self.seconds if self.seconds > 0 else float("inf")


def pyrodigal_genes(contigs: Sequence[tuple[str, str]], meta: bool = True) -> GeneFinderRun:
    """Prodigal's protein-coding genes on every (name, sequence) contig, on one thread.

    meta: the pre-trained metagenomic models (`GeneFinder(meta=True)`); otherwise single mode,
    trained first on all the contigs together (at least 20 kbp in all). Pyrodigal's begin and end
    (1-based, inclusive, begin < end on either strand) become 0-based half-open coordinates.
    """
    import pyrodigal

    finder = pyrodigal.GeneFinder(meta=meta)
    began = time.perf_counter()
    if not meta:
        finder.train(*[sequence for _, sequence in contigs])
    train_seconds = time.perf_counter() - began
    began = time.perf_counter()
    genes = [
        PredictedGene(name, gene.begin - 1, gene.end, gene.strand, bool(gene.partial_begin), bool(gene.partial_end))
        for name, sequence in contigs
        for gene in finder.find_genes(sequence)
    ]
    find_seconds = time.perf_counter() - began
    return GeneFinderRun(
        genes, "meta" if meta else "single", sum(len(s) for _, s in contigs), train_seconds, find_seconds
    )


def score_gene_calls(annotated: Sequence, run: GeneFinderRun) -> dict:
    """Score a run against annotated contigs (`genoformer.data.genome.annotations`): per-base
    coding MCC (coding or not; and CDS+ / CDS- / other) over all the contigs together, and the
    gene agreement of `genoformer.genome.genecalls` (reference CDS only)."""
    from genoformer.data.genome.annotations import Gene, label_track

    from genoformer.genome.genecalls import gene_agreement, per_base_coding_mcc, strand_coding_mcc

    predicted = [
        Gene(
            contig=g.contig,
            start=g.start,
            end=g.end,
            strand=g.strand,
            kind="CDS",
            attributes=(("partial", f"{int(g.partial_begin)}{int(g.partial_end)}"),)
            if g.partial_begin or g.partial_end
            else (),
        )
        for g in run.genes
    ]
    by_contig: dict[str, list] = {}
    for gene in predicted:
        by_contig.setdefault(gene.contig, []).append(gene)
    reference_labels = np.concatenate([contig.labels for contig in annotated])
    predicted_labels = np.concatenate(
        [label_track(len(contig.codes), by_contig.get(contig.name, [])) for contig in annotated]
    )
    reference_genes = [gene for contig in annotated for gene in contig.genes if gene.kind == "CDS"]
    agreement = gene_agreement(reference_genes, predicted)
    return {
        "per_base_coding_mcc": float(per_base_coding_mcc(reference_labels, predicted_labels)),
        "strand_coding_mcc": float(strand_coding_mcc(reference_labels, predicted_labels)),
        "agreement": {
            key: (float(value) if isinstance(value, (float, np.floating)) else value)
            for key, value in agreement.items()
        },
        "n_genes": len(run.genes),
        "n_reference_cds": len(reference_genes),
        "partial_genes": sum(g.partial_begin or g.partial_end for g in run.genes),
        "train_seconds": run.train_seconds,
        "find_seconds": run.find_seconds,
        "bases_per_second": run.bases_per_second,
    }


def annotation_source(path: Path) -> dict[str, int] | str:
    """Who called the reference genes: the CDS count per GFF3 source column (e.g. a Prokka draft
    says "Prodigal:2.6", so Prodigal's agreement with it is partly agreement with itself), or a
    GenBank file's "Annotation Pipeline/Method/Software" comment lines."""
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    sources: dict[str, int] = {}
    lines = []
    with opener(path, "rt") as handle:
        for line in handle:
            if line.startswith("##FASTA") or line.startswith("ORIGIN"):
                break
            fields = line.split("\t")
            if len(fields) == 9 and fields[2] == "CDS":
                sources[fields[1]] = sources.get(fields[1], 0) + 1
            elif line.lstrip().startswith("Annotation ") and "::" in line:
                lines.append(" ".join(line.split()))
    return sources or "; ".join(lines)


def genes_task(paths: Sequence[Path]) -> dict:
    from genoformer.data.genome.annotations import read_annotated_genomes

    genomes = {}
    for path in paths:
        annotated = read_annotated_genomes([path], progress=False)
        contigs = [(contig.name, decode(contig.codes)) for contig in annotated]
        entry = {
            "data": str(path),
            "contigs": len(contigs),
            "bases": sum(len(s) for _, s in contigs),
            "reference_source": annotation_source(path),
            "models": {},
        }
        for meta in (True, False):
            run = pyrodigal_genes(contigs, meta=meta)
            entry["models"][f"pyrodigal_{run.mode}"] = scores = score_gene_calls(annotated, run)
            print(
                f"genes {path.name} pyrodigal {run.mode}: MCC {scores['per_base_coding_mcc']:.4f}, "
                f"{scores['n_genes']} genes, {run.seconds:.1f} s",
                flush=True,
            )
        genomes[path.name] = entry
    return {
        "protocol": "pyrodigal 1 thread; meta: GeneFinder(meta=True); single: GeneFinder() trained on the "
        "genome's own contigs (training time included in bases_per_second); reference: the "
        "file's CDS features",
        "genomes": genomes,
    }


# ------------------------------------------------------------------------------------------ main
def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _missing(paths: Sequence[Path]) -> str | None:
    absent = [str(p) for p in paths if not Path(p).exists()]
    return f"absent: {', '.join(absent)}" if absent else None


def _gene_modules_missing() -> str | None:
    for module in ("genoformer.data.genome.annotations", "genoformer.genome.genecalls"):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"{module} does not import ({exc})"
    return None


def arguments(parser) -> None:
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS), help="tasks to run (default all)")
    parser.add_argument("--splice", type=Path, default=SPLICE_TABLE, help="splice junction table (sequence, label)")
    parser.add_argument("--tf-dir", type=Path, default=TF_DIR, help="folder of {oct4,mafk}_{train,test}.fasta")
    parser.add_argument(
        "--genomes",
        type=Path,
        nargs="+",
        default=list(GENOMES),
        help="annotated genomes (GenBank, or GFF3 with ##FASTA) for the genes task",
    )
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds of the splice task")
    parser.add_argument("--seed", type=int, default=0, help="seed of the folds")
    parser.add_argument("--jobs", type=int, default=1, help="processes for each logistic regression's inner CV")


def measure(args) -> dict:
    from threadpoolctl import threadpool_info  # installed with scikit-learn

    if args.smoke:  # the shipped splice table's first 150 rows, 2 folds, two values of C, the one-hot model
        rows = (REPO / "examples" / "splice_junctions_statlog.tsv").read_text().splitlines()[:151]
        args.splice = Path(tempfile.mkdtemp()) / "splice.tsv"
        args.splice.write_text("\n".join(rows) + "\n")
        args.tasks, args.folds = ["splice"], 2
    results: dict = {
        "jobs": args.jobs,
        "blas_threads": sorted({pool["num_threads"] for pool in threadpool_info()}),
        "versions": {name: _version(name) for name in ("scikit-learn", "pyrodigal", "numpy")},
        "tasks": {},
        "skipped": {},
    }
    available = {
        "splice": lambda: _missing([args.splice]),
        "tf": lambda: _missing([args.tf_dir / f"{p}_{s}.fasta" for p in ("oct4", "mafk") for s in ("train", "test")]),
        "genes": lambda: _missing(args.genomes) or _gene_modules_missing(),
    }
    run = {
        "splice": lambda: splice_task(
            args.splice, args.folds, args.seed, args.jobs, (1e-2, 1.0) if args.smoke else CS, kmers_too=not args.smoke
        ),
        "tf": lambda: tf_task(args.tf_dir, args.seed, args.jobs),
        "genes": lambda: genes_task(args.genomes),
    }
    load_before = os.getloadavg()
    for task in args.tasks:
        reason = available[task]()
        if reason is not None:
            results["skipped"][task] = reason
            continue
        began = time.perf_counter()
        results["tasks"][task] = {**run[task](), "seconds": time.perf_counter() - began}
    # a shared machine: the 1-minute load average before and after says how contended the timings were
    results["load_average_1min"] = [load_before[0], os.getloadavg()[0]]
    return {"baselines": results}


def summarize(data: dict) -> Summary:
    tasks, rows = data["baselines"]["tasks"], []
    for task in ("splice", "tf"):
        for name, m in tasks.get(task, {}).get("models", {}).items():
            rows.append(
                {
                    "task": task,
                    "model": name.replace("_", " "),
                    "accuracy": m.get("accuracy_mean", m.get("accuracy")),
                    "accuracy sd": m.get("accuracy_sd"),
                    "AUROC": m.get("auroc_mean", m.get("auroc")),
                    "MCC": m.get("mcc_mean", m.get("mcc")),
                }
            )
    for genome, entry in tasks.get("genes", {}).get("genomes", {}).items():
        rows += [
            {"task": f"genes, {genome}", "model": name.replace("_", " "), "MCC": m["per_base_coding_mcc"]}
            for name, m in entry["models"].items()
        ]
    skipped = data["baselines"]["skipped"]
    return Summary(
        tables=[table(rows, "Mean over the folds (splice), the test split (tf), whole genomes (genes)")],
        notes=[f"{task} skipped: {why}" for task, why in skipped.items()],
    )


BENCHMARK = Benchmark(
    "finetune_baselines", "Fine-tuning: the classical baselines (CPU)", __doc__, measure, summarize, arguments=arguments
)

if __name__ == "__main__":
    BENCHMARK.main()
