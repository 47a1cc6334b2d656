"""Options named in error messages, in the syntax of whoever reads them.

A message raised from Python code names options as Python keywords (``overwrite=True``); the same
message printed by the ``genoformer`` command names them as command-line options (``--overwrite``),
so that a hint can be typed as it is. The command sets the style with :func:`command_line_hints`
around the work it runs; everything else gets the Python style.

    raise FileExistsError(f"{out} exists; pass {option('overwrite')} to replace it")
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_COMMAND_LINE = contextvars.ContextVar("genoformer_command_line_hints", default=False)


@contextlib.contextmanager
def command_line_hints() -> Iterator[None]:
    """Within this block, :func:`option` and :func:`hint` give the command-line form."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def hint(python: str, command_line: str) -> str:
    """``command_line`` inside :func:`command_line_hints`, else ``python``."""
    return command_line if _COMMAND_LINE.get() else python


def option(name: str, value: object = True, *, metavar: str | None = None) -> str:
    """One option as typed: ``name=value`` in Python, ``--name value`` on the command line.

    A True value is a bare flag on the command line (``--overwrite``). ``metavar`` stands for a
    value the reader chooses (``sampling_rate=HZ`` / ``--sampling_rate HZ``).
    """
    if metavar is not None:
        return hint(f"{name}={metavar}", f"--{name} {metavar}")
    if value is True:
        return hint(f"{name}=True", f"--{name}")
    return hint(f"{name}={value!r}", f"--{name} {value}")
