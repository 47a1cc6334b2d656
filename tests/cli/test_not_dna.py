"""A protein (or other text that is not DNA) given to a DNA command is an error that names the
input and what was found, not a sequence of N scored without a word."""

from __future__ import annotations

import pytest
from cli_helpers import fails

# 48 residues written only with letters that are also nucleotide codes: 36 are not A C G T
PEPTIDE = "MYNSWDRNRVNVNDWKRKHSGGGRSYNKSCTTWHYCKDNTAAHMACVK"
FOUND = "36 of 48 letters are not A, C, G or T (30 IUPAC ambiguity codes such as R Y S W, 6 N): not DNA (a protein?)"


@pytest.mark.parametrize("command, suffix", [("score", "bedgraph"), ("evaluate", "json")])
def test_a_protein_fasta_is_refused(command, suffix, causal_checkpoint, tmp_path, capsys):
    fasta = tmp_path / "protein.fa"
    fasta.write_text(f">dnaA_protein\n{PEPTIDE}\n")
    out = tmp_path / f"out.{suffix}"
    err = fails(capsys, [command, "--checkpoint", str(causal_checkpoint), "--inputs", str(fasta), "--out", str(out)])
    assert f"{fasta}: record 'dnaA_protein', {FOUND}" in err and not out.exists()


def test_embed_refuses_a_protein_string(causal_checkpoint, tmp_path, capsys):
    out = tmp_path / "e.npz"
    err = fails(capsys, ["embed", "--checkpoint", str(causal_checkpoint), "--inputs", PEPTIDE, "--out", str(out)])
    assert f"sequence 'seq0', {FOUND}" in err and not out.exists()
