"""One ``main()`` for every node executable, as ros2/examples writes it: ``--help`` answers
without ROS, an invalid configuration refuses to start with its reason, Ctrl-C and an
external shutdown end the node cleanly."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from uq_common.parameters import ParameterSpec, parameters_help

# Exit code of a node that refused to start (invalid parameters or files).
EXIT_REFUSED = 1


def node_argument_parser(prog: str, description: str, specs: Iterable[ParameterSpec],
                         params_file: str, interfaces: str = '') -> argparse.ArgumentParser:
    """The ``--help`` of a node executable: its description, parameters and interfaces."""
    lines = [f'parameters (set with --ros-args --params-file {params_file} '
             'or -p name:=value):', *parameters_help(specs)]
    if interfaces:
        lines += ['', interfaces]
    return argparse.ArgumentParser(prog=prog, description=description, epilog='\n'.join(lines),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def run_node(node_factory: Callable[[], Any], parser: argparse.ArgumentParser,
             args: Sequence[str] | None = None) -> int:
    """Parse ``args`` (``sys.argv`` by default), then create the node and spin it until
    shutdown on a single-threaded executor.

    Returns
    -------
    int
        0 after a clean shutdown, :data:`EXIT_REFUSED` when the node refused to start
        (a ``ValueError`` or ``ParameterException`` from its constructor).
    """
    import rclpy
    from rclpy.exceptions import ParameterException
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
    from rclpy.utilities import remove_ros_args

    argv = list(sys.argv if args is None else args)
    parser.parse_args(remove_ros_args(argv)[1:])
    rclpy.init(args=argv)
    node = None
    try:
        # The executor exists before the node can publish: a SIGINT arriving as soon as its
        # first message is seen then ends spin() cleanly instead of failing to build an
        # executor on a context already shut down.
        executor = SingleThreadedExecutor()
        node = node_factory()
        executor.add_node(node)
        executor.spin()
    except (ValueError, ParameterException) as err:
        print(f'{parser.prog}: refusing to start: {err}', file=sys.stderr)
        return EXIT_REFUSED
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return 0
