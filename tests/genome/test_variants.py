"""`genoformer score` (bedGraph of per-base log2 p) and `genoformer variant_effect` (llr of alt
against ref): equal to hand computations with the model, for causal and masked models; bad
variants are reported by line, never dropped."""

from __future__ import annotations

import gzip
import math

import numpy as np
import pytest
import torch
from model_helpers import random_tokens

from genoformer.data.genome.alphabet import MASK, decode, encode
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
    out = variant_effect(checkpoint=checkpoint, reference=[str(path)], variants=variants, out=tmp_path / "e.tsv",
                         window=40, device="cpu")
    header, row = out.read_text().splitlines()
    assert header.split("\t") == ["chrom", "pos", "ref", "alt", "gene", "llr", "note"]
    llr = float(row.split("\t")[5])
    scorer = Scorer.from_checkpoint(checkpoint, device="cpu")
    codes = encode(sequence)
    start = pos - 1 - 20
    ref_window = codes[start:start + 40]
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
        f"chr1\t10\t{wrong}\tG\n"          # line 1: ref does not match
        "chr9\t5\tA\tC\n"                   # line 2: unknown contig
        "chr2\t11\tA\tC\n"                  # line 3: past the end of chr2
        f"chr1\t5\t{sequence[4]}\tTT\n"     # line 4: not an SNV
        f"chr1\t7\t{sequence[6]}\t{'G' if sequence[6] != 'G' else 'T'}\n"  # line 5: fine
    )
    out = variant_effect(checkpoint=causal_checkpoint, reference=[str(path)], variants=variants,
                         out=tmp_path / "bad_effects.tsv", device="cpu")
    rows = [line.split("\t") for line in out.read_text().splitlines()[1:]]
    assert len(rows) == 5
    assert "does not match" in rows[0][-1] and "not in the reference" in rows[1][-1]
    assert "outside contig" in rows[2][-1] and "single-nucleotide" in rows[3][-1]
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
    out = variant_effect(checkpoint=causal_checkpoint, reference=[str(path)], variants=vcf, out=tmp_path / "v.tsv", device="cpu")
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert rows[0][:5] == ["CHROM", "POS", "ID", "REF", "ALT"]
    assert [r[4] for r in rows[1:]] == alts and all(r[-1] == "" for r in rows[1:])
