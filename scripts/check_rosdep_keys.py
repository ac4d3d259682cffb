#!/usr/bin/env python3
"""Check every rosdep key of the workspace's manifests against a checkout of rosdistro.

    git clone https://github.com/ros/rosdistro /tmp/rosdistro
    python3 scripts/check_rosdep_keys.py --rosdistro /tmp/rosdistro

For each key named in a ``src/*/package.xml`` (the workspace's own packages left out, as
``rosdep install --ignore-src`` does) it prints one row of the table in docs/deployment.md:
the kind of key, what it resolves to on Ubuntu 24.04 (``noble``, the x86 image and a robot
with ROS 2 Jazzy from apt) and on Ubuntu 22.04 (``jammy``, the Jetson image), and whether
the images install it (the images build uq_bringup and the workspace packages it needs, as
a robot does). A key resolves as rosdep resolves it: a package released in the
distribution (``<distro>/distribution.yaml``) becomes ``ros-<distro>-<name>``; any other key
is looked up in the ``rosdep/*.yaml`` files for the operating system and its version.

Exit status 1 when a build or run dependency does not resolve on the first ``--os`` (then
``rosdep install`` would stop there), else 0. Keys only the tests use may be unresolvable:
``rosdep install -t buildtool -t buildtool_export -t build -t build_export -t exec`` never
asks for them.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from catkin_pkg.package import parse_package

WORKSPACE = Path(__file__).resolve().parents[1]
#: Dependency kinds of a format-3 manifest that rosdep installs with these ``-t`` types.
RUNTIME_KINDS = ('buildtool_depends', 'buildtool_export_depends', 'build_depends',
                 'build_export_depends', 'exec_depends')
TEST_KINDS = ('test_depends',)
#: The package the images and a robot build, with the workspace packages it needs.
ROBOT_BRINGUP = 'uq_bringup'
#: Installer names that may appear where rosdep's YAML otherwise names an OS version.
INSTALLERS = ('apt', 'pip', 'source', 'gem', 'npm')


@dataclass(frozen=True)
class Resolution:
    """What one key becomes on one operating system version.

    Attributes
    ----------
    kind
        ``ROS`` (a package of the distribution), the installer of a rosdep rule (``apt``,
        ``pip``, ...) or ``none`` when nothing resolves it.
    packages
        The packages that installer installs (empty for ``none``).
    """

    kind: str
    packages: tuple[str, ...]


def _manifests(workspace: Path) -> dict:
    """Package name -> its parsed ``src/*/package.xml``."""
    return {m.parent.name: parse_package(str(m))
            for m in sorted((workspace / 'src').glob('*/package.xml'))}


def manifest_keys(workspace: Path = WORKSPACE) -> dict[str, set[str]]:
    """Key -> the dependency kinds naming it, over every ``src/*/package.xml``."""
    packages = _manifests(workspace)
    keys: dict[str, set[str]] = {}
    for package in packages.values():
        for kind in RUNTIME_KINDS + TEST_KINDS:
            for dependency in getattr(package, kind):
                if dependency.name not in packages:
                    keys.setdefault(dependency.name, set()).add(kind)
    return keys


def robot_keys(workspace: Path = WORKSPACE) -> set[str]:
    """The build and run keys of uq_bringup and of the workspace packages it needs, followed
    through their manifests: what ``rosdep install`` installs on a robot and in the images."""
    packages = _manifests(workspace)
    needed, todo, keys = {ROBOT_BRINGUP}, [ROBOT_BRINGUP], set()
    while todo:
        package = packages[todo.pop()]
        for kind in RUNTIME_KINDS:
            for dependency in getattr(package, kind):
                if dependency.name not in packages:
                    keys.add(dependency.name)
                elif dependency.name not in needed:
                    needed.add(dependency.name)
                    todo.append(dependency.name)
    return keys


def released_packages(rosdistro: Path, distro: str) -> set[str]:
    """Names of the packages released in ``<distro>/distribution.yaml``."""
    path = rosdistro / distro / 'distribution.yaml'
    if not path.is_file():
        raise FileNotFoundError(f'{path} not found: is {rosdistro} a rosdistro checkout?')
    data = yaml.safe_load(path.read_text(encoding='utf-8'))
    names: set[str] = set()
    for name, repository in (data.get('repositories') or {}).items():
        release = (repository or {}).get('release')
        if release:
            names.update(release.get('packages') or [name])
    return names


