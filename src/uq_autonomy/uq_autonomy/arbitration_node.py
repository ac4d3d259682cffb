"""Shared-autonomy arbitration node: perception uncertainty gates the robot's level of autonomy.

Thin ROS 2 adapter around :class:`uq_autonomy.arbitration.arbiter.Arbiter` (all decisions live
there).

Subscribes
    ``detections`` (uq_msgs/DetectionArray, best-effort: accepts best-effort and reliable
    publishers), ``operator/cmd_vel`` and ``autonomy/cmd_vel`` (geometry_msgs/Twist,
    best-effort, depth 1), ``autonomy/target_track_id`` (std_msgs/Int32, best-effort, depth
    1: the track the autonomy is reaching for, -1 for none; read under
    ``driving_detection: autonomy_target``).
Publishes
    ``cmd_vel`` (geometry_msgs/Twist, reliable) every decision period and at once on a level
    change; ``autonomy_state`` (uq_msgs/AutonomyState, reliable + transient-local) on every
    change and as a heartbeat; ``/diagnostics`` (diagnostic_msgs/DiagnosticArray).
Serves
    ``set_autonomy_override`` (uq_msgs/SetAutonomyOverride).

Deadlines and timers run on the steady clock, so the fail-safe keeps its promise under
simulated time and clock jumps; message stamps use the node's (ROS) clock, against which each
frame's stamp is checked (``max_frame_age_s``, ``max_future_stamp_s``). When that clock goes
backwards (a bag replayed in a loop under ``use_sim_time``) the arbiter is reset to
teleoperation.

The model's range comes with every frame (``DetectionArray.reference_variance_max``): a
signal the loaded model cannot give -- the calibrated score of a model without a score
reference, raw GP-variance thresholds far above its range -- keeps the level at
teleoperation, with one error line naming the parameter and the range (logged when the
problem appears or changes) and an ERROR status on ``/diagnostics``; the node keeps running
and takes a corrected parameter at once.

Bounded work per message: rclpy normally deserialises a whole message into Python objects
before the callback runs, so a 20,000-detection array would cost its full conversion however
quickly the callback then refused it. The ``detections`` subscription therefore takes the
serialized bytes (``raw=True``), reads the stamp and the detection count from the CDR header
(:func:`peek_detection_array`) and decodes the message only when the count is within
``max_detections``. What remains proportional to the size is the middleware's copy of the
bytes; the reader's history depth (``PERCEPTION_QOS``) bounds how many such copies queue.
"""

from __future__ import annotations

import argparse
import math
import struct
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import Twist
from rcl_interfaces.msg import SetParametersResult
from rclpy.clock import Clock, ClockType
from rclpy.duration import Duration
from rclpy.exceptions import ParameterException
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message
from std_msgs.msg import Int32

from uq_autonomy.arbitration.arbiter import Arbiter, ArbiterState, Step
from uq_autonomy.arbitration.config import Level, ModelRange
from uq_autonomy.arbitration.frame_validity import (
    DetectionSummary,
    UncertaintyValues,
    stamp_problem,
    too_many_detections,
)
from uq_autonomy.arbitration.params import NODE_NAME, PARAMETERS, config_from_values
from uq_common.node_main import node_argument_parser, run_node
from uq_common.parameters import declare_parameters, plain_value
from uq_common.rolling_stats import RollingStats
from uq_msgs.msg import AutonomyState, DetectionArray
from uq_msgs.srv import SetAutonomyOverride

# Perception is sensor-like: a best-effort reader matches both best-effort and reliable
# writers, and a stale frame is worth nothing, so a short queue (which also bounds the
# memory a flood of oversized messages can hold).
PERCEPTION_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=2,
                            reliability=ReliabilityPolicy.BEST_EFFORT,
                            durability=DurabilityPolicy.VOLATILE)
# Input commands: only the latest matters; best-effort accepts either kind of publisher.
COMMAND_IN_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                            reliability=ReliabilityPolicy.BEST_EFFORT,
                            durability=DurabilityPolicy.VOLATILE)
COMMAND_OUT_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10,
                             reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.VOLATILE)
# Latched state; a history of 10 so a burst of transitions is not overwritten before the
# readers acknowledge it. A late joiner with depth 1 gets the current state only.
STATE_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10,
                       reliability=ReliabilityPolicy.RELIABLE,
                       durability=DurabilityPolicy.TRANSIENT_LOCAL)

