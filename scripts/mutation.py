"""Mutation testing of ROS-free modules with their own tests (``make mutation``).

Usage: python scripts/mutation.py [--tests FILE ...] [--module-timeout-s S] [--jobs N] MODULE...

For each MODULE (a source file under ``src/<package>/<package>/``):

1. its test files: those that ``scripts/mutation_tests.txt`` maps it to, else every test
   file of the workspace (``src/*/test``, ``test/``) that imports the module (read from the
   files' import statements), or ``--tests`` for all modules at once;
2. mutmut 3 (``requirements/mutation.in``, pinned by ``requirements/constraints.txt``;
   installed here on first use) mutates the module in a copy of its package under
   ``build/mutation/<module>/``, never in ``src/``, and runs, for each mutant, the selected
   tests that call the mutated function, in a forked process with a CPU-time limit of
   ``2 * TIMEOUT_MULTIPLIER * (those tests' duration + TIMEOUT_CONSTANT_S)`` seconds; the
   whole module has ``--module-timeout-s`` (default 900 s);
3. prints the module's kill rate, ``(killed + timed out) / mutants``: a mutant that no test
   reaches counts as not killed, and every mutant that survives, as its changed lines.

Only ROS-free modules: a module that imports rclpy, launch or ROS messages is left out, with
a line that says so (its behaviour is the node's, tested over DDS, far too slowly to run once
per mutant). The tests
run as in ``make test``: the workspace's conftest.py and pytest settings, the other
packages from the colcon build. Exit status: 0 when every module ran (whatever its kill
rate), 1 when mutmut could not run one (its clean run failed, or the time limit ended it
before any mutant), 2 on bad arguments (one line on stderr).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

WORKSPACE = Path(__file__).resolve().parents[1]
STAGING = WORKSPACE / 'build' / 'mutation'
MAPPING = WORKSPACE / 'scripts' / 'mutation_tests.txt'
CONSTRAINTS = WORKSPACE / 'requirements' / 'constraints.txt'
REQUIREMENTS = WORKSPACE / 'requirements' / 'mutation.in'
#: mutmut's per-mutant time limit (see the module docstring): generous, since a mutant that
#: loops forever is killed by it, and a test suite slower under load must not count as one.
TIMEOUT_MULTIPLIER = 3.0
TIMEOUT_CONSTANT_S = 5.0
#: Imports that make a module part of ROS (refused): rclpy, launch, message packages.
ROS_IMPORT = re.compile(r'^(rclpy|launch|launch_ros|launch_testing|rosidl_\w+|rosbag2_py|'
                        r'\w+_msgs|\w+_srvs|builtin_interfaces)(\.|$)')


class UsageError(Exception):
    """Bad arguments: one line, exit status 2."""


@dataclass(frozen=True)
class Module:
    path: Path          # relative to the workspace
    package: str        # uq_autonomy
    dotted: str         # uq_autonomy.labels.url
    inside: Path        # labels/url.py, relative to the package folder


def module_of(text: str) -> Module:
    """The module a MODULE argument names, checked: a .py file of a package under src/."""
    path = Path(text)
    full = (WORKSPACE / path).resolve() if not path.is_absolute() else path.resolve()
    try:
        relative = full.relative_to(WORKSPACE)
    except ValueError:
        raise UsageError(f'{text}: not a file of this workspace') from None
    parts = relative.parts
    if not (full.is_file() and full.suffix == '.py' and len(parts) >= 4 and parts[0] == 'src'
            and parts[1] == parts[2]):
        raise UsageError(f'{text}: expected a module of a package, '
                         'src/<package>/<package>/.../NAME.py')
    inside = Path(*parts[3:])
    names = [parts[2], *inside.with_suffix('').parts]
    if names[-1] == '__init__':
        names.pop()
    return Module(relative, parts[2], '.'.join(names), inside)


def imported_names(path: Path) -> set[str]:
    """Every module a Python file imports (``from a.b import c`` gives a.b and a.b.c),
    wherever the import statement is."""
    tree = ast.parse(path.read_text(encoding='utf-8'), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f'{node.module}.{alias.name}' for alias in node.names)
    return names


def ros_imports(module: Module) -> list[str]:
    return sorted({n.split('.')[0] for n in imported_names(WORKSPACE / module.path)
                   if ROS_IMPORT.match(n)})


def mapped_tests() -> dict[str, list[str]]:
    """scripts/mutation_tests.txt: ``MODULE: TEST [TEST ...]`` lines, ``#`` comments."""
    mapping: dict[str, list[str]] = {}
    for number, line in enumerate(MAPPING.read_text(encoding='utf-8').splitlines(), 1):
        line = line.split('#', 1)[0].strip()
        if not line:
            continue
        module, sep, tests = line.partition(':')
        if not sep or not tests.split():
            raise UsageError(f'{MAPPING.name} line {number}: expected MODULE: TEST [TEST ...]')
        mapping[module.strip()] = tests.split()
    return mapping


