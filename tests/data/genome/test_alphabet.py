import numpy as np
import pytest
from genoformer.data import (
    BOS,
    MASK,
    PAD,
    VOCAB_SIZE,
    InvalidBaseError,
    NotDNAError,
    decode,
    encode,
    reverse_complement,
)


def test_codes_match_the_contract():
    assert encode("ACGTN").tolist() == [0, 1, 2, 3, 4]
    assert (PAD, MASK, BOS, VOCAB_SIZE) == (5, 6, 7, 8)


def test_lowercase_folds_and_iupac_is_n():
    assert encode("acgtn").tolist() == [0, 1, 2, 3, 4]
    assert encode("ACGT" * 20 + "RYSWKMBDHVryswkmbdhv").tolist()[80:] == [4] * 20


# a 48-residue peptide written only with letters that are also nucleotide codes (Met, Lys, Arg,
# Ser, Trp, Asp, His, Val, Ala, Cys, Gly, Thr, Asn, Tyr): 36 of its 48 letters are not A C G T
PEPTIDE = "MYNSWDRNRVNVNDWKRKHSGGGRSYNKSCTTWHYCKDNTAAHMACVK"


def test_protein_made_of_nucleotide_letters_is_not_dna():
    assert len(PEPTIDE) == 48 and sum(c not in "ACGT" for c in PEPTIDE) == 36
    with pytest.raises(
        NotDNAError,
        match=r"36 of 48 letters are not A, C, G or T \(30 IUPAC ambiguity codes .*, 6 N\): "
        r"not DNA \(a protein\?\)",
    ):
        encode(PEPTIDE)
    assert encode("GTGYCAGCMGCCGCGGTAA").tolist()[3] == 4  # a degenerate primer (two ambiguity codes) is DNA
    assert encode("ACGT" * 30 + "N" * 500).size == 620  # so are assembly gaps


def test_protein_letters_are_named_as_such():
    with pytest.raises(
        InvalidBaseError,
        match=r"base 3 \(1-based\): invalid character 'E' \(4 of 8 characters are "
        r"not nucleotide codes; 'E' is an amino-acid letter: a protein\?\)",
    ):
        encode("MKELLKEA")


@pytest.mark.parametrize("seq,pos,char", [("ACGX", 3, "X"), ("-ACG", 0, "-"), ("AC GT", 2, " "), ("ACé", 2, "é")])
def test_invalid_character_names_position(seq, pos, char):
    with pytest.raises(InvalidBaseError, match=f"base {pos + 1} ") as info:
        encode(seq)
    assert info.value.char == char and info.value.position == pos


def test_decode_round_trip_and_specials():
    seq = "ACGTNNACGT"
    assert decode(encode(seq)) == seq
    with pytest.raises(ValueError, match="special token"):
        decode(np.array([0, PAD], dtype=np.uint8))


def test_reverse_complement_known_and_involution():
    assert decode(reverse_complement(encode("AACGTN"))) == "NACGTT"
    codes = np.random.default_rng(0).integers(0, VOCAB_SIZE, size=10_001).astype(np.uint8)
    assert np.array_equal(reverse_complement(reverse_complement(codes)), codes)


def test_encode_returns_writable_copy():
    codes = encode("ACGT")
    codes[0] = 3
    assert codes.flags.writeable
