"""Packaging: every package.xml is a valid format-3 manifest, every launch file is installed
by the bring-up package whose dependencies it needs, and every `uq` subcommand answers --help
(the installed console scripts: test/test_robot_install.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from catkin_pkg.package import parse_package
from workspace_manifests import needed_packages

from uq_common.cli import build_parser

WORKSPACE = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((WORKSPACE / 'src').glob('*/package.xml'))
PYTHON_PACKAGES = ['uq_common', 'uq_perception', 'uq_autonomy', 'uq_sim', 'uq_eval']
# ament_cmake packages that install files of the workspace's top level: the robot stack, and
# the simulation's launch files on top of it.
BRINGUP_PACKAGES = ['uq_bringup', 'uq_sim_bringup']


def test_every_package_has_a_manifest():
    assert {m.parent.name for m in MANIFESTS} == {'uq_msgs', *BRINGUP_PACKAGES,
                                                  *PYTHON_PACKAGES}


@pytest.mark.parametrize('manifest', MANIFESTS, ids=lambda p: p.parent.name)
def test_manifest_is_valid_format_3(manifest):
    package = parse_package(str(manifest))  # raises InvalidPackage on any violation
    package.validate()
    assert package.package_format == 3
    assert package.name == manifest.parent.name
    build_type = package.get_build_type()
    assert build_type == ('ament_cmake' if package.name in ('uq_msgs', *BRINGUP_PACKAGES)
                          else 'ament_python')


@pytest.mark.skipif(shutil.which('xmllint') is None,
                    reason='xmllint not installed (Debian libxml2-utils; make setup installs it)')
@pytest.mark.parametrize('manifest', MANIFESTS, ids=lambda p: p.parent.name)
def test_manifest_is_xmllint_clean(manifest):
    result = subprocess.run(['xmllint', '--noout', str(manifest)], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stderr, result.stderr


def _installed_launch_files() -> dict[str, list[str]]:
    """Launch file -> the bring-up packages whose CMakeLists.txt installs it."""
    installers: dict[str, list[str]] = {}
    for package in BRINGUP_PACKAGES:
        cmake = (WORKSPACE / 'src' / package / 'CMakeLists.txt').read_text(encoding='utf-8')
        for name in re.findall(r'/launch/([\w.]+\.launch\.py)"', cmake):
            installers.setdefault(name, []).append(package)
    return installers


def test_every_launch_file_is_installed_by_one_bringup_package():
    installers = _installed_launch_files()
    on_disk = sorted(p.name for p in (WORKSPACE / 'launch').glob('*.launch.py'))
    assert sorted(installers) == on_disk, f'installed: {sorted(installers)}, in launch/: {on_disk}'
    assert all(len(packages) == 1 for packages in installers.values()), installers
    assert installers['uq_stack.launch.py'] == ['uq_bringup']


@pytest.mark.parametrize('name,package', sorted((n, p[0]) for n, p in
                                                 _installed_launch_files().items()))
def test_launch_file_names_only_packages_its_bringup_needs(name, package):
    # A launch file starts nodes of, includes from and imports workspace packages; each must
    # be installed wherever its bring-up package is, so the robot's launch file can name no
    # simulation package.
    text = (WORKSPACE / 'launch' / name).read_text(encoding='utf-8')
    workspace = {m.parent.name for m in MANIFESTS}
    named = set(re.findall(r"'(uq_\w+)'", text)) | set(re.findall(r'^from (uq_\w+)[. ]', text,
                                                                    re.MULTILINE))
    assert named & workspace, f'{name} names no workspace package'
    assert named & workspace <= needed_packages(package), \
        f'{name} ({package}) names {sorted((named & workspace) - needed_packages(package))}'


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


# Every `uq ... --help` in one separate process, as `python -m uq_common.cli` runs each (the
# same main(), the parser built afresh for each): a process per command paid the interpreter
# and the parser's imports each time, for each of some forty commands. Prints {command:
# {code, stdout, stderr}} as JSON.
_HELP_OF_EACH = """
import contextlib, io, json, sys, traceback
from uq_common.cli import main
answers = {}
for command in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([*command, '--help'])
        except SystemExit as exit:
            code = exit.code
        except Exception:  # the command's own failure, reported by its test
            traceback.print_exc()
            code = 1
    answers[' '.join(command)] = {'code': code, 'stdout': out.getvalue(),
                                  'stderr': err.getvalue()}
print(json.dumps(answers))
"""


def test_building_the_uq_parser_imports_no_torch():
    """Every `uq` process builds the whole parser; torch's import alone takes longer than
    the rest of it, and a command that needs torch imports it when it runs."""
    code = ('import sys; from uq_common.cli import build_parser; build_parser(); '
            'print(sorted(m for m in sys.modules if m.split(".")[0] == "torch")[:3])')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '[]', result.stdout


@pytest.fixture(scope='module')
def help_answers() -> dict[str, dict]:
    """What `uq --help` and `uq <subcommand> --help` answer, by command ('' for `uq`)."""
    import json

    commands = [[], *_subcommand_paths()]
    result = subprocess.run([sys.executable, '-c', _HELP_OF_EACH, json.dumps(commands)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_uq_help_lists_every_top_level_command(help_answers):
    answer = help_answers['']
    assert answer['code'] == 0, answer['stderr']
    for path in _subcommand_paths():
        if len(path) == 1:
            assert path[0] in answer['stdout']


@pytest.mark.parametrize('command', _subcommand_paths(), ids=' '.join)
def test_uq_subcommand_answers_help(command, help_answers):
    answer = help_answers[' '.join(command)]
    assert answer['code'] == 0, answer['stderr']
    assert f'uq {" ".join(command)}' in answer['stdout']
