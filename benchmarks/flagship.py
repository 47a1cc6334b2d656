"""The flagship DNA model: held-out sets, scoring at 1k to 32k of context, order-k Markov models and
the mixture of both on the same bases.

The held-out sets (`heldout`), fixed by rule so that every method scores the same bases:
- new_genus: Leptospira kirschneri H1 (fetch-more.sh's GenBank), whole contigs of at least 32 kb in
  file order until SET_BASES; no Leptospira is trained on;
- strain: a non-K-12 E. coli (fetch-more.sh's Prokka GFF3), the same rule; K-12 is trained on;
- eukaryote: C. elegans chromosome X, SET_BASES from 8 Mb on; no nematode is trained on;
- trained_bacteria / trained_eukaryotes: the test split (the last 3% of every chromosome, never
  trained on) of the training genomes, bacteria whole, eukaryotes' longest chromosome of each
  file, up to SET_BASES.
Bits per base count A/C/G/T on both strands, less each record's first base (no context), the same
bases for every model. Context gains are paired (same model, same bases): 95% intervals by a block
bootstrap over 50 kb blocks. Stages, each its own call; the result joins them:

    python -m benchmarks.flagship store --out .device/dna/genomes.zarr          # CPU: the training store
    python -m benchmarks.flagship heldout --out .device/dna/heldout --genomes .device/dna/genomes.zarr
    python -m benchmarks.flagship --out OUT --stage score --runs /tmp/flagship --heldout .device/dna/heldout  # GPU
    python -m benchmarks.flagship --out OUT --stage markov --genomes STORE --heldout DIR        # CPU
    python -m benchmarks.flagship --out OUT --stage mixture                                    # CPU
    python -m benchmarks.flagship --out benchmarks/results --from SCORE*.json MARKOV.json MIXTURE.json
(benchmarks/gpu_genome.sh stage1 / stage2 train the flagship and run the score stage.)
"""

from __future__ import annotations

import csv
import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np
from genoformer.data.genome.alphabet import decode, reverse_complement

from benchmarks.common import (
    Benchmark,
    Summary,
    at_least,
    at_most,
    block_bootstrap,
    join,
    pack_parts,
    table,
    verdict,
    write_json_file,
)

REPO = Path(__file__).resolve().parents[1]
PREVIOUS_SHIPPED = REPO / "examples" / "genoformer_bacteria_8k.ckpt"
"""The model shipped before the flagship, the first round's start (git show 4576bed:examples/genoformer_bacteria_8k.ckpt)."""
EXTRA = REPO.parent / "shared-extra" / "genomes"
CONFIG = REPO / "configs" / "genome_dna_gpu.yaml"
CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
SET_BASES, MIN_CONTIG, WORM_START = 600_000, 32_768, 8_000_000
SETS = ("new_genus", "strain", "eukaryote", "trained_bacteria", "trained_eukaryotes")
LABELS = {
    "new_genus": "new genus",
    "strain": "strain (not K-12)",
    "eukaryote": "new eukaryote",
    "trained_bacteria": "trained bacteria, test",
    "trained_eukaryotes": "trained eukaryotes, test",
}
BACTERIA = ("ecoli_k12_mg1655", "saureus_col", "hpylori_els37", "vcholerae_o395")
BACTERIAL, EUKARYOTIC = ("new_genus", "strain", "trained_bacteria"), ("eukaryote", "trained_eukaryotes")
BLOCK = 50_000
STAGE2 = ("long", "flagship32k")  # the 32k runs: their bf16 models and per-base scores come back from the GPU
FLAGSHIP = "flagship32k"  # examples/genoformer_dna.ckpt is its weights in bfloat16
MARKOV_MODELS = {
    # name: (training data, highest order, settings fixed instead of chosen)
    "bacteria": ("bacteria", 16, {}),  # k, d, a chosen on the training genomes' held-out tails
    "all": ("all", 12, {}),  # every training genome; order 12 keeps the counts of 108 Mbp in memory
    # memory of the training genomes on a strain: light smoothing, a 16-mer seen once predicts its next base
    "bacteria_memorising": ("bacteria", 16, {"order": 16, "discount": 0.9, "concentration": 1.0}),
}


