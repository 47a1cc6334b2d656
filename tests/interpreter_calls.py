"""Triton's CPU interpreter patches `triton.language` once per kernel launch and, again, on every
call of a `@triton.jit` helper inside the kernel: the second patching walks every member of
`tl`, `tl.core`, `tl.tensor` and `tl.math` each time, finds them already patched by the launch,
and leaves them as they were. Our kernels call helpers in their inner loops (a tile's pointers,
its mask, one step of the online softmax), so that walk took a third of the interpreter's time.

With this plugin a helper called inside a launch skips the walk when the launch has already
patched every language module the helper's own module sees (the modules `_patch_lang` looks for);
a helper whose module sees another one, or a call outside any launch, is patched as before. The
kernels run the same code on the same values: the tests judge them against the float64 reference
as they did. Active only under TRITON_INTERPRET=1, and only where the installed Triton has the
three functions it wraps (otherwise the interpreter runs as it comes).
"""

from __future__ import annotations

import importlib.util
import os

import pytest


def _reuse_the_launch_patch() -> None:
    from triton.runtime import interpreter

    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    lang_modules = (interpreter.tl, interpreter.tl.core)
    seen: dict[int, frozenset[int]] = {}  # id(function) -> ids of the language modules its globals hold
    launches: list[frozenset[int] | None] = []  # per running launch: what its own patching covered

    def langs(fn) -> frozenset[int]:
        if id(fn) not in seen:
            seen[id(fn)] = frozenset(id(v) for v in fn.__globals__.values() if any(v is m for m in lang_modules))
        return seen[id(fn)]

    def patch_once_per_launch(fn):
        if launches and launches[-1] is None:  # the launch's own patching: done in full
            launches[-1] = langs(fn)
        elif launches and langs(fn) <= launches[-1]:  # a helper inside the launch: already patched
            return interpreter._LangPatchScope()
        return patch_lang(fn)

    def launch_with_one_patch(self, *args, **kwargs):
        launches.append(None)
        try:
            return launch(self, *args, **kwargs)
        finally:
            launches.pop()

    interpreter._patch_lang = patch_once_per_launch
    interpreter.GridExecutor.__call__ = launch_with_one_patch


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None:
        return
    from triton.runtime import interpreter

    if all(hasattr(interpreter, name) for name in ("_patch_lang", "GridExecutor", "_LangPatchScope")):
        _reuse_the_launch_patch()
