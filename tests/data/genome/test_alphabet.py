import numpy as np
import pytest

from genoformer.data import BOS, MASK, PAD, VOCAB_SIZE, InvalidBaseError, decode, encode, reverse_complement


def test_codes_match_the_contract():
    assert encode("ACGTN").tolist() == [0, 1, 2, 3, 4]
    assert (PAD, MASK, BOS, VOCAB_SIZE) == (5, 6, 7, 8)


def test_lowercase_folds_and_iupac_is_n():
    assert encode("acgtn").tolist() == [0, 1, 2, 3, 4]
    assert encode("RYSWKMBDHVryswkmbdhv").tolist() == [4] * 20


@pytest.mark.parametrize("seq,pos,char", [("ACGX", 3, "X"), ("-ACG", 0, "-"), ("AC GT", 2, " "), ("ACé", 2, "é")])
def test_invalid_character_names_position(seq, pos, char):
    with pytest.raises(InvalidBaseError, match=f"position {pos}") as info:
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
