"""The gating tests' DDS observer: a node of the test's own that records every
``AutonomyState`` and the arrival of non-empty ``DetectionArray`` messages.

Loaded by path by the tests that use it (``--import-mode=importlib`` puts no test folder on
``sys.path``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

from uq_msgs.msg import AutonomyState, DetectionArray


class GatingObserver:
    """Subscribes on its own context and domain, spinning in a thread of its own.

    ``states`` holds ``(arrival monotonic time, AutonomyState)``; ``detections`` the arrival
    times of the non-empty ``DetectionArray`` messages.
    """

    def __init__(self, name: str, domain_id: int, namespace: str = '') -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node(name, namespace=namespace, context=self.context)
        self.lock = threading.Lock()
        self.states: list[tuple[float, AutonomyState]] = []
        self.detections: list[float] = []
        # Reliable and transient-local as the arbitration node publishes its state, so the
        # state it held before this node joined arrives too.
        self.node.create_subscription(
            AutonomyState, 'autonomy_state', self._on_state,
            QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE,
                       durability=DurabilityPolicy.TRANSIENT_LOCAL))
        self.node.create_subscription(
            DetectionArray, 'detections', self._on_detections,
            QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT))
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _on_state(self, msg: AutonomyState) -> None:
        with self.lock:
            self.states.append((time.monotonic(), msg))

    def _on_detections(self, msg: DetectionArray) -> None:
        if msg.detections:
            with self.lock:
                self.detections.append(time.monotonic())

    def first_detections(self) -> float | None:
        """Arrival time of the first non-empty detections, or None."""
        with self.lock:
            return self.detections[0] if self.detections else None

    def after(self, since: float) -> list[tuple[float, AutonomyState]]:
        """The states that arrived at or after ``since``."""
        with self.lock:
            return [(t, s) for t, s in self.states if t >= since]

    def story(self, since: float) -> str:
        """Each change of level, staleness or reason since ``since``, one per line."""
        lines, last = [], None
        for t, s in self.after(since):
            if (s.level, s.perception_stale, s.reason) != last:
                last = (s.level, s.perception_stale, s.reason)
                lines.append(f'  {t - since:6.2f} s level {s.level}'
                             f'{" (stale)" if s.perception_stale else ""}: {s.reason}')
        return '\n'.join(lines)

    def wait_for(self, predicate: Callable[[], Any], timeout_s: float,
                 still_running: Callable[[], None] = lambda: None) -> Any:
        """Poll ``predicate`` under the lock until it is truthy or ``timeout_s`` passes;
        ``still_running`` may raise to end the wait early (a process under test died)."""
        end = time.monotonic() + timeout_s
        while True:
            with self.lock:
                result = predicate()
            if result or time.monotonic() >= end:
                return result
            still_running()
            time.sleep(0.05)

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        self.context.try_shutdown()
