"""The names of the attention backends (`Backend`), importable without torch: the commands' and
configs' `backend` option parses them before anything runs. `genoformer.kernels.dispatch` says
what each backend is and runs it."""

from __future__ import annotations

import enum


class _ByNameOrValue(enum.EnumMeta):
    """`Backend[...]` finds a member by name or value in any case, as `Backend(...)` does.

    jsonargparse (LightningCLI's parser) reads an Enum-typed field with `Backend[text]`, so
    `attention_backend: flash_attn`, `auto` or `FLASH_ATTN` in a config all parse."""

    def __getitem__(cls, name):
        member = cls._missing_(name) if isinstance(name, str) else None
        if member is None:
            raise KeyError(name)
        return member


class Backend(str, enum.Enum, metaclass=_ByNameOrValue):
    """Which implementation runs `attention`; parses from its value or its name in any case."""

    AUTO = "auto"
    REFERENCE = "reference"
    TORCH = "torch"
    SDPA = "sdpa"
    FLASH_ATTN = "flash_attn"
    FLASH_ATTN_2 = "flash_attn_2"
    FLASH_ATTN_4 = "flash_attn_4"
    TRITON = "triton"
    GLUON = "gluon"
    XFORMERS = "xformers"
    FP8 = "fp8"

    @classmethod
    def _missing_(cls, value):
        if not isinstance(value, str):
            return None
        folded = value.lower()
        return next((m for m in cls.__members__.values() if folded in (m.value, m.name.lower())), None)
