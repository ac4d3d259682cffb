"""Fixtures of the cross-package tests (the rclpy contexts are in the root conftest.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from rosidl_parser import definition as idl

# Values exactly representable in float32 so equality survives serialisation.
_counter = itertools.count(1)


def _value_for(slot: Any, type_support_module: Callable[[str, str], type]) -> Any:
    n = next(_counter)
    if isinstance(slot, idl.BasicType):
        t = slot.typename
        if t == 'boolean':
            return n % 2 == 0
        if t in ('float', 'double'):
            return n + 0.25
        if t in ('octet', 'char'):
            return bytes([n % 256]) if t == 'octet' else chr(65 + n % 26)
        if t.startswith('int'):
            return -n if t != 'int8' else -(n % 100)
        if t.startswith('uint'):
            return n % 200
        raise AssertionError(f'unhandled basic type {t}')
    if isinstance(slot, idl.AbstractString):
        return f'text-{n}-ü'
    if isinstance(slot, idl.NamespacedType):
        return fill_message(type_support_module(slot.namespaces[0], slot.name))
    if isinstance(slot, idl.Array):
        return [_value_for(slot.value_type, type_support_module) for _ in range(slot.size)]
    if isinstance(slot, idl.AbstractSequence):
        return [_value_for(slot.value_type, type_support_module) for _ in range(3)]
    raise AssertionError(f'unhandled slot type {slot!r}')


def _import_type(package: str, name: str) -> type:
    import importlib
    for kind in ('msg', 'srv'):
        try:
            return getattr(importlib.import_module(f'{package}.{kind}'), name)
        except (ImportError, AttributeError):
            continue
    raise AssertionError(f'cannot import {package}/{name}')


def fill_message(cls: type) -> Any:
    """An instance of the ROS message class ``cls`` with every field, nested ones included,
    set to a distinct non-default value (sequences get three elements)."""
    msg = cls()
    for field_name, slot in zip(cls.get_fields_and_field_types(), cls.SLOT_TYPES, strict=True):
        value = _value_for(slot, _import_type)
        if isinstance(slot, idl.AbstractSequence | idl.Array) and isinstance(
                slot.value_type, idl.BasicType) and slot.value_type.typename == 'octet':
            value = b''.join(value)
        setattr(msg, field_name, value)
    return msg


@pytest.fixture
def filled_message() -> Callable[[type], Any]:
    return fill_message
