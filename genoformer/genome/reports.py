"""One comparison table for the commands that measure bits per base: the model's, the Markov
baseline's and their mixture's, side by side with the same columns whichever command wrote it.

`genoformer evaluate --mix MODEL.npz` fills all three columns (over the same bases),
`genoformer evaluate` the model's and `genoformer baseline` the Markov model's; each prints the
table and writes it with `--out TABLE.tsv` (the JSON report with `--out REPORT.json`):

    name    bases   model_bits_per_base  markov_bits_per_base  mixture_bits_per_base
    chr1    48501   1.9123               1.9410                1.9011
    total   48501   1.9123               1.9410                1.9011

A value that was not measured is empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from genoformer.data.storage import write_text

METHODS = ("model", "markov", "mixture")
"""The methods of the table, in column order."""
TABLE_SUFFIX = ".tsv"


def comparison_rows(
    records: Sequence[Mapping[str, Any]], total: Mapping[str, Any], keys: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The table's rows (per record, then "total"): name, bases and each method's bits per base,
    read from the report's rows under `keys` (method -> key, e.g. {"model": "bits_per_base"}); a
    method without a key is None."""
    rows = []
    for row in [*records, {"name": "total", **total}]:
        rows.append(
            {
                "name": row["name"],
                "bases": row["bases"],
                **{method: row.get(keys[method]) if method in keys else None for method in METHODS},
            }
        )
    return rows


def comparison_text(rows: Sequence[Mapping[str, Any]], title: str, what: str = "record") -> str:
    """The rows as aligned text under `title`, with only the methods measured."""
    methods = [method for method in METHODS if any(row[method] is not None for row in rows)]
    width = max(len(str(row["name"])) for row in [*rows, {"name": what}])
    lines = [title, f"{what:<{width}}  {'bases':>12}" + "".join(f"  {method:>9}" for method in methods)]
    for row in rows:
        cells = "".join(f"  {'-' if row[m] is None else f'{row[m]:9.4f}':>9}" for m in methods)
        lines.append(f"{row['name']:<{width}}  {row['bases']:>12,}{cells}")
    return "\n".join(lines) + "\n(bits per base; lower is better)"


def write_comparison(path: Path, rows: Sequence[Mapping[str, Any]], *, overwrite: bool) -> Path:
    """Write the rows as TSV (atomically): name, bases, then <method>_bits_per_base per method."""
    header = ["name", "bases", *(f"{method}_bits_per_base" for method in METHODS)]
    lines = ["\t".join(header)]
    for row in rows:
        lines.append(
            "\t".join(
                [str(row["name"]), str(row["bases"]), *("" if row[m] is None else f"{row[m]:.6f}" for m in METHODS)]
            )
        )
    return write_text(Path(path), "\n".join(lines) + "\n", overwrite=overwrite)


def is_table(path: Optional[Path]) -> bool:
    """Whether `--out` names the table (.tsv) rather than the JSON report."""
    return path is not None and Path(path).suffix.lower() == TABLE_SUFFIX
