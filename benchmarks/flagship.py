"""The flagship DNA model (issue 28): held-out sets, scoring at 1k to 32k of context, the Markov
baseline and mixture on the same bases, and the BENCHMARKS.md section.

Stages, each a subcommand:

    # CPU: the nine genomes' store for training and the held-out sets (FASTA), carried to the GPU
    python -m benchmarks.flagship store --out .device/dna/genomes.zarr
    python -m benchmarks.flagship heldout --out .device/dna/heldout
    # GPU (benchmarks/gpu_flagship.sh runs it after training): every run's model on every set
    python -m benchmarks.flagship score --runs /tmp/flagship --heldout .device/dna/heldout --out OUT/flagship
    # CPU: the Markov models on the same training data, scored on the same bases; the mixtures
    python -m benchmarks.flagship baseline --heldout .device/dna/heldout --out benchmarks/results/flagship
    # anywhere: tables, curves and the BENCHMARKS.md section
    python -m benchmarks.flagship report --results benchmarks/results/flagship --benchmarks_md BENCHMARKS.md

The held-out sets (`heldout`), fixed by rule so that every method scores the same bases:
- new_genus: Leptospira kirschneri H1 (GenBank of fetch-more.sh), whole contigs of at least 32 kb
  in file order until SET_BASES; no Leptospira is in any training set;
- strain: a non-K-12 E. coli (Prokka GFF3 of fetch-more.sh), the same rule; K-12 is trained on;
- eukaryote: C. elegans chromosome X, SET_BASES from 8 Mb on; no nematode is trained on;
- trained_bacteria / trained_eukaryotes: the test split (the last 3% of every chromosome, never
  trained on) of the training genomes, bacteria whole, eukaryotes' longest chromosome of each
  file, up to SET_BASES.
Bits per base count A/C/G/T on both strands, less the first base of each record and strand (no
context), the same bases for every model and the Markov baseline.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import tarfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import command_line, describe_environment, write_json_file
from benchmarks.genome_science import block_sums
from genoformer.data.genome.alphabet import decode, reverse_complement

REPO = Path(__file__).resolve().parents[1]
PREVIOUS_SHIPPED = REPO / "examples" / "genoformer_bacteria_8k.ckpt"
"""The model shipped before the flagship, the first round's start (in git until 4576bed)."""
EXTRA = REPO.parent / "shared-extra" / "genomes"
CONFIG = REPO / "configs" / "genome_dna_gpu.yaml"
CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
SET_BASES = 600_000
MIN_CONTIG = 32_768
WORM_START = 8_000_000  # the eukaryote set: C. elegans chromosome X from this base on
SETS = ("new_genus", "strain", "eukaryote", "trained_bacteria", "trained_eukaryotes")
BACTERIA = ("ecoli_k12_mg1655", "saureus_col", "hpylori_els37", "vcholerae_o395")
PART_BYTES = 15 << 20  # the device tool brings back files of at most 16 MiB
STAGE2 = ("long", "flagship32k")  # the 32k runs: their bf16 models and per-base scores come back from the GPU
MARKOV_MODELS = {
    # name: (training data, highest order, settings fixed instead of chosen)
    "bacteria": ("bacteria", 16, {}),  # k, d, a chosen on the training genomes' held-out tails
    "all": ("all", 12, {}),  # every training genome; order 12 keeps the counts of 108 Mbp in memory
    # what memory of the training genomes gives on a strain: light smoothing, so that a 16-mer seen
    # once predicts its next base (not chosen on any held-out data; the selection prefers a = 256)
    "bacteria_memorising": ("bacteria", 16, {"order": 16, "discount": 0.9, "concentration": 1.0}),
}


def config_data() -> tuple[list[str], object]:
    """The flagship config's FASTA files (relative to the repository) and its split."""
    from genoformer.training_cli import training_cli

    cli = training_cli(["--config", str(CONFIG), "--trainer.accelerator", "cpu", "--trainer.precision", "32-true"], run=False)
    return cli.datamodule.fasta, cli.datamodule.split


# ------------------------------------------------------------------------------------- store
def store(args: argparse.Namespace) -> None:
    from genoformer.data.genome.store import prepare_genome_store

    fasta, _ = config_data()
    missing = [f for f in fasta if not (REPO / f).is_file()]
    if missing:
        raise SystemExit(f"missing {missing}: run bash ../shared/data/fetch-more.sh ../shared-extra first")
    prepare_genome_store([REPO / f for f in fasta], args.out, progress=True)


# ----------------------------------------------------------------------------------- heldout
def _whole_contigs(path: Path, budget: int) -> list[tuple[str, np.ndarray]]:
    from genoformer.data.genome.inputs import read_sequences

    chosen, total = [], 0
    for record in read_sequences([str(path)]):
        if len(record.codes) >= MIN_CONTIG and total < budget:
            chosen.append((record.name, record.codes))
            total += len(record.codes)
    return chosen


def _test_split(genomes: Path, budget: int) -> dict[str, list[tuple[str, np.ndarray]]]:
    """The test intervals of the training store: every bacterial one; for each eukaryotic file
    that of its longest chromosome, in file order until `budget` bases."""
    from genoformer.data.genome.store import GenomeStore
    from genoformer.data.splits import SequenceSource, split_intervals

    _, split = config_data()
    genome = GenomeStore(genomes)
    intervals = split_intervals([SequenceSource(c.name, c.length, c.source_name) for c in genome.contigs], split)["test"]
    bacteria, eukaryotes, longest = [], [], {}
    for iv in intervals:
        contig = genome.contigs[iv.index]
        if contig.source_name.split(".")[0] in BACTERIA:
            bacteria.append(iv)
        elif contig.length > longest.get(contig.source_name, (0, None))[0]:
            longest[contig.source_name] = (contig.length, iv)
    total = 0
    for _, iv in longest.values():
        if total < budget:
            eukaryotes.append(iv)
            total += iv.length

    def read(chosen):
        return [(f"{genome.contigs[iv.index].name}:{iv.start}-{iv.end}", genome.read(iv.index, iv.start, iv.end)) for iv in chosen]

    return {"trained_bacteria": read(bacteria), "trained_eukaryotes": read(eukaryotes)}


