"""Message types for reading and writing rosbag2 files without a ROS installation.

`rosbags` ships the standard ROS 2 Jazzy types; our own ``uq_msgs`` types are registered
from the package's ``.msg`` files, so bags written by rclpy-based nodes and by `rosbags`
share one definition and stay interchangeable.
"""

from __future__ import annotations

from pathlib import Path

from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from rosbags.typesys.store import Typestore

INTERFACE_PACKAGE = 'uq_msgs'


def interface_msg_dir() -> Path:
    """Directory holding the installed ``uq_msgs`` ``.msg`` files.

    Raises
    ------
    FileNotFoundError
        If ``uq_msgs`` is not installed in any ament prefix.
    """
    from ament_index_python.packages import PackageNotFoundError, get_package_share_directory
    try:
        return Path(get_package_share_directory(INTERFACE_PACKAGE)) / 'msg'
    except PackageNotFoundError as exc:
        raise FileNotFoundError(
            f'{INTERFACE_PACKAGE} is not installed; build the workspace (make setup) and '
            'source scripts/env.sh') from exc


def uq_typestore(msg_dir: Path | None = None) -> Typestore:
    """A ROS 2 Jazzy `rosbags` typestore with every ``uq_msgs`` message registered.

    Parameters
    ----------
    msg_dir
        Directory of ``*.msg`` files; defaults to the installed ``uq_msgs`` share directory.
    """
    msg_dir = msg_dir or interface_msg_dir()
    msg_files = sorted(msg_dir.glob('*.msg'))
    if not msg_files:
        raise FileNotFoundError(f'no .msg files in {msg_dir}')
    typestore = get_typestore(Stores.ROS2_JAZZY)
    types: dict = {}
    for path in msg_files:
        types.update(get_types_from_msg(path.read_text(), f'{INTERFACE_PACKAGE}/msg/{path.stem}'))
    typestore.register(types)
    return typestore
