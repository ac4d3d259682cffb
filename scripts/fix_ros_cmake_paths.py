"""Rewrite the build-machine paths baked into the ROS 2 Jazzy PyPI wheels.

The wheels' exported CMake targets name include directories of the machine that built
them (``/opt/python/cp311-cp311/...``); CMake's generate step fails on paths that do not
exist, so building our own interfaces (uq_msgs) fails. This points them at this Python's
include directory and numpy's, and the ament parent-prefix records at the venv itself.
Idempotent: a second run finds nothing to rewrite.

Usage: python fix_ros_cmake_paths.py VENV_PREFIX
"""

import sys
import sysconfig
from pathlib import Path

import numpy

BUILD_PREFIX = '/opt/python/cp311-cp311'


def main(prefix: Path) -> int:
    replacements = [
        (f'{BUILD_PREFIX}/lib/python3.11/site-packages/numpy/_core/include', numpy.get_include()),
        (f'{BUILD_PREFIX}/include/python3.11', sysconfig.get_paths()['include']),
        (BUILD_PREFIX, str(prefix)),
    ]
    share = prefix / 'share'
    candidates = list(share.rglob('*.cmake'))
    candidates += list((share / 'ament_index/resource_index/parent_prefix_path').glob('*'))
    changed = 0
    for path in candidates:
        text = path.read_text()
        if BUILD_PREFIX not in text:
            continue
        for old, new in replacements:
            text = text.replace(old, new)
        path.write_text(text)
        changed += 1
    print(f'[setup] rewrote build-machine paths in {changed} ROS CMake/ament files')
    return 0


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(Path(sys.argv[1]).resolve()))
