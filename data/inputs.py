"""Input lists as users write them: files, folders, globs and lists, expanded one way everywhere.

Every command that reads several inputs (`prepare`, `prepare_timeseries`, `embed`, `evaluate`,
`score`, `baseline`, ...) accepts several values after one flag (`--inputs a.fa b.fa`, so a shell
glob works), a list in brackets (`"[a.fa,b.fa]"`), a folder (every input file in it, sorted by
name) and a quoted glob (`"genomes/*.fa.gz"`, sorted). `expand_inputs` turns all of these into
one flat list; the genome and time-series readers decide what each entry is.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Union

GLOB_CHARACTERS = frozenset("*?[")


def is_glob(item: str) -> bool:
    """Whether `item` is a glob pattern (and not an existing path that happens to hold `[`)."""
    return any(char in item for char in GLOB_CHARACTERS) and not os.path.exists(item)


def expand_inputs(
    items: Union[str, Path, Sequence[Union[str, Path]]],
    *,
    is_input: Callable[[str], bool],
    kind: str,
    keep_folder: Callable[[Path], bool] = lambda path: False,
    flag: str = "--inputs",
) -> list[str]:
    """`items` with every folder replaced by its input files (`is_input(name)`, sorted by name)
    and every glob by its matches (sorted). A folder for which `keep_folder` is true (a store)
    stays as it is.

    Raises FileNotFoundError for an input that does not exist (one holding commas is read as a
    list written the wrong way), a folder without inputs and a glob that matches nothing;
    ValueError for an empty list.
    """
    listed = [items] if isinstance(items, (str, Path)) else list(items)
    if not listed:
        raise ValueError(f"no input given; pass {kind} files after {flag}")
    found: list[str] = []
    for item in map(str, listed):
        path = Path(item)
        # os.path's checks say False for a string too long to be a path (a long literal sequence)
        if os.path.isdir(item) and not keep_folder(path):
            files = sorted(str(child) for child in path.iterdir() if child.is_file() and is_input(child.name))
            if not files:
                raise FileNotFoundError(f"folder {path} holds no {kind} files")
            found += files
        elif is_glob(item):
            matches = sorted(glob.glob(item))
            if not matches:
                raise FileNotFoundError(f"{flag} {item}: the pattern matches no file")
            found += expand_inputs(matches, is_input=is_input, kind=kind, keep_folder=keep_folder, flag=flag)
        elif not os.path.exists(item):
            raise missing_input_error(item, flag, f"{kind} files")
        else:
            found.append(item)
    return found


def missing_input_error(item: str, flag: str, kind: str) -> FileNotFoundError:
    """Our message for an input that does not exist; a name with commas is read as a list
    written the wrong way."""
    if "," in item:
        return FileNotFoundError(
            f"input file not found: {item}; give several files after one flag ({flag} a b) or as a "
            f"list in brackets ({flag} '[a,b]')"
        )
    return FileNotFoundError(f"input not found: {item} (expected {kind})")
