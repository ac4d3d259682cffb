"""Fixtures of the uq_eval tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope='session')
def quadrant_detector() -> ModuleType:
    """The small DETR-style test detector (``quadrant_detector.py`` beside this file, loaded
    by its path: the test folders are no packages)."""
    spec = importlib.util.spec_from_file_location(
        'quadrant_detector', Path(__file__).with_name('quadrant_detector.py'))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