def heldout(args: argparse.Namespace) -> None:
    from genoformer.data.genome.inputs import read_sequences

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = Path(args.extra)
    worm = next(iter(read_sequences([str(extra / "celegans_ce2_chrX.fasta.gz")])))
    start = WORM_START
    sets = {
        "new_genus": _whole_contigs(extra / "leptospira_kirschneri_h1.gbk.gz", args.bases),
        "strain": _whole_contigs(extra / "ecoli_draft_prokka.gff3.gz", args.bases),
        "eukaryote": [(f"{worm.name}:{start}-{start + args.bases}", worm.codes[start:start + args.bases])],
        **_test_split(Path(args.genomes), args.bases),
    }
    described = {}
    for name, records in sets.items():
        with gzip.open(out / f"{name}.fa.gz", "wt", compresslevel=6) as handle:
            for title, codes in records:
                handle.write(f">{title}\n{decode(codes)}\n")
        described[name] = {"records": [title for title, _ in records], "bases": int(sum(len(c) for _, c in records))}
        print(f"{name}: {len(records)} records, {described[name]['bases']:,} bases")
    write_json_file(out / "sets.json", {"command": command_line(), "sets": described})


def read_set(heldout_dir: Path, name: str) -> list[tuple[str, np.ndarray]]:
    from genoformer.data.genome.inputs import read_sequences

    return [(r.name, r.codes) for r in read_sequences([str(heldout_dir / f"{name}.fa.gz")])]


# ------------------------------------------------------------------------------------- score
def _contexts_of(max_seq_len: int, contexts: list[int]) -> list[int]:
    """Every context up to the model's trained one for a long model; the trained one alone else."""
    usable = [c for c in contexts if c <= max_seq_len]
    return usable if max_seq_len >= max(contexts) else usable[-1:]


def score(args: argparse.Namespace) -> None:
    import torch

    from genoformer.core.export import export
    from genoformer.genome.scoring import Scorer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = Path(args.runs)
    heldout_dir = Path(args.heldout)
    sets = {name: read_set(heldout_dir, name) for name in SETS}
    if args.max_bases:  # the smoke test: a few kb of each set
        sets = {name: [(t, c[: args.max_bases]) for t, c in records[:1]] for name, records in sets.items()}
    models = {}
    if not args.prefix:  # the first round's reference: the model shipped before the flagship
        if not PREVIOUS_SHIPPED.is_file():
            raise SystemExit(f"{PREVIOUS_SHIPPED} (the model the first round compares with) was replaced by "
                             f"examples/genoformer_dna.ckpt: restore it with `git show 4576bed:{PREVIOUS_SHIPPED.relative_to(REPO)} "
                             f"> {PREVIOUS_SHIPPED.relative_to(REPO)}`, or score only some runs with --prefix")
        models["shipped"] = PREVIOUS_SHIPPED
    for run in sorted(p for p in runs.iterdir() if (p / "checkpoints" / "last.ckpt").is_file() and p.name.startswith(args.prefix)):
        # the stage-2 models come back (bf16, weights only); the others stay on the GPU machine
        where = out if run.name.startswith(STAGE2) else runs / "exports"
        where.mkdir(exist_ok=True)
        models[run.name] = export(checkpoint=run / "checkpoints" / "last.ckpt", out=where / f"{run.name}.ckpt",
                                  dtype="bfloat16", overwrite=True)
        if (run / "metrics.csv").is_file():
            shutil.copy(run / "metrics.csv", out / f"{run.name}.metrics.csv")
    results = {"environment": {**describe_environment(), "command": command_line()}, "models": {}}
    for model, path in models.items():
        scorer = Scorer.from_checkpoint(path, device=args.device)
        entry = results["models"][model] = {"max_seq_len": scorer.model.config.max_seq_len,
                                            "parameters": sum(p.numel() for p in scorer.model.parameters()), "contexts": {}}
        for context in _contexts_of(scorer.model.config.max_seq_len, list(args.contexts)):
            per_set, began = {}, time.perf_counter()
            for name, records in sets.items():
                sequences = [c for _, c in records] + [reverse_complement(c) for _, c in records]
                log2p = scorer.score_many(sequences, context=context, batch_size=args.batch_size, progress=False)
                per_set[name] = {"records": block_sums(records, log2p)}
                if context == scorer.model.config.max_seq_len and model.startswith(STAGE2):
                    n = len(records)  # per-base log2 p of both strands (reverse aligned to forward), for the mixtures
                    np.savez_compressed(out / f"{model}.{name}.log2p.npz",
                                        **{f"{i}": np.stack([f, b[::-1]]).astype(np.float16)
                                           for i, (f, b) in enumerate(zip(log2p[:n], log2p[n:]))})
            seconds = time.perf_counter() - began
            entry["contexts"][str(context)] = {"seconds": seconds, "sets": per_set}
            line = ", ".join(f"{n} {_bpb(s):.4f}" for n, s in per_set.items())
            print(f"{model} @ {context}: {line} ({seconds:.1f} s)", flush=True)
        del scorer
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    write_json_file(out / "scores.json", results)
    pack(out, Path(args.out).parent)


def _bpb(result: dict) -> float:
    bits = sum(sum(r["bits"]) for r in result["records"])
    bases = sum(sum(r["bases"]) for r in result["records"])
    return bits / bases


def pack(folder: Path, dest: Path) -> None:
    """One tar of `folder`, cut in parts of PART_BYTES (`cat NAME.tar.part* | tar x` rejoins it)."""
    tar_path = dest / f"{folder.name}.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(folder, arcname=folder.name)
    shutil.rmtree(folder)
    with open(tar_path, "rb") as source:
        index = 0
        while chunk := source.read(PART_BYTES):
            (dest / f"{folder.name}.tar.part{index}").write_bytes(chunk)
            index += 1
    tar_path.unlink()


