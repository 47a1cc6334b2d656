"""Options named in error messages, in the syntax of whoever reads them.

A message raised from Python code names options as Python keywords (``overwrite=True``); the same
message printed by the ``genoformer`` command names them as command-line options (``--overwrite``),
so that a hint can be typed as it is. The command sets the style with :func:`command_line_hints`
around the work it runs, with the prefix its options need (``genoformer fit`` reaches the data
code through the data module: ``--data.init_args.missing ffill``); everything else gets the
Python style.

    raise FileExistsError(f"{out} exists; pass {option('overwrite')} to replace it")
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_OPTION_PREFIX: contextvars.ContextVar[str | None] = contextvars.ContextVar("genoformer_option_prefix", default=None)


@contextlib.contextmanager
def command_line_hints(prefix: str = "") -> Iterator[None]:
    """Within this block, :func:`option` and :func:`hint` give the command-line form, and
    :func:`option` puts ``prefix`` before option names (``--{prefix}{name}``)."""
    token = _OPTION_PREFIX.set(prefix)
    try:
        yield
    finally:
        _OPTION_PREFIX.reset(token)


def hint(python: str, command_line: str) -> str:
    """``command_line`` inside :func:`command_line_hints`, else ``python``."""
    return python if _OPTION_PREFIX.get() is None else command_line


def option(name: str, value: object = True, *, metavar: str | None = None) -> str:
    """One option as typed: ``name=value`` in Python, ``--name value`` on the command line.

    A True value is a bare flag on the command line (``--overwrite``). ``metavar`` stands for a
    value the reader chooses (``sampling_rate=HZ`` / ``--sampling_rate HZ``).
    """
    flag = f"--{_OPTION_PREFIX.get() or ''}{name}"
    if metavar is not None:
        return hint(f"{name}={metavar}", f"{flag} {metavar}")
    if value is True:
        return hint(f"{name}=True", flag)
    return hint(f"{name}={value!r}", f"{flag} {value}")
