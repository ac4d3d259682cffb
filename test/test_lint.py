"""Linters are part of the test suite: ruff over all Python code, mypy over the ROS-free
core modules (node modules adapt untyped rclpy APIs and are left to ruff)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

WORKSPACE = Path(__file__).resolve().parents[1]


def test_ruff_is_clean():
    result = subprocess.run(
        [sys.executable, '-m', 'ruff', 'check', 'src', 'test', 'scripts'],
        cwd=WORKSPACE, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean_on_core_modules():
    # Subpackages included (uq_perception.ntk, the uq_eval families).
    core = sorted(str(p.relative_to(WORKSPACE)) for p in WORKSPACE.glob('src/uq_*/uq_*/**/*.py')
                  if not p.name.endswith('_node.py'))
    result = subprocess.run(
        [sys.executable, '-m', 'mypy', '--no-error-summary', '--follow-imports=silent', *core],
        cwd=WORKSPACE, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
