"""scripts/setup.sh installs the Debian packages the workspace builds with, or stops early.

The build of ``uq_msgs`` needs a compiler, CMake, git and Python 3.11's venv and headers;
set-up checks them with ``dpkg-query`` and installs what is missing with apt as root (or
through ``sudo -n``). Without either it must stop before creating anything, naming the
missing packages and the one command that installs them. That path runs here for real: a
copy of the script whose list also names a Debian package this machine lacks, run as an
unprivileged user.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

WORKSPACE = Path(__file__).resolve().parents[1]
SETUP = WORKSPACE / 'scripts' / 'setup.sh'
#: A real Debian package that nothing here needs.
ABSENT = 'cowsay'


def _system_packages() -> list[str]:
    text = SETUP.read_text(encoding='utf-8')
    match = re.search(r'^SYSTEM_PACKAGES=\(([^)]*)\)', text, re.MULTILINE)
    assert match, 'scripts/setup.sh has no SYSTEM_PACKAGES list'
    return match.group(1).split()


def test_the_build_tools_are_in_the_list():
    assert {'g++', 'cmake', 'git', 'python3.11-venv', 'python3.11-dev'} <= set(
        _system_packages())


def test_without_root_or_sudo_it_stops_naming_the_packages_and_the_command():
    if os.geteuid() != 0 or shutil.which('runuser') is None:
        pytest.skip('needs root and runuser to run the script as an unprivileged user')
    installed = subprocess.run(['dpkg-query', '-W', '-f=${Status}', ABSENT],
                               capture_output=True, text=True)
    if 'install ok installed' in installed.stdout:
        pytest.skip(f'{ABSENT} is installed here: no package is missing')
    root = Path(tempfile.mkdtemp(prefix='uq-setup-'))
    try:
        (root / 'scripts').mkdir()
        script = SETUP.read_text(encoding='utf-8').replace(
            'SYSTEM_PACKAGES=(', f'SYSTEM_PACKAGES=({ABSENT} ', 1)
        (root / 'scripts' / 'setup.sh').write_text(script, encoding='utf-8')
        for path in (root, root / 'scripts'):
            path.chmod(0o755)
        result = subprocess.run(['runuser', '-u', 'nobody', '--', 'bash',
                                 str(root / 'scripts' / 'setup.sh')],
                                capture_output=True, text=True, timeout=120, cwd=root)
        if 'installing Debian packages' in result.stdout:
            pytest.skip('user nobody has password-less sudo here')
        assert result.returncode == 1, result.stdout + result.stderr
        assert f'missing Debian packages: {ABSENT}' in result.stderr
        assert f"sudo sh -c 'apt-get update && apt-get install -y {ABSENT}'" in result.stderr
        assert sorted(p.name for p in root.iterdir()) == ['scripts'], 'it went on'
    finally:
        shutil.rmtree(root)
