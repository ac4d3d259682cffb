"""Strict parsing of JSON texts that arrive from outside (messages, files), ROS-free.

Python's ``json`` accepts more than JSON: ``NaN`` and ``Infinity``, and numbers that
overflow to infinity; and it raises ``RecursionError``, not ``ValueError``, on deeply
nested arrays. Here every one of those is a ``ValueError`` saying what was wrong, so a
caller that catches ``ValueError`` for bad input catches them all.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _reject_constant(name: str) -> float:
    raise ValueError(f'{name} is not a number JSON allows')


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f'number {text[:20]} is out of range')
    return value


def parse_json(text: str) -> Any:
    """``json.loads`` restricted to JSON (module docstring).

    Raises
    ------
    ValueError
        If ``text`` is not JSON, holds ``NaN``/``Infinity`` or a number that overflows, or
        is nested too deeply.
    """
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError('nested too deeply') from None


def parse_json_object(text: str, what: str, max_chars: int) -> dict[str, Any]:
    """The JSON object in ``text``, of at most ``max_chars`` characters.

    Raises
    ------
    ValueError
        Starting with ``what``, if ``text`` is too long, not JSON (:func:`parse_json`) or
        not an object.
    """
    if len(text) > max_chars:
        raise ValueError(f'{what} is {len(text)} characters long; at most {max_chars} are '
                         'allowed')
    try:
        value = parse_json(text)
    except ValueError as exc:
        raise ValueError(f'{what} is not JSON ({exc})') from None
    if not isinstance(value, dict):
        raise ValueError(f'{what} must be a JSON object, got {type(value).__name__}')
    return value
