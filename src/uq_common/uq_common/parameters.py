"""Node parameters declared in one place: type, default, range, choices, description and
validation, as generate_parameter_library does for C++ nodes.

A node lists :class:`ParameterSpec` entries; :func:`declare_parameters` declares them with a
full ``ParameterDescriptor`` (type, ranges, read-only, constraints) and checks the start-up
values with :func:`validate_value`, the single per-value check also used by the runtime
set-parameters callback (:func:`first_invalid`), so a value refused at start is refused at
runtime too. Cross-parameter rules belong to the node's own configuration builder.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ParameterValue = bool | int | float | str | list[float]


@dataclass(frozen=True)
class ParameterSpec:
    """One node parameter.

    Attributes
    ----------
    name, default, description
        As declared; the default also fixes the type (bool, int, float, str, or a list of
        floats).
    min_value, max_value
        Inclusive numeric range of a scalar or of every element of a float list
        (``None``: unbounded).
    choices
        Allowed string values (``None``: any).
    read_only
        Only settable at start-up (model paths, topic names, timer periods).
    check
        Extra validation returning an error message or ``None``.
    constraints
        Rules checked elsewhere (across parameters), shown in the descriptor and ``--help``.
    """

    name: str
    default: ParameterValue
    description: str
    min_value: float | None = None
    max_value: float | None = None
    choices: Sequence[str] | None = None
    read_only: bool = False
    check: Callable[[Any], str | None] | None = None
    constraints: str = ''

    @property
    def type_name(self) -> str:
        """Human name of the parameter's type."""
        return 'list of floats' if isinstance(self.default, list) else type(
            self.default).__name__


def plain_value(value: Any) -> Any:
    """A parameter value as plain Python: double arrays arrive as ``array.array`` or numpy
    arrays depending on the source."""
    if isinstance(value, str | bool | int | float) or value is None:
        return value
    try:
        return [float(v) for v in value]
    except (TypeError, ValueError):
        return value


def validate_value(spec: ParameterSpec, value: Any) -> str | None:
    """Return why ``value`` is invalid for ``spec``, or ``None`` when it is valid."""
    value = plain_value(value)
    default = spec.default
    if isinstance(default, list):
        if not isinstance(value, list) or not all(
                isinstance(v, float) and not isinstance(v, bool) for v in value):
            return f'{spec.name} must be a list of floats, got {value!r}'
        elements = value
    else:
        # Strict, as rclpy's typed parameters: an integer is no value for a double.
        expected = type(default)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            return f'{spec.name} must be a {expected.__name__}, got {value!r}'
        elements = [value]
    for element in elements:
        if isinstance(element, float) and not math.isfinite(element):
            return f'{spec.name} must be finite, got {value!r}'
        if spec.min_value is not None and element < spec.min_value:
            return f'{spec.name} must be >= {spec.min_value:g}, got {value!r}'
        if spec.max_value is not None and element > spec.max_value:
            return f'{spec.name} must be <= {spec.max_value:g}, got {value!r}'
    if spec.choices is not None and value not in spec.choices:
        return f'{spec.name} must be one of {", ".join(spec.choices)}, got {value!r}'
    if spec.check is not None:
        return spec.check(value)
    return None


def descriptor(spec: ParameterSpec) -> Any:
    """The ``rcl_interfaces/ParameterDescriptor`` of ``spec`` (type, range, constraints)."""
    from rcl_interfaces.msg import (
        FloatingPointRange,
        IntegerRange,
        ParameterDescriptor,
        ParameterType,
    )

    constraints = [spec.constraints] if spec.constraints else []
    if spec.choices is not None:
        constraints.insert(0, f'one of: {", ".join(spec.choices)}')
    result = ParameterDescriptor(description=spec.description, read_only=spec.read_only,
                                 additional_constraints='; '.join(constraints))
    default = spec.default
    low, high = spec.min_value, spec.max_value
    if isinstance(default, bool):
        result.type = ParameterType.PARAMETER_BOOL
    elif isinstance(default, int):
        result.type = ParameterType.PARAMETER_INTEGER
        if low is not None and high is not None:
            result.integer_range = [IntegerRange(from_value=int(low), to_value=int(high), step=0)]
    elif isinstance(default, float):
        result.type = ParameterType.PARAMETER_DOUBLE
        if low is not None and high is not None:
            result.floating_point_range = [FloatingPointRange(
                from_value=float(low), to_value=float(high), step=0.0)]
    elif isinstance(default, str):
        result.type = ParameterType.PARAMETER_STRING
    else:
        # rclpy checks ranges of scalars only; validate_value checks list elements.
        result.type = ParameterType.PARAMETER_DOUBLE_ARRAY
    return result


def declare_parameters(node: Any, specs: Iterable[ParameterSpec]) -> dict[str, Any]:
    """Declare ``specs`` on an rclpy node and return their validated start-up values.

    A name in the node's parameter overrides (parameters file, ``-p``) that no spec
    declares is an error: a misspelt name would otherwise leave a default in force.

    Raises
    ------
    ValueError
        Listing every invalid start-up value (the node must refuse to start).
    """
    values: dict[str, Any] = {}
    errors = []
    for spec in specs:
        value = plain_value(node.declare_parameter(spec.name, spec.default,
                                                   descriptor(spec)).value)
        error = validate_value(spec, value)
        if error:
            errors.append(error)
        values[spec.name] = value
    overrides = getattr(node, '_parameter_overrides', {})
    unknown = sorted(name for name in overrides
                     if not node.has_parameter(name) and not name.startswith('qos_overrides.'))
    if unknown:
        errors.append(f'unknown parameters for {node.get_name()}: {", ".join(unknown)}')
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


def parameters_help(specs: Iterable[ParameterSpec]) -> list[str]:
    """One ``--help`` line per parameter: name, default, read-only flag, description, rules."""
    lines = []
    for spec in specs:
        rules = [f'one of {", ".join(spec.choices)}'] if spec.choices is not None else []
        if spec.min_value is not None or spec.max_value is not None:
            low = '-inf' if spec.min_value is None else f'{spec.min_value:g}'
            high = 'inf' if spec.max_value is None else f'{spec.max_value:g}'
            rules.append(f'range [{low}, {high}]')
        if spec.constraints:
            rules.append(spec.constraints)
        extra = f' [{"; ".join(rules)}]' if rules else ''
        fixed = ' (read-only)' if spec.read_only else ''
        lines.append(f'  {spec.name} = {spec.default!r}{fixed}: {spec.description}{extra}')
    return lines
