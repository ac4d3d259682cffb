"""One ``main()`` for every node executable, as ros2/examples writes it: ``--help`` answers
without ROS, an invalid configuration refuses to start with its reason, Ctrl-C and an
external shutdown end the node cleanly."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
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


@contextlib.contextmanager
def _shutdown_on_signals(context: Any):
    """While inside, SIGINT and SIGTERM shut ``context`` down through rclpy's Python API.

    rclpy's own handler wakes executors first and shuts contexts down after, from another
    thread: an executor woken in between finds its context still valid and waits again,
    for ever, and the node ignores the signal. ``Context.try_shutdown`` shuts down first,
    then runs the context's on-shutdown callbacks, which wake the executor and the
    detector's image thread. Python handlers only run when the main thread executes
    bytecode, which a blocked ``rcl_wait`` never does, so the signal reaches a watcher
    thread through the wakeup file descriptor. A repeated signal changes nothing: under
    ``ros2 launch`` one Ctrl-C reaches each node twice (from the terminal and from launch).
    """
    stop_signals = (signal.SIGINT, signal.SIGTERM)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def shut_down_when_signalled() -> None:
        # Every signal with a Python handler writes its number here: only ours stop.
        while signums := os.read(read_fd, 16):  # empty once run_node closes the pipe
            if any(signum in stop_signals for signum in signums):
                context.try_shutdown()

    previous_handlers = {signum: signal.signal(signum, lambda *_: None)
                         for signum in stop_signals}
    previous_wakeup_fd = signal.set_wakeup_fd(write_fd)
    watcher = threading.Thread(target=shut_down_when_signalled, name='shutdown_on_signal',
                               daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_wakeup_fd)
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)
        os.close(write_fd)  # ends the watcher's read with end-of-file
        watcher.join()
        os.close(read_fd)


def run_node(node_factory: Callable[[], Any], parser: argparse.ArgumentParser,
             args: Sequence[str] | None = None) -> int:
    """Parse ``args`` (``sys.argv`` by default), then create the node and spin it on a
    single-threaded executor until SIGINT, SIGTERM or an external shutdown.

    Returns
    -------
    int
        0 after a clean shutdown, :data:`EXIT_REFUSED` when the node refused to start
        (a ``ValueError`` or ``ParameterException`` from its constructor).
    """
    import rclpy
    from rclpy.exceptions import ParameterException
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions
    from rclpy.utilities import get_default_context, remove_ros_args

    argv = list(sys.argv if args is None else args)
    parser.parse_args(remove_ros_args(argv)[1:])
    rclpy.init(args=argv, signal_handler_options=SignalHandlerOptions.NO)
    context = get_default_context()
    node = None
    with _shutdown_on_signals(context):
        try:
            # The executor exists before the node can publish: a signal arriving as soon as
            # its first message is seen then ends spin() cleanly instead of failing to
            # build an executor on a context already shut down.
            executor = SingleThreadedExecutor()
            node = node_factory()
            executor.add_node(node)
            executor.spin()
        except ExternalShutdownException:
            pass
        except Exception as err:
            if not context.ok():
                return 0  # signalled while starting: the node was half built, not refused
            if isinstance(err, (ValueError, ParameterException)):
                print(f'{parser.prog}: refusing to start: {err}', file=sys.stderr)
                return EXIT_REFUSED
            raise
        finally:
            if node is not None:
                node.destroy_node()
            rclpy.try_shutdown()
    return 0