# ---------------------------------------------------------------------------------- baseline
def baseline(args: argparse.Namespace) -> None:
    """Order-k Markov models fitted on the flagship's own training intervals (the config's train
    split of the store), each scored on every held-out set, both strands, on the network's bases."""
    from genoformer.data.genome.store import GenomeStore
    from genoformer.data.splits import SequenceSource, split_intervals
    from genoformer.genome.markov import fit_markov_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    _, split = config_data()
    genome = GenomeStore(args.genomes)
    train = split_intervals([SequenceSource(c.name, c.length, c.source_name) for c in genome.contigs], split)["train"]
    sets = {name: read_set(Path(args.heldout), name) for name in SETS}
    previous = out / "markov.json"
    report = json.loads(previous.read_text()) if previous.is_file() else {"models": {}}
    report.update({"environment": {**describe_environment("cpu"), "command": command_line()}})
    for name in args.models:
        data, max_order, fixed = MARKOV_MODELS[name]
        chosen = [iv for iv in train if data == "all" or genome.contigs[iv.index].source_name.split(".")[0] in BACTERIA]
        sequences = [genome.read(iv.index, iv.start, iv.end) for iv in chosen]
        began = time.perf_counter()
        model, _ = fit_markov_model(sequences, max_order=max_order, progress=True, **fixed)
        fit_seconds = time.perf_counter() - began
        del sequences
        model.save(work / f"markov_{name}.npz", overwrite=True)
        entry = report["models"][name] = {
            "data": data, "chosen": "fixed" if fixed else "on held-out training data",
            "train_bases": int(sum(iv.length for iv in chosen)), "max_order": max_order, "order": model.order,
            "discount": model.discount, "concentration": model.concentration, "fit_seconds": fit_seconds, "sets": {}}
        for set_name, records in sets.items():
            forward = [model.log2_probabilities(c) for _, c in records]
            backward = [model.log2_probabilities(reverse_complement(c)) for _, c in records]
            for values in forward + backward:
                values[0] = np.nan  # the network has no context for a record's first base: neither counts it
            entry["sets"][set_name] = {"records": block_sums(records, forward + backward)}
            np.savez_compressed(work / f"markov_{name}.{set_name}.log2p.npz",
                                **{f"{i}": np.stack([f, b[::-1]]).astype(np.float32)
                                   for i, (f, b) in enumerate(zip(forward, backward))})
            print(f"markov {name} (order {model.order}) {set_name}: {_bpb(entry['sets'][set_name]):.4f}", flush=True)
        write_json_file(out / "markov.json", report)


# ----------------------------------------------------------------------------------- mixture
def _streams(path: Path) -> list[np.ndarray]:
    """The (2, L) per-base log2 p arrays of one set (both strands, reverse aligned to forward)."""
    with np.load(path) as arrays:
        return [arrays[str(i)].astype(np.float64) for i in range(len(arrays.files))]


def mixture(args: argparse.Namespace) -> None:
    """The network mixed with each Markov model on every held-out set: the switching mixture (no
    fitted weight) and a fixed weight fitted on the other four sets (never on the set it scores)."""
    from genoformer.genome.mixture import Mixture, MixMode, fit_weight

    scores, work = Path(args.scores), Path(args.work)
    report = {"environment": {**describe_environment("cpu"), "command": command_line()}, "network": args.network,
              "context": args.context, "markov": {}}
    network = {name: _streams(scores / f"{args.network}.{name}.log2p.npz") for name in SETS}
    for markov in args.markov:
        theirs = {name: _streams(work / f"markov_{markov}.{name}.log2p.npz") for name in SETS}
        flat = {name: (np.concatenate([a.ravel() for a in network[name]]), np.concatenate([b.ravel() for b in theirs[name]]))
                for name in SETS}
        entry = report["markov"][markov] = {}
        for name in SETS:
            a_L, b_L = flat[name]
            both = np.isfinite(a_L) & np.isfinite(b_L)
            others = [n for n in SETS if n != name]
            weight = fit_weight(np.concatenate([flat[n][0] for n in others]), np.concatenate([flat[n][1] for n in others]))
            fixed = Mixture(mode=MixMode.FIXED, weight=weight)
            switching = Mixture()
            mixed = {"fixed": [fixed.mix(a, b) for a_2L, b_2L in zip(network[name], theirs[name]) for a, b in zip(a_2L, b_2L)],
                     "switching": [switching.mix(a, b) for a_2L, b_2L in zip(network[name], theirs[name]) for a, b in zip(a_2L, b_2L)]}
            entry[name] = {"bases": int(both.sum()), "network": float(-a_L[both].mean()), "markov": float(-b_L[both].mean()),
                           "fixed_weight": weight,
                           **{mode: float(-np.concatenate(v)[both].mean()) for mode, v in mixed.items()}}
            row = entry[name]
            print(f"{markov:>20} {name:>18}: network {row['network']:.4f} markov {row['markov']:.4f} "
                  f"fixed({weight:.2f}) {row['fixed']:.4f} switching {row['switching']:.4f}", flush=True)
    write_json_file(Path(args.out) / "mixture.json", report)


# ------------------------------------------------------------------------------------ report
LABELS = {"new_genus": "new genus (Leptospira)", "strain": "strain (E. coli, not K-12)",
          "eukaryote": "new eukaryote (C. elegans X)", "trained_bacteria": "trained bacteria, test regions",
          "trained_eukaryotes": "trained eukaryotes, test regions"}
IN_PROSE = {"new_genus": "the new genus", "strain": "the strain", "eukaryote": "the new eukaryote",
            "trained_bacteria": "the trained bacteria's test regions", "trained_eukaryotes": "the trained eukaryotes' test regions"}
