"""The package graph: every import of a workspace package or a third-party module is declared
in the importing package's ``package.xml`` (rosdep keys), and packages import only from
layers below their own, so rosdep and Docker builds from the manifests work; inside the
packages, modules form no import cycle, only nodes and a listed few modules talk to ROS, and
``uq_eval`` is one subpackage per family (docs/dependencies.md).

Third-party modules map to rosdep keys through the table in ``docs/dependencies.md``; the
ones that only pip provides are listed there with the packages that use them.
"""

from __future__ import annotations

import ast
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest
from workspace_manifests import ROBOT_BRINGUP, needed_packages, run_dependencies

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / 'src'
TABLE = REPO / 'docs' / 'dependencies.md'
# Layers import only downwards:
# msgs <- common <- {perception, autonomy, sim} <- {eval, bringup} <- sim_bringup.
# uq_bringup (the robot stack) and uq_eval share a layer, so the robot never depends on the
# evaluation; the simulation's launch files sit above both.
LAYERS = {'uq_msgs': 1, 'uq_common': 2, 'uq_perception': 3, 'uq_autonomy': 3, 'uq_sim': 3,
          'uq_eval': 4, 'uq_bringup': 4, 'uq_sim_bringup': 5}
DEPEND_TAGS = ('depend', 'exec_depend', 'build_depend', 'build_export_depend')


@dataclass(frozen=True)
class Problem:
    package: str
    module: str
    where: str
    what: str

    def __str__(self) -> str:
        return f'{self.package}: {self.where} imports {self.module}: {self.what}'


def declared_dependencies(package_xml: Path, test: bool = False) -> set[str]:
    """Dependency keys of a manifest (``test_depend`` too when ``test``)."""
    root = ET.parse(package_xml).getroot()
    tags = DEPEND_TAGS + (('test_depend',) if test else ())
    return {element.text.strip() for tag in tags for element in root.iter(tag)
            if element.text}


