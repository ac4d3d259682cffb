"""``uq bench arbitration``: decision latency and fail-safe reaction time of the arbitration
node, printed as JSON.

Four latency figures, each labelled with what it covers:

* ``core``: :meth:`Arbiter.observe` alone on ready-made detection summaries;
* ``core_with_message_conversion``: the same plus reading a ``uq_msgs/DetectionArray``;
* ``node_callback``: time inside the real node's DetectionArray callback for messages
  that arrived over DDS (conversion, decision, and AutonomyState/cmd_vel publication and
  logging when the level changes);
* ``node_end_to_end_transition``: publish of a DetectionArray that changes the level to
  receipt of the AutonomyState reporting it, over DDS in one process, one message in flight
  (every such message is a transition, so this includes the transition's publication and
  log line).

The first three use the same stream: uncertainty sweeping slowly across all thresholds with
the configured dwell, so some messages cause transitions and most do not, as on a robot.

The fail-safe figure is measured on the same node: valid perception, then silence; time from
the last DetectionArray published to receipt of the AutonomyState that reports the fall-back,
against the configured ``perception_deadline_s + decision_period_s``.

The ``flood`` section: another process publishes DetectionArrays of ``--flood-detections``
detections (far above ``max_detections``) at ``--flood-rate`` Hz; the worst gap between
consecutive ``cmd_vel`` messages received meanwhile is compared with two decision periods.
It also reports how many flood messages reached the node's callback (over default Fast DDS
settings, messages this large may be dropped before they arrive; run it with the shipped
profile, ``source scripts/env.sh``, so they are delivered).
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

from uq_common.arguments import domain_id, positive_float, positive_int

TARGET_P99_MS = 1.0
SWEEP_PERIOD_S = 4.0
# Enough classes that the largest mutual information the sweep produces (2 x down[0] + 1 nats
# with the shipped thresholds) stays below ln(C), so every benchmark frame is valid.
CLASS_NAMES = ['known'] + [f'other{i}' for i in range(7)]
PROBABILITIES = (0.8,) + (0.2 / 7,) * 7
FLOOD_GAP_TARGET_PERIODS = 2.0


def _default_params_file() -> str:
    root = Path(os.environ.get('UQ_WORKSPACE', Path.cwd()))
    return str(root / 'config' / 'arbitration.yaml')


def configure(parser: argparse.ArgumentParser) -> None:
    """Arbitration decision latency (core and node) and fail-safe reaction time, as JSON."""
    parser.add_argument('--params-file', default=_default_params_file(),
                        help='arbitration node parameters (YAML); missing file = defaults')
    parser.add_argument('--messages', type=positive_int, default=1000,
                        help='messages for the core and node-callback latency')
    parser.add_argument('--rate', type=positive_float, default=100.0,
                        help='DetectionArray rate for the node-callback latency (Hz)')
    parser.add_argument('--round-trips', type=positive_int, default=200,
                        help='one-at-a-time transitions for the end-to-end latency')
    parser.add_argument('--detections', type=positive_int, default=10,
                        help='detections per message')
    parser.add_argument('--failsafe-trials', type=positive_int, default=5,
                        help='repetitions of the stale-perception fall-back')
    parser.add_argument('--domain-id', type=domain_id, default=87,
                        help='ROS_DOMAIN_ID for the node measurements (kept private)')
    parser.add_argument('--flood-detections', type=positive_int, default=20000,
                        help='detections per message of the flood (0 skips the flood)')
    parser.add_argument('--flood-rate', type=positive_float, default=20.0, help='flood rate (Hz)')
    parser.add_argument('--flood-duration', type=positive_float, default=10.0,
                        help='seconds of flood')
    parser.add_argument('--core-only', action='store_true', help='skip the ROS measurements')
    parser.add_argument('--output', help='also write the JSON to this file')
    parser.set_defaults(run=run)


def _sweep(config: Any, t: float, k: int, rng: Any) -> list[float]:
    # The most uncertain detection sweeps from 0 to 1.5 x down[0] and back; the others sit
    # below it, as in a scene with one doubtful object.
    top = 0.75 * config.thresholds.down[0] * (1.0 - math.cos(2.0 * math.pi * t / SWEEP_PERIOD_S))
    if _is_score(config):
        top = min(top, 1.0)  # a calibrated score is at most 1
    values = rng.uniform(0.3, 1.0, size=k) * top
    values[0] = top
    return [float(v) for v in values]


def _extreme(config: Any, low: bool, k: int) -> list[float]:
    th = config.thresholds
    high = 1.0 if _is_score(config) else 2.0 * th.down[0] + 1.0
    value = 0.1 * th.up[-1] if low else high
    return [value] * k


def _is_score(config: Any) -> bool:
    return config.uncertainty_signal.value == 'calibrated_score'


def _fields(config: Any, v: float) -> tuple[float, float, float]:
    """(gp_variance, mutual_information, calibrated_score): the driving one sweeps, the
    others stay valid."""
    signal = config.uncertainty_signal.value
    if signal == 'gp_variance':
        return v, 0.01, 0.5
    if signal == 'mutual_information':
        return 1e-4, v, 0.5
    return 1e-4, 0.01, v


def _summaries(config: Any, values: list[float]) -> list[Any]:
    from uq_autonomy.arbitration.frame_validity import DetectionSummary

    out = []
    for j, v in enumerate(values):
        gp, mi, score = _fields(config, v)
        out.append(DetectionSummary('known', 0, j, 100.0 + j, 80.0, 20.0, 20.0, gp, mi,
                                    PROBABILITIES, 0.9, mi, 0.0, 0.8, calibrated_score=score))
    return out


def _message(config: Any, values: list[float], stamp: Any = None) -> Any:
    from uq_msgs.msg import Detection, DetectionArray

    msg = DetectionArray()
    msg.class_names = CLASS_NAMES
    # A model with a score reference, whose range the configured raw thresholds suit.
    msg.model_id = 'arbitration-benchmark'
    msg.reference_variance_max = config.gp_variance_thresholds.down[0]
    if stamp is not None:
        msg.header.stamp = stamp
    for j, v in enumerate(values):
        gp, mi, score = _fields(config, v)
        d = Detection()
        d.class_id, d.class_index, d.score, d.track_id = 'known', 0, 0.9, j
        d.class_probabilities = list(PROBABILITIES)
        d.center_x, d.center_y, d.width, d.height = 100.0 + j, 80.0, 20.0, 20.0
        d.uncertainty.gp_variance = gp
        d.uncertainty.mutual_information = mi
        d.uncertainty.calibrated_score = score
        d.uncertainty.predictive_entropy = mi
        d.uncertainty.max_probability = 0.8
        d.uncertainty.class_variance = [gp] * len(CLASS_NAMES)
        msg.detections.append(d)
    return msg


def _flood_publisher(domain_id: int, detections: int, rate: float, duration: float,
                     ready: Any, go: Any, sent: Any) -> None:
    """Child process: publish oversized DetectionArrays at ``rate`` for ``duration`` s.

    The message is serialized once and only its stamp is rewritten in place before each
    publish, so the flood runs at its rate instead of at the speed of converting 20,000
    Python detections (as a C++ producer would).
    """
    import struct
    import time

    import rclpy
    from rclpy.node import Node
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from rclpy.serialization import serialize_message

    from uq_autonomy.arbitration_node import DETECTIONS_TOPIC
    from uq_msgs.msg import Detection, DetectionArray

    context = rclpy.Context()
    rclpy.init(args=['uq-bench-flood'], context=context, domain_id=domain_id)
    node = Node('uq_bench_arbitration_flood', context=context)
    publisher = node.create_publisher(DetectionArray, DETECTIONS_TOPIC, QoSProfile(
        depth=2, reliability=ReliabilityPolicy.BEST_EFFORT))
    msg = DetectionArray(class_names=CLASS_NAMES)
    d = Detection(class_id='known', class_index=0, score=0.9,
                  class_probabilities=list(PROBABILITIES), center_x=100.0, center_y=80.0,
                  width=20.0, height=20.0)
    msg.detections = [d] * detections
    serialized = bytearray(serialize_message(msg))
    byte_order = '<' if serialized[1] == 1 else '>'
    end = time.monotonic() + 10.0
    while publisher.get_subscription_count() == 0 and time.monotonic() < end:
        time.sleep(0.01)
    ready.set()
    go.wait(30.0)
    t0 = time.monotonic()
    i = 0
    while time.monotonic() - t0 < duration:
        sec, nanosec = divmod(node.get_clock().now().nanoseconds, 10**9)
        struct.pack_into(f'{byte_order}iI', serialized, 4, sec, nanosec)
        publisher.publish(bytes(serialized))
        i += 1
        sent.value = i
        time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
    node.destroy_node()
    context.try_shutdown()


def _core(config: Any, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    import time

    import numpy as np

    from uq_autonomy.arbitration.arbiter import Arbiter
    from uq_autonomy.arbitration_node import detection_summaries, frame_uncertainty
    from uq_common.rolling_stats import latency_summary

    rng = np.random.default_rng(0)
    period = 1.0 / args.rate
    frames = [_sweep(config, i * period, args.detections, rng) for i in range(args.messages)]
    results: dict[str, dict[str, Any]] = {}
    for label, prepared in (('core', [_summaries(config, f) for f in frames]),
                            ('core_with_message_conversion',
                             [_message(config, f) for f in frames])):
        arbiter = Arbiter(config, 0.0)
        samples = []
        transitions = 0
        for i, item in enumerate(prepared):
            now = (i + 1) * period  # simulated receipt times at the stream's rate
            start = time.perf_counter()
            if label == 'core':
                step = arbiter.observe(now, item, len(CLASS_NAMES))
            else:
                step = arbiter.observe(now, detection_summaries(item), len(item.class_names),
                                       frame_uncertainty(item))
            samples.append((time.perf_counter() - start) * 1e3)
            transitions += step.transition is not None
        results[label] = {**latency_summary(samples), 'transitions': transitions}
    results['core']['what'] = 'Arbiter.observe on ready-made detection summaries'
    results['core_with_message_conversion']['what'] = (
        'DetectionArray -> summaries + Arbiter.observe, no DDS')
    return results


def _node(config: Any, args: argparse.Namespace, params_file: str | None) -> dict[str, Any]:
    import threading
    import time

    import numpy as np
    import rclpy
    from geometry_msgs.msg import Twist
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node
    from rclpy.parameter import Parameter
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    from uq_autonomy.arbitration_node import (
        CMD_VEL_TOPIC,
        DETECTIONS_TOPIC,
        STATE_TOPIC,
        ArbitrationNode,
    )
    from uq_common.rolling_stats import latency_summary
    from uq_common.spin_thread import SpinThread
    from uq_msgs.msg import AutonomyState, DetectionArray

    context = rclpy.Context()
    ros_args = ['--ros-args', '--params-file', params_file] if params_file else []
    rclpy.init(args=['uq-bench', *ros_args], context=context, domain_id=args.domain_id)
    node = ArbitrationNode(context=context)
    driver = Node('uq_bench_arbitration_driver', context=context)
    # One thread runs every callback, so once it stops nothing is left in flight when the
    # nodes are destroyed (the node serialises its own callbacks anyway).
    executor = SingleThreadedExecutor(context=context)
    states: list[tuple[float, Any]] = []
    got_state = threading.Condition()

    def on_state(msg: AutonomyState) -> None:
        with got_state:
            states.append((time.monotonic(), msg))
            got_state.notify_all()

    publisher = driver.create_publisher(DetectionArray, DETECTIONS_TOPIC, QoSProfile(
        depth=10, reliability=ReliabilityPolicy.RELIABLE))
    cmd_times: list[float] = []
    driver.create_subscription(Twist, CMD_VEL_TOPIC, lambda _: cmd_times.append(
        time.monotonic()), QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
    driver.create_subscription(AutonomyState, STATE_TOPIC, on_state, QoSProfile(
        depth=100, reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL))
    executor.add_node(node)
    executor.add_node(driver)
    spinner = SpinThread(executor, name='bench_driver')

    def wait_for(predicate: Any, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with got_state:
            while not predicate():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                got_state.wait(left)
        return True

    def stamp() -> Any:
        return driver.get_clock().now().to_msg()

    def new_states(n: int) -> list[tuple[float, Any]]:
        with got_state:
            return list(states[n:])

    try:
        end = time.monotonic() + 10.0
        while (publisher.get_subscription_count() == 0 or not states) and time.monotonic() < end:
            time.sleep(0.01)
        rng = np.random.default_rng(1)
        k = args.detections

        # 1. Callback latency on the sweeping stream, at the configured dwell.
        node.decision_latency.clear()
        period = 1.0 / args.rate
        t0 = time.monotonic()
        for i in range(args.messages):
            publisher.publish(_message(config, _sweep(config, i * period, k, rng), stamp()))
            time.sleep(max(0.0, t0 + (i + 1) * period - time.monotonic()))
        end = time.monotonic() + 5.0
        while (len(node.decision_latency.latency_samples()) < args.messages
               and time.monotonic() < end):
            time.sleep(0.01)
        callback = {**node.decision_latency.latency_summary(), 'sent': args.messages,
                    'rate_hz': args.rate,
                    'what': 'inside the node DetectionArray callback, messages received over '
                            'DDS (conversion, decision, publication and log of any change)'}

        # 2. End-to-end per transition: zero dwell (set at run time, as an operator would),
        # alternate a certain and an uncertain frame, one in flight at a time.
        node.set_parameters([Parameter('min_dwell_s', value=0.0)])
        publisher.publish(_message(config, _extreme(config, False, k), stamp()))
        wait_for(lambda: states[-1][1].level == 0, 2.0)
        round_trips = []
        lost = 0
        for i in range(args.round_trips):
            low = i % 2 == 0
            msg = _message(config, _extreme(config, low, k), stamp())
            with got_state:
                n_before = len(states)
            start = time.monotonic()
            publisher.publish(msg)
            expected = 1 if low else 0
            if wait_for(lambda n=n_before, e=expected: any(
                    s.level == e for _, s in states[n:]), 1.0):
                received = next(t for t, s in new_states(n_before) if s.level == expected)
                round_trips.append((received - start) * 1e3)
            else:
                lost += 1
        end_to_end = {**latency_summary(round_trips), 'lost': lost,
                      'what': 'DetectionArray publish -> AutonomyState receipt for a message '
                              'that changes the level, over DDS, one process, one in flight'}

        # 3. Fail-safe: valid certain frames (the level climbs, zero dwell), then silence.
        deadline = float(node.get_parameter('perception_deadline_s').value)
        decision_period = float(node.get_parameter('decision_period_s').value)
        trials: list[dict[str, Any]] = []
        for _ in range(args.failsafe_trials):
            with got_state:
                n_before = len(states)
            last = time.monotonic()
            for _ in range(10):
                last = time.monotonic()
                publisher.publish(_message(config, _extreme(config, True, k), stamp()))
                time.sleep(min(0.02, 0.5 * deadline))
            wait_for(lambda n=n_before, t_last=last: any(
                s.perception_stale and t > t_last for t, s in states[n:]), deadline + 5.0)
            after = new_states(n_before)
            first_stale = next((t for t, s in after if s.perception_stale and t > last), None)
            fresh = [s for t, s in after if not s.perception_stale and t <= last]
            trials.append({
                'reaction_s': None if first_stale is None else first_stale - last,
                'level_before': int(fresh[-1].level) if fresh else None})
        measured: list[float] = [t['reaction_s'] for t in trials if t['reaction_s'] is not None]
        bound = deadline + decision_period
        failsafe = {
            'perception_deadline_s': deadline, 'decision_period_s': decision_period,
            'bound_s': bound, 'trials': trials,
            'max_s': max(measured) if measured else None,
            'mean_s': float(np.mean(measured)) if measured else None,
            'within_bound': len(measured) == len(trials) > 0 and max(measured) <= bound,
            'what': 'last DetectionArray published -> AutonomyState(level 0, perception_stale) '
                    'received; bound = deadline + one decision period',
        }
        flood = None
        if args.flood_detections > 0:
            import multiprocessing

            def worst_gap(first: int, start: float, stop: float) -> tuple[int, Any]:
                times = [t for t in cmd_times[first:] if start <= t <= stop]
                return len(times), (np.diff(times) if len(times) > 1 else np.array([math.inf]))

            spawn = multiprocessing.get_context('spawn')
            ready, go = spawn.Event(), spawn.Event()
            flood_sent = spawn.Value('i', 0)
            child = spawn.Process(target=_flood_publisher, args=(
                args.domain_id, args.flood_detections, args.flood_rate, args.flood_duration,
                ready, go, flood_sent))
            child.start()
            ready.wait(120.0)
            # Control: the same machine, the same length of time, no flood. On a loaded
            # machine the gap is set by the load; the flood figure is read against this one.
            first_cmd, start = len(cmd_times), time.monotonic()
            time.sleep(args.flood_duration)
            baseline_count, baseline_gaps = worst_gap(first_cmd, start, time.monotonic())
            received_before = node.perception_messages
            with got_state:
                n_before = len(states)
            first_cmd = len(cmd_times)
            start = time.monotonic()
            go.set()
            child.join(args.flood_duration + 60.0)
            stop = time.monotonic()
            count, gaps = worst_gap(first_cmd, start, stop)
            reasons = sorted({s.reason for _, s in new_states(n_before)})
            worst = float(np.max(gaps))
            flood = {
                'detections_per_message': args.flood_detections, 'rate_hz': args.flood_rate,
                'duration_s': round(stop - start, 3),
                'sent': int(flood_sent.value),
                'received_by_node': node.perception_messages - received_before,
                'max_detections': int(node.get_parameter('max_detections').value),
                'cmd_vel_received': count,
                'worst_cmd_vel_gap_s': worst,
                'p99_cmd_vel_gap_s': float(np.percentile(gaps, 99)),
                'baseline_without_flood': {
                    'cmd_vel_received': baseline_count,
                    'worst_cmd_vel_gap_s': float(np.max(baseline_gaps)),
                    'p99_cmd_vel_gap_s': float(np.percentile(baseline_gaps, 99))},
                'decision_period_s': decision_period,
                'target_gap_s': FLOOD_GAP_TARGET_PERIODS * decision_period,
                'meets_target': worst <= FLOOD_GAP_TARGET_PERIODS * decision_period,
                'autonomy_reasons': reasons[:5],
                'what': 'worst gap between cmd_vel messages received while another process '
                        'publishes oversized DetectionArrays (best-effort)',
            }
    finally:
        spinner.stop()
        executor.shutdown()
        node.destroy_node()
        driver.destroy_node()
        context.try_shutdown()
    return {'node_callback': callback, 'node_end_to_end_transition': end_to_end,
            'failsafe': failsafe, 'flood': flood, 'min_dwell_s_for_end_to_end_and_failsafe': 0.0}


def run(args: argparse.Namespace) -> int:
    """Run the measurements and print the JSON report; 0 when the latency target is met."""
    import json
    import platform

    from uq_autonomy.arbitration.params import (
        config_from_values,
        default_values,
        load_parameters_file,
    )

    params_file: str | None = args.params_file
    values = default_values()
    if params_file and Path(params_file).is_file():
        values.update(load_parameters_file(params_file))
    else:
        params_file = None
    config = config_from_values(values)
    latency = _core(config, args)
    report: dict[str, Any] = {
        'benchmark': 'arbitration',
        'params_file': params_file,
        'uncertainty_signal': config.uncertainty_signal.value,
        'detections_per_message': args.detections,
        'machine': {'cpus': os.cpu_count(), 'python': platform.python_version(),
                    'processor': platform.machine(),
                    # Latency tails on a shared machine follow its load; report it.
                    'load_average_1min': os.getloadavg()[0]},
        'target_p99_ms': TARGET_P99_MS,
    }
    if not args.core_only:
        node = _node(config, args, params_file)
        latency['node_callback'] = node.pop('node_callback')
        latency['node_end_to_end_transition'] = node.pop('node_end_to_end_transition')
        report['min_dwell_s_for_end_to_end_and_failsafe'] = node.pop(
            'min_dwell_s_for_end_to_end_and_failsafe')
        report['failsafe'] = node.pop('failsafe')
        report['flood'] = node.pop('flood')
    report['decision_latency'] = latency
    # The target is judged on what the node itself spends per message (DDS delivery and
    # thread hand-offs are outside the arbitration node's control).
    judged = 'node_callback' if 'node_callback' in latency else 'core_with_message_conversion'
    report['p99_target_judged_on'] = judged
    report['meets_p99_target'] = bool(latency[judged]['p99_ms'] <= TARGET_P99_MS)
    text = json.dumps(report, indent=2, default=float)
    print(text)
    if args.output:
        Path(args.output).write_text(text + '\n', encoding='utf-8')
    failsafe_ok = report.get('failsafe', {}).get('within_bound', True)
    flood_ok = (report.get('flood') or {}).get('meets_target', True)
    return 0 if report['meets_p99_target'] and failsafe_ok and flood_ok else 1