FLAGSHIP = "flagship32k"  # the flagship: examples/genoformer_dna.ckpt is its weights in bfloat16
RUNS = {  # run: (what it is, what it starts from, data); its steps before: its start's, plus the start's own
    "shipped": ("the model shipped before (examples/genoformer_bacteria_8k.ckpt), 256 x 8", "fresh", "4 bacteria"),
    "bacteria": ("first round: stage 1, 256 x 8, bacteria only (data ablation)", "shipped", "4 bacteria"),
    "warm": ("first round: stage 1, 256 x 8, all nine genomes", "shipped", "9 genomes"),
    "w256_d8": ("first round: sweep, fresh 256 x 8", "fresh", "9 genomes"),
    "w384_d6": ("first round: sweep, fresh 384 x 6", "fresh", "9 genomes"),
    "long_rope10k": ("first round: stage 2 at 32k, RoPE base 10,000", "warm", "9 genomes"),
    "long_rope500k": ("first round: stage 2 at 32k, RoPE base 500,000", "warm", "9 genomes"),
    "flagship8k": ("final: stage 1 at 8k, 256 x 8, all nine genomes", "shipped", "9 genomes"),
    FLAGSHIP: ("final: stage 2 at 32k, RoPE base 500,000 (the flagship)", "flagship8k", "9 genomes"),
}
SHIPPED_STEPS = 1600  # the shipped model's own training (configs/genome_bacteria_gpu.yaml)
TOKENS_PER_STEP = 131_072
FINAL_COLOURS = {"flagship8k": "black", FLAGSHIP: "crimson"}  # the final round's lines on the training curve
ROUNDS = ("sweep", "long", "final")  # the results' folders, each a scores.json and its runs' metrics.csv
CURVE_MODELS = (FLAGSHIP, "long_rope10k", "long_rope500k")  # scored at every context
BACTERIAL, EUKARYOTIC = ("new_genus", "strain", "trained_bacteria"), ("eukaryote", "trained_eukaryotes")
TARGETS = {"new_genus_below_markov": 0.15, "moonshot_new_genus": 1.70, "strain_mix_within": 0.02, "gain_1k_8k": 0.01}


def _pooled(context_result: dict, names: tuple[str, ...]) -> dict:
    return {"records": [r for name in names for r in context_result["sets"][name]["records"]]}


def _metrics(path: Path) -> dict:
    """A run's metrics.csv: validation bits per base by step, the last logged step, the peak learning rate."""
    import csv

    steps, values, trained, peak_lr = [], [], 0, 0.0
    with open(path) as handle:
        for row in csv.DictReader(handle):
            trained = max(trained, int(row["step"]) + 1)
            if row.get("lr-AdamW/pg1"):
                peak_lr = max(peak_lr, float(row["lr-AdamW/pg1"]))
            if row.get("val/bpb"):
                steps.append(int(row["step"]) + 1)
                values.append(float(row["val/bpb"]))
    return {"steps": steps, "bpb": values, "trained": trained, "peak_lr": peak_lr}


def _steps_before(curves: dict[str, dict]) -> dict[str, int]:
    """Steps each run's weights had seen when it started, counted from a fresh model."""
    def before(name: str) -> int:
        start = RUNS[name][1]
        if start == "fresh":
            return 0
        if start == "shipped":
            return SHIPPED_STEPS
        if start not in curves:
            raise SystemExit(f"{name} starts from {start}, whose metrics.csv is not in the results: copy it there")
        return before(start) + curves[start]["trained"]

    return {name: before(name) for name in curves}


def _span(values: list[float], digits: int) -> str:
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low} to {high}"


def _set_bpb(models: dict, name: str, context: str) -> dict[str, float]:
    return {s: _bpb(models[name]["contexts"][context]["sets"][s]) for s in SETS}


