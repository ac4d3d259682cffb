"""Packaging: every package.xml is a valid format-3 manifest, every console script and
every `uq` subcommand answers --help."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

import pytest
from catkin_pkg.package import parse_package

from uq_common.cli import build_parser

WORKSPACE = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((WORKSPACE / 'src').glob('*/package.xml'))
PYTHON_PACKAGES = ['uq_common', 'uq_perception', 'uq_autonomy', 'uq_sim', 'uq_eval']


def _console_scripts() -> list[tuple[str, str]]:
    return [(pkg, ep.name) for pkg in PYTHON_PACKAGES
            for ep in distribution(pkg).entry_points if ep.group == 'console_scripts']


def test_every_package_has_a_manifest():
    assert {m.parent.name for m in MANIFESTS} == {'uq_msgs', 'uq_bringup', *PYTHON_PACKAGES}


@pytest.mark.parametrize('manifest', MANIFESTS, ids=lambda p: p.parent.name)
def test_manifest_is_valid_format_3(manifest):
    package = parse_package(str(manifest))  # raises InvalidPackage on any violation
    package.validate()
    assert package.package_format == 3
    assert package.name == manifest.parent.name
    build_type = package.get_build_type()
    assert build_type == ('ament_cmake' if package.name in ('uq_msgs', 'uq_bringup')
                          else 'ament_python')


@pytest.mark.skipif(shutil.which('xmllint') is None,
                    reason='xmllint not installed (Debian libxml2-utils; make setup installs it)')
@pytest.mark.parametrize('manifest', MANIFESTS, ids=lambda p: p.parent.name)
def test_manifest_is_xmllint_clean(manifest):
    result = subprocess.run(['xmllint', '--noout', str(manifest)], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stderr, result.stderr


@pytest.mark.parametrize('package,script', _console_scripts(), ids=lambda v: v)
def test_console_script_answers_help(package, script):
    path = WORKSPACE / 'install' / package / 'lib' / package / script
    assert path.is_file() and os.access(path, os.X_OK), f'{path} not installed'
    result = subprocess.run([str(path), '--help'], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert 'usage' in result.stdout.lower()


def _subcommand_paths() -> list[list[str]]:
    paths: list[list[str]] = []

    def walk(parser, prefix):
        for action in parser._actions:
            if action.__class__.__name__ == '_SubParsersAction':
                for name, sub in action.choices.items():
                    paths.append([*prefix, name])
                    walk(sub, [*prefix, name])
    walk(build_parser(), [])
    return paths


def test_uq_help_lists_every_top_level_command():
    result = subprocess.run([sys.executable, '-m', 'uq_common.cli', '--help'],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for path in _subcommand_paths():
        if len(path) == 1:
            assert path[0] in result.stdout


@pytest.mark.parametrize('command', _subcommand_paths(), ids=' '.join)
def test_uq_subcommand_answers_help(command):
    result = subprocess.run([sys.executable, '-m', 'uq_common.cli', *command, '--help'],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert f'uq {" ".join(command)}' in result.stdout
