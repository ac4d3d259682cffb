"""Every package runs on Python 3.10 and newer: JetPack 6 (L4T r36) ships Python 3.10, the
x86 and JetPack 7 images Python 3.12, this machine 3.11 (docs/gpu_jetson.md). vermin
checks the syntax and standard-library use statically; ruff's target-version (pyproject)
keeps its upgrade rules from suggesting 3.11-only forms."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

WORKSPACE = Path(__file__).resolve().parents[1]


def _vermin() -> str:
    # The console script of the venv this test runs in (vermin has no ``__main__``).
    beside = Path(sys.executable).with_name('vermin')
    return str(beside) if beside.exists() else shutil.which('vermin') or 'vermin'


def test_sources_need_no_python_newer_than_3_10():
    result = subprocess.run(
        [_vermin(), '--target=3.10-', '--no-tips', '--violations',
         '--exclude-regex', r'(^|/)(build|install|log)/', 'src/'],
        cwd=WORKSPACE, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_targets_the_oldest_supported_python():
    pyproject = (WORKSPACE / 'pyproject.toml').read_text()
    assert re.search(r'^target-version = "py310"', pyproject, re.MULTILINE), pyproject
