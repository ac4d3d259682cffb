"""``StrEnum`` for every supported Python (3.10 has no ``enum.StrEnum``).

JetPack 6 runs Python 3.10 (docs/gpu_jetson.md). Members are ``str`` instances whose
``str()`` and ``format()`` give their value, as with Python 3.11's ``enum.StrEnum``, so
f-strings, JSON and ROS string fields see the plain value on every version.
"""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """An ``Enum`` whose members are strings and print as their value."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        return str(self.value).__format__(format_spec)
