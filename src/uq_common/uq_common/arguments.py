"""Argument types for the ``uq`` commands: numbers checked by rule when parsed.

A count of 0, a negative thread number, a NaN rate or a ROS domain id out of range is then
refused by argparse with exit status 2 and one line saying what is wrong, instead of a
traceback (or a silent nonsense run) from deep inside the command.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

# ROS 2 domain ids that every RMW maps to valid ports (docs.ros.org: "Domain ID").
MAX_DOMAIN_ID = 232


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected a whole number, got {text!r}') from None


def _finite_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected a number, got {text!r}') from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f'expected a finite number, got {text!r}')
    return value


def _checked(value: int | float, ok: bool, rule: str) -> Any:
    if not ok:
        raise argparse.ArgumentTypeError(f'{rule}, got {value}')
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1 (counts, sizes, threads)."""
    value = _whole_number(text)
    return _checked(value, value >= 1, 'must be >= 1')


def non_negative_int(text: str) -> int:
    """A whole number >= 0 (seeds)."""
    value = _whole_number(text)
    return _checked(value, value >= 0, 'must be >= 0')


def domain_id(text: str) -> int:
    """A ROS 2 domain id, 0 to :data:`MAX_DOMAIN_ID`."""
    value = _whole_number(text)
    return _checked(value, 0 <= value <= MAX_DOMAIN_ID,
                    f'a ROS domain id must be 0..{MAX_DOMAIN_ID}')


def positive_float(text: str) -> float:
    """A finite number > 0 (rates, durations, timeouts)."""
    value = _finite_number(text)
    return _checked(value, value > 0.0, 'must be > 0')


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (delays, offsets, loss weights)."""
    value = _finite_number(text)
    return _checked(value, value >= 0.0, 'must be >= 0')


def open_fraction(text: str) -> float:
    """A number in (0, 1) (shares of a dataset held out for validation)."""
    value = _finite_number(text)
    return _checked(value, 0.0 < value < 1.0, 'must be in (0, 1)')


def unit_interval(text: str) -> float:
    """A finite number in [0, 1] (a score threshold)."""
    value = _finite_number(text)
    return _checked(value, 0.0 <= value <= 1.0, 'must be in [0, 1]')
