"""The uncertainty-gated perception stack: detector, arbitration and ask-for-help nodes.

    ros2 launch uq_bringup uq_stack.launch.py                      # sim profile, CPU
    ros2 launch uq_bringup uq_stack.launch.py profile:=robot image_topic:=/camera/color/image_raw
    ros2 launch uq_bringup uq_stack.launch.py --show-args          # every argument, documented

Nodes (all in ``namespace``):

- ``detector_node`` (uq_perception), a managed (lifecycle) node. With ``autostart:=true``
  (default) its own ``autostart`` parameter is set: each process configures and activates
  itself as soon as it starts, and this launch file logs ``detector_node is active`` once
  the process answers ``active`` to ``get_state`` (``_LogWhenActive``). With
  ``autostart:=false`` it waits unconfigured for a lifecycle manager or
  ``ros2 lifecycle set <ns>/detector_node configure``.
  **Respawn:** if the detector process dies, launch reports it (``process has died``) and
  starts it again after ``respawn_delay`` seconds (``respawn:=false`` turns this off); the
  new process configures and activates itself again. It does not wait for a request from
  this launch process: after a SIGKILL, what the others send to the new process is held up
  for seconds by their shared-memory transport, which still maps the dead process's port
  (docs/dds.md), and the restart has 3 s (docs/performance.md, "Restart"). While it is down
  the arbitration node sees no detections and falls back to teleoperation within its
  perception deadline.
- ``arbitration_node`` (uq_autonomy): autonomy level from the detections' uncertainty.
- ``ask_for_help_node`` (uq_autonomy), unless ``ask_for_help:=false``.

Parameters: for each node, ``config/<name>.yaml`` (the sim profile, the base, required;
``detector``, ``arbitration``, ``ask_for_help``), then, with ``profile:=robot``,
``config/robot/<name>.yaml`` on top of it if present (only the values a robot changes), then
the node's section of ``overlay_params`` if given (``sim.launch.py closed_loop:=true``
passes ``config/shared_autonomy.yaml``), then the launch arguments (``model_format``,
``model_path``, ``backend``, ``use_sim_time`` ...).
``config_dir:=DIR`` reads the base files from another directory. The files may name their
node ``detector_node``, ``/**`` or ``/**/detector_node``; the merged values are written to
one parameter file per node whose key matches the node in any namespace.

Bad arguments fail the launch before any process starts, with a message naming the argument:
an unknown ``backend``, ``model_format``, ``profile`` or ``log_level``, a ``model_path`` of
the other ``model_format`` (an ONNX file with ``torch``, the default, or a torch archive with
``onnx``), a ``model_path`` / ``gp_path`` /
``dds_profile`` / ``overlay_params`` that is not a file, ``backend:=tensorrt`` without an
existing ``engine_path``, a non-boolean flag, a negative ``respawn_delay``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import launch.logging
import yaml
from launch import LaunchContext, LaunchDescription
from launch.actions import (
    DeclareLaunchArgument,
    OpaqueFunction,
    RegisterEventHandler,
    SetEnvironmentVariable,
)
from launch.event_handlers import OnProcessStart
from launch.substitutions import EnvironmentVariable, LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode, Node
from launch_ros.ros_adapters import get_ros_node
from launch_ros.substitutions import FindPackageShare

from uq_common.lifecycle_state import wait_for_state
from uq_perception.detectors.model_files import model_format_mismatch

BACKENDS = ('onnxruntime', 'pytorch-cpu', 'pytorch-cuda', 'tensorrt')
MODEL_FORMATS = ('torch', 'onnx')
PROFILES = ('sim', 'robot')
LOG_LEVELS = ('debug', 'info', 'warn', 'error', 'fatal')
NODES = {  # node name -> package (the executable has the node's name)
    'detector_node': 'uq_perception',
    'arbitration_node': 'uq_autonomy',
    'ask_for_help_node': 'uq_autonomy',
}

SHARE = FindPackageShare('uq_bringup')
ARGUMENTS = [
    DeclareLaunchArgument(
        'namespace', default_value='',
        description='ROS namespace of every node of the stack (empty: the root namespace).'),
    DeclareLaunchArgument(
        'image_topic', default_value='image',
        description='Camera image topic (sensor_msgs/Image) the detector and the ask-for-help '
                    'node read; remaps their relative "image". Relative names resolve in '
                    '`namespace`.'),
    DeclareLaunchArgument(
        'camera_info_topic', default_value='camera_info',
        description='CameraInfo topic matching image_topic (optional input of the detector).'),
    DeclareLaunchArgument(
        'model_format', default_value='torch',
        description='Format of model_path: torch (the shipped CenterNet) or onnx (any ONNX '
                    'detector with a linear class head, read by the ONNX adapter; its onnx_* '
                    'settings come from the parameter files or overlay_params; see '
                    'docs/detector_contract.md).'),
    DeclareLaunchArgument(
        'model_path', default_value=PathJoinSubstitution([SHARE, 'models', 'detector.pt']),
        description='Detector weights or ONNX file (must exist). Default: the shipped model.'),
    DeclareLaunchArgument(
        'gp_path', default_value=PathJoinSubstitution([SHARE, 'models', 'detector_gp.npz']),
        description='NTK-GP artefact fitted for model_path (must exist and match the model).'),
    DeclareLaunchArgument(
        'backend', default_value='onnxruntime',
        description='Inference backend of a torch model: one of ' + ', '.join(BACKENDS) + ' '
                    '(onnxruntime falls back to pytorch-cpu, saying why, when its export of the '
                    'model cannot run or does not agree with torch). An onnx model always runs '
                    'on ONNX Runtime.'),
    DeclareLaunchArgument(
        'engine_path', default_value='',
        description='TensorRT engine from `uq build-engine`; required (an existing file) '
                    'with backend:=tensorrt, ignored otherwise.'),
    DeclareLaunchArgument(
        'profile', default_value='sim',
        description='Parameter profile: sim (config/*.yaml) or robot (config/robot/*.yaml '
                    'applied on top of config/*.yaml).'),
    DeclareLaunchArgument(
        'config_dir', default_value=PathJoinSubstitution([SHARE, 'config']),
        description='Directory of the parameter files: detector.yaml, arbitration.yaml, '
                    'ask_for_help.yaml (the sim profile) and robot/ (the robot profile).'),
    DeclareLaunchArgument(
        'overlay_params', default_value='',
        description='Parameter file applied on top of the profile files to each node it has '
                    'a section for (e.g. config/shared_autonomy.yaml); empty: none.'),
    DeclareLaunchArgument(
        'use_sim_time', default_value='false',
        description='true: every node follows /clock (bag replay, simulators).'),
    DeclareLaunchArgument(
        'log_level', default_value='info',
        description='Logger level of every node: one of ' + ', '.join(LOG_LEVELS) + '.'),
    DeclareLaunchArgument(
        'autostart', default_value='true',
        description='true: configure and activate the lifecycle detector at start-up; '
                    'false: leave it unconfigured for a lifecycle manager.'),
    DeclareLaunchArgument(
        'respawn', default_value='true',
        description='true: restart the detector process when it dies (then configured and '
                    'activated again when autostart is true).'),
    DeclareLaunchArgument(
        'respawn_delay', default_value='0.1',
        description='Seconds between the detector process dying and its restart (every '
                    'second of it is a second of teleoperation after a crash).'),
    DeclareLaunchArgument(
        'ask_for_help', default_value='true',
        description='true: start the ask-for-help node (labelling requests).'),
    DeclareLaunchArgument(
        'dds_profile',
        default_value=EnvironmentVariable(
            'FASTRTPS_DEFAULT_PROFILES_FILE',
            default_value=PathJoinSubstitution([SHARE, 'config', 'dds',
                                                'fastdds_large_images.xml'])),
        description='Fast DDS XML profile of the nodes (FASTRTPS_DEFAULT_PROFILES_FILE; '
                    'default: the one already exported, else the shipped large-image profile, '
                    'docs/dds.md); empty: Fast DDS defaults.'),
]


class LaunchArgumentError(RuntimeError):
    """A launch argument is invalid; the message names it."""


def _arg(context: LaunchContext, name: str) -> str:
    return LaunchConfiguration(name).perform(context).strip()


def _flag(context: LaunchContext, name: str) -> bool:
    value = _arg(context, name).lower()
    if value not in ('true', 'false'):
        raise LaunchArgumentError(
            f"launch argument '{name}' must be true or false, got {value!r}")
    return value == 'true'


def _choice(context: LaunchContext, name: str, choices: tuple[str, ...]) -> str:
    value = _arg(context, name)
    if value not in choices:
        raise LaunchArgumentError(
            f"launch argument '{name}' must be one of {', '.join(choices)}, got {value!r}")
    return value


def _existing_file(context: LaunchContext, name: str, hint: str = '') -> str:
    value = _arg(context, name)
    if not value or not Path(value).is_file():
        raise LaunchArgumentError(
            f"launch argument '{name}': no such file {value!r}{hint}")
    return str(Path(value).resolve())


def _node_parameters(path: Path, node: str) -> dict[str, Any]:
    """The ``ros__parameters`` of ``node`` in a ROS parameter file (``{}`` if none)."""
    with open(path, encoding='utf-8') as stream:
        data = yaml.safe_load(stream) or {}
    if not isinstance(data, dict):
        raise LaunchArgumentError(f'parameter file {path} is not a mapping of node names')
    merged: dict[str, Any] = {}
    for key, entry in data.items():
        name = str(key).lstrip('/')
        if name in (node, '**', f'**/{node}') or name.endswith(f'/{node}'):
            params = (entry or {}).get('ros__parameters', {}) if isinstance(entry, dict) else {}
            _deep_update(merged, params)
    return merged


def _deep_update(target: dict[str, Any], source: dict[str, Any]) -> None:
    for key, value in source.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _deep_update(target[key], value)
        else:
            target[key] = value


def _parameter_file(node: str, files: list[Path], overrides: dict[str, Any]) -> Path:
    """Merge ``files`` (later wins) and ``overrides`` into one parameter file for ``node``."""
    params: dict[str, Any] = {}
    for path in files:
        _deep_update(params, _node_parameters(path, node))
    _deep_update(params, overrides)
    # Keyed /**/<node>: the values reach the node in whatever namespace it runs.
    handle, name = tempfile.mkstemp(prefix=f'uq_{node}_', suffix='.yaml')
    with os.fdopen(handle, 'w', encoding='utf-8') as stream:
        yaml.safe_dump({f'/**/{node}': {'ros__parameters': params}}, stream,
                       default_flow_style=None, sort_keys=False)
    return Path(name)


def _profile_files(config_dir: Path, profile: str, node: str) -> list[Path]:
    """``<config_dir>/<name>.yaml`` (+ ``robot/<name>.yaml``), name = node less ``_node``."""
    name = node.removesuffix('_node')
    base, robot = config_dir / f'{name}.yaml', config_dir / 'robot' / f'{name}.yaml'
    if not base.is_file():
        raise LaunchArgumentError(f"launch argument 'config_dir': no parameter file {base.name} "
                                  f'for {node} in {str(config_dir)!r}')
    return [base, robot] if profile == 'robot' and robot.is_file() else [base]


class _LogWhenActive:
    """``OnProcessStart`` action: log ``detector_node is active`` once the new process says so.

    Its transition events cannot tell: they are volatile, and a process that activates
    itself within a second of starting publishes them before this launch process's
    subscription is matched. Asked through ``get_state`` instead, in a worker thread, until
    the process answers ``active``, launch shuts down or the process is started again.
    """

    def __init__(self, detector: LifecycleNode) -> None:
        self._detector = detector
        self._generation = 0

    def __call__(self, event: Any, context: LaunchContext) -> None:
        self._generation += 1
        generation = self._generation
        node = get_ros_node(context)  # here, in launch's thread: not safe from a worker

        def log_when_active() -> None:
            if wait_for_state(node, self._detector.node_name, 'active',
                              lambda: context.is_shutdown or generation != self._generation):
                launch.logging.get_logger('launch.user').info('detector_node is active')

        context.add_completion_future(
            context.asyncio_loop.run_in_executor(None, log_when_active))


def _stack(context: LaunchContext) -> list:
    """Validate the arguments, then build the nodes (nothing starts if validation fails)."""
    backend = _choice(context, 'backend', BACKENDS)
    model_format = _choice(context, 'model_format', MODEL_FORMATS)
    profile = _choice(context, 'profile', PROFILES)
    log_level = _choice(context, 'log_level', LOG_LEVELS)
    use_sim_time = _flag(context, 'use_sim_time')
    autostart = _flag(context, 'autostart')
    respawn = _flag(context, 'respawn')
    ask_for_help = _flag(context, 'ask_for_help')
    model_path = _existing_file(context, 'model_path')
    mismatch = model_format_mismatch(model_path, model_format)
    if mismatch:
        raise LaunchArgumentError(f"launch argument 'model_format': {mismatch}")
    gp_path = _existing_file(context, 'gp_path')
    engine_path = ''
    if backend == 'tensorrt':
        engine_path = _existing_file(
            context, 'engine_path', ' (backend tensorrt needs an engine: build it on this '
            'machine with `uq build-engine --out FILE`)')
    try:
        respawn_delay = float(_arg(context, 'respawn_delay'))
    except ValueError:
        respawn_delay = -1.0
    if not respawn_delay >= 0.0:
        raise LaunchArgumentError("launch argument 'respawn_delay' must be a number >= 0, "
                                  f'got {_arg(context, "respawn_delay")!r}')
    config_dir = Path(_arg(context, 'config_dir'))
    if not config_dir.is_dir():
        raise LaunchArgumentError(f"launch argument 'config_dir': no such directory "
                                  f'{str(config_dir)!r}')
    if profile == 'robot' and not (config_dir / 'robot').is_dir():
        raise LaunchArgumentError(f"launch argument 'profile': robot profile directory "
                                  f'{str(config_dir / "robot")!r} does not exist')
    image_topic, info_topic = _arg(context, 'image_topic'), _arg(context, 'camera_info_topic')
    for name, value in (('image_topic', image_topic), ('camera_info_topic', info_topic)):
        if not value:
            raise LaunchArgumentError(f"launch argument '{name}' must not be empty")
    namespace = _arg(context, 'namespace')
    dds_profile = _arg(context, 'dds_profile')
    if dds_profile:
        dds_profile = _existing_file(context, 'dds_profile')
    overlay = [Path(_existing_file(context, 'overlay_params'))] \
        if _arg(context, 'overlay_params') else []

    def params(node: str, overrides: dict[str, Any]) -> list[Path]:
        return [_parameter_file(node, _profile_files(config_dir, profile, node) + overlay,
                                {'use_sim_time': use_sim_time, **overrides})]

    common: dict[str, Any] = {
        'namespace': namespace, 'output': 'screen', 'emulate_tty': True,
        'ros_arguments': ['--log-level', log_level],
    }
    detector = LifecycleNode(
        package=NODES['detector_node'], executable='detector_node', name='detector_node',
        parameters=params('detector_node', {
            'model_format': model_format, 'model_path': model_path, 'gp_path': gp_path,
            'backend': backend,
            'engine_path': engine_path, 'autostart': autostart}),
        remappings=[('image', image_topic), ('camera_info', info_topic)],
        respawn=respawn, respawn_delay=respawn_delay, **common)
    actions: list = []
    if dds_profile:
        actions.append(SetEnvironmentVariable('FASTRTPS_DEFAULT_PROFILES_FILE', dds_profile))
    actions.append(detector)
    if autostart:
        # On every start of the process, the first and each respawn.
        actions.append(RegisterEventHandler(OnProcessStart(
            target_action=detector, on_start=_LogWhenActive(detector))))
    actions.append(Node(
        package=NODES['arbitration_node'], executable='arbitration_node',
        name='arbitration_node', parameters=params('arbitration_node', {}), **common))
    if ask_for_help:
        actions.append(Node(
            package=NODES['ask_for_help_node'], executable='ask_for_help_node',
            name='ask_for_help_node', parameters=params('ask_for_help_node', {}),
            remappings=[('image', image_topic)], **common))
    return actions


def generate_launch_description() -> LaunchDescription:
    return LaunchDescription([*ARGUMENTS, OpaqueFunction(function=_stack)])
