"""Fixtures shared by every test folder of the workspace: rclpy contexts on a ROS domain
private to the test module, so that test modules running side by side do not hear each
other."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import pytest


def _private_context(module_name: str) -> Iterator[Any]:
    import rclpy

    domain_id = 100 + zlib.crc32(module_name.encode()) % 100
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain_id)
    try:
        yield context
    finally:
        context.try_shutdown()


@pytest.fixture
def ros_context(request: pytest.FixtureRequest) -> Iterator[Any]:
    """An initialised rclpy context for one test."""
    yield from _private_context(request.module.__name__)


@pytest.fixture(scope='module')
def module_ros_context(request: pytest.FixtureRequest) -> Iterator[Any]:
    """An initialised rclpy context shared by the tests of one module."""
    yield from _private_context(request.module.__name__)
