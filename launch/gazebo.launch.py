"""The stack on the Gazebo (Harmonic) twin of the MuJoCo tabletop.

    sudo apt install ros-jazzy-ros-gz        # Gazebo Harmonic + ros_gz, the Jazzy pairing
    ros2 launch uq_sim_bringup gazebo.launch.py                  # headless server
    ros2 launch uq_sim_bringup gazebo.launch.py headless:=false  # with the Gazebo GUI
    ros2 launch uq_sim_bringup gazebo.launch.py --show-args

Starts Gazebo Sim (``ros_gz_sim``'s ``gz_sim.launch.py``) on ``worlds/tabletop.sdf`` (table,
four known and three unknown objects, the robot camera at 320x240, 15 Hz), bridges the
camera's image and camera_info and ``/clock`` to ROS with ``ros_gz_bridge``
(``config/gazebo_bridge.yaml``), and includes ``uq_stack.launch.py`` in the same namespace
with ``use_sim_time`` true. Other stack arguments (backend, profile, ...) are given on the
command line as usual.

Not run on the development machines (Gazebo is not installable there): the world, the bridge
table and this file are checked statically by ``test/test_gazebo_static.py``; if
``ros_gz_sim`` or ``ros_gz_bridge`` is missing, the launch fails at start saying which.
"""

from __future__ import annotations

import os
from pathlib import Path

from ament_index_python.packages import PackageNotFoundError, get_package_share_directory
from launch import LaunchContext, LaunchDescription
from launch.actions import (
    DeclareLaunchArgument,
    IncludeLaunchDescription,
    OpaqueFunction,
    SetEnvironmentVariable,
)
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

SHARE = FindPackageShare('uq_bringup')  # the stack and its parameter files
SIM_SHARE = FindPackageShare('uq_sim_bringup')  # the world


def _gazebo(context: LaunchContext) -> list:
    shares = {}
    for package in ('ros_gz_sim', 'ros_gz_bridge'):
        try:
            shares[package] = Path(get_package_share_directory(package))
        except PackageNotFoundError:
            raise RuntimeError(f'{package} is not installed: Gazebo Harmonic and its ROS 2 '
                               'bridge come with `apt install ros-jazzy-ros-gz`') from None
    world = Path(LaunchConfiguration('world').perform(context))
    if not world.is_file():
        raise RuntimeError(f"launch argument 'world': no such file {str(world)!r}")
    bridge = Path(LaunchConfiguration('bridge_config').perform(context))
    if not bridge.is_file():
        raise RuntimeError(f"launch argument 'bridge_config': no such file {str(bridge)!r}")
    headless = LaunchConfiguration('headless').perform(context).lower()
    if headless not in ('true', 'false'):
        raise RuntimeError(f"launch argument 'headless' must be true or false, got {headless!r}")
    # -r: run at once; -s: server only (no GUI).
    gz_args = f'-r {"-s " if headless == "true" else ""}{world}'
    # Relative mesh URIs resolve against the world's directory; the resource path lets
    # Gazebo find them also when the world is given by name.
    resource_path = os.pathsep.join(
        p for p in (str(world.parent), os.environ.get('GZ_SIM_RESOURCE_PATH', '')) if p)
    return [
        SetEnvironmentVariable('GZ_SIM_RESOURCE_PATH', resource_path),
        IncludeLaunchDescription(
            PythonLaunchDescriptionSource(str(shares['ros_gz_sim'] / 'launch' /
                                              'gz_sim.launch.py')),
            launch_arguments=[('gz_args', gz_args)]),
        Node(package='ros_gz_bridge', executable='parameter_bridge', name='gz_bridge',
             namespace=LaunchConfiguration('namespace').perform(context), output='screen',
             parameters=[{'config_file': str(bridge), 'use_sim_time': True}]),
    ]


def generate_launch_description() -> LaunchDescription:
    stack = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(PathJoinSubstitution([SHARE, 'launch',
                                                            'uq_stack.launch.py'])),
        launch_arguments=[('namespace', LaunchConfiguration('namespace')),
                          ('use_sim_time', 'true')])
    return LaunchDescription([
        DeclareLaunchArgument('namespace', default_value='',
                              description='ROS namespace of the bridge and the stack.'),
        DeclareLaunchArgument('world',
                              default_value=PathJoinSubstitution([SIM_SHARE, 'worlds',
                                                                  'tabletop.sdf']),
                              description='SDF world to simulate (default: the tabletop twin).'),
        DeclareLaunchArgument('bridge_config',
                              default_value=PathJoinSubstitution([SHARE, 'config',
                                                                  'gazebo_bridge.yaml']),
                              description='ros_gz_bridge topic table (image, camera_info, '
                                          '/clock).'),
        DeclareLaunchArgument('headless', default_value='true',
                              description='true: Gazebo server only; false: also the GUI.'),
        OpaqueFunction(function=_gazebo),
        stack,
    ])