DETECTIONS_TOPIC = 'detections'
OPERATOR_TOPIC = 'operator/cmd_vel'
AUTONOMY_TOPIC = 'autonomy/cmd_vel'
AUTONOMY_TARGET_TOPIC = 'autonomy/target_track_id'
CMD_VEL_TOPIC = 'cmd_vel'
STATE_TOPIC = 'autonomy_state'
OVERRIDE_SERVICE = 'set_autonomy_override'


class ConfigurationError(ValueError):
    """The node's parameters are invalid; it refuses to start."""


def _twist_vector(msg: Twist) -> tuple[float, ...]:
    return (msg.linear.x, msg.linear.y, msg.linear.z,
            msg.angular.x, msg.angular.y, msg.angular.z)


def _uncertainty_values(u: Any) -> UncertaintyValues:
    return UncertaintyValues(u.gp_variance, u.mutual_information, u.predictive_entropy,
                             u.expected_entropy, u.max_probability,
                             tuple(float(v) for v in u.class_variance), u.calibrated_score)


def detection_summaries(msg: DetectionArray) -> list[DetectionSummary]:
    """The fields of each detection the arbiter checks and uses (adapter, no logic)."""
    out = []
    for d in msg.detections:
        u = d.uncertainty
        out.append(DetectionSummary(
            d.class_id, d.class_index, d.track_id, d.center_x, d.center_y, d.width, d.height,
            u.gp_variance, u.mutual_information,
            tuple(float(p) for p in d.class_probabilities), d.score, u.predictive_entropy,
            u.expected_entropy, u.max_probability, tuple(float(v) for v in u.class_variance),
            u.calibrated_score, u.track_score, u.track_views, u.track_labelled))
    return out


def frame_uncertainty(msg: DetectionArray) -> UncertaintyValues:
    """The frame-level uncertainty summary of a DetectionArray."""
    return _uncertainty_values(msg.uncertainty)


def model_range(msg: DetectionArray) -> ModelRange:
    """What a DetectionArray says about its model (adapter, no logic)."""
    return ModelRange(msg.model_id, msg.reference_variance_max, msg.ood_threshold)


# CDR encapsulation identifiers (first two bytes of a serialized ROS 2 message) and the byte
# order they announce: plain CDR and XCDR2 plain, big and little endian. For the fields read
# here (int32, uint32, string) both encodings have the same layout.
_ENCAPSULATION_BYTE_ORDER = {0x0000: '>', 0x0001: '<', 0x0006: '>', 0x0007: '<'}


def peek_detection_array(data: bytes) -> tuple[float, int] | None:
    """Stamp (s) and number of detections of a serialized DetectionArray, read without
    decoding it: O(length of header.frame_id), whatever the number of detections.

    The layout is ``std_msgs/Header`` (int32 sec, uint32 nanosec, string frame_id as a
    uint32 length plus bytes) then the ``detections`` sequence length, aligned to 4 bytes
    from the end of the 4-byte encapsulation header. Returns None when the bytes cannot be
    such a message (unknown encapsulation, truncated).
    """
    if len(data) < 20:
        return None
    order = _ENCAPSULATION_BYTE_ORDER.get(int.from_bytes(data[:2], 'big'))
    if order is None:
        return None
    sec, nanosec, name_length = struct.unpack_from(f'{order}iII', data, 4)
    offset = 16 + name_length
    offset += (-(offset - 4)) % 4
    if offset + 4 > len(data):
        return None
    (count,) = struct.unpack_from(f'{order}I', data, offset)
    return sec + nanosec * 1e-9, count


