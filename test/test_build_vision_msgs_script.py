"""scripts/build_vision_msgs.sh: vision_msgs from a local source checkout into an overlay.

The refusals run everywhere (no build). With ``UQ_VISION_MSGS_SRC`` naming a checkout of
https://github.com/ros-perception/vision_msgs (branch ros2 or a 4.x tag), the script builds it
into a temporary folder and the built messages import there; without one that part skips,
saying so.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

WORKSPACE = Path(__file__).resolve().parents[1]
SCRIPT = WORKSPACE / 'scripts' / 'build_vision_msgs.sh'
MANIFEST = """<?xml version="1.0"?>
<package format="3">
  <name>{name}</name>
  <version>{version}</version>
  <description>d</description>
  <maintainer email="m@example.org">m</maintainer>
  <license>Apache License 2.0</license>
</package>
"""


def _run(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(['bash', str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def _package(root: Path, name: str, version: str) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / 'package.xml').write_text(MANIFEST.format(name=name, version=version))
    return root


def test_a_folder_without_vision_msgs_is_refused(tmp_path):
    source = _package(tmp_path / 'src', 'other_msgs', '4.1.1')
    result = _run(source, tmp_path / 'out')
    assert result.returncode == 2
    assert 'no vision_msgs package' in result.stderr
    assert not (tmp_path / 'out').exists(), 'nothing is created for a refused checkout'


def test_a_vision_msgs_for_another_ros_release_is_refused(tmp_path):
    source = _package(tmp_path / 'src', 'vision_msgs', '3.0.2')
    result = _run(source, tmp_path / 'out')
    assert result.returncode == 2
    assert 'vision_msgs 3.0.2' in result.stderr and '4.x' in result.stderr


def test_a_missing_folder_and_a_missing_argument_are_refused(tmp_path):
    missing = _run(tmp_path / 'missing')
    assert missing.returncode == 2 and 'is not a directory' in missing.stderr
    no_argument = _run()
    assert no_argument.returncode == 2 and 'usage:' in no_argument.stderr


def test_a_checkout_builds_into_an_overlay_that_imports(tmp_path):
    checkout = os.environ.get('UQ_VISION_MSGS_SRC')
    if not checkout:
        pytest.skip('UQ_VISION_MSGS_SRC is not set: give it a checkout of '
                    'https://github.com/ros-perception/vision_msgs (branch ros2) to build it')
    result = _run(checkout, tmp_path / 'ws', timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    setup = tmp_path / 'ws' / 'install' / 'local_setup.bash'
    assert setup.is_file()
    check = subprocess.run(
        ['bash', '-c', f'source {WORKSPACE}/.venv/bin/activate && set +u && source {setup} '
         '&& python -c "from vision_msgs.msg import Detection2DArray; '
         'import vision_msgs; print(vision_msgs.__file__)"'],
        capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr
    assert str(tmp_path) in check.stdout