def rosdep_rules(rosdistro: Path) -> dict[str, dict]:
    """Every key of ``rosdep/*.yaml`` with its rule (later files do not override earlier)."""
    files = sorted((rosdistro / 'rosdep').glob('*.yaml'))
    if not files:
        raise FileNotFoundError(f'no rosdep/*.yaml in {rosdistro}: is it a rosdistro checkout?')
    rules: dict[str, dict] = {}
    for path in files:
        for key, rule in (yaml.safe_load(path.read_text(encoding='utf-8')) or {}).items():
            rules.setdefault(key, rule or {})
    return rules


def _installer_packages(value: object) -> Resolution:
    """A rule's value once the OS version is chosen: a package list (the OS's default
    installer, apt on Ubuntu), ``{installer: {packages: [...]}}`` or ``{installer: [...]}``,
    or null/empty for "not available"."""
    if isinstance(value, list) and value:
        return Resolution('apt', tuple(str(v) for v in value))
    if isinstance(value, dict):
        for installer in INSTALLERS:
            if installer in value:
                spec = value[installer]
                packages = spec.get('packages') if isinstance(spec, dict) else spec
                if packages:
                    return Resolution(installer, tuple(str(p) for p in packages))
    return Resolution('none', ())


def resolve(key: str, operating_system: str, version: str, released: set[str],
            rules: dict[str, dict], distro: str) -> Resolution:
    """What ``rosdep`` installs for ``key`` on ``operating_system:version``."""
    if key in released:
        return Resolution('ROS', (f"ros-{distro}-{key.replace('_', '-')}",))
    rule = rules.get(key)
    if not isinstance(rule, dict) or operating_system not in rule:
        return Resolution('none', ())
    value = rule[operating_system]
    if isinstance(value, dict) and not any(i in value for i in INSTALLERS):
        value = value.get(version, value.get('*'))
    return _installer_packages(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--rosdistro', type=Path, required=True,
                        help='checkout of https://github.com/ros/rosdistro')
    parser.add_argument('--distro', default='jazzy', help='ROS distribution (default jazzy)')
    parser.add_argument('--os', dest='systems', action='append',
                        help='OS:VERSION to resolve for, repeatable (default ubuntu:noble '
                             'and ubuntu:jammy); the first decides the exit status')
    args = parser.parse_args(argv)
    systems = [tuple(s.split(':', 1)) for s in (args.systems or ['ubuntu:noble',
                                                                  'ubuntu:jammy'])]
    if any(len(s) != 2 for s in systems):
        parser.error('--os takes OS:VERSION, e.g. ubuntu:noble')
    try:
        released = released_packages(args.rosdistro, args.distro)
        rules = rosdep_rules(args.rosdistro)
    except (OSError, yaml.YAMLError) as error:
        print(f'error: {error}', file=sys.stderr)
        return 2
    keys, on_robot = manifest_keys(), robot_keys()
    print('| key | kind | ' + ' | '.join(f'{o}:{v}' for o, v in systems) + ' | in images |')
    print('|---|---|' + '---|' * len(systems) + '---|')
    missing: list[str] = []
    pip_keys: list[str] = []
    for key in sorted(keys, key=lambda k: (k.startswith('python3-'), k)):
        runtime = bool(keys[key] & set(RUNTIME_KINDS))
        found = [resolve(key, o, v, released, rules, args.distro) for o, v in systems]
        kind = {'ROS': 'ROS', 'apt': 'Ubuntu'}.get(found[0].kind, found[0].kind)
        cells = [', '.join(f'`{p}`' for p in r.packages) if r.packages else '—'
                 for r in found]
        images = 'yes' if key in on_robot else 'no (off the robot)' if runtime else 'no (tests)'
        print(f"| `{key}` | {kind} | {' | '.join(cells)} | {images} |")
        if runtime and found[0].kind == 'none':
            missing.append(key)
        if runtime and found[0].kind == 'pip':
            pip_keys.append(key)
    print(f'\n{len(keys)} keys; rosdistro checked: {args.rosdistro}', file=sys.stderr)
    if pip_keys:
        print(f'note: rosdep installs {", ".join(pip_keys)} with the system\'s pip, which '
              'Ubuntu 24.04 refuses (PEP 668): give them to --skip-keys and install their '
              'packages in the virtual environment (docs/deployment.md)', file=sys.stderr)
    if missing:
        print(f'error: build or run keys without a rosdep rule on {":".join(systems[0])}: '
              f'{", ".join(missing)}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
