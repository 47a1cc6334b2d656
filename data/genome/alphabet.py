"""Nucleotide alphabet: codes A=0, C=1, G=2, T=3, N=4 and special tokens PAD=5, MASK=6, BOS=7.

Lowercase (soft-masked) bases fold to uppercase codes; the IUPAC ambiguity letters
(R Y S W K M B D H V N) all map to N. Any other character is an error that names it and its
position, and so is text whose letters are nucleotide codes but mostly ambiguity codes (a protein
such as MKRSWDHV... reads as one): both are `NotDNAError`. Encoding is a byte-translation table: ``bytes.translate`` then ``np.frombuffer``.

Shapes: ``codes`` is a 1-D ``np.uint8`` array (L,) of the codes above.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

A, C, G, T, N = 0, 1, 2, 3, 4
PAD, MASK, BOS = 5, 6, 7
VOCAB_SIZE = 8
BASES = "ACGTN"
SPECIAL_TOKENS = {"PAD": PAD, "MASK": MASK, "BOS": BOS}
#: The code of every token, written into each store's metadata.
TOKEN_CODES = {"A": A, "C": C, "G": G, "T": T, "N": N, **SPECIAL_TOKENS}

#: IUPAC ambiguity letters other than N; they are read as N.
IUPAC_AMBIGUOUS = "RYSWKMBDHV"
INVALID = 255


def _translation_tables() -> tuple[bytes, bytes]:
    codes = bytearray([INVALID] * 256)
    lower = bytearray(256)
    for letter, code in zip("ACGT", (A, C, G, T)):
        codes[ord(letter)] = code
        codes[ord(letter.lower())] = code
    for letter in IUPAC_AMBIGUOUS + "N":
        codes[ord(letter)] = N
        codes[ord(letter.lower())] = N
    for letter in "ACGT" + IUPAC_AMBIGUOUS + "N":
        lower[ord(letter.lower())] = 1
    return bytes(codes), bytes(lower)


#: 256-byte tables for ``bytes.translate``: ASCII byte -> code (255 = not allowed), and
#: ASCII byte -> 1 for a lowercase (soft-masked) base else 0.
ENCODE_TABLE, SOFTMASK_TABLE = _translation_tables()
_DECODE = np.frombuffer(BASES.encode("ascii"), dtype=np.uint8)
#: code -> code of the complementary base; N and the special tokens map to themselves.
COMPLEMENT = np.array([T, G, C, A, N, PAD, MASK, BOS], dtype=np.uint8)


ALLOWED = f"allowed are A C G T N (any case) and the IUPAC ambiguity codes {' '.join(IUPAC_AMBIGUOUS)} (read as N)"
"""What a nucleotide sequence may hold, for messages."""
AMBIGUOUS_SHARE_LIMIT = 0.25
"""A sequence of which more than this share (and at least `AMBIGUOUS_COUNT_LIMIT` letters) are
IUPAC ambiguity codes other than N is refused as not DNA: ambiguity codes are rare in sequenced
DNA (a degenerate primer has a few), while a protein made of the letters that are also nucleotide
codes (A C G T R Y S W K M B D H V N: Ala, Arg, Lys, Ser, ...) is mostly them."""
AMBIGUOUS_COUNT_LIMIT = 8
AMINO_ACID_ONLY = "EFILPQXZJOU*"
"""Letters of protein sequences that are not nucleotide codes."""


class NotDNAError(ValueError):
    """Text that is not a nucleotide sequence; `found` says what was found, for messages that add
    where it was (file, record, row)."""

    def __init__(self, found: str) -> None:
        self.found = found
        super().__init__(f"{found}; {ALLOWED}")


class InvalidBaseError(NotDNAError):
    """A character that is not a nucleotide letter; ``position`` is 0-based; ``invalid`` counts
    the characters of the sequence (of ``length``) that are not."""

    def __init__(self, char: str, position: int, invalid: int = 1, length: int = 0) -> None:
        self.char = char
        self.position = position
        found = f"base {position + 1:,} (1-based): invalid character {char!r}"
        if length:
            found += f" ({invalid:,} of {length:,} characters are not nucleotide codes"
            found += f"; {char!r} is an amino-acid letter: a protein?)" if char.upper() in AMINO_ACID_ONLY else ")"
        super().__init__(found)


class AmbiguousTextError(NotDNAError):
    """Letters that are all nucleotide codes, but too many of them ambiguity codes to be DNA."""

    def __init__(self, ambiguous: int, unknown: int, length: int) -> None:
        self.ambiguous = ambiguous
        super().__init__(
            f"{ambiguous + unknown:,} of {length:,} letters are not A, C, G or T ({ambiguous:,} IUPAC ambiguity "
            f"codes such as {' '.join(IUPAC_AMBIGUOUS[:4])}, {unknown:,} N): not DNA (a protein?), which would be "
            "read as N"
        )


_INVALID_BYTE = bytes([INVALID])
_AMBIGUOUS_BYTES = (IUPAC_AMBIGUOUS + IUPAC_AMBIGUOUS.lower()).encode("ascii")
_N_BYTES = b"Nn"


def encode_bytes(seq: bytes) -> np.ndarray:
    """Encode ASCII bytes to a read-only codes array (a view of the translated bytes).

    Raises InvalidBaseError naming the first bad character and its position, and
    AmbiguousTextError for text whose letters are nucleotide codes but too many of them
    ambiguity codes (`AMBIGUOUS_SHARE_LIMIT`); both are NotDNAError, a ValueError.
    """
    codes = seq.translate(ENCODE_TABLE)
    if _INVALID_BYTE in codes:
        pos = codes.index(_INVALID_BYTE)
        raise InvalidBaseError(chr(seq[pos]), pos, codes.count(_INVALID_BYTE), len(seq))
    ambiguous = len(seq) - len(seq.translate(None, _AMBIGUOUS_BYTES))
    if ambiguous >= AMBIGUOUS_COUNT_LIMIT and ambiguous > AMBIGUOUS_SHARE_LIMIT * len(seq):
        raise AmbiguousTextError(ambiguous, len(seq) - len(seq.translate(None, _N_BYTES)), len(seq))
    return np.frombuffer(codes, dtype=np.uint8)


def encode(seq: str | bytes) -> np.ndarray:
    """Encode a nucleotide string to a fresh ``np.uint8`` array (L,) of codes.

    Lowercase folds to uppercase, ambiguity codes become N (4). Raises NotDNAError (a
    ValueError) as `encode_bytes` does.
    """
    if isinstance(seq, str):
        try:
            seq = seq.encode("ascii")
        except UnicodeEncodeError as exc:
            raise InvalidBaseError(seq[exc.start], exc.start) from exc
    return encode_bytes(bytes(seq)).copy()


def softmask_bytes(seq: bytes) -> np.ndarray:
    """(L,) uint8: 1 where ``seq`` holds a lowercase (soft-masked) base, else 0."""
    return np.frombuffer(seq.translate(SOFTMASK_TABLE), dtype=np.uint8)


def decode(codes: np.ndarray) -> str:
    """Codes (L,) -> uppercase string over ACGTN. Special tokens (PAD, MASK, BOS) are an error:
    strip them first."""
    codes = np.asarray(codes)
    bad = np.flatnonzero(codes > N)
    if bad.size:
        raise ValueError(
            f"code {int(codes[bad[0]])} at position {int(bad[0])} is a special token, not a base; "
            "remove PAD/MASK/BOS tokens before decoding"
        )
    return _DECODE[codes.astype(np.intp, copy=False)].tobytes().decode("ascii")


def reverse_complement(codes: np.ndarray) -> np.ndarray:
    """Reverse complement of codes (L,): A<->T, C<->G, N and special tokens unchanged.

    An involution: ``reverse_complement(reverse_complement(x)) == x``. Returns a new array.
    """
    return COMPLEMENT[np.asarray(codes)[::-1]]


def check_alphabet(checkpoint: Mapping[str, Any], action: str) -> None:
    """ValueError unless the checkpoint's model reads this genoformer's token codes."""
    alphabet = checkpoint.get("alphabet", TOKEN_CODES)
    if alphabet != TOKEN_CODES:
        raise ValueError(
            f"the checkpoint's model reads the token codes {alphabet}, this genoformer encodes "
            f"{TOKEN_CODES}; {action} with the genoformer version that trained it"
        )
