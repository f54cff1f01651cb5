"""Boundary validation: one message shape for every bad choice."""
from __future__ import annotations

import enum
from typing import Iterable

__all__ = ["check_choice", "parse_enum"]


def check_choice(param: str, value, choices: Iterable[str]) -> str:
    """Return ``value`` if it names one of ``choices``; else ValueError naming all three."""
    choices = list(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{param}: unknown value {value!r}; valid choices: {', '.join(choices)}")
    return value


def parse_enum(param: str, value, enum_cls: type[enum.Enum]):
    """Accept an enum member, its name or its value (case-insensitive)."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        for m in enum_cls:
            if value.lower() in (m.name.lower(), str(m.value).lower()):
                return m
    raise ValueError(f"{param}: unknown value {value!r}; valid choices: "
                     + ", ".join(m.name for m in enum_cls))