def dependency_table(path: Path = TABLE) -> tuple[dict[str, str], dict[str, set[str]]]:
    """From the documented table: module to rosdep key, and pip-only module to the packages
    that may use it."""
    rosdep: dict[str, str] = {}
    pip_only: dict[str, set[str]] = {}
    for line in path.read_text(encoding='utf-8').splitlines():
        cells = [c.strip().strip('`') for c in line.strip().strip('|').split('|')]
        if len(cells) != 4 or cells[0] in ('module', '') or set(cells[0]) <= {'-'}:
            continue
        module, key, pip_name, users = cells
        if key == 'pip only':
            pip_only[module] = {u.strip().strip('`') for u in users.split(',') if u.strip()}
        else:
            rosdep[module] = key
    return rosdep, pip_only


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every absolute import in a Python file, nested ones included."""
    tree = ast.parse(path.read_text(encoding='utf-8'), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split('.')[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split('.')[0])
    return names


def check_package(package_dir: Path, rosdep: dict[str, str], pip_only: dict[str, set[str]],
                  ros_packages: set[str], layers: dict[str, int] = LAYERS) -> list[Problem]:
    """Every undeclared or upward import of one ament_python package."""
    name = package_dir.name
    problems = []
    for kind, folder in (('code', package_dir / name), ('test', package_dir / 'test')):
        if not folder.is_dir():
            continue
        declared = declared_dependencies(package_dir / 'package.xml', test=kind == 'test')
        for path in sorted(folder.rglob('*.py')):
            where = str(path.relative_to(package_dir))
            for module in sorted(imported_modules(path)):
                if module == name or module in sys.stdlib_module_names or module == '__future__':
                    continue
                if module in layers or module in ros_packages:
                    if module not in declared:
                        problems.append(Problem(name, module, where, 'not in package.xml'))
                    if module in layers and layers[module] >= layers.get(name, 0):
                        problems.append(Problem(name, module, where,
                                                'a package of the same or a higher layer'))
                elif module in rosdep:
                    if rosdep[module] not in declared:
                        problems.append(Problem(name, module, where,
                                                f'rosdep key {rosdep[module]} not declared'))
                elif module in pip_only:
                    if name not in pip_only[module]:
                        problems.append(Problem(name, module, where,
                                                f'pip-only module not listed for {name} in '
                                                'docs/dependencies.md'))
                else:
                    problems.append(Problem(name, module, where,
                                            'unknown module: add it to docs/dependencies.md'))
    return problems


def ros_package_names() -> set[str]:
    """ROS packages installed in the environment (ament index), e.g. rclpy, sensor_msgs."""
    import os

    names: set[str] = set()
    for prefix in os.environ.get('AMENT_PREFIX_PATH', '').split(os.pathsep):
        index = Path(prefix) / 'share' / 'ament_index' / 'resource_index' / 'packages'
        if index.is_dir():
            names.update(p.name for p in index.iterdir())
    return names - set(LAYERS)


PYTHON_PACKAGES = sorted(p.parent.name for p in SRC.glob('*/setup.py'))


@pytest.mark.parametrize('package', PYTHON_PACKAGES)
def test_every_import_is_declared_and_points_down(package):
    rosdep, pip_only = dependency_table()
    problems = check_package(SRC / package, rosdep, pip_only, ros_package_names())
    assert not problems, '\n'.join(map(str, problems))


def test_manifests_declare_no_upward_or_unused_workspace_dependency():
    for manifest in sorted(SRC.glob('*/package.xml')):
        package = manifest.parent.name
        declared = declared_dependencies(manifest) & set(LAYERS)
        upward = {d for d in declared if LAYERS[d] >= LAYERS[package]}
        assert not upward, f'{package} declares {upward} of the same or a higher layer'
        if (manifest.parent / 'setup.py').exists():
            used = set().union(*(imported_modules(p) for p in
                                 (manifest.parent / package).rglob('*.py')))
            assert declared - {'uq_msgs'} <= used | {'uq_msgs'}, (
                f'{package} declares {sorted(declared - used)} but never imports them')


# What only the simulation and the evaluation need; a robot installs none of it.
OFF_ROBOT_PACKAGES = {'uq_sim', 'uq_eval', 'uq_sim_bringup'}


def test_the_robot_stack_needs_no_simulation_or_evaluation():
    # rosdep and colcon follow the manifests from uq_bringup (the robot build), so whatever a
    # package on that path names is installed on every robot.
    robot = needed_packages(ROBOT_BRINGUP)
    assert {'uq_msgs', 'uq_common', 'uq_perception', 'uq_autonomy'} <= robot, sorted(robot)
    pulled = sorted(robot & OFF_ROBOT_PACKAGES)
    assert not pulled, f'the robot build pulls in {pulled}'
    keys = set().union(*(run_dependencies(p) for p in robot)) - robot
    assert not {k for k in keys if 'mujoco' in k}, sorted(keys)
    # MuJoCo has no rosdep key: pip installs it for the packages docs/dependencies.md names.
    _, pip_only = dependency_table()
    assert not pip_only['mujoco'] & robot, f"mujoco is used by {sorted(pip_only['mujoco'])}"


def test_the_simulation_bringup_needs_what_its_launch_files_start():
    # sim.launch.py starts uq_sim's nodes, replay.launch.py runs `uq replay` (uq_eval), and
    # both include the stack of uq_bringup.
    assert {'uq_bringup', 'uq_sim', 'uq_eval'} <= needed_packages('uq_sim_bringup')


def test_checker_reports_an_undeclared_import(tmp_path):
    # A throwaway package whose module imports numpy and a higher layer, while its manifest
    # declares neither: the checker must name both.
    package = tmp_path / 'uq_common'
    (package / 'uq_common').mkdir(parents=True)
    (package / 'uq_common' / 'core.py').write_text(
        'import json\n\ndef f():\n    import numpy\n    from uq_eval import demo\n')
    (package / 'package.xml').write_text(
        '<package format="3"><name>uq_common</name><exec_depend>rclpy</exec_depend></package>')
    problems = check_package(package, {'numpy': 'python3-numpy'}, {}, {'rclpy'})
    text = '\n'.join(map(str, problems))
    assert re.search(r'imports numpy: rosdep key python3-numpy not declared', text), text
    assert 'imports uq_eval: not in package.xml' in text
    assert 'imports uq_eval: a package of the same or a higher layer' in text
    assert 'json' not in text
    (package / 'package.xml').write_text(
        '<package format="3"><name>uq_common</name><exec_depend>python3-numpy</exec_depend>'
        '</package>')
    (package / 'uq_common' / 'core.py').write_text('import numpy\n')
    assert check_package(package, {'numpy': 'python3-numpy'}, {}, {'rclpy'}) == []


# -- modules and subpackages inside the packages ---------------------------------------------

# Modules that talk to ROS (rclpy or the generated uq_msgs types) besides the nodes
# (``*_node.py``): the node entry helpers, message conversion, and the evaluation tools that
# drive a graph over DDS. Every other module is ROS-free: importable and testable without a
# ROS installation.
ROS_FACING_MODULES = {
    'uq_common.node_main', 'uq_common.qos', 'uq_common.spin_thread',
    'uq_perception.messages',
    'uq_eval.bags.record', 'uq_eval.bags.replay',
    'uq_eval.benchmarks.arbitration', 'uq_eval.benchmarks.node',
    'uq_eval.closed_loop.demo_recorder', 'uq_eval.closed_loop.help_eval',
    'uq_eval.closed_loop.loop',
}
ROS_MODULES = {'rclpy', 'uq_msgs'}
# The families of the evaluation package; each registers its `uq` subcommands in one
# ``commands`` module.
EVAL_SUBPACKAGES = ('bags', 'benchmarks', 'closed_loop', 'detector', 'gp', 'mnist')
# The perception package by concern: what a detector is, how it runs, the NTK-GP engine, and
# training (off the robot); the per-frame pipeline and the node stay at the top.
PERCEPTION_SUBPACKAGES = ('detectors', 'ntk', 'runtime', 'training')
# The per-frame path starts at the node; nothing it reaches may import these.
PER_FRAME_ENTRY = 'uq_perception.detector_node'
OFF_ROBOT = ('uq_perception.training.train',)
MAX_LOOSE_PERCEPTION_MODULES = 9
# The autonomy package by concern: the level of autonomy, asking for help, the label store
# and its tools; the nodes and the reach policy stay at the top.
AUTONOMY_SUBPACKAGES = ('arbitration', 'help', 'labels')
MAX_LOOSE_AUTONOMY_MODULES = 6
# The arbitration's per-message path: every frame and every decision runs through these.
ARBITRATION_ENTRY = 'uq_autonomy.arbitration_node'
NOT_ON_ARBITRATION_PATH = ('uq_autonomy.help', 'uq_autonomy.labels')


def module_name(path: Path, package_dir: Path) -> str:
    """Dotted module name of a file of an ament_python package (``__init__`` is the package)."""
    parts = path.relative_to(package_dir).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def workspace_imports(path: Path, package: str) -> set[str]:
    """Dotted names of the modules of ``package`` that a file imports, nested imports included
    (``from pkg.sub import name`` counts as ``pkg.sub.name`` when that is a module)."""
    tree = ast.parse(path.read_text(encoding='utf-8'), filename=str(path))
    # Imports for type annotations only (``if TYPE_CHECKING:``) never run: not an arrow.
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, 'id', None) == 'TYPE_CHECKING':
            node.body = []
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split('.')[0] == package)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split('.')[0] == package:
            names.add(node.module)
            names.update(f'{node.module}.{a.name}' for a in node.names)
    return names


def module_graph(package_dir: Path) -> dict[str, set[str]]:
    """Import arrows between the modules of one package's code folder."""
    name = package_dir.name
    files = {module_name(p, package_dir): p for p in (package_dir / name).rglob('*.py')}
    return {module: {m for m in workspace_imports(path, name) if m in files and m != module}
            for module, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph as a list of nodes (first repeated last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def package_arrows(graph: dict[str, set[str]], depth: int) -> dict[str, set[str]]:
    """The module graph collapsed onto the (sub)packages named by the first ``depth`` parts,
    ``__init__`` modules left out (they may name their members)."""
    def group(module: str) -> str:
        return '.'.join(module.split('.')[:depth])

    arrows: dict[str, set[str]] = {}
    for module, targets in graph.items():
        arrows.setdefault(group(module), set()).update(
            group(t) for t in targets if group(t) != group(module))
    return arrows


@pytest.mark.parametrize('package', PYTHON_PACKAGES)
def test_no_import_cycle_between_modules(package):
    cycle = find_cycle(module_graph(SRC / package))
    assert cycle is None, 'import cycle: ' + ' -> '.join(cycle or [])


def test_eval_subpackages_form_no_cycle_and_each_has_one_commands_module():
    graph = module_graph(SRC / 'uq_eval')
    flat = [m for m in graph if m.count('.') == 1 and m.split('.')[1] not in EVAL_SUBPACKAGES]
    assert flat == [], f'modules outside the family subpackages: {flat}'
    arrows = package_arrows(graph, 2)
    cycle = find_cycle(arrows)
    assert cycle is None, 'subpackage cycle: ' + ' -> '.join(cycle or [])
    entry_points = (SRC / 'uq_eval' / 'setup.py').read_text(encoding='utf-8')
    targets = re.findall(r"'[\w.-]+ = (uq_eval\.[\w.]+):\w+'", entry_points)
    assert targets, 'no uq.commands entry points found in uq_eval/setup.py'
    assert {t.rsplit('.', 1)[1] for t in targets} == {'commands'}, targets
    assert {t.split('.')[1] for t in targets} == set(EVAL_SUBPACKAGES)


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Modules ``start`` imports directly or through others, nested imports included."""
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_perception_is_split_by_concern_without_subpackage_cycles():
    graph = module_graph(SRC / 'uq_perception')
    loose = sorted(m for m in graph if m.count('.') == 1
                   and m.split('.')[1] not in PERCEPTION_SUBPACKAGES)
    assert len(loose) <= MAX_LOOSE_PERCEPTION_MODULES, f'loose top-level modules: {loose}'
    missing = [s for s in PERCEPTION_SUBPACKAGES if f'uq_perception.{s}' not in graph]
    assert missing == [], f'subpackages missing: {missing}'
    cycle = find_cycle(package_arrows(graph, 2))
    assert cycle is None, 'subpackage cycle: ' + ' -> '.join(cycle or [])


def test_autonomy_is_split_by_concern_without_subpackage_cycles():
    graph = module_graph(SRC / 'uq_autonomy')
    loose = sorted(m for m in graph if m.count('.') == 1
                   and m.split('.')[1] not in AUTONOMY_SUBPACKAGES)
    assert len(loose) <= MAX_LOOSE_AUTONOMY_MODULES, f'loose top-level modules: {loose}'
    missing = [s for s in AUTONOMY_SUBPACKAGES if f'uq_autonomy.{s}' not in graph]
    assert missing == [], f'subpackages missing: {missing}'
    cycle = find_cycle(package_arrows(graph, 2))
    assert cycle is None, 'subpackage cycle: ' + ' -> '.join(cycle or [])


def test_arbitration_path_imports_nothing_of_help_or_labels():
    path = reachable(module_graph(SRC / 'uq_autonomy'), ARBITRATION_ENTRY)
    assert {'uq_autonomy.arbitration.arbiter', 'uq_autonomy.arbitration.params'} <= path, \
        sorted(path)
    outside = sorted(m for m in path if m.startswith(NOT_ON_ARBITRATION_PATH))
    assert outside == [], f'the arbitration path reaches help or labels: {outside}'


def test_per_frame_path_imports_no_training_and_no_evaluation():
    package_dir = SRC / 'uq_perception'
    graph = module_graph(package_dir)
    path = reachable(graph, PER_FRAME_ENTRY)
    assert {'uq_perception.perception', 'uq_perception.runtime.loading',
            'uq_perception.ntk'} <= path, sorted(path)
    off_robot = sorted(m for m in path if m.startswith(OFF_ROBOT))
    assert off_robot == [], f'the per-frame path reaches training code: {off_robot}'
    files = {module_name(p, package_dir): p for p in (package_dir / 'uq_perception').rglob('*.py')}
    evaluation = sorted(m for m in path if 'uq_eval' in imported_modules(files[m]))
    assert evaluation == [], f'the per-frame path imports uq_eval: {evaluation}'


def test_per_frame_rule_sees_a_planted_training_import():
    graph = {'p.node': {'p.pipeline'}, 'p.pipeline': {'p.runtime.x'},
             'p.runtime.x': {'p.training.fit'}, 'p.training.fit': set()}
    assert 'p.training.fit' in reachable(graph, 'p.node')
    graph['p.runtime.x'] = set()
    assert 'p.training.fit' not in reachable(graph, 'p.node')


@pytest.mark.parametrize('package', PYTHON_PACKAGES)
def test_ros_free_modules_import_no_ros(package):
    package_dir = SRC / package
    talking = set()
    for path in sorted((package_dir / package).rglob('*.py')):
        if ROS_MODULES & imported_modules(path):
            talking.add(module_name(path, package_dir))
    nodes = {m for m in talking if m.endswith('_node')}
    assert talking - nodes <= ROS_FACING_MODULES, (
        f'modules that should be ROS-free import rclpy or uq_msgs: '
        f'{sorted(talking - nodes - ROS_FACING_MODULES)}')


def test_cycle_finder_finds_a_planted_cycle():
    graph = {'p.a': {'p.b'}, 'p.b': {'p.c'}, 'p.c': {'p.a'}, 'p.d': set()}
    assert find_cycle(graph) == ['p.a', 'p.b', 'p.c', 'p.a']
    graph['p.c'] = set()
    assert find_cycle(graph) is None
    assert package_arrows({'p.x.m': {'p.y.n'}, 'p.y.n': {'p.x.k'}}, 2) == {
        'p.x': {'p.y'}, 'p.y': {'p.x'}}