def test_files() -> list[Path]:
    found = sorted(WORKSPACE.glob('src/*/test/**/test_*.py')) + sorted(
        WORKSPACE.glob('test/test_*.py'))
    return [p.relative_to(WORKSPACE) for p in found]


def tests_for(module: Module, given: list[str], mapping: dict[str, list[str]]
              ) -> tuple[list[Path], str]:
    """The module's test files and where they came from."""
    if given:
        tests, how = [Path(t) for t in given], '--tests'
    elif str(module.path) in mapping:
        tests, how = [Path(t) for t in mapping[str(module.path)]], MAPPING.name
    else:
        tests = [t for t in test_files() if module.dotted in imported_names(WORKSPACE / t)]
        how = 'the test files that import it'
    if not tests:
        raise UsageError(f'{module.path}: no test file imports {module.dotted}; name them '
                         f'with TESTS=... or in {MAPPING.relative_to(WORKSPACE)}')
    for test in tests:
        if not (WORKSPACE / test).is_file():
            raise UsageError(f'{module.path}: test file {test} not found')
    return tests, how


def ensure_mutmut() -> None:
    """Install the pinned mutmut into this environment unless it is there already."""
    pins = dict(re.findall(r'^([\w.-]+)==(\S+)$', CONSTRAINTS.read_text(encoding='utf-8'),
                           re.MULTILINE))
    try:
        if metadata.version('mutmut') == pins['mutmut']:
            return
    except metadata.PackageNotFoundError:
        pass
    print(f'installing mutmut {pins["mutmut"]} (requirements/mutation.in)', flush=True)
    subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--disable-pip-version-check',
                    '-c', str(CONSTRAINTS), '-r', str(REQUIREMENTS)], check=True)


def stage(module: Module, tests: list[Path]) -> Path:
    """A fresh folder where mutmut sees ``src/<package>`` (a copy of the package: mutants
    are written there, never into src/) and, under ``mutants/ws``, the workspace's tests
    by symbolic links, so that they run with its conftest.py and pytest settings and find
    its files (tests resolve their own paths)."""
    root = STAGING / module.dotted
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(WORKSPACE / 'src' / module.package / module.package,
                    root / 'src' / module.package,
                    ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
    ws = root / 'mutants' / 'ws'
    ws.mkdir(parents=True)
    for name in ('conftest.py', 'pyproject.toml', 'test'):
        (ws / name).symlink_to(WORKSPACE / name)
    for folder in sorted(WORKSPACE.glob('src/*/test')):
        (ws / 'src' / folder.parent.name).mkdir(parents=True, exist_ok=True)
        (ws / 'src' / folder.parent.name / 'test').symlink_to(folder)
    selection = ', '.join(json.dumps(f'ws/{t}') for t in tests)
    (root / 'pyproject.toml').write_text(
        '[tool.mutmut]\n'
        'source_paths = ["src"]\n'
        f'only_mutate = [{json.dumps(f"src/{module.package}/{module.inside}")}]\n'
        f'pytest_add_cli_args_test_selection = [{selection}]\n'
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]\n'
        f'timeout_multiplier = {TIMEOUT_MULTIPLIER}\n'
        f'timeout_constant = {TIMEOUT_CONSTANT_S}\n'
        'use_git_change_detection = false\n', encoding='utf-8')
    return root