def block_sums(records: list[tuple[str, np.ndarray]], log2p: list[np.ndarray]) -> list[dict]:
    """Per record: bits and scored bases in consecutive blocks of BLOCK bases, both strands summed
    (the reverse strand's block b covers the same bases as the forward strand's block b)."""
    n, result = len(records), []
    for (name, codes), forward, backward in zip(records, log2p[:n], log2p[n:]):
        both = np.stack([forward, backward[::-1]])  # the reverse strand aligned to forward positions
        edges = np.arange(0, len(codes) + BLOCK, BLOCK)[: max(2, -(-len(codes) // BLOCK) + 1)]
        edges[-1] = len(codes)
        blocks = [both[:, lo:hi] for lo, hi in zip(edges, edges[1:])]
        result.append(
            {
                "name": name,
                "bits": [float(-b[np.isfinite(b)].sum()) for b in blocks],
                "bases": [int(np.isfinite(b).sum()) for b in blocks],
            }
        )
    return result


def config_data() -> tuple[list[str], object]:
    """The flagship config's FASTA files (relative to the repository) and its split."""
    from genoformer.training_cli import training_cli

    cli = training_cli(
        ["--config", str(CONFIG), "--trainer.accelerator", "cpu", "--trainer.precision", "32-true"], run=False
    )
    return cli.datamodule.fasta, cli.datamodule.split


# ------------------------------------------------------------------------------------- store
def store(args) -> None:
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
    intervals = split_intervals([SequenceSource(c.name, c.length, c.source_name) for c in genome.contigs], split)[
        "test"
    ]
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
        return [
            (f"{genome.contigs[iv.index].name}:{iv.start}-{iv.end}", genome.read(iv.index, iv.start, iv.end))
            for iv in chosen
        ]

    return {"trained_bacteria": read(bacteria), "trained_eukaryotes": read(eukaryotes)}


def heldout(args) -> None:
    from genoformer.data.genome.inputs import read_sequences

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = Path(args.extra)
    worm = next(iter(read_sequences([str(extra / "celegans_ce2_chrX.fasta.gz")])))
    start = WORM_START
    sets = {
        "new_genus": _whole_contigs(extra / "leptospira_kirschneri_h1.gbk.gz", args.bases),
        "strain": _whole_contigs(extra / "ecoli_draft_prokka.gff3.gz", args.bases),
        "eukaryote": [(f"{worm.name}:{start}-{start + args.bases}", worm.codes[start : start + args.bases])],
        **_test_split(Path(args.genomes), args.bases),
    }
    described = {}
    for name, records in sets.items():
        with gzip.open(out / f"{name}.fa.gz", "wt", compresslevel=6) as handle:
            for title, codes in records:
                handle.write(f">{title}\n{decode(codes)}\n")
        described[name] = {"records": [title for title, _ in records], "bases": int(sum(len(c) for _, c in records))}
        print(f"{name}: {len(records)} records, {described[name]['bases']:,} bases")
    write_json_file(out / "sets.json", {"sets": described})


def read_set(heldout_dir: Path, name: str) -> list[tuple[str, np.ndarray]]:
    from genoformer.data.genome.inputs import read_sequences

    return [(r.name, r.codes) for r in read_sequences([str(heldout_dir / f"{name}.fa.gz")])]


# ------------------------------------------------------------------------------------- score
def _contexts_of(max_seq_len: int, contexts: list[int]) -> list[int]:
    """Every context up to the model's trained one for a long model; the trained one alone else."""
    usable = [c for c in contexts if c <= max_seq_len]
    return usable if max_seq_len >= max(contexts) else usable[-1:]


def score(args) -> dict:
    """Every run's model (and, unless --prefix, the model shipped before the flagship) on every
    held-out set at every context up to its own; the stage-2 models (bf16) and their per-base scores
    come back as OUT/flagship_scores.tar.part* (`cat ... | tar x`: the mixture stage reads them)."""
    import torch

    from genoformer.core.export import export
    from genoformer.genome.scoring import Scorer

    out = Path(args.out) / "flagship_scores"
    out.mkdir(parents=True, exist_ok=True)
    runs = Path(args.runs)
    heldout_dir = Path(args.heldout)
    sets = {name: read_set(heldout_dir, name) for name in SETS}
    if args.max_bases:  # the smoke test: a few kb of each set
        sets = {name: [(t, c[: args.max_bases]) for t, c in records[:1]] for name, records in sets.items()}
    models = {}
    if args.smoke:  # the shipped model on slices of the lambda genome
        models["genoformer_dna"] = REPO / "examples" / "genoformer_dna.ckpt"
    elif not args.prefix:  # the first round's reference: the model shipped before the flagship
        if not PREVIOUS_SHIPPED.is_file():
            raise SystemExit(
                f"{PREVIOUS_SHIPPED} (the model the first round compares with) was replaced by "
                f"examples/genoformer_dna.ckpt: restore it with `git show 4576bed:{PREVIOUS_SHIPPED.relative_to(REPO)} "
                f"> {PREVIOUS_SHIPPED.relative_to(REPO)}`, or score only some runs with --prefix"
            )
        models["shipped"] = PREVIOUS_SHIPPED
    for run in sorted(
        p
        for p in runs.iterdir()
        if (p / "checkpoints" / "last.ckpt").is_file() and p.name.startswith(args.prefix) and not args.smoke
    ):
        # the stage-2 models come back (bf16, weights only); the others stay on the GPU machine
        where = out if run.name.startswith(STAGE2) else runs / "exports"
        where.mkdir(exist_ok=True)
        models[run.name] = export(
            checkpoint=run / "checkpoints" / "last.ckpt",
            out=where / f"{run.name}.ckpt",
            dtype="bfloat16",
            overwrite=True,
        )
    results = {
        "models": {},
        "sets": json.loads((heldout_dir / "sets.json").read_text())["sets"],
        "curves": {
            r.name: _metrics(r / "metrics.csv")
            for r in runs.iterdir()
            if (r / "metrics.csv").is_file() and r.name.startswith(args.prefix)
        },
    }
    for model, path in models.items():
        scorer = Scorer.from_checkpoint(path, device=args.device)
        entry = results["models"][model] = {
            "max_seq_len": scorer.model.config.max_seq_len,
            "parameters": sum(p.numel() for p in scorer.model.parameters()),
            "contexts": {},
        }
        for context in _contexts_of(scorer.model.config.max_seq_len, list(args.contexts)):
            per_set, began = {}, time.perf_counter()
            for name, records in sets.items():
                sequences = [c for _, c in records] + [reverse_complement(c) for _, c in records]
                log2p = scorer.score_many(sequences, context=context, batch_size=args.batch_size, progress=False)
                per_set[name] = {"records": block_sums(records, log2p)}
                if context == scorer.model.config.max_seq_len and model.startswith(STAGE2):
                    n = len(records)  # per-base log2 p of both strands (reverse aligned to forward), for the mixtures
                    np.savez_compressed(
                        out / f"{model}.{name}.log2p.npz",
                        **{
                            f"{i}": np.stack([f, b[::-1]]).astype(np.float16)
                            for i, (f, b) in enumerate(zip(log2p[:n], log2p[n:]))
                        },
                    )
            seconds = time.perf_counter() - began
            entry["contexts"][str(context)] = {"seconds": seconds, "sets": per_set}
            line = ", ".join(f"{n} {_bpb(s):.4f}" for n, s in per_set.items())
            print(f"{model} @ {context}: {line} ({seconds:.1f} s)", flush=True)
        del scorer
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    pack_parts(out, Path(args.out))
    return results


# ---------------------------------------------------------------------------------- baseline
def baseline(args) -> dict:
    """Order-k Markov models fitted on the flagship's own training intervals (the config's train
    split of the store), each scored on every held-out set, both strands, on the network's bases."""
    from genoformer.data.genome.store import GenomeStore
    from genoformer.data.splits import SequenceSource, split_intervals

    from genoformer.genome.markov import fit_markov_model

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    _, split = config_data()
    genome = GenomeStore(args.genomes)
    train = split_intervals([SequenceSource(c.name, c.length, c.source_name) for c in genome.contigs], split)["train"]
    sets = {name: read_set(Path(args.heldout), name) for name in SETS}
    report: dict = {"models": {}}
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
            "data": data,
            "chosen": "fixed" if fixed else "on held-out training data",
            "train_bases": int(sum(iv.length for iv in chosen)),
            "max_order": max_order,
            "order": model.order,
            "discount": model.discount,
            "concentration": model.concentration,
            "fit_seconds": fit_seconds,
            "sets": {},
        }
        for set_name, records in sets.items():
            forward = [model.log2_probabilities(c) for _, c in records]
            backward = [model.log2_probabilities(reverse_complement(c)) for _, c in records]
            for values in forward + backward:
                values[0] = np.nan  # the network has no context for a record's first base: neither counts it
            entry["sets"][set_name] = {"records": block_sums(records, forward + backward)}
            np.savez_compressed(
                work / f"markov_{name}.{set_name}.log2p.npz",
                **{
                    f"{i}": np.stack([f, b[::-1]]).astype(np.float32) for i, (f, b) in enumerate(zip(forward, backward))
                },
            )
            print(f"markov {name} (order {model.order}) {set_name}: {_bpb(entry['sets'][set_name]):.4f}", flush=True)
    return {"markov": report["models"]}


# ----------------------------------------------------------------------------------- mixture
def _streams(path: Path) -> list[np.ndarray]:
    """The (2, L) per-base log2 p arrays of one set (both strands, reverse aligned to forward)."""
    with np.load(path) as arrays:
        return [arrays[str(i)].astype(np.float64) for i in range(len(arrays.files))]


def mixture(args) -> dict:
    """The network mixed with each Markov model on every held-out set: the switching mixture (no
    fitted weight) and a fixed weight fitted on the other four sets (never on the set it scores)."""
    from genoformer.genome.mixture import MixMode, Mixture, fit_weight

    scores, work = Path(args.work) / "flagship_scores", Path(args.work)
    report = {"network": args.network, "markov": {}}
    network = {name: _streams(scores / f"{args.network}.{name}.log2p.npz") for name in SETS}
    for markov in args.models:
        theirs = {name: _streams(work / f"markov_{markov}.{name}.log2p.npz") for name in SETS}
        flat = {
            name: (
                np.concatenate([a.ravel() for a in network[name]]),
                np.concatenate([b.ravel() for b in theirs[name]]),
            )
            for name in SETS
        }
        entry = report["markov"][markov] = {}
        for name in SETS:
            a_L, b_L = flat[name]
            both = np.isfinite(a_L) & np.isfinite(b_L)
            others = [n for n in SETS if n != name]
            weight = fit_weight(
                np.concatenate([flat[n][0] for n in others]), np.concatenate([flat[n][1] for n in others])
            )
            fixed = Mixture(mode=MixMode.FIXED, weight=weight)
            switching = Mixture()
            mixed = {
                "fixed": [
                    fixed.mix(a, b) for a_2L, b_2L in zip(network[name], theirs[name]) for a, b in zip(a_2L, b_2L)
                ],
                "switching": [
                    switching.mix(a, b) for a_2L, b_2L in zip(network[name], theirs[name]) for a, b in zip(a_2L, b_2L)
                ],
            }
            entry[name] = {
                "bases": int(both.sum()),
                "network": float(-a_L[both].mean()),
                "markov": float(-b_L[both].mean()),
                "fixed_weight": weight,
                **{mode: float(-np.concatenate(v)[both].mean()) for mode, v in mixed.items()},
            }
            row = entry[name]
            print(
                f"{markov:>20} {name:>18}: network {row['network']:.4f} markov {row['markov']:.4f} "
                f"fixed({weight:.2f}) {row['fixed']:.4f} switching {row['switching']:.4f}",
                flush=True,
            )
    return {"mixture": report}


def _metrics(path: Path) -> dict:
    """A run's metrics.csv: validation bits per base by step, the last logged step, the peak learning rate."""
    steps, values, trained, peak_lr = [], [], 0, 0.0
    with open(path) as handle:
        for row in csv.DictReader(handle):
            trained = max(trained, int(row["step"]) + 1)
            peak_lr = max(peak_lr, float(row.get("lr-AdamW/pg1") or 0.0))
            if row.get("val/bpb"):
                steps.append(int(row["step"]) + 1)
                values.append(float(row["val/bpb"]))
    return {"steps": steps, "bpb": values, "trained": trained, "peak_lr": peak_lr}


def _bpb(result: dict) -> float:
    return sum(sum(r["bits"]) for r in result["records"]) / sum(sum(r["bases"]) for r in result["records"])


def _pooled(context_result: dict, names: tuple[str, ...]) -> dict:
    return {"records": [r for name in names for r in context_result["sets"][name]["records"]]}


def _gain(a: dict, b: dict) -> tuple[float, float, float]:
    """bits/base(a) - bits/base(b) over the same blocks, with its 95% block-bootstrap interval."""
    bits_a, bits_b = (np.concatenate([r["bits"] for r in x["records"]]) for x in (a, b))
    bases = np.concatenate([r["bases"] for r in a["records"]])
    return block_bootstrap(bits_a - bits_b, bases)


def arguments(parser) -> None:
    parser.add_argument(
        "--stage",
        choices=("score", "markov", "mixture"),
        default="score",
        help="score: every run's model on every held-out set (GPU); markov: the Markov models on the "
        "flagship's training data (CPU); mixture: the network mixed with each (CPU)",
    )
    parser.add_argument("--runs", type=Path, help="score: folder of run directories (each with checkpoints/last.ckpt)")
    parser.add_argument(
        "--heldout", type=Path, default=REPO / ".device" / "dna" / "heldout", help="what `heldout` wrote"
    )
    parser.add_argument(
        "--genomes", type=Path, default=REPO / ".device" / "dna" / "genomes.zarr", help="the training store"
    )
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    parser.add_argument(
        "--prefix",
        default="",
        help="score: only the runs whose names start with this (and not the model shipped before the flagship)",
    )
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--device", default=None)
    parser.add_argument("--max_bases", type=int, default=0, help="score: only this many bases of one record per set")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "flagship", help="per-base scores, Markov models")
    parser.add_argument("--network", default=FLAGSHIP, help="mixture: the run whose per-base scores are mixed")
    parser.add_argument("--models", nargs="+", choices=sorted(MARKOV_MODELS), default=list(MARKOV_MODELS))


def measure(args) -> dict:
    if args.smoke:  # the score stage: five "sets" of 300 bases cut from the lambda genome, the shipped model
        from genoformer.data.genome.inputs import read_sequences

        (record,) = read_sequences([str(REPO / "examples" / "lambda_phage.fasta.gz")])
        args.heldout, args.runs, args.contexts, args.device = args.out / "heldout", args.out, [128], "cpu"
        args.heldout.mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(SETS):
            (args.heldout / f"{name}.fa.gz").write_bytes(
                gzip.compress(f">s{i}\n{decode(record.codes[300 * i : 300 * i + 300])}\n".encode())
            )
        write_json_file(
            args.heldout / "sets.json",
            {"sets": {name: {"records": [f"s{i}"], "bases": 300} for i, name in enumerate(SETS)}},
        )
        return score(args)
    return {"score": score, "markov": baseline, "mixture": mixture}[args.stage](args)


def summarize(data: dict) -> Summary:
    models, markov, mixed = data.get("models", {}), data.get("markov", {}), data.get("mixture")
    tables, targets = [], []
    rows = []
    for name, entry in models.items():
        contexts = sorted(entry["contexts"], key=int)
        rows += [
            {
                "model": name,
                "context": f"{int(c) // 1024}k",
                **{LABELS[s]: _bpb(entry["contexts"][c]["sets"][s]) for s in SETS},
            }
            for c in contexts
            if c in ("8192", contexts[-1])
        ]
    rows += [
        {
            "model": f"Markov {name} (order {m['order']})",
            "context": str(m["order"]),
            **{LABELS[s]: _bpb(m["sets"][s]) for s in SETS},
        }
        for name, m in markov.items()
    ]
    shown = [
        r
        for r in rows
        if (r["model"], r["context"]) in {("shipped", "8k"), (FLAGSHIP, "32k")} or r["model"].startswith("Markov")
    ]
    tables += [
        table(shown or rows, "Bits per base on the held-out sets (lower is better)", digits=5),
        table(rows, "Every run at its trained context (and 8k)", digits=5, headline=False),
    ]
    if FLAGSHIP in models:
        entry = models[FLAGSHIP]["contexts"]
        gains = {
            (label, low, high): _gain(_pooled(entry[low], names), _pooled(entry[high], names))
            for label, names in (("bacterial", BACTERIAL), ("eukaryotic", EUKARYOTIC))
            for low, high in (("1024", "8192"), ("8192", "32768"))
        }
        tables.append(
            table(
                [
                    {
                        "held-out DNA": label,
                        **{f"{int(c) // 1024}k": _bpb(_pooled(entry[c], names)) for c in ("1024", "8192", "32768")},
                        **{
                            f"{int(lo) // 1024}k - {int(hi) // 1024}k (95% CI)": "{:+.4f} ({:+.4f}, {:+.4f})".format(
                                *gains[label, lo, hi]
                            )
                            for lo, hi in (("1024", "8192"), ("8192", "32768"))
                        },
                    }
                    for label, names in (("bacterial", BACTERIAL), ("eukaryotic", EUKARYOTIC))
                ],
                f"What the context buys ({FLAGSHIP}, half-window overlap)",
                digits=5,
            )
        )
        flagship = {s: _bpb(entry["32768"]["sets"][s]) for s in SETS}
        selected = (
            min((_bpb(m["sets"]["new_genus"]), n) for n, m in markov.items() if n != "bacteria_memorising")
            if markov
            else (None, "")
        )
        targets += [
            at_least(
                f"new genus: >= 0.15 bits/base below the selected Markov model ({selected[1]})",
                selected[0] - flagship["new_genus"] if selected[0] else None,
                0.15,
            ),
            at_least(
                "bacterial DNA: 8k >= 0.01 bits/base below 1k (95% CI's low end)",
                gains["bacterial", "1024", "8192"][1],
                0.01,
            ),
            verdict(
                "32k no worse than 8k (bacterial / eukaryotic)",
                "{:+.4f} / {:+.4f} saved".format(
                    gains["bacterial", "8192", "32768"][0], gains["eukaryotic", "8192", "32768"][0]
                ),
                min(gains["bacterial", "8192", "32768"][0], gains["eukaryotic", "8192", "32768"][0]) >= 0,
            ),
        ]
    if mixed:
        mix_rows = [
            {
                "Markov": name,
                "held out": LABELS[s],
                f"network ({mixed['network']})": e["network"],
                "Markov alone": e["markov"],
                "fixed weight": e["fixed"],
                "switching (default)": e["switching"],
            }
            for name, entry in mixed["markov"].items()
            for s, e in entry.items()
        ]
        tables += [
            table(
                [r for r in mix_rows if r["Markov"] == "bacteria_memorising"],
                "The network mixed with the memorising Markov model (`--mix`)",
                digits=5,
            ),
            table(mix_rows, "Every mixture (fixed weight fitted on the other sets)", digits=5, headline=False),
        ]
        strain = mixed["markov"]["bacteria_memorising"]["strain"]
        targets.append(
            at_most(
                "strain: `--mix` within 0.02 bits/base of the memorising Markov model",
                strain["switching"] - strain["markov"],
                0.02,
            )
        )
    return Summary(
        tables=tables,
        targets=targets,
        notes=[
            "Held-out sets: "
            + ", ".join(f"{LABELS[s]} {v['bases'] / 1e6:.2f} Mbp" for s, v in data["sets"].items())
            + "."
        ]
        if "sets" in data
        else [],
    )


BENCHMARK = Benchmark(
    "flagship",
    "Flagship DNA model: held-out DNA, context, mixture with the Markov model",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    merge=join,
    name_of=lambda args: f"flagship_{args.stage}",
    baseline="order-k Markov models fitted on the same training data, scored on the same bases",
)

if __name__ == "__main__":
    if sys.argv[1:2] in (["store"], ["heldout"]):
        import argparse

        parser = argparse.ArgumentParser(prog=f"python -m benchmarks.flagship {sys.argv[1]}")
        parser.add_argument("--out", type=Path, required=True)
        parser.add_argument("--genomes", type=Path, help="heldout: the training store (for its test split)")
        parser.add_argument("--extra", type=Path, default=EXTRA, help="heldout: fetch-more.sh's genomes folder")
        parser.add_argument("--bases", type=int, default=SET_BASES)
        options = parser.parse_args(sys.argv[2:])
        (store if sys.argv[1] == "store" else heldout)(options)
    else:
        BENCHMARK.main()
