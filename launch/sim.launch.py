"""The stack in the MuJoCo simulation: sim camera + detector, arbitration, ask-for-help.

    ros2 launch uq_bringup sim.launch.py
    ros2 launch uq_bringup sim.launch.py scenario:=unknown_static rate_hz:=10.0
    ros2 launch uq_bringup sim.launch.py --show-args

Starts ``sim_camera_node`` (uq_sim, ``config/sim_camera.yaml``) publishing ``image`` and
``camera_info`` in ``namespace``, and includes ``uq_stack.launch.py`` with the same
namespace and topics (every stack argument can be passed through, e.g. ``backend:=...``).

The closed-loop parts come with later work (the velocity-controlled robot, the autonomy
policy, the scripted operator and the scripted labeller): each has a flag here, false by
default. Setting one to true while its executable is not installed fails the launch at
start with a message naming the flag and the missing executable, so the flags can be wired
in now and the nodes added as they land (table ``CLOSED_LOOP_NODES``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml
from ament_index_python.packages import PackageNotFoundError, get_package_prefix
from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription, OpaqueFunction
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

SHARE = FindPackageShare('uq_bringup')
SCENARIOS = ('tabletop_demo', 'known_static', 'unknown_static')
# flag -> (package, executable, what it is). Executable names to be confirmed by the
# closed-loop and ask-for-help work that delivers them.
CLOSED_LOOP_NODES = {
    'robot': ('uq_sim', 'sim_robot_node', 'velocity-controlled robot in the MuJoCo world'),
    'autonomy_policy': ('uq_sim', 'autonomy_policy_node',
                        'autonomy policy publishing autonomy/cmd_vel'),
    'operator': ('uq_sim', 'scripted_operator_node',
                 'scripted operator publishing operator/cmd_vel'),
    'labeller': ('uq_sim', 'scripted_labeller_node',
                 'scripted labeller answering help requests'),
}
# Declared here and handed to the stack; the stack's other arguments (backend, model_path,
# profile, ...) are given on the command line as usual and reach the included file as
# launch configurations (uq_stack.launch.py --show-args lists them).
SHARED_ARGUMENTS = ('namespace', 'image_topic', 'camera_info_topic', 'use_sim_time',
                    'config_dir', 'log_level')


def _executable(package: str, executable: str) -> Path | None:
    try:
        path = Path(get_package_prefix(package)) / 'lib' / package / executable
    except PackageNotFoundError:
        return None
    return path if path.is_file() else None


def _for_any_namespace(path: Path, node: str, overrides: dict) -> Path:
    """The ``node:`` section of a parameter file, with ``overrides``, re-keyed
    ``/**/<node>`` (a ``node:`` key applies only in the root namespace)."""
    data = yaml.safe_load(path.read_text(encoding='utf-8')) or {}
    params = {**(data.get(node) or {}).get('ros__parameters', {}), **overrides}
    handle, name = tempfile.mkstemp(prefix=f'uq_{node}_', suffix='.yaml')
    with os.fdopen(handle, 'w', encoding='utf-8') as stream:
        yaml.safe_dump({f'/**/{node}': {'ros__parameters': params}}, stream)
    return Path(name)


def _sim_nodes(context: LaunchContext) -> list:
    namespace = LaunchConfiguration('namespace').perform(context)
    scenario = LaunchConfiguration('scenario').perform(context)
    if scenario not in SCENARIOS:
        raise RuntimeError(f"launch argument 'scenario' must be one of {', '.join(SCENARIOS)}, "
                           f'got {scenario!r}')
    try:
        rate_hz = float(LaunchConfiguration('rate_hz').perform(context))
    except ValueError:
        rate_hz = float('nan')
    if not 0.1 <= rate_hz <= 60.0:
        raise RuntimeError("launch argument 'rate_hz' must be a number in [0.1, 60], got "
                           f"{LaunchConfiguration('rate_hz').perform(context)!r}")
    use_sim_time = LaunchConfiguration('use_sim_time').perform(context) == 'true'
    config = Path(LaunchConfiguration('config_dir').perform(context)) / 'sim_camera.yaml'
    if not config.is_file():
        raise RuntimeError(f"launch argument 'config_dir': no parameter file {config.name} in "
                           f'{str(config.parent)!r}')
    actions: list = [Node(
        package='uq_sim', executable='sim_camera_node', name='sim_camera_node',
        namespace=namespace, output='screen', emulate_tty=True,
        parameters=[_for_any_namespace(config, 'sim_camera_node', {
            'scenario': scenario, 'rate_hz': rate_hz, 'use_sim_time': use_sim_time})],
        remappings=[('image', LaunchConfiguration('image_topic').perform(context)),
                    ('camera_info', LaunchConfiguration('camera_info_topic').perform(context))],
        ros_arguments=['--log-level', LaunchConfiguration('log_level').perform(context)])]
    for flag, (package, executable, what) in CLOSED_LOOP_NODES.items():
        value = LaunchConfiguration(flag).perform(context).lower()
        if value not in ('true', 'false'):
            raise RuntimeError(f"launch argument '{flag}' must be true or false, got {value!r}")
        if value == 'false':
            continue
        if _executable(package, executable) is None:
            raise RuntimeError(f"launch argument '{flag}:=true': {package}/{executable} ({what}) "
                               'is not installed in this workspace yet')
        actions.append(Node(package=package, executable=executable, name=executable,
                            namespace=namespace, output='screen', emulate_tty=True,
                            parameters=[{'use_sim_time': use_sim_time}]))
    return actions


def generate_launch_description() -> LaunchDescription:
    stack = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(PathJoinSubstitution([SHARE, 'launch',
                                                            'uq_stack.launch.py'])),
        launch_arguments=[(name, LaunchConfiguration(name)) for name in SHARED_ARGUMENTS])
    return LaunchDescription([
        DeclareLaunchArgument('namespace', default_value='',
                              description='ROS namespace of the simulation and the stack.'),
        DeclareLaunchArgument('scenario', default_value='tabletop_demo',
                              description='Scripted scenario of the sim camera: one of '
                                          + ', '.join(SCENARIOS) + '.'),
        DeclareLaunchArgument('rate_hz', default_value='15.0',
                              description='Frames rendered per second, [0.1, 60].'),
        DeclareLaunchArgument('image_topic', default_value='image',
                              description='Image topic between the sim camera and the stack.'),
        DeclareLaunchArgument('camera_info_topic', default_value='camera_info',
                              description='CameraInfo topic between the sim camera and the '
                                          'stack.'),
        DeclareLaunchArgument('use_sim_time', default_value='false',
                              description='true: every node follows /clock.'),
        DeclareLaunchArgument('config_dir', default_value=PathJoinSubstitution([SHARE, 'config']),
                              description='Directory of the parameter files (sim_camera.yaml '
                                          'and the stack base files).'),
        DeclareLaunchArgument('log_level', default_value='info',
                              description='Logger level of every node.'),
        *[DeclareLaunchArgument(flag, default_value='false',
                                description=f'true: also start {package}/{executable} ({what}); '
                                            'not available yet.')
          for flag, (package, executable, what) in CLOSED_LOOP_NODES.items()],
        OpaqueFunction(function=_sim_nodes),
        stack,
    ])
