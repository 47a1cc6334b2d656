"""Options named in error messages, in the syntax of whoever reads them.

A message raised from Python code names options as Python keywords (``overwrite=True``); the same
message printed by the ``genoformer`` command names them as command-line options (``--overwrite``),
so that a hint can be typed as it is. The command sets the style with :func:`command_line_hints`
around the work it runs, with the prefix its options need (``genoformer fit`` reaches the data
code through the data module: ``--data.init_args.missing ffill``); everything else gets the
Python style.

    raise FileExistsError(f"{out} exists; pass {option('overwrite')} to replace it")

On the command line a value is written as a shell takes it: quoted where it holds characters the
shell would read (a path with a space); a list comma-separated for the tool commands
(``--horizons 96,192``) and as ``'[a,b]'`` for the training commands (``--data.init_args.fasta
'[a.fa,b.fa]'``), as each reads a list.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import shlex
from collections.abc import Iterator


@dataclasses.dataclass(frozen=True)
class _Style:
    prefix: str
    bare_flags: bool


_STYLE: contextvars.ContextVar[_Style | None] = contextvars.ContextVar("genoformer_option_style", default=None)


@contextlib.contextmanager
def command_line_hints(prefix: str = "", bare_flags: bool = True) -> Iterator[None]:
    """Within this block, :func:`option` and :func:`hint` give the command-line form, and
    :func:`option` puts ``prefix`` before option names (``--{prefix}{name}``). ``bare_flags``
    False writes a True flag with its value (``--data.init_args.pack true``), as the training
    commands need."""
    token = _STYLE.set(_Style(prefix, bare_flags))
    try:
        yield
    finally:
        _STYLE.reset(token)


def hint(python: str, command_line: str) -> str:
    """``command_line`` inside :func:`command_line_hints`, else ``python``."""
    return python if _STYLE.get() is None else command_line


def option(name: str, value: object = True, *, metavar: str | None = None) -> str:
    """One option as typed: ``name=value`` in Python, ``--name value`` on the command line.

    A True value is a bare flag on the command line (``--overwrite``) where the command takes
    one. A list or tuple is ``name=[96, 192]`` in Python, ``--name 96,192`` for a tool command and
    ``--name '[96,192]'`` for a training command. ``metavar`` stands for a value the reader chooses (``sampling_rate=HZ`` /
    ``--sampling_rate HZ``).
    """
    style = _STYLE.get()
    flag = f"--{style.prefix if style else ''}{name}"
    if metavar is not None:
        return hint(f"{name}={metavar}", f"{flag} {metavar}")
    if value is True and (style is None or style.bare_flags):
        return hint(f"{name}=True", flag)
    if isinstance(value, (list, tuple)):
        items = ",".join(str(item) for item in value)
        typed = items if style is not None and style.bare_flags and items else f"[{items}]"
        return hint(f"{name}={list(value)!r}", f"{flag} {shlex.quote(typed)}")
    typed = "true" if value is True else "false" if value is False else str(value)
    return hint(f"{name}={value!r}", f"{flag} {shlex.quote(typed)}")
