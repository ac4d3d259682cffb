"""The rosdep keys of the manifests against rosdistro (scripts/check_rosdep_keys.py).

With ``UQ_ROSDISTRO_DIR`` naming a checkout of https://github.com/ros/rosdistro, the check
runs against it: every build and run key must resolve, and the table in docs/deployment.md
must be the check's output. Without one that part skips, saying so; the resolution rules
themselves are tested here on rule files in rosdep's own YAML forms.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKSPACE = Path(__file__).resolve().parents[1]
SCRIPT = WORKSPACE / 'scripts' / 'check_rosdep_keys.py'
_spec = importlib.util.spec_from_file_location('check_rosdep_keys', SCRIPT)
assert _spec is not None and _spec.loader is not None
check = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = check  # dataclasses look their module up there
_spec.loader.exec_module(check)

RULES = """
plain-list:
  debian: [deb-plain]
  ubuntu: [ubuntu-plain]
by-version:
  ubuntu:
    '*': [ubuntu-any]
    focal: [ubuntu-focal]
    jammy: null
pip-everywhere:
  ubuntu:
    pip:
      packages: [some-wheel]
pip-on-old-releases:
  ubuntu:
    '*': [ubuntu-new]
    bionic:
      pip:
        packages: [old-wheel]
apt-installer:
  ubuntu:
    noble:
      apt:
        packages: [first, second]
no-ubuntu:
  fedora: [fedora-only]
"""

DISTRIBUTION = """
repositories:
  single_package_repo:
    release: {version: 1.0.0}
  multi:
    release:
      packages: [multi_a, multi_b]
  source_only:
    source: {type: git, url: https://example.org/x.git}
"""


@pytest.fixture
def rosdistro(tmp_path: Path) -> Path:
    (tmp_path / 'rosdep').mkdir()
    (tmp_path / 'rosdep' / 'python.yaml').write_text(RULES)
    (tmp_path / 'jazzy').mkdir()
    (tmp_path / 'jazzy' / 'distribution.yaml').write_text(DISTRIBUTION)
    return tmp_path


def _resolve(rosdistro: Path, key: str, version: str = 'noble'):
    return check.resolve(key, 'ubuntu', version, check.released_packages(rosdistro, 'jazzy'),
                         check.rosdep_rules(rosdistro), 'jazzy')


def test_released_packages_resolve_to_the_distribution_package(rosdistro):
    assert check.released_packages(rosdistro, 'jazzy') == {
        'single_package_repo', 'multi_a', 'multi_b'}
    assert _resolve(rosdistro, 'multi_b') == check.Resolution('ROS', ('ros-jazzy-multi-b',))
    assert _resolve(rosdistro, 'source_only').kind == 'none'


@pytest.mark.parametrize('key,version,kind,packages', [
    ('plain-list', 'noble', 'apt', ('ubuntu-plain',)),
    ('by-version', 'noble', 'apt', ('ubuntu-any',)),
    ('by-version', 'focal', 'apt', ('ubuntu-focal',)),
    ('by-version', 'jammy', 'none', ()),
    ('pip-everywhere', 'noble', 'pip', ('some-wheel',)),
    ('pip-on-old-releases', 'noble', 'apt', ('ubuntu-new',)),
    ('pip-on-old-releases', 'bionic', 'pip', ('old-wheel',)),
    ('apt-installer', 'noble', 'apt', ('first', 'second')),
    ('apt-installer', 'jammy', 'none', ()),
    ('no-ubuntu', 'noble', 'none', ()),
    ('not-a-key', 'noble', 'none', ()),
])
def test_rosdep_rules_resolve_as_rosdep_reads_them(rosdistro, key, version, kind, packages):
    assert _resolve(rosdistro, key, version) == check.Resolution(kind, packages)


def test_a_folder_that_is_not_rosdistro_is_refused(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), '--rosdistro', str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and 'rosdistro checkout' in result.stderr


def test_the_manifests_keys_against_a_rosdistro_checkout():
    checkout = os.environ.get('UQ_ROSDISTRO_DIR')
    if not checkout:
        pytest.skip('UQ_ROSDISTRO_DIR is not set: give it a checkout of '
                    'https://github.com/ros/rosdistro to check the keys against it')
    result = subprocess.run([sys.executable, str(SCRIPT), '--rosdistro', checkout],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    table = [line for line in result.stdout.splitlines() if line.startswith('| `')]
    doc = (WORKSPACE / 'docs' / 'deployment.md').read_text(encoding='utf-8')
    section = doc.split('<!-- rosdep-keys:begin -->')[1].split('<!-- rosdep-keys:end -->')[0]
    documented = [line for line in section.splitlines() if line.startswith('| `')]
    assert documented == table, 'docs/deployment.md: the rosdep table is not the check\'s ' \
                                'output; paste it from scripts/check_rosdep_keys.py'


def test_the_optional_vision_msgs_is_a_run_key_that_resolves_to_its_ros_package():
    # Optional at run time (the detector's detections_2d), yet a run key: rosdep installs it
    # on a robot, so the robot has the standard output.
    keys = check.manifest_keys()
    assert keys['vision_msgs'] == {'exec_depends'}
    assert check.resolve('vision_msgs', 'ubuntu', 'noble', {'vision_msgs'}, {}, 'jazzy') == \
        check.Resolution('ROS', ('ros-jazzy-vision-msgs',))
