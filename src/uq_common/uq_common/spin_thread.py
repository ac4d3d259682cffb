"""An executor spun on a background thread, stopped and joined before shutdown."""

from __future__ import annotations

import threading
from typing import Any


class SpinThread:
    """Spin ``executor`` on a daemon thread until :meth:`stop`.

    The thread spins in short slices and checks a flag rather than calling
    ``executor.spin()``: Jazzy's ``Executor.shutdown()`` does not wait for a spinning
    thread, which then trips over destroyed handles, and a daemon thread still inside
    rclpy when the interpreter exits aborts the process ("terminate called without an
    active exception"). Call :meth:`stop` before destroying the nodes and the context.
    """

    def __init__(self, executor: Any, name: str = 'spin', slice_s: float = 0.05) -> None:
        self._executor = executor
        self._slice_s = slice_s
        self._running = threading.Event()
        self._running.set()
        self._thread = threading.Thread(target=self._spin, name=name, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        from rclpy.executors import ExternalShutdownException

        try:
            while self._running.is_set() and self._executor.context.ok():
                self._executor.spin_once(timeout_sec=self._slice_s)
        except ExternalShutdownException:
            pass  # the context was shut down under us: nothing left to spin

    def stop(self, timeout_s: float = 10.0) -> None:
        """Let the callback in progress finish, then end and join the thread."""
        self._running.clear()
        self._thread.join(timeout_s)