def mutmut(root: Path, *arguments: str, timeout_s: float | None = None
           ) -> subprocess.CompletedProcess[str]:
    """Run mutmut in ``root``; on ``timeout_s`` its whole process group is ended."""
    # One OpenMP thread: mutmut forks a process per mutant, and a process forked while
    # torch's thread pool exists can hang; it also keeps mutmut to its share of the cores.
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}
    process = subprocess.Popen([sys.executable, '-m', 'mutmut', *arguments], cwd=root, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        out, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
        return subprocess.CompletedProcess(process.args, -signal.SIGKILL, out)
    return subprocess.CompletedProcess(process.args, process.returncode, out)


def changed_lines(root: Path, name: str) -> list[str]:
    """The lines a mutant changes (``mutmut show``'s diff without its headers)."""
    shown = mutmut(root, 'show', name).stdout.splitlines()
    return [line for line in shown if line[:1] in '+-' and not line.startswith(('+++', '---'))]


def run_module(module: Module, tests: list[Path], how: str, args: argparse.Namespace) -> dict:
    print(f'\n{module.dotted} ({module.path})', flush=True)
    print(f'  tests ({how}): {", ".join(map(str, tests))}', flush=True)
    root = stage(module, tests)
    run = mutmut(root, 'run', '--max-children', str(args.jobs),
                 timeout_s=args.module_timeout_s)
    (root / 'run.log').write_text(run.stdout, encoding='utf-8')
    timed_out = run.returncode == -signal.SIGKILL
    # Every mutant with its status ('killed', 'timeout', 'survived', 'no tests', 'not
    # checked' when the time limit came first, ...).
    listed = mutmut(root, 'results', '--all', 'true').stdout.splitlines()
    status = dict(line.strip().rsplit(': ', 1) for line in listed if ': ' in line)
    checked = {name: s for name, s in status.items() if s != 'not checked'}
    if run.returncode != 0 and not (timed_out and checked):
        tail = [line for line in run.stdout.splitlines() if line.strip()][-5:]
        print(f'  mutmut could not run (exit {run.returncode}); its log: '
              f'{(root / "run.log").relative_to(WORKSPACE)}', flush=True)
        for line in tail:
            print(f'    {line[-160:]}')
        return {'module': module.dotted, 'error': True}
    count = {name: sum(s == name for s in checked.values())
             for name in ('killed', 'timeout', 'survived', 'no tests')}
    other = len(checked) - sum(count.values())
    killed = count['killed'] + count['timeout']
    rate = killed / len(checked) if checked else float('nan')
    survivors = [name for name, s in checked.items() if s == 'survived']
    untested = [name for name, s in checked.items() if s == 'no tests']
    print(f'  {len(checked)} mutants: {count["killed"]} killed, {count["timeout"]} timed out, '
          f'{count["survived"]} survived, {count["no tests"]} reached by no test'
          + (f', {other} other (suspicious, segfault)' if other else '')
          + f' -> kill rate {rate:.1%}'
          + (f' (module time limit reached: {len(status) - len(checked)} of {len(status)} '
             'not run)' if timed_out else ''), flush=True)
    for title, names in (('surviving', survivors), ('reached by no test', untested)):
        if names:
            print(f'  {title}:')
        for name in names:
            lines = changed_lines(root, name)
            print(f'    {name.removeprefix(module.dotted + ".")}')
            for line in lines[:6]:
                print(f'      {line.strip()[:150]}')
    return {'module': module.dotted, 'total': len(checked), 'killed': killed, 'rate': rate}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('modules', nargs='*', metavar='MODULE')
    parser.add_argument('--tests', nargs='+', default=[], metavar='FILE',
                        help='test files to run for every module (default: the mapping, '
                             'else the test files that import it)')
    parser.add_argument('--module-timeout-s', type=float, default=900.0,
                        help='time limit of one module\'s whole run')
    parser.add_argument('--jobs', type=int, default=2, help='mutants run at once')
    args = parser.parse_args(argv)
    try:
        if not args.modules:
            raise UsageError('name the modules: make mutation MODULES="src/pkg/pkg/a.py ..."')
        if args.jobs < 1 or args.module_timeout_s <= 0:
            raise UsageError('--jobs and --module-timeout-s must be positive')
        mapping = mapped_tests()
        plan = []
        for text in args.modules:
            module = module_of(text)
            ros = ros_imports(module)
            if ros:
                # Said, not fatal: the modules a change touches may include nodes.
                print(f'{module.path}: left out, it imports {", ".join(ros)} (only ROS-free '
                      'modules are mutation-tested)')
                continue
            plan.append((module, *tests_for(module, args.tests, mapping)))
        if not plan:
            raise UsageError('no ROS-free module to test')
    except (UsageError, SyntaxError) as err:
        print(f'mutation: error: {err}', file=sys.stderr)
        return 2
    ensure_mutmut()
    rows = [run_module(module, tests, how, args) for module, tests, how in plan]
    print('\nkill rate per module (killed or timed out, of all mutants):')
    for row in rows:
        print(f'  {row["module"]}: ' + ('mutmut could not run' if row.get('error') else
                                        f'{row["rate"]:.1%} ({row["killed"]}/{row["total"]})'))
    return 1 if any(row.get('error') for row in rows) else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
