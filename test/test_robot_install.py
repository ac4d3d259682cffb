"""The colcon install works as the README's robot path uses it: in a fresh shell that has only
sourced ``install/setup.bash`` (no scripts/env.sh), ``uq`` is on PATH and every node
executable is where ``ros2 run <package> <node>`` looks (``lib/<package>/<node>``), and each
answers --help. With a ``ros2`` command in that shell (ROS 2 from apt, whose setup
install/setup.bash sources, or the launch kit of UQ_LAUNCH_KIT), ``ros2 run`` itself is
tried too."""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest

WORKSPACE = Path(__file__).resolve().parents[1]
INSTALL = WORKSPACE / 'install'
SETUP = INSTALL / 'setup.bash'
PYTHON_PACKAGES = sorted(p.parent.name for p in (WORKSPACE / 'src').glob('*/setup.py'))

pytestmark = pytest.mark.skipif(not SETUP.is_file(),
                                reason='the workspace is not built (make setup)')


def _console_scripts(package: str) -> list[str]:
    """The console scripts ``src/<package>/setup.py`` declares."""
    tree = ast.parse((WORKSPACE / 'src' / package / 'setup.py').read_text(encoding='utf-8'))
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == 'console_scripts':
                    return [entry.split('=')[0].strip() for entry in ast.literal_eval(value)]
    return []


NODES = [(package, script) for package in PYTHON_PACKAGES for script in _console_scripts(package)
         if script.endswith('_node')]


def _fresh_shell(command: str, before: str = '') -> subprocess.CompletedProcess:
    """``command`` in a bash that has sourced only ``before`` and install/setup.bash, with no
    variable of this process's environment (as a user's new terminal on the robot)."""
    script = f'{before}source {SETUP} && {command}'
    return subprocess.run(['env', '-i', f'HOME={Path.home()}', 'bash', '--noprofile', '--norc',
                           '-c', script], capture_output=True, text=True, timeout=60,
                          cwd=WORKSPACE)


def test_every_console_script_but_uq_is_a_node():
    # Anything else a user types would need its own place on PATH, as `uq` has.
    scripts = {(p, s) for p in PYTHON_PACKAGES for s in _console_scripts(p)}
    assert len(NODES) >= 8, NODES
    assert scripts - set(NODES) == {('uq_common', 'uq')}


def test_uq_runs_after_sourcing_the_install_alone():
    result = _fresh_shell('command -v uq && uq --help')
    assert result.returncode == 0, result.stdout + result.stderr
    found, _, usage = result.stdout.partition('\n')
    assert Path(found) == INSTALL / 'uq_common' / 'bin' / 'uq'
    assert usage.startswith('usage: uq')


@pytest.mark.parametrize('package,node', NODES, ids=lambda v: v)
def test_node_is_where_ros2_run_finds_it_and_answers_help(package, node):
    path = INSTALL / package / 'lib' / package / node
    assert path.is_file() and os.access(path, os.X_OK), f'{path} is not installed'
    result = _fresh_shell(f'{path} --help')
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f'usage: {node}'), result.stdout


def _ros2_setup() -> str:
    """What a shell sources before install/setup.bash to have `ros2`: the launch kit when one
    is named; ROS 2 from apt comes with install/setup.bash (colcon sources the underlay)."""
    kit = os.environ.get('UQ_LAUNCH_KIT')
    return f'source {kit}/bin/activate && ' if kit else ''


def test_ros2_run_starts_each_node():
    before = _ros2_setup()
    if _fresh_shell('command -v ros2', before).returncode != 0:
        pytest.skip('no ros2 command after sourcing install/setup.bash: ROS 2 from PyPI has '
                    'no ros2cli (set UQ_LAUNCH_KIT to the launch kit, docs/deployment.md)')
    # One shell for all nodes: each `ros2 run` starts ros2cli, which takes most of a second.
    runs = ' && '.join(f'echo "== {node}" && ros2 run {package} {node} --help'
                       for package, node in NODES)
    result = _fresh_shell(runs, before)
    assert result.returncode == 0, result.stdout + result.stderr
    for _, node in NODES:
        assert f'== {node}\nusage: {node}' in result.stdout, result.stdout
