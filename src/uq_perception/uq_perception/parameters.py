"""Node parameters declared in one place: type, default, range, description, validation.

A node lists :class:`ParameterSpec` entries; :func:`declare_parameters` declares them with
full ``ParameterDescriptor`` (ranges, read-only, description) and :func:`validate_value`
is the single check used both at start-up and in the runtime set-parameters callback, as
generate_parameter_library does for C++ nodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParameterSpec:
    """One node parameter.

    Attributes
    ----------
    name, default, description
        As declared; the default also fixes the type (bool, int, float, str).
    min_value, max_value
        Inclusive numeric range (``None``: unbounded).
    choices
        Allowed string values (``None``: any).
    read_only
        Only settable at start-up (e.g. model paths, topic names).
    check
        Extra validation returning an error message or ``None``.
    """

    name: str
    default: Any
    description: str
    min_value: float | None = None
    max_value: float | None = None
    choices: Sequence[str] | None = None
    read_only: bool = False
    check: Callable[[Any], str | None] | None = None


def validate_value(spec: ParameterSpec, value: Any) -> str | None:
    """Return why ``value`` is invalid for ``spec``, or ``None`` when it is valid."""
    expected = type(spec.default)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        return f'{spec.name} must be a {expected.__name__}, got {value!r}'
    if isinstance(value, float) and not math.isfinite(value):
        return f'{spec.name} must be finite, got {value}'
    if spec.min_value is not None and value < spec.min_value:
        return f'{spec.name} must be >= {spec.min_value}, got {value}'
    if spec.max_value is not None and value > spec.max_value:
        return f'{spec.name} must be <= {spec.max_value}, got {value}'
    if spec.choices is not None and value not in spec.choices:
        return f'{spec.name} must be one of {", ".join(spec.choices)}, got {value!r}'
    if spec.check is not None:
        return spec.check(value)
    return None


def declare_parameters(node: Any, specs: Iterable[ParameterSpec]) -> dict[str, Any]:
    """Declare ``specs`` on an rclpy node and return their validated start-up values.

    Raises
    ------
    ValueError
        Listing every invalid start-up value (the node must refuse to start).
    """
    from rcl_interfaces.msg import (
        FloatingPointRange,
        IntegerRange,
        ParameterDescriptor,
    )

    values: dict[str, Any] = {}
    errors = []
    for spec in specs:
        descriptor = ParameterDescriptor(description=spec.description,
                                         read_only=spec.read_only)
        if spec.choices is not None:
            descriptor.additional_constraints = f'one of: {", ".join(spec.choices)}'
        if isinstance(spec.default, float) and spec.min_value is not None \
                and spec.max_value is not None:
            descriptor.floating_point_range = [FloatingPointRange(
                from_value=float(spec.min_value), to_value=float(spec.max_value))]
        elif isinstance(spec.default, int) and not isinstance(spec.default, bool) \
                and spec.min_value is not None and spec.max_value is not None:
            descriptor.integer_range = [IntegerRange(
                from_value=int(spec.min_value), to_value=int(spec.max_value), step=0)]
        value = node.declare_parameter(spec.name, spec.default, descriptor).value
        error = validate_value(spec, value)
        if error:
            errors.append(error)
        values[spec.name] = value
    if errors:
        raise ValueError('invalid parameters: ' + '; '.join(errors))
    return values


def first_invalid(specs: Mapping[str, ParameterSpec], parameters: Iterable[Any]) -> str | None:
    """Why the first of ``parameters`` (objects with ``name`` and ``value``, e.g. rclpy
    ``Parameter``) is invalid, or ``None``; names without a spec are not judged here.

    Runtime set-parameters callbacks use it so that a batch is accepted or refused whole.
    """
    for parameter in parameters:
        spec = specs.get(parameter.name)
        if spec is not None:
            error = validate_value(spec, parameter.value)
            if error:
                return error
    return None
