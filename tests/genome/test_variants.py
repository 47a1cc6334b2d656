"""`genoformer score` (bedGraph of per-base log2 p) and `genoformer variant_effect` (llr of alt
against ref): equal to hand computations with the model, for causal and masked models, SNVs and
indels, one strand or both; bad variants are reported by line, never dropped; a VCF output keeps
the input's records as they were; --regions keeps the variants inside them; the hints name the
command's own options."""

from __future__ import annotations

import gzip
import math
import re
import shlex

import numpy as np
import pytest
import torch
import vcfpy
from cli_helpers import fails
from genoformer.data.genome.alphabet import MASK, decode, encode, reverse_complement
from model_helpers import random_tokens

from genoformer.cli import main
from genoformer.genome.evaluate import score
from genoformer.genome.scoring import Scorer
from genoformer.genome.variants import variant_effect


def log2_softmax(model, tokens_L: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        logits_LV = model(torch.from_numpy(np.asarray(tokens_L)).long()[None])[0]
    return (torch.log_softmax(logits_LV.double(), -1) / math.log(2)).numpy()


@pytest.fixture(scope="module")
def genome(tmp_path_factory):
    folder = tmp_path_factory.mktemp("genome")
    sequence = decode(random_tokens(1, 120, seed=11)[0].numpy())
    path = folder / "ref.fa.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(f">chr1\n{sequence}\n>chr2\nACGTNACGTA\n")
    return path, sequence


@pytest.mark.parametrize("which", ["causal_checkpoint", "mlm_checkpoint"])
def test_score_writes_the_per_base_log_likelihood_as_bedgraph(which, genome, tmp_path, request):
    checkpoint = request.getfixturevalue(which)
    path, sequence = genome
    out = score(checkpoint=checkpoint, inputs=[str(path)], out=tmp_path / "track.bedgraph", context=128, device="cpu")
    lines = out.read_text().splitlines()
    assert lines[0].startswith("track type=bedGraph")
    values = {}
    for line in lines[1:]:
        chrom, start, end, value = line.split("\t")
        for position in range(int(start), int(end)):
            values[(chrom, position)] = float(value)
    scorer = Scorer.from_checkpoint(checkpoint, device="cpu")
    codes = encode(sequence)
    if scorer.causal:
        by_hand = log2_softmax(scorer.model, codes)
        expected = {p: by_hand[p - 1, codes[p]] for p in range(1, len(codes))}
    else:
        expected = {}
        for p in range(len(codes)):
            inputs = codes.copy()
            inputs[np.arange(len(codes)) % scorer.mask_period == p % scorer.mask_period] = MASK
            expected[p] = log2_softmax(scorer.model, inputs)[p, codes[p]]
    for p, value in expected.items():
        assert values[("chr1", p)] == pytest.approx(value, abs=1e-4)
    assert ("chr2", 4) not in values  # the N of chr2 has no row
    with pytest.raises(FileExistsError, match="overwrite=True"):
        score(checkpoint=checkpoint, inputs=[str(path)], out=out, device="cpu")


@pytest.mark.parametrize("which", ["causal_checkpoint", "mlm_checkpoint"])
def test_variant_effect_equals_a_hand_computation(which, genome, tmp_path, request):
    checkpoint = request.getfixturevalue(which)
    path, sequence = genome
    pos = 61  # 1-based
    ref = sequence[pos - 1]
    alt = "A" if ref != "A" else "C"
    variants = tmp_path / "variants.tsv"
    variants.write_text(f"chrom\tpos\tref\talt\tgene\nchr1\t{pos}\t{ref}\t{alt}\tg1\n")
    out = variant_effect(
        checkpoint=checkpoint, reference=[str(path)], variants=variants, out=tmp_path / "e.tsv", window=40, device="cpu"
    )
    header, row = out.read_text().splitlines()
    assert header.split("\t") == ["chrom", "pos", "ref", "alt", "gene", "llr", "note"]
    llr = float(row.split("\t")[5])
    scorer = Scorer.from_checkpoint(checkpoint, device="cpu")
    codes = encode(sequence)
    start = pos - 1 - 20
    ref_window = codes[start : start + 40]
    alt_window = ref_window.copy()
    alt_window[20] = encode(alt)[0]
    if scorer.causal:

        def window_log2p(window):
            values = log2_softmax(scorer.model, window)
            return sum(values[i - 1, window[i]] for i in range(1, len(window)))

        expected = window_log2p(alt_window) - window_log2p(ref_window)
    else:
        masked = ref_window.copy()
        masked[20] = MASK
        values = log2_softmax(scorer.model, masked)[20]
        expected = values[encode(alt)[0]] - values[encode(ref)[0]]
    assert llr == pytest.approx(expected, abs=1e-4)


def test_variant_effect_reports_bad_variants_by_line(causal_checkpoint, genome, tmp_path, capsys):
    path, sequence = genome
    wrong = "A" if sequence[9] != "A" else "C"
    variants = tmp_path / "bad.tsv"
    variants.write_text(
        f"chr1\t10\t{wrong}\tG\n"  # line 1: ref does not match
        "chr9\t5\tA\tC\n"  # line 2: unknown contig
        "chr2\t11\tA\tC\n"  # line 3: past the end of chr2
        f"chr1\t5\t{sequence[4]}\t<DEL>\n"  # line 4: not a sequence of bases
        f"chr1\t7\t{sequence[6]}\t{'G' if sequence[6] != 'G' else 'T'}\n"  # line 5: fine
    )
    out = variant_effect(
        checkpoint=causal_checkpoint,
        reference=[str(path)],
        variants=variants,
        out=tmp_path / "bad_effects.tsv",
        device="cpu",
    )
    rows = [line.split("\t") for line in out.read_text().splitlines()[1:]]
    assert len(rows) == 5
    assert "does not match" in rows[0][-1] and "not in the reference" in rows[1][-1]
    assert "outside contig" in rows[2][-1] and "not a sequence variant" in rows[3][-1]
    assert rows[4][-1] == "" and float(rows[4][-2]) == float(rows[4][-2])
    printed = capsys.readouterr().out
    for line in (1, 2, 3, 4):
        assert f"bad.tsv:{line}: not scored" in printed


def test_variant_effect_reads_vcf(causal_checkpoint, genome, tmp_path):
    path, sequence = genome
    vcf = tmp_path / "calls.vcf"
    ref = sequence[29]
    alts = [b for b in "ACGT" if b != ref][:2]
    vcf.write_text(
        "##fileformat=VCFv4.2\n##contig=<ID=chr1,length=120>\n"
        "#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\n"
        f"chr1\t30\trs1\t{ref}\t{','.join(alts)}\t.\tPASS\t.\n"
    )
    out = variant_effect(
        checkpoint=causal_checkpoint, reference=[str(path)], variants=vcf, out=tmp_path / "v.tsv", device="cpu"
    )
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert rows[0][:5] == ["CHROM", "POS", "ID", "REF", "ALT"]
    assert [r[4] for r in rows[1:]] == alts and all(r[-1] == "" for r in rows[1:])


# ------------------------------------------------------------------------ indels, both strands
def window_sum(model, window: np.ndarray, offset: int) -> float:
    """By hand: sum of log2 p(base | the window's bases before it) from `offset` to the end."""
    values = log2_softmax(model, window)
    return sum(values[i - 1, window[i]] for i in range(max(offset, 1), len(window)))


def masked_llr(model, window: np.ndarray, offset: int, alt: int, ref: int) -> float:
    masked = window.copy()
    masked[offset] = MASK
    values = log2_softmax(model, masked)[offset]
    return values[alt] - values[ref]


def run_effects(checkpoint, genome_path, tmp_path, lines: list[str], name: str, **options) -> list[list[str]]:
    variants = tmp_path / f"{name}.tsv"
    variants.write_text("chrom\tpos\tref\talt\n" + "".join(line + "\n" for line in lines))
    out = variant_effect(
        checkpoint=checkpoint,
        reference=[str(genome_path)],
        variants=variants,
        out=tmp_path / f"{name}_effects.tsv",
        device="cpu",
        **options,
    )
    return [line.split("\t") for line in out.read_text().splitlines()[1:]]


def test_indels_equal_a_hand_computation_with_the_flank_aligned(causal_checkpoint, genome, tmp_path):
    path, sequence = genome
    codes = encode(sequence)
    deletion = (61, sequence[60:63], sequence[60])  # VCF style: the anchor base, then 2 deleted
    insertion = (61, sequence[60], sequence[60] + "GTA")  # 3 bases inserted after the anchor
    complex_ = (61, sequence[60:62], "TTT")  # 2 bases replaced by 3
    lines = [f"chr1\t{pos}\t{ref}\t{alt}" for pos, ref, alt in (deletion, insertion, complex_)]
    rows = run_effects(causal_checkpoint, path, tmp_path, lines, "indels", window=40)
    assert all(row[-1] == "" for row in rows), rows
    model = Scorer.from_checkpoint(causal_checkpoint, device="cpu").model
    s, p = 40, 60  # window 40 around 0-based 60: [40, 80); an insertion of 2 net bases ends it 2 earlier
    for row, (_, ref, alt) in zip(rows, (deletion, insertion, complex_)):
        e = 80 - max(0, len(alt) - len(ref))
        ref_window = codes[s:e]
        alt_window = np.concatenate([codes[s:p], encode(alt), codes[p + len(ref) : e]])
        assert len(alt_window) <= 40
        expected = window_sum(model, alt_window, p - s) - window_sum(model, ref_window, p - s)
        assert float(row[-2]) == pytest.approx(expected, abs=1e-4), (ref, alt)


def test_indels_that_cannot_be_scored_say_why(causal_checkpoint, mlm_checkpoint, genome, tmp_path):
    path, sequence = genome
    long_deletion = f"chr1\t61\t{sequence[60:90]}\t{sequence[60]}"  # 29 bases gone: past a 40-base window's flank
    snv = f"chr1\t61\t{sequence[60]}\t{'G' if sequence[60] != 'G' else 'T'}"  # scored: the file is written
    rows = run_effects(causal_checkpoint, path, tmp_path, [long_deletion, snv], "long", window=40)
    assert rows[0][-2] == "" and "do not fit a window of 40" in rows[0][-1] and "window=LARGER" in rows[0][-1]
    assert run_effects(causal_checkpoint, path, tmp_path, [long_deletion], "long_ok", window=96)[0][-1] == ""
    masked_deletion = f"chr1\t61\t{sequence[60:62]}\t{sequence[60]}"
    rows = run_effects(mlm_checkpoint, path, tmp_path, [masked_deletion, snv], "masked", window=40)
    assert rows[0][-2] == "" and "single-nucleotide variants only" in rows[0][-1]
    with pytest.raises(ValueError, match="scored 0 of 1 variants .*not written: 1 the 30-base ref"):
        run_effects(causal_checkpoint, path, tmp_path, [long_deletion], "none", window=40)


@pytest.mark.parametrize("which", ["causal_checkpoint", "mlm_checkpoint"])
def test_both_strands_is_the_mean_of_the_strands(which, genome, tmp_path, request):
    checkpoint = request.getfixturevalue(which)
    path, sequence = genome
    codes = encode(sequence)
    pos, ref = 61, sequence[60]
    alt = "G" if ref != "G" else "T"
    line = [f"chr1\t{pos}\t{ref}\t{alt}"]
    forward = float(run_effects(checkpoint, path, tmp_path, line, "forward", window=40)[0][-2])
    both = float(run_effects(checkpoint, path, tmp_path, line, "both", window=40, both_strands=True)[0][-2])
    model = Scorer.from_checkpoint(checkpoint, device="cpu").model
    ref_window = codes[40:80]
    alt_window = ref_window.copy()
    alt_window[20] = encode(alt)[0]
    rc_ref, rc_alt = reverse_complement(ref_window), reverse_complement(alt_window)
    offset = 80 - 60 - 1  # on the reverse strand the variant sits after the reversed downstream flank
    if model.config.causal:
        reverse = window_sum(model, rc_alt, offset) - window_sum(model, rc_ref, offset)
    else:
        reverse = masked_llr(model, rc_ref, offset, rc_alt[offset], rc_ref[offset])
    assert reverse != pytest.approx(forward, abs=1e-3)  # the strands differ, so the mean is a real test
    assert both == pytest.approx((forward + reverse) / 2, abs=1e-4)


# ---------------------------------------------------------------------------------- VCF output
VCF_HEADER = (
    "##fileformat=VCFv4.2\n##contig=<ID=chr1,length=120>\n"
    '##INFO=<ID=DP,Number=1,Type=Integer,Description="Depth">\n'
    '##INFO=<ID=DB,Number=0,Type=Flag,Description="In dbSNP">\n'
    '##FILTER=<ID=q10,Description="Quality below 10">\n'
    '##FORMAT=<ID=GT,Number=1,Type=String,Description="Genotype">\n'
    '##FORMAT=<ID=GQ,Number=1,Type=Integer,Description="Genotype quality">\n'
    "#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\tFORMAT\tS1\tS2\n"
)


def calls_vcf(tmp_path, sequence: str):
    others = [b for b in "ACGT" if b != sequence[29]]
    body = (
        f"chr1\t30\trs1\t{sequence[29]}\t{others[0]},{others[1]}\t50\tPASS\tDP=14;DB\tGT:GQ\t0/1:48\t1|2:3\n"
        f"chr1\t41\t.\t{sequence[40]}\t<DEL>\t3.5\tq10\t.\tGT\t./.\t0/0\n"
        f"chr1\t61\trs3\t{sequence[60:63]}\t{sequence[60]}\t.\t.\tDP=3\tGT\t0/1\t1/1\n"
    )
    path = tmp_path / "calls.vcf"
    path.write_text(VCF_HEADER + body)
    return path


def record_fields(record) -> tuple:
    info = {key: value for key, value in record.INFO.items() if key != "GF_LLR"}
    calls = [(call.sample, dict(call.data)) for call in record.calls]
    return (
        record.CHROM,
        record.POS,
        record.ID,
        record.REF,
        [str(a) for a in record.ALT],
        record.QUAL,
        record.FILTER,
        info,
        record.FORMAT,
        calls,
    )


@pytest.mark.parametrize("suffix", [".vcf", ".vcf.gz"])
def test_vcf_output_keeps_the_records_and_adds_the_llr_per_alt(suffix, causal_checkpoint, genome, tmp_path):
    path, sequence = genome
    vcf = calls_vcf(tmp_path, sequence)
    options = dict(checkpoint=causal_checkpoint, reference=[str(path)], variants=vcf, window=40, device="cpu")
    table = variant_effect(out=tmp_path / "effects.tsv", **options)
    llr = [float(row.split("\t")[5]) if row.split("\t")[5] else None for row in table.read_text().splitlines()[1:]]
    out = variant_effect(out=tmp_path / f"effects{suffix}", **options)
    reader = vcfpy.Reader.from_path(str(out))
    info = reader.header.get_info_field_info("GF_LLR")
    assert (info.number, info.type) == ("A", "Float") and "window 40" in info.description
    records = list(reader)
    assert [record_fields(r) for r in records] == [record_fields(r) for r in vcfpy.Reader.from_path(str(vcf))]
    assert llr[2] is None and llr[3] is not None  # the symbolic allele is not scored, the deletion is
    assert records[0].INFO["GF_LLR"] == pytest.approx(llr[:2], abs=1e-5)
    assert records[2].INFO["GF_LLR"] == pytest.approx(llr[3:], abs=1e-5)
    assert "\tGF_LLR=.\tGT\t" in _text(out)  # the unscored ALT (vcfpy reads a lone '.' as [])
    # scoring its own output again replaces the values instead of adding a second field
    again = variant_effect(out=tmp_path / f"again{suffix}", **{**options, "variants": out})
    assert [r.INFO["GF_LLR"] for r in vcfpy.Reader.from_path(str(again))] == [r.INFO["GF_LLR"] for r in records]
    assert sum(line.startswith("##INFO=<ID=GF_LLR") for line in _text(again).splitlines()) == 1


def _text(path) -> str:
    return (gzip.open(path, "rt") if str(path).endswith(".gz") else open(path)).read()


def test_vcf_output_of_a_tsv_input_is_refused_with_a_hint_that_works(causal_checkpoint, genome, tmp_path, capsys):
    path, sequence = genome
    variants = tmp_path / "in.tsv"
    variants.write_text(f"chr1\t30\t{sequence[29]}\t{'A' if sequence[29] != 'A' else 'C'}\n")
    args = [
        "variant_effect",
        "--checkpoint",
        str(causal_checkpoint),
        "--reference",
        str(path),
        "--variants",
        str(variants),
        "--window",
        "40",
        "--device",
        "cpu",
    ]
    err = fails(capsys, args + ["--out", str(tmp_path / "out.vcf")])
    assert "is a TSV" in err
    main(args + shlex.split(re.search(r"--out \S+", err).group(0)))  # the hint, as typed
    assert (tmp_path / "out.tsv").read_text().startswith("chrom\tpos\tref\talt\tllr\tnote\n")


# ------------------------------------------------------------------------------------ regions
def test_regions_keep_the_variants_inside_them(causal_checkpoint, genome, tmp_path, capsys):
    path, sequence = genome
    lines = [
        f"chr1\t{pos}\t{sequence[pos - 1]}\t{'A' if sequence[pos - 1] != 'A' else 'C'}" for pos in (10, 50, 51, 70, 71)
    ]
    lines.append("chr2\t2\tC\tG")
    variants = tmp_path / "many.tsv"
    variants.write_text("".join(line + "\n" for line in lines))
    base = [
        "variant_effect",
        "--checkpoint",
        str(causal_checkpoint),
        "--reference",
        str(path),
        "--variants",
        str(variants),
        "--window",
        "40",
        "--device",
        "cpu",
    ]
    main(base + ["--regions", "chr1:51-70", "chr2", "--out", str(tmp_path / "strings.tsv")])
    kept = [row.split("\t")[:2] for row in (tmp_path / "strings.tsv").read_text().splitlines()[1:]]
    assert kept == [["chr1", "51"], ["chr1", "70"], ["chr2", "2"]]
    bed = tmp_path / "keep.bed"
    bed.write_text("chr1\t50\t70\tmiddle\n")  # 0-based: the same bases as chr1:51-70
    main(base + ["--regions", str(bed), "--out", str(tmp_path / "bed.tsv")])
    assert [row.split("\t")[:2] for row in (tmp_path / "bed.tsv").read_text().splitlines()[1:]] == kept[:2]
    err = fails(capsys, base + ["--regions", "chr1:100-130", "--out", str(tmp_path / "bad.tsv")])
    assert "chr1:100-130" in err and "at most 120" in err
    assert not (tmp_path / "bad.tsv").exists()


# -------------------------------------------------------------------------------------- hints
def test_a_too_short_window_names_the_commands_own_option_and_help(causal_checkpoint, genome, tmp_path, capsys):
    path, sequence = genome
    variants = tmp_path / "one.tsv"
    variants.write_text(f"chr1\t30\t{sequence[29]}\t{'A' if sequence[29] != 'A' else 'C'}\n")
    args = [
        "variant_effect",
        "--checkpoint",
        str(causal_checkpoint),
        "--reference",
        str(path),
        "--variants",
        str(variants),
        "--out",
        str(tmp_path / "e.tsv"),
        "--device",
        "cpu",
    ]
    err = fails(capsys, args + ["--window", "1"])
    assert "--context" not in err and "window 1 is too short" in err
    assert "genoformer variant_effect --help" in err
    main(args + shlex.split(re.search(r"--window \d+", err).group(0)))  # the hint, as typed
    assert (tmp_path / "e.tsv").read_text().count("\n") == 2
    with pytest.raises(SystemExit) as exit_info:
        main(shlex.split(re.search(r"genoformer (variant_effect --help)", err).group(1)))
    assert exit_info.value.code == 0 and "--window" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"pass window=\d+ "):  # the Python API speaks Python
        variant_effect(
            checkpoint=causal_checkpoint,
            reference=[str(path)],
            variants=variants,
            out=tmp_path / "p.tsv",
            window=1,
            device="cpu",
        )
