"""Helpers for the command-line tests (a uniquely named module, so test files can import it next to
other folders' helpers)."""

from __future__ import annotations

import pytest

from genoformer.cli import main


def fails(capsys, args: list[str]) -> str:
    """Run the command, expect the short error of bad input (exit code 1) and return stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err
