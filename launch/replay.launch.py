"""The stack fed by a recorded bag, for rosbag replay evaluation.

    ros2 launch uq_sim_bringup replay.launch.py bag:=/data/run1
    ros2 launch uq_sim_bringup replay.launch.py bag:=run1.mcap replay_args:='--rate 2.0'
    ros2 launch uq_sim_bringup replay.launch.py --show-args

Includes ``uq_stack.launch.py`` (``use_sim_time`` true by default: the nodes follow the
bag's ``/clock``) and runs ``uq replay <bag> [replay_args]`` (with ``--clock`` under
``use_sim_time``), which publishes the bag's messages over DDS with their original timing.
The replay starts once the detector is active (its model loaded), so no frame is lost to
start-up; it sends each image once the previous one is answered (``uq replay --help``:
``--pace``) and names the images left unanswered. When the replay process ends, the whole
launch shuts down (``shutdown_at_end:=false`` keeps the stack running).

``replay_args`` is passed to ``uq replay`` unchanged (``--rate``, ``--start-offset``,
``--record OUT`` ...). Where the installed ``uq`` has no ``replay`` command the launch fails
at start saying so, before any node is started.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from ament_index_python.packages import PackageNotFoundError, get_package_prefix
from launch import Event, LaunchContext, LaunchDescription
from launch.actions import (
    DeclareLaunchArgument,
    EmitEvent,
    ExecuteProcess,
    IncludeLaunchDescription,
    LogInfo,
    OpaqueFunction,
    RegisterEventHandler,
)
from launch.event_handler import EventHandler
from launch.event_handlers import OnProcessExit
from launch.events import Shutdown
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.ros_adapters import get_ros_node
from launch_ros.substitutions import FindPackageShare

from uq_common.lifecycle_state import wait_for_state

SHARE = FindPackageShare('uq_bringup')  # the stack and its parameter files


def _uq_command() -> str | None:
    """The `uq` executable: on PATH, else in uq_common's bin/ (a launch started with
    AMENT_PREFIX_PATH but not PATH from the workspace)."""
    found = shutil.which('uq')
    if found:
        return found
    try:
        path = Path(get_package_prefix('uq_common')) / 'bin' / 'uq'
    except PackageNotFoundError:
        return None
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def _replay(context: LaunchContext) -> list:
    bag = LaunchConfiguration('bag').perform(context).strip()
    if not bag or not Path(bag).exists():
        raise RuntimeError(f"launch argument 'bag': no such bag {bag!r} (a rosbag2 directory "
                           'or a .mcap / .db3 file)')
    shutdown = LaunchConfiguration('shutdown_at_end').perform(context).lower()
    if shutdown not in ('true', 'false'):
        raise RuntimeError(f"launch argument 'shutdown_at_end' must be true or false, "
                           f'got {shutdown!r}')
    uq = _uq_command()
    if uq is None:
        raise RuntimeError('the `uq` command is not installed (source this workspace: '
                           'install/setup.bash)')
    probe = subprocess.run([uq, 'replay', '--help'], capture_output=True, text=True,
                           timeout=60, check=False)
    if probe.returncode != 0:
        raise RuntimeError('`uq replay` is not available in this workspace (`uq replay '
                           f'--help` failed: {probe.stderr.strip()[-200:]}); cannot replay '
                           f'{bag!r}')
    extra = shlex.split(LaunchConfiguration('replay_args').perform(context))
    # Nodes on use_sim_time need the bag's time on /clock.
    if LaunchConfiguration('use_sim_time').perform(context).lower() == 'true' \
            and '--clock' not in extra:
        extra.append('--clock')
    replay = ExecuteProcess(cmd=[uq, 'replay', str(Path(bag).resolve()), *extra],
                            name='uq_replay', output='screen', emulate_tty=True)
    actions: list = [replay]
    if shutdown == 'true':
        actions.append(RegisterEventHandler(OnProcessExit(
            target_action=replay,
            on_exit=[EmitEvent(event=Shutdown(reason='bag replay finished'))])))
    if LaunchConfiguration('autostart').perform(context).lower() != 'true':
        return actions
    # The first frames would be lost on a detector still loading its model: start the
    # replay once the detector is active (once: a respawned detector does not restart it).
    # Asked through get_state: the detector activates itself, and its transition events
    # can be published before this process's subscription is matched.
    namespace = context.launch_configurations.get('namespace', '').strip('/')
    detector = '/' + '/'.join(part for part in (namespace, 'detector_node') if part)
    node = get_ros_node(context)

    def announce_when_active() -> None:
        if wait_for_state(node, detector, 'active', lambda: context.is_shutdown):
            context.asyncio_loop.call_soon_threadsafe(context.emit_event_sync,
                                                      _DetectorActive())

    context.add_completion_future(
        context.asyncio_loop.run_in_executor(None, announce_when_active))
    return [RegisterEventHandler(EventHandler(
        matcher=lambda event: isinstance(event, _DetectorActive),
        entities=[LogInfo(msg='detector_node is active: replaying the bag'), *actions],
        handle_once=True))]


class _DetectorActive(Event):
    """The detector answered ``active`` to ``get_state``."""

    name = 'uq_sim_bringup.replay.detector_active'


def generate_launch_description() -> LaunchDescription:
    stack = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(PathJoinSubstitution([SHARE, 'launch',
                                                            'uq_stack.launch.py'])),
        launch_arguments=[(name, LaunchConfiguration(name))
                          for name in ('use_sim_time', 'autostart')])
    return LaunchDescription([
        DeclareLaunchArgument('bag', description='The bag to replay (rosbag2 directory, or '
                                                 'a .mcap / .db3 file); required.'),
        DeclareLaunchArgument('replay_args', default_value='',
                              description="Extra options for `uq replay`, e.g. '--rate 2.0' "
                                          '(see `uq replay --help`).'),
        DeclareLaunchArgument('use_sim_time', default_value='true',
                              description="true: the nodes follow the bag's /clock."),
        DeclareLaunchArgument('shutdown_at_end', default_value='true',
                              description='true: stop every node when the replay ends.'),
        DeclareLaunchArgument('autostart', default_value='true',
                              description='true: activate the detector and start the replay '
                                          'once it is active; false: start the replay at once '
                                          'and leave the detector to a lifecycle manager.'),
        # Validation first: a missing bag or `uq replay` fails before the stack starts.
        OpaqueFunction(function=_replay),
        stack,
    ])