class ArbitrationNode(Node):
    """Maps perception uncertainty to a level of autonomy and arbitrates the robot command.

    Parameters
    ----------
    node_name : str
        Node name (the section of the parameters file it reads).
    **kwargs
        Passed to :class:`rclpy.node.Node` (``context``, ``parameter_overrides``, ...).

    Raises
    ------
    ConfigurationError
        When a parameter is missing, mistyped, out of range or inconsistent, or the
        parameters file names one this node does not have.
    """

    def __init__(self, node_name: str = NODE_NAME, **kwargs: Any) -> None:
        super().__init__(node_name, **kwargs)
        try:
            values = declare_parameters(self, PARAMETERS)
            config = config_from_values(values)
        except (ValueError, ParameterException) as err:
            self.get_logger().fatal(f'invalid configuration: {err}')
            self.destroy_node()
            raise ConfigurationError(str(err)) from None

        self._lock = threading.Lock()
        self._arbiter = Arbiter(config, time.monotonic())
        self._latency = RollingStats(window=4096)
        self._last_state: ArbiterState | None = None
        self._last_clock_s = -math.inf
        self._perception_messages = 0
        self._reported_problem: str | None = None

        self._cmd_pub = self.create_publisher(Twist, CMD_VEL_TOPIC, COMMAND_OUT_QOS)
        self._state_pub = self.create_publisher(AutonomyState, STATE_TOPIC, STATE_QOS)
        self._diag_pub = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        # Raw bytes: the size and stamp are checked before anything is decoded.
        self.create_subscription(DetectionArray, DETECTIONS_TOPIC, self._on_detections,
                                 PERCEPTION_QOS, raw=True)
        self.create_subscription(Twist, OPERATOR_TOPIC, self._on_operator, COMMAND_IN_QOS)
        self.create_subscription(Twist, AUTONOMY_TOPIC, self._on_autonomy, COMMAND_IN_QOS)
        self.create_subscription(Int32, AUTONOMY_TARGET_TOPIC, self._on_autonomy_target,
                                 COMMAND_IN_QOS)
        self.create_service(SetAutonomyOverride, OVERRIDE_SERVICE, self._on_override)

        # Steady-clock timers: the fail-safe must not wait for a paused or replayed /clock.
        self._steady = Clock(clock_type=ClockType.STEADY_TIME)
        self.create_timer(values['decision_period_s'], self._on_decision_tick, clock=self._steady)
        self.create_timer(values['state_publish_period_s'], self._on_heartbeat,
                          clock=self._steady)
        self.create_timer(values['diagnostics_period_s'], self._on_diagnostics,
                          clock=self._steady)
        # Watchdog restarted by every DetectionArray: it fires one deadline after the last
        # one, so the fall-back comes at the deadline plus scheduling delay; the decision
        # tick is the backstop that bounds it by deadline + one period.
        self._watchdog = self.create_timer(config.perception_deadline_s,
                                           self._on_decision_tick, clock=self._steady)

        self.add_on_set_parameters_callback(self._validate_parameters)
        self.add_post_set_parameters_callback(self._apply_parameters)

        with self._lock:
            self._publish(self._arbiter.step(time.monotonic()), force_state=True)
        self.get_logger().info(
            f'arbitrating on {config.uncertainty_signal.value} of the '
            f'{config.driving_detection.value} detection; perception deadline '
            f'{config.perception_deadline_s:g} s, decision period '
            f'{values["decision_period_s"]:g} s; starting at teleoperation')

    # -- parameters ---------------------------------------------------------------------

    def _parameter_values(self) -> dict[str, Any]:
        return {spec.name: plain_value(self.get_parameter(spec.name).value) for spec in PARAMETERS}

    def _validate_parameters(self, parameters: list[Parameter]) -> SetParametersResult:
        values = self._parameter_values()
        for parameter in parameters:
            if parameter.name in values:
                values[parameter.name] = plain_value(parameter.value)
        try:
            config_from_values(values)
        except ValueError as err:
            self.get_logger().warn(f'parameter change refused: {err}')
            return SetParametersResult(successful=False, reason=str(err))
        return SetParametersResult(successful=True)

    def _apply_parameters(self, parameters: list[Parameter]) -> None:
        config = config_from_values(self._parameter_values())
        with self._lock:
            if config.perception_deadline_s != self._arbiter.config.perception_deadline_s:
                self.destroy_timer(self._watchdog)
                self._watchdog = self.create_timer(config.perception_deadline_s,
                                                   self._on_decision_tick, clock=self._steady)
            self._publish(self._arbiter.set_config(config, time.monotonic()))
            self._report_signal_problem()
        names = ', '.join(f'{p.name}={plain_value(p.value)!r}' for p in parameters)
        self.get_logger().info(f'parameters updated: {names}')

    # -- inputs -------------------------------------------------------------------------

    def _ros_clock_s(self) -> float:
        """The node clock in seconds; resets the arbiter when it went backwards (the caller
        holds the lock)."""
        now_s = self.get_clock().now().nanoseconds * 1e-9
        if now_s < self._last_clock_s:
            reason = (f'clock jumped back {self._last_clock_s - now_s:.3f} s (bag loop or '
                      '/clock restart): state reset')
            self.get_logger().warn(reason)
            self._publish(self._arbiter.reset(time.monotonic(), reason))
        self._last_clock_s = now_s
        return now_s

    def _on_detections(self, data: bytes) -> None:
        start = time.perf_counter()
        self._perception_messages += 1
        with self._lock:
            clock_s = self._ros_clock_s()
            config = self._arbiter.config
            peeked = peek_detection_array(data)
            if peeked is None:
                problem: str | None = (f'invalid DetectionArray: {len(data)} bytes that are '
                                       'not a serialized DetectionArray')
            else:
                stamp_s, count = peeked
                problem = (too_many_detections(count, config)
                           if count > config.max_detections
                           else stamp_problem(stamp_s, clock_s, config))
        if problem is None:
            try:
                msg = deserialize_message(data, DetectionArray)
            except Exception as err:  # noqa: BLE001 - any decoding failure is a bad frame
                problem = f'invalid DetectionArray: cannot decode ({err})'
        if problem is None:
            summaries = detection_summaries(msg)
            with self._lock:
                step = self._arbiter.observe(time.monotonic(), summaries, len(msg.class_names),
                                             frame_uncertainty(msg), model_range(msg))
                self._publish(step)
                self._report_signal_problem()
                self._watchdog.reset()
        else:
            self.get_logger().warn(problem, throttle_duration_sec=2.0)
            with self._lock:
                self._publish(self._arbiter.observe_invalid(time.monotonic(), problem))
                # An invalid frame is no perception: the watchdog keeps counting from the last
                # valid one.
        self._latency.record_latency((time.perf_counter() - start) * 1e3)

    def _on_operator(self, msg: Twist) -> None:
        with self._lock:
            ok = self._arbiter.operator_command(time.monotonic(), _twist_vector(msg))
        if not ok:
            self.get_logger().warn('ignoring a non-finite operator command',
                                   throttle_duration_sec=2.0)

    def _on_autonomy_target(self, msg: Int32) -> None:
        with self._lock:
            self._arbiter.autonomy_target(time.monotonic(), msg.data)

    def _report_signal_problem(self) -> None:
        """Log a signal the loaded model cannot give once, when it appears or changes, and
        once more when it is gone (the caller holds the lock)."""
        problem = self._arbiter.signal_problem
        if problem == self._reported_problem:
            return
        if problem is not None:
            self.get_logger().error(f'{problem}; autonomy at teleoperation until then')
        else:
            self.get_logger().info(f'the uncertainty signal now suits the model '
                                   f'({self._arbiter.config.uncertainty_signal.value})')
        self._reported_problem = problem

    def _on_autonomy(self, msg: Twist) -> None:
        with self._lock:
            ok = self._arbiter.autonomy_command(time.monotonic(), _twist_vector(msg))
        if not ok:
            self.get_logger().warn('ignoring a non-finite autonomy command',
                                   throttle_duration_sec=2.0)

    def _on_override(self, request: SetAutonomyOverride.Request,
                     response: SetAutonomyOverride.Response) -> SetAutonomyOverride.Response:
        duration_s = request.duration.sec + request.duration.nanosec * 1e-9
        with self._lock:
            ok, message, step = self._arbiter.set_override(
                time.monotonic(), int(request.level), duration_s)
            self._publish(step)
        text = f'override request level={request.level} duration={duration_s:g} s: {message}'
        if ok:
            self.get_logger().info(text)
        else:
            self.get_logger().warn(text)
        response.success = ok
        response.message = message
        return response

    # -- timers -------------------------------------------------------------------------

    def _on_decision_tick(self) -> None:
        with self._lock:
            self._ros_clock_s()
            self._publish(self._arbiter.step(time.monotonic()), command=True)

    def _on_heartbeat(self) -> None:
        with self._lock:
            if self._last_state is not None:
                self._state_pub.publish(self._state_message(self._last_state))

    def _on_diagnostics(self) -> None:
        with self._lock:
            state = self._last_state
            problem = self._arbiter.signal_problem
        if state is None:
            return
        stats = self._latency.latency_summary()
        level = DiagnosticStatus.WARN if state.perception_stale else DiagnosticStatus.OK
        status = DiagnosticStatus(
            level=DiagnosticStatus.ERROR if problem is not None else level,
            name=f'{self.get_name()}: arbitration', hardware_id=self.get_fully_qualified_name(),
            message=f'{state.level.label}: {state.reason}')
        status.values = [KeyValue(key=k, value=str(v)) for k, v in (
            ('level', state.level.label), ('uncertainty', f'{state.uncertainty:.6g}'),
            ('uncertainty_signal', state.uncertainty_signal.value),
            ('signal_problem', problem or ''),
            ('perception_stale', state.perception_stale),
            ('override_active', state.override_active),
            ('decision_latency_p50_ms', f'{stats["p50_ms"]:.4f}'),
            ('decision_latency_p99_ms', f'{stats["p99_ms"]:.4f}'),
            ('decision_latency_samples', stats['count']))]
        array = DiagnosticArray(status=[status])
        array.header.stamp = self.get_clock().now().to_msg()
        self._diag_pub.publish(array)

    # -- outputs ------------------------------------------------------------------------

    def _publish(self, step: Step, command: bool = False, force_state: bool = False) -> None:
        """Publish what a decision changed; the caller holds the lock."""
        self._last_state = step.state
        if step.changed or force_state:
            self._state_pub.publish(self._state_message(step.state))
        # A refused signal is reported by _report_signal_problem, in one error line.
        refused = step.state.perception_stale and self._arbiter.signal_problem is not None
        if step.transition is not None and not refused:
            t = step.transition
            text = f'autonomy {t.from_level.label} -> {t.to_level.label}: {t.reason}'
            # rclpy ties a severity to each logging call site, hence two calls.
            if t.to_level < t.from_level:
                self.get_logger().warn(text)
            else:
                self.get_logger().info(text)
        elif step.changed and not refused:
            self.get_logger().info(
                f'autonomy {step.state.level.label} held: {step.state.reason}'
                + (' (override active)' if step.state.override_active else ''))
        if command or step.transition is not None:
            c = self._arbiter.command_to_send(time.monotonic(), step.command)
            msg = Twist()
            msg.linear.x, msg.linear.y, msg.linear.z = float(c[0]), float(c[1]), float(c[2])
            msg.angular.x, msg.angular.y, msg.angular.z = float(c[3]), float(c[4]), float(c[5])
            self._cmd_pub.publish(msg)

    def _state_message(self, state: ArbiterState) -> AutonomyState:
        now = self.get_clock().now()
        msg = AutonomyState()
        msg.header.stamp = now.to_msg()
        msg.level = int(state.level)
        msg.level_name = state.level.label
        msg.previous_level = int(state.previous_level)
        msg.uncertainty = state.uncertainty
        msg.uncertainty_signal = state.uncertainty_signal.value
        msg.up_thresholds = list(state.up_thresholds)
        msg.down_thresholds = list(state.down_thresholds)
        msg.blend_alpha = state.blend_alpha
        msg.reason = state.reason
        msg.perception_stale = state.perception_stale
        msg.override_active = state.override_active
        msg.suspect_hold = state.suspect_hold
        msg.suspect_track_id = state.suspect_track_id
        msg.track_score = state.track_score
        if state.override_expires is not None:
            # The arbiter keeps time on the monotonic clock; report the end in ROS time.
            remaining = max(0.0, state.override_expires - time.monotonic())
            msg.override_expires = (now + Duration(nanoseconds=int(remaining * 1e9))).to_msg()
        return msg

    # -- introspection (benchmarks, tests) ----------------------------------------------

    @property
    def decision_latency(self) -> RollingStats:
        """Processing time of each DetectionArray callback (conversion, decision, publish)."""
        return self._latency

    @property
    def perception_messages(self) -> int:
        """DetectionArray messages that reached the callback, valid or not."""
        return self._perception_messages

    @property
    def level(self) -> Level:
        """Level in force."""
        with self._lock:
            return self._arbiter.level


def _argument_parser() -> argparse.ArgumentParser:
    return node_argument_parser(
        NODE_NAME,
        'Shared-autonomy arbitration: perception uncertainty to a level of autonomy '
        '(teleoperation, guided, shared, assistance) and the robot command, with hysteresis '
        'and a fail-safe.', PARAMETERS, 'config/arbitration.yaml',
        f'topics: sub {DETECTIONS_TOPIC}, {OPERATOR_TOPIC}, {AUTONOMY_TOPIC}, '
        f'{AUTONOMY_TARGET_TOPIC}; '
        f'pub {CMD_VEL_TOPIC}, {STATE_TOPIC}, /diagnostics; '
        f'service {OVERRIDE_SERVICE}. Remap with --ros-args -r from:=to.')


def main(args: Sequence[str] | None = None) -> int:
    """Run the node until shut down; returns the exit code (1 for an invalid configuration)."""
    return run_node(ArbitrationNode, _argument_parser(), args)


if __name__ == '__main__':
    sys.exit(main())
