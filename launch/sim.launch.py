"""The stack in the MuJoCo simulation, open loop (scripted scenes) or closed loop (the grasp task).

    ros2 launch uq_sim_bringup sim.launch.py                      # tabletop_demo scene
    ros2 launch uq_sim_bringup sim.launch.py scenario:=unknown_static rate_hz:=10.0
    ros2 launch uq_sim_bringup sim.launch.py closed_loop:=true    # `make demo`'s graph
    ros2 launch uq_sim_bringup sim.launch.py --show-args

Both include ``uq_stack.launch.py`` (detector, arbitration and ask-for-help nodes) in
``namespace``; every stack argument can be passed through (``profile:=robot``,
``backend:=...``, ``ask_for_help:=false``, ...).

**Open loop** (default): ``sim_camera_node`` (uq_sim, ``config/sim_camera.yaml``) plays the
scripted ``scenario`` and publishes ``image``, ``camera_info`` and ``ground_truth``.

**Closed loop** (``closed_loop:=true``): the grasp task that ``make demo`` runs, as
launch-managed processes. ``sim_robot_node`` is the robot, its camera and the task judge
(in place of ``sim_camera_node``, so ``image`` has one publisher); ``reach_policy_node`` is
the autonomy; ``scripted_operator_node`` is the person at the controls; with
``ask_for_help`` (the default) ``scripted_labeller_node`` is the person who answers help
requests (``config/scripted_labeller.yaml``). These nodes, and the stack's detector and
arbitration node, read ``config/shared_autonomy.yaml`` on top of their own files (the
stack's ``overlay_params``): the arbitration follows the track the autonomy reaches for, in
calibrated-score units. ``seed`` and ``lookalike`` draw the first trial (``make demo``
plays seed 1 with a look-alike); later trials start with a ``reset_task`` message
(docs/shared_autonomy.md). ``scenario`` and ``rate_hz`` belong to the open loop.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml
from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription, OpaqueFunction
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

SHARE = FindPackageShare('uq_bringup')  # the stack and its parameter files
# uq_sim.scenario.SCENARIO_NAMES (test/test_scenario_lists.py keeps them equal).
SCENARIOS = ('tabletop_demo', 'known_static', 'unknown_static', 'novel_arrivals', 'novel_pair')
LOOKALIKE = ('yes', 'no', 'random')
MAX_SEED = 2**31 - 1  # uq_sim.grasp_task.MAX_SEED, the sim robot's seed range
# The closed loop's own nodes: node (= executable) -> (package, parameter file in
# config_dir, what it is). Its file's section for the node is applied, then the launch's
# overrides.
CLOSED_LOOP_NODES = {
    'sim_robot_node': ('uq_sim', 'shared_autonomy.yaml',
                       'robot, camera and task judge of the grasp task'),
    'reach_policy_node': ('uq_autonomy', 'shared_autonomy.yaml',
                          'the autonomy, publishing autonomy/cmd_vel'),
    'scripted_operator_node': ('uq_sim', 'shared_autonomy.yaml',
                               'the person at the controls, publishing operator/cmd_vel'),
    'scripted_labeller_node': ('uq_sim', 'scripted_labeller.yaml',
                               'the person answering help requests'),
}
OVERLAY = 'shared_autonomy.yaml'  # the closed loop's parameters of the stack's nodes
# Handed to the stack; its other arguments (backend, model_path, profile, ...) are given on
# the command line as usual and reach the included file as launch configurations
# (uq_stack.launch.py --show-args lists them).
SHARED_ARGUMENTS = ('namespace', 'image_topic', 'camera_info_topic', 'use_sim_time',
                    'config_dir', 'log_level')


def _for_any_namespace(path: Path, node: str, overrides: dict[str, Any]) -> Path:
    """The ``node:`` section of a parameter file, with ``overrides``, re-keyed
    ``/**/<node>`` (a ``node:`` key applies only in the root namespace)."""
    data = yaml.safe_load(path.read_text(encoding='utf-8')) or {}
    params = {**(data.get(node) or {}).get('ros__parameters', {}), **overrides}
    handle, name = tempfile.mkstemp(prefix=f'uq_{node}_', suffix='.yaml')
    with os.fdopen(handle, 'w', encoding='utf-8') as stream:
        yaml.safe_dump({f'/**/{node}': {'ros__parameters': params}}, stream)
    return Path(name)


def _arg(context: LaunchContext, name: str) -> str:
    return LaunchConfiguration(name).perform(context).strip()


def _flag(context: LaunchContext, name: str) -> bool:
    value = _arg(context, name).lower()
    if value not in ('true', 'false'):
        raise RuntimeError(f"launch argument '{name}' must be true or false, got {value!r}")
    return value == 'true'


def _config_file(config_dir: Path, name: str) -> Path:
    path = config_dir / name
    if not path.is_file():
        raise RuntimeError(f"launch argument 'config_dir': no parameter file {name} in "
                           f'{str(config_dir)!r}')
    return path


def _open_loop(context: LaunchContext, config_dir: Path,
               common: dict[str, Any]) -> list[Node]:
    scenario = _arg(context, 'scenario')
    if scenario not in SCENARIOS:
        raise RuntimeError(f"launch argument 'scenario' must be one of {', '.join(SCENARIOS)}, "
                           f'got {scenario!r}')
    try:
        rate_hz = float(_arg(context, 'rate_hz'))
    except ValueError:
        rate_hz = float('nan')
    if not 0.1 <= rate_hz <= 60.0:
        raise RuntimeError("launch argument 'rate_hz' must be a number in [0.1, 60], got "
                           f"{_arg(context, 'rate_hz')!r}")
    return [Node(
        package='uq_sim', executable='sim_camera_node', name='sim_camera_node',
        parameters=[_for_any_namespace(_config_file(config_dir, 'sim_camera.yaml'),
                                       'sim_camera_node',
                                       {'scenario': scenario, 'rate_hz': rate_hz,
                                        **common['overrides']})],
        remappings=common['camera_remappings'], **common['node'])]


def _closed_loop(context: LaunchContext, config_dir: Path,
                 common: dict[str, Any]) -> list[Node]:
    try:
        seed = int(_arg(context, 'seed'))
    except ValueError:
        seed = -1
    if not 0 <= seed <= MAX_SEED:
        raise RuntimeError(f"launch argument 'seed' must be an integer in [0, {MAX_SEED}], "
                           f"got {_arg(context, 'seed')!r}")
    lookalike = _arg(context, 'lookalike')
    if lookalike not in LOOKALIKE:
        raise RuntimeError(f"launch argument 'lookalike' must be one of {', '.join(LOOKALIKE)}, "
                           f'got {lookalike!r}')
    nodes = dict(CLOSED_LOOP_NODES)
    if not _flag(context, 'ask_for_help'):
        del nodes['scripted_labeller_node']  # nobody asks, nobody answers
    actions = []
    for node, (package, file_name, _) in nodes.items():
        overrides = dict(common['overrides'])
        remappings: list[tuple[str, str]] = []
        if node == 'sim_robot_node':
            overrides.update(seed=seed, lookalike=lookalike)
            remappings = common['camera_remappings']
        actions.append(Node(
            package=package, executable=node, name=node,
            parameters=[_for_any_namespace(_config_file(config_dir, file_name), node,
                                           overrides)],
            remappings=remappings, **common['node']))
    return actions


def _sim(context: LaunchContext) -> list:
    """Validate the arguments, then build the simulation nodes and include the stack
    (nothing starts if validation fails)."""
    closed_loop = _flag(context, 'closed_loop')
    config_dir = Path(_arg(context, 'config_dir'))
    common = {
        'overrides': {'use_sim_time': _arg(context, 'use_sim_time') == 'true'},
        'camera_remappings': [('image', _arg(context, 'image_topic')),
                              ('camera_info', _arg(context, 'camera_info_topic'))],
        'node': {'namespace': _arg(context, 'namespace'), 'output': 'screen',
                 'emulate_tty': True,
                 'ros_arguments': ['--log-level', _arg(context, 'log_level')]},
    }
    if closed_loop:
        actions = _closed_loop(context, config_dir, common)
        overlay = str(_config_file(config_dir, OVERLAY))
    else:
        actions = _open_loop(context, config_dir, common)
        overlay = ''
    stack = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(PathJoinSubstitution([SHARE, 'launch',
                                                            'uq_stack.launch.py'])),
        launch_arguments=[*((name, LaunchConfiguration(name)) for name in SHARED_ARGUMENTS),
                          ('overlay_params', overlay)])
    return [*actions, stack]


def generate_launch_description() -> LaunchDescription:
    return LaunchDescription([
        DeclareLaunchArgument('namespace', default_value='',
                              description='ROS namespace of the simulation and the stack.'),
        DeclareLaunchArgument('closed_loop', default_value='false',
                              description='true: the grasp task of `make demo` (robot, '
                                          'autonomy, scripted operator and labeller, '
                                          'config/shared_autonomy.yaml); false: the sim '
                                          'camera plays `scenario`.'),
        DeclareLaunchArgument('scenario', default_value='tabletop_demo',
                              description='Open loop: scripted scenario of the sim camera, '
                                          'one of ' + ', '.join(SCENARIOS) + '.'),
        DeclareLaunchArgument('rate_hz', default_value='15.0',
                              description='Open loop: frames rendered per second, [0.1, 60].'),
        DeclareLaunchArgument('seed', default_value='1',
                              description='Closed loop: grasp-task trial drawn at start, '
                                          f'[0, {MAX_SEED}] (make demo: 1).'),
        DeclareLaunchArgument('lookalike', default_value='yes',
                              description='Closed loop: a look-alike of the target in that '
                                          'trial: ' + ', '.join(LOOKALIKE) + '.'),
        DeclareLaunchArgument('ask_for_help', default_value='true',
                              description='true: the ask-for-help node (and, in the closed '
                                          'loop, the scripted labeller answering it).'),
        DeclareLaunchArgument('image_topic', default_value='image',
                              description='Image topic between the simulated camera and the '
                                          'stack.'),
        DeclareLaunchArgument('camera_info_topic', default_value='camera_info',
                              description='CameraInfo topic between the simulated camera and '
                                          'the stack.'),
        DeclareLaunchArgument('use_sim_time', default_value='false',
                              description='true: every node follows /clock.'),
        DeclareLaunchArgument('config_dir', default_value=PathJoinSubstitution([SHARE, 'config']),
                              description='Directory of the parameter files (sim_camera.yaml, '
                                          'shared_autonomy.yaml, scripted_labeller.yaml and '
                                          'the stack base files).'),
        DeclareLaunchArgument('log_level', default_value='info',
                              description='Logger level of every node.'),
        OpaqueFunction(function=_sim),
    ])