def report(args: argparse.Namespace) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from benchmarks.common import markdown_table, replace_markdown_section, write_atomically
    from benchmarks.genome_science import bootstrap_difference

    root = Path(args.results)
    rounds = {folder: json.loads((root / folder / "scores.json").read_text()) for folder in ROUNDS}
    markov = json.loads((root / "markov.json").read_text())
    mixed = json.loads((root / "mixture.json").read_text())
    sets = json.loads((root / "sets.json").read_text())["sets"]
    shipped_science = json.loads(Path(args.shipped_summary).read_text())["regions"]
    scored = {name: entry for scores in rounds.values() for name, entry in scores["models"].items()}
    if unknown := sorted(set(scored) - set(RUNS)):
        raise SystemExit(f"scores of models {unknown} that RUNS does not describe: add them to RUNS in benchmarks/flagship.py")
    models = {name: scored[name] for name in RUNS if name in scored}
    found = {path.name.split(".")[0]: path for folder in ROUNDS for path in (root / folder).glob("*.metrics.csv")}
    if unknown := sorted(set(found) - set(RUNS)):
        raise SystemExit(f"metrics of runs {unknown} that RUNS does not describe: add them to RUNS in benchmarks/flagship.py")
    curves = {name: _metrics(found[name]) for name in RUNS if name in found}
    before = _steps_before(curves)

    # held-out bits per base, every model at its trained context (the long ones at 8k too, the flagship at 1k too)
    rows = []
    for name, entry in models.items():
        contexts = sorted(entry["contexts"], key=int)
        shown = ("1024", "8192", contexts[-1]) if name == FLAGSHIP else ("8192", contexts[-1])
        for context in ([c for c in contexts if c in shown] if len(contexts) > 1 else contexts):
            result = entry["contexts"][context]
            row = {"model": name, "what": RUNS[name][0], "params": f"{entry['parameters'] / 1e6:.1f} M", "context": f"{int(context) // 1024}k"}
            row.update({LABELS[s]: f"{_bpb(result['sets'][s]):.4f}" for s in SETS})
            rows.append(row)
    for name, entry in markov["models"].items():
        row = {"model": f"Markov {name}", "what": f"order {entry['order']}, d {entry['discount']:g}, a {entry['concentration']:g}, "
               f"{entry['train_bases'] / 1e6:.1f} Mbp", "params": "-", "context": f"{entry['order']}"}
        row.update({LABELS[s]: f"{_bpb(entry['sets'][s]):.4f}" for s in SETS})
        rows.append(row)
    held_out = markdown_table(rows)

    # the context curve of the 32k models, pooled over bacterial and eukaryotic sets, paired bootstrap
    figure = Figure(figsize=(12, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    per_set, pooled_ax = figure.subplots(1, 2)
    curve_rows, gains = [], {}
    for name in CURVE_MODELS:
        entry = models[name]["contexts"]
        contexts = sorted(entry, key=int)
        xs = [int(c) for c in contexts]
        for label, names in (("bacterial", BACTERIAL), ("eukaryotic", EUKARYOTIC)):
            row = {"model": name, "held-out DNA": label}
            row.update({f"{int(c) // 1024}k": f"{_bpb(_pooled(entry[c], names)):.4f}" for c in contexts})
            for low, high in (("1024", "8192"), ("8192", "32768")):
                point, lo, hi = gains[(name, label, low, high)] = bootstrap_difference(
                    _pooled(entry[low], names), _pooled(entry[high], names))
                row[f"{int(low) // 1024}k - {int(high) // 1024}k (95% CI)"] = f"{point:+.4f} ({lo:+.4f}, {hi:+.4f})"
            curve_rows.append(row)
            base = _bpb(_pooled(entry[contexts[0]], names))
            style = {"linewidth": 2.5} if name == FLAGSHIP else {"linestyle": "--", "alpha": 0.7}
            pooled_ax.plot(xs, [base - _bpb(_pooled(entry[c], names)) for c in contexts], marker="o",
                           label=f"{name}, {label}", **style)
        if name == FLAGSHIP:
            for s in SETS:
                base = _bpb(entry[contexts[0]]["sets"][s])
                per_set.plot(xs, [base - _bpb(entry[c]["sets"][s]) for c in contexts], "o-", label=LABELS[s])
    for ax, title in ((per_set, f"the flagship ({FLAGSHIP}): each held-out set"),
                      (pooled_ax, f"{FLAGSHIP} and the first round's two RoPE bases, pooled")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("bits per base saved over a 1k context")
        ax.axhline(TARGETS["gain_1k_8k"], color="grey", linestyle=":", label=f"target at 8k: {TARGETS['gain_1k_8k']}")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    figure.savefig(root / "context_curve.png", dpi=120)
    curve = markdown_table(curve_rows)

    # validation bits per base against training tokens, counted from a fresh model
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    run_rows = []
    for name, run in curves.items():
        style = {"linewidth": 2.5, "color": FINAL_COLOURS[name]} if name in FINAL_COLOURS else {"alpha": 0.7}
        ax.plot([(before[name] + s) * TOKENS_PER_STEP / 1e6 for s in run["steps"]], run["bpb"], "o-", markersize=3,
                label=f"{name} ({RUNS[name][2]})", **style)
        run_rows.append({"run": name, "what": RUNS[name][0], "starts from": RUNS[name][1], "data": RUNS[name][2],
                         "steps before": f"{before[name]:,}", "steps (last logged)": f"{run['trained']:,}",
                         "tokens (M)": f"{run['trained'] * TOKENS_PER_STEP / 1e6:.0f}", "peak learning rate": f"{run['peak_lr']:.2g}",
                         "last val bits/base": f"{run['bpb'][-1]:.4f}" if run["bpb"] else "-"})
    ax.axvline(SHIPPED_STEPS * TOKENS_PER_STEP / 1e6, color="grey", linestyle=":", label="the shipped model")
    ax.set_xlabel("training tokens, counted from a fresh model (M)")
    ax.set_ylabel("validation bits per base")
    ax.set_title("validation: the first 8 batches of each run's held-out regions\n"
                 "(bacteria only for `bacteria`; 32k tiles, other windows, for the stage-2 runs)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    figure.savefig(root / "training_curve.png", dpi=120)
    runs_table = markdown_table(run_rows)

    mix_rows = []
    for name, entry in mixed["markov"].items():
        for s in SETS:
            e = entry[s]
            mix_rows.append({"Markov": name, "held out": LABELS[s], f"network ({mixed['network']})": f"{e['network']:.4f}",
                             "Markov alone": f"{e['markov']:.4f}",
                             "fixed weight (fitted on the other sets)": f"{e['fixed']:.4f} (w {e['fixed_weight']:.2f})",
                             "switching (default)": f"**{e['switching']:.4f}**"})
    mix_table = markdown_table(mix_rows)
    write_atomically(root / "tables.md", "\n\n".join([runs_table, held_out, curve, mix_table]) + "\n")
    if args.benchmarks_md:
        facts = {"rounds": rounds, "models": models, "curves": curves, "before": before, "markov": markov, "mixed": mixed,
                 "sets": sets, "shipped_science": shipped_science, "gains": gains}
        replace_markdown_section(args.benchmarks_md, "flagship", _section(facts, runs_table, held_out, curve, mix_table))
    print(held_out, curve, mix_table, sep="\n\n")


def _section(facts: dict, runs_table: str, held_out: str, curve: str, mix_table: str) -> str:
    first, final = facts["rounds"]["long"]["environment"], facts["rounds"]["final"]["environment"]
    curves, sets, mixed = facts["curves"], facts["sets"], facts["mixed"]
    train_bases = facts["markov"]["models"]["all"]["train_bases"]
    mbp = {s: sets[s]["bases"] / 1e6 for s in SETS}
    network = mixed["network"]
    mixed_note = "" if network == FLAGSHIP else (
        f" ({network} is the first round's network: `python -m benchmarks.flagship mixture --network {FLAGSHIP}` "
        "on the flagship's per-base scores redoes this table)")
    return "\n".join([
        "## Flagship DNA model: sweep, data, context, mixture with the Markov model",
        "",
        f"The first round (a sweep and two 32k runs) on **{first['device']}**, {first['date_utc']}: "
        "`bash benchmarks/gpu_flagship.sh sweep` (four 8k runs at once, each about a quarter of the GPU, beside the nine "
        "time-series runs) and `bash benchmarks/gpu_flagship.sh long` (two 32k runs at once, then `python -m benchmarks.flagship "
        f"score`). The final round on **{final['device']}**, {final['date_utc']}; torch {final['torch']}, triton {final['triton']}: "
        f"`bash benchmarks/gpu_flagship.sh stage1` (flagship8k, {curves['flagship8k']['trained']:,} steps at 8k from the shipped "
        f"model), then `bash benchmarks/gpu_flagship.sh stage2` ({FLAGSHIP}, {curves[FLAGSHIP]['trained']:,} logged steps at 32k, then "
        "`score`). Markov models and mixtures on the 2-core CPU: `python -m benchmarks.flagship baseline ...` and "
        "`python -m benchmarks.flagship mixture`; this section: `python -m benchmarks.flagship report --benchmarks_md BENCHMARKS.md`. "
        "Held-out sets (`python -m benchmarks.flagship heldout`, benchmarks/results/flagship/sets.json): Leptospira kirschneri "
        f"contigs ({mbp['new_genus']:.2f} Mbp, a genus never trained on), a non-K-12 E. coli ({mbp['strain']:.2f} Mbp), "
        f"C. elegans chromosome X from {WORM_START / 1e6:g} Mb ({mbp['eukaryote']:.2f} Mbp), and the test split of the training "
        f"genomes (bacteria {mbp['trained_bacteria']:.2f} Mbp, eukaryotes {mbp['trained_eukaryotes']:.2f} Mbp); both strands, "
        f"the same bases for every model. Data: configs/genome_dna_gpu.yaml ({len(BACTERIA)} bacteria + Dictyostelium, "
        f"Plasmodium, Ustilago, Drosophila 2R; {train_bases / 1e6:.1f} Mbp of training intervals, half the windows bacterial).",
        "",
        f"The shipped file: `examples/genoformer_dna.ckpt` is {FLAGSHIP} in bfloat16.",
        "",
        f"Runs ({TOKENS_PER_STEP:,} tokens per step; steps before: what the starting weights had seen, the shipped model "
        f"{SHIPPED_STEPS:,}):",
        "",
        runs_table,
        "",
        "![validation bits per base against training tokens](benchmarks/results/flagship/training_curve.png)",
        "",
        "Each run validates on the first 8 batches of its own held-out regions: the bacteria-only run on bacteria, the "
        "stage-2 runs on 32k tiles (other windows than stage 1's 8k tiles), so levels compare within a run, and "
        "across runs only on the held-out sets below.",
        "",
        "Bits per base on the held-out sets (lower is better):",
        "",
        held_out,
        "",
        f"What the context buys ({FLAGSHIP} and the first round's 32k runs, scored at each context with half-window overlap; "
        "paired block bootstrap):",
        "",
        curve,
        "",
        "![bits per base saved over a 1k context](benchmarks/results/flagship/context_curve.png)",
        "",
        f"The network ({network}, {mixed['context'] // 1024}k context) mixed with each Markov model (`--mix`), bits per base on "
        f"the same bases{mixed_note}:",
        "",
        mix_table,
        "",
        "### What the measurements say",
        "",
        *_measurements(facts),
        "",
        "### Targets",
        "",
        *_targets(facts),
    ])


def _measurements(facts: dict) -> list[str]:
    models, curves, mixed = facts["models"], facts["curves"], facts["mixed"]
    at8k = {name: _set_bpb(models, name, "8192") for name in models}
    at32k = {name: _set_bpb(models, name, "32768") for name in CURVE_MODELS}
    eukaryotes, trained = ("eukaryote", "trained_eukaryotes"), ("strain", "trained_bacteria")
    data = {s: at8k["bacteria"][s] - at8k["warm"][s] for s in SETS}  # > 0: the eukaryotes help
    width = {s: at8k["w256_d8"][s] - at8k["w384_d6"][s] for s in SETS}  # > 0: the wider model is better
    rope = {(s, c): (at8k if c == "8k" else at32k)["long_rope10k"][s] - (at8k if c == "8k" else at32k)["long_rope500k"][s]
            for s in SETS for c in ("8k", "32k")}  # > 0: RoPE base 500,000 is better
    long_gain = {name: facts["gains"][(name, "bacterial", "8192", "32768")][0] for name in ("long_rope10k", "long_rope500k")}
    moved = {s: at8k["long_rope500k"][s] - at8k["warm"][s] for s in SETS}  # > 0: stage 2 worse at 8k
    worst = max(moved, key=moved.get)
    if "flagship8k" in models:
        stage2 = {s: at8k[FLAGSHIP][s] - at8k["flagship8k"][s] for s in SETS}
        final_moved = (f"; {FLAGSHIP}'s 8k scores against flagship8k's: {_span(list(stage2.values()), 4)} "
                       f"(positive: worse), at a peak learning rate of {curves[FLAGSHIP]['peak_lr']:.2g}")
    else:
        final_moved = (f"; flagship8k is not in final/scores.json, so what {FLAGSHIP}'s stage (peak learning rate "
                       f"{curves[FLAGSHIP]['peak_lr']:.2g}) did to the 8k scores is not measured")
    memorising = mixed["markov"]["bacteria_memorising"]
    m_model = facts["markov"]["models"]["bacteria_memorising"]
    beats = [s for s in SETS if memorising[s]["switching"] < min(memorising[s]["network"], memorising[s]["markov"])]
    keeps = [s for s in SETS if s not in beats]
    selected = [n for n in mixed["markov"] if n != "bacteria_memorising"]
    concentrations = sorted({facts["markov"]["models"][n]["concentration"] for n in selected})
    gain = {(n, s): mixed["markov"][n][s]["network"] - mixed["markov"][n][s]["switching"] for n in mixed["markov"] for s in SETS}
    best_selected = max(((n, s) for n in selected for s in SETS), key=gain.get)
    best_memorising = max(SETS, key=lambda s: gain[("bacteria_memorising", s)])
    strain = memorising["strain"]
    sweep_steps = curves["warm"]["trained"]
    return [
        f"- **Data.** From the same start and the same {sweep_steps:,} steps, adding the eukaryotes (`warm` against `bacteria`) "
        f"lowers the new genus by {data['new_genus']:.3f} bits/base and the eukaryotes by {_span([data[s] for s in eukaryotes], 2)}, "
        f"and costs {_span([-data[s] for s in trained], 3)} on the trained species (the strain, the trained bacteria's test "
        "regions): each bacterium gets an eighth of the windows instead of a quarter.",
        f"- **Width.** Fresh 384 x 6 ({models['w384_d6']['parameters'] / 1e6:.1f} M parameters) against 256 x 8 "
        f"({models['w256_d8']['parameters'] / 1e6:.1f} M) after {curves['w384_d6']['trained']:,} steps: "
        f"{_span(list(width.values()), 3)} bits/base better, within what {curves['w384_d6']['trained']:,} steps can separate; "
        "both are far behind the warm-started runs, which carry the shipped model's "
        f"{SHIPPED_STEPS * TOKENS_PER_STEP / 1e6:.0f} M tokens: a session's device time cannot train a fresh model past the "
        "shipped one.",
        f"- **RoPE base.** 500,000 against 10,000 for the first round's 32k stage: "
        f"{_span([rope[('new_genus', c)] for c in ('8k', '32k')], 4)} bits/base better on the new genus at 8k and 32k and a larger "
        f"gain from 8k to 32k on bacterial DNA ({long_gain['long_rope500k']:.4f} against {long_gain['long_rope10k']:.4f}), "
        f"{_span([-rope[('trained_bacteria', c)] for c in ('8k', '32k')], 4)} worse on the trained bacteria; the flagship uses 500,000.",
        f"- **32k curriculum.** {FLAGSHIP}: {curves[FLAGSHIP]['trained']:,} steps at 32k after {curves['flagship8k']['trained']:,} "
        "at 8k; its 32k context against 8k is in the targets below. In the first round (long_rope500k, "
        f"{curves['long_rope500k']['trained']:,} steps at 32k after `warm`'s {sweep_steps:,} at 8k) the 8k scores moved by "
        f"{_span(list(moved.values()), 4)} (positive: worse; most on {IN_PROSE[worst]}), at a peak learning rate of "
        f"{curves['long_rope500k']['peak_lr']:.2g}: `--init_weights` then took training settings from the checkpoint (fixed "
        f"since: they are the config's){final_moved}.",
        f"- **Mixture.** The switching mixture with a memorising Markov model (order {m_model['order']}, d {m_model['discount']:g}, "
        f"a {m_model['concentration']:g}; `genoformer baseline --order {m_model['order']} --discount {m_model['discount']:g} "
        f"--concentration {m_model['concentration']:g} --save`) keeps the network's score where the Markov model does not help "
        f"({', '.join(IN_PROSE[s] for s in keeps)}: within "
        f"{max(abs(memorising[s]['switching'] - memorising[s]['network']) for s in keeps):.3f}) and beats both where it "
        f"remembers ({', '.join(IN_PROSE[s] for s in beats)}). The selected Markov models (a = "
        f"{', '.join(f'{a:g}' for a in concentrations)}, chosen on held-out tails of the training genomes) barely memorise: "
        f"with them the mixture gains at most {gain[best_selected]:.3f} bits/base over the network (`{best_selected[0]}`, "
        f"{IN_PROSE[best_selected[1]]}), against {gain[('bacteria_memorising', best_memorising)]:.3f} with the memorising one "
        f"({IN_PROSE[best_memorising]}). A fixed weight cannot do both: fitted on the other sets (w {strain['fixed_weight']:.2f}) "
        f"it stays near the network and misses the strain ({strain['fixed']:.4f} against the switching mixture's "
        f"{strain['switching']:.4f}).",
    ]


def _targets(facts: dict) -> list[str]:
    models, curves, before, gains, markov, mixed = (facts[k] for k in ("models", "curves", "before", "gains", "markov", "mixed"))
    verdict = lambda ok: "MET" if ok else "NOT MET"  # noqa: E731
    longest = max(models[FLAGSHIP]["contexts"], key=int)
    flagship = _set_bpb(models, FLAGSHIP, longest)
    seen_steps = before[FLAGSHIP] + curves[FLAGSHIP]["trained"]
    seen = seen_steps * TOKENS_PER_STEP
    selected = {n: _bpb(m["sets"]["new_genus"]) for n, m in markov["models"].items() if n != "bacteria_memorising"}
    best_markov = min(selected, key=selected.get)
    genus_gap = selected[best_markov] - flagship["new_genus"]
    genus = (f"- New genus at least {TARGETS['new_genus_below_markov']} bits/base below the Markov model on the same data: "
             f"**{verdict(genus_gap >= TARGETS['new_genus_below_markov'])}**: {flagship['new_genus']:.4f} ({FLAGSHIP} at "
             f"{int(longest) // 1024}k) against {selected[best_markov]:.4f} (the better selected Markov, `{best_markov}`), "
             f"{genus_gap:.3f} below.")
    if genus_gap < TARGETS["new_genus_below_markov"]:
        stage1 = curves["flagship8k"]
        half = next(i for i, s in enumerate(stage1["steps"]) if s >= stage1["steps"][-1] / 2)
        val_rate = ((stage1["bpb"][half] - stage1["bpb"][-1])
                    / ((stage1["steps"][-1] - stage1["steps"][half]) * TOKENS_PER_STEP) * 1e8)  # bits/base per 100 M tokens
        shipped = _bpb(models["shipped"]["contexts"]["8192"]["sets"]["new_genus"])
        genus_rate = (shipped - flagship["new_genus"]) / ((seen_steps - SHIPPED_STEPS) * TOKENS_PER_STEP) * 1e8
        missing = TARGETS["new_genus_below_markov"] - genus_gap
        rate = max(val_rate, genus_rate)
        budget = (f"at the faster of the two the missing {missing:.3f} takes at least {missing / rate * 1e8 / 1e9:.1f} B more "
                  f"tokens, {missing / rate * 1e8 / seen:.1f} times what the model has seen (the rate falls as training goes on)"
                  if rate > 0 else "neither falls any more: more of the same training will not close it")
        genus += (f" Gap {missing:.3f}: the model is small ({models[FLAGSHIP]['parameters'] / 1e6:.1f} M parameters) and has "
                  f"seen {seen / 1e6:.0f} M tokens ({seen_steps:,} steps); over the second half of stage 1 (flagship8k, steps "
                  f"{stage1['steps'][half]:,} to {stage1['steps'][-1]:,}) validation fell {val_rate:.4f} bits/base per 100 M "
                  f"tokens, and the new genus fell {genus_rate:.4f} per 100 M tokens from the shipped model ({shipped:.4f}) "
                  f"to {FLAGSHIP}: {budget}.")
    moonshot = TARGETS["moonshot_new_genus"]
    genus += f" Moonshot {moonshot:.2f}: {'reached' if flagship['new_genus'] <= moonshot else 'not reached'}."

    mix = mixed["markov"]["bacteria_memorising"]["strain"]
    memorising = _bpb(markov["models"]["bacteria_memorising"]["sets"]["strain"])
    shipped_strain = _bpb(models["shipped"]["contexts"]["8192"]["sets"]["strain"])
    ahead = mix["markov"] - mix["switching"]
    strain = (f"- Strain with `--mix` within {TARGETS['strain_mix_within']} of the Markov model: "
              f"**{verdict(mix['switching'] <= mix['markov'] + TARGETS['strain_mix_within'])}**: {mix['switching']:.4f} "
              f"({mixed['network']} mixed with `bacteria_memorising`) against the memorising Markov's {mix['markov']:.4f}: "
              f"{'better than' if ahead >= 0 else 'behind'} it by {abs(ahead):.3f}"
              + ("" if mixed["network"] == FLAGSHIP else f" (the first round's network; not yet redone on {FLAGSHIP})") + ". "
              f"The network alone closer to the Markov model than the shipped model: "
              f"**{verdict(flagship['strain'] < shipped_strain)}**: {flagship['strain']:.4f} ({FLAGSHIP}) against the shipped "
              f"model's {shipped_strain:.4f} ({flagship['strain'] - memorising:.2f} bits/base behind the memorising Markov model)"
              + ("." if flagship["strain"] < shipped_strain else "; the eukaryotes took half the windows (the data ablation above)."))

    g81, e81 = gains[(FLAGSHIP, "bacterial", "1024", "8192")], gains[(FLAGSHIP, "eukaryotic", "1024", "8192")]
    context = (f"- 8k at least {TARGETS['gain_1k_8k']} bits/base below 1k on held-out bacterial DNA: "
               f"**{verdict(g81[1] >= TARGETS['gain_1k_8k'])}**: {g81[0]:.4f} saved by {FLAGSHIP} (95% CI {g81[1]:.4f} to "
               f"{g81[2]:.4f}); on eukaryotic DNA {e81[0]:.4f} ({e81[1]:.4f} to {e81[2]:.4f}).")
    if g81[1] < TARGETS["gain_1k_8k"]:
        shipped_gain = facts["shipped_science"]["saved_vs_shortest"]["8192"]["point"]
        first = gains[("long_rope500k", "bacterial", "1024", "8192")][0]
        first_steps = before["long_rope500k"] + curves["long_rope500k"]["trained"]
        per_step = (g81[0] - shipped_gain) / (seen_steps - SHIPPED_STEPS)
        context += (f" Cause: the context gain grows slowly with training: {shipped_gain:.4f} for the shipped model after "
                    f"{SHIPPED_STEPS:,} steps (on its own test regions, benchmarks/results/genome_science/summary.json), "
                    f"{g81[0]:.4f} for {FLAGSHIP} after {seen_steps:,} (peak learning rate {curves[FLAGSHIP]['peak_lr']:.2g})"
                    + (f": at that rate the {TARGETS['gain_1k_8k']} takes about "
                       f"{round((TARGETS['gain_1k_8k'] - g81[0]) / per_step, -2):,.0f} more steps." if per_step > 0 else
                       ": no more than the shipped model, so more steps alone will not raise it.")
                    + f" The first round's long_rope500k: {first:.4f} after {first_steps:,} steps (peak learning rate "
                    f"{curves['long_rope500k']['peak_lr']:.2g})" + (f", more than {FLAGSHIP} in fewer steps." if first > g81[0] else "."))
    g328, e328 = gains[(FLAGSHIP, "bacterial", "8192", "32768")], gains[(FLAGSHIP, "eukaryotic", "8192", "32768")]
    long_context = (f"- 32k no worse than 8k: **{verdict(g328[0] >= 0 and e328[0] >= 0)}**: {g328[0]:+.4f} bits/base saved by "
                    f"{FLAGSHIP} on bacterial, {e328[0]:+.4f} on eukaryotic DNA (95% CIs {g328[1]:+.4f} to {g328[2]:+.4f}; "
                    f"{e328[1]:+.4f} to {e328[2]:+.4f}).")
    return [genus, strain, context, long_context]


# -------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="stage", required=True)
    s = commands.add_parser("store", help="the training store of configs/genome_dna_gpu.yaml")
    s.add_argument("--out", required=True)
    s.set_defaults(run=store)
    h = commands.add_parser("heldout", help="the held-out sets as FASTA (CPU)")
    h.add_argument("--out", required=True)
    h.add_argument("--genomes", required=True, help="the training store (for its test split)")
    h.add_argument("--extra", default=str(EXTRA), help="fetch-more.sh's genomes folder")
    h.add_argument("--bases", type=int, default=SET_BASES)
    h.set_defaults(run=heldout)
    c = commands.add_parser("score", help="every run's model on every held-out set (GPU)")
    c.add_argument("--runs", required=True, help="folder of run directories (each with checkpoints/last.ckpt)")
    c.add_argument("--heldout", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    c.add_argument("--prefix", default="", help="only the runs whose names start with this (and not the shipped model)")
    c.add_argument("--batch_size", type=int, default=8)
    c.add_argument("--device", default=None)
    c.add_argument("--max_bases", type=int, default=0, help="score only this many bases of one record per set (smoke)")
    c.set_defaults(run=score)
    b = commands.add_parser("baseline", help="Markov models on the flagship's training data, on every held-out set (CPU)")
    b.add_argument("--genomes", required=True, help="the training store")
    b.add_argument("--heldout", required=True)
    b.add_argument("--out", required=True, help="folder of markov.json")
    b.add_argument("--work", default=str(REPO / "runs" / "flagship"), help="the models (.npz) and per-base scores")
    b.add_argument("--models", nargs="+", choices=sorted(MARKOV_MODELS), default=list(MARKOV_MODELS))
    b.set_defaults(run=baseline)
    m = commands.add_parser("mixture", help="the network mixed with each Markov model on the same bases (CPU)")
    m.add_argument("--scores", default=str(REPO / "runs" / "flagship" / "log2p"), help="the network's per-base scores")
    m.add_argument("--network", default=FLAGSHIP, help="the run whose per-base scores are mixed (the report names it)")
    m.add_argument("--context", type=int, default=32768, help="the context the network's scores were taken at (for the report)")
    m.add_argument("--work", default=str(REPO / "runs" / "flagship"), help="the Markov models' per-base scores")
    m.add_argument("--markov", nargs="+", default=list(MARKOV_MODELS))
    m.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "flagship"))
    m.set_defaults(run=mixture)
    r = commands.add_parser("report", help="tables, curves and the BENCHMARKS.md section")
    r.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "flagship"))
    r.add_argument("--benchmarks_md", default=None)
    r.add_argument("--shipped_summary", default=str(REPO / "benchmarks" / "results" / "genome_science" / "summary.json"),
                   help="the shipped model's context gain on its own test regions (benchmarks.genome_science report)")
    r.set_defaults(run=report)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
