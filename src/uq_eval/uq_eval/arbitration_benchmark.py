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
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

TARGET_P99_MS = 1.0
SWEEP_PERIOD_S = 4.0


def _default_params_file() -> str:
    root = Path(os.environ.get('UQ_WORKSPACE', Path.cwd()))
    return str(root / 'config' / 'arbitration.yaml')


def configure(parser: argparse.ArgumentParser) -> None:
    """Arbitration decision latency (core and node) and fail-safe reaction time, as JSON."""
    parser.add_argument('--params-file', default=_default_params_file(),
                        help='arbitration node parameters (YAML); missing file = defaults')
    parser.add_argument('--messages', type=int, default=1000,
                        help='messages for the core and node-callback latency')
    parser.add_argument('--rate', type=float, default=100.0,
                        help='DetectionArray rate for the node-callback latency (Hz)')
    parser.add_argument('--round-trips', type=int, default=200,
                        help='one-at-a-time transitions for the end-to-end latency')
    parser.add_argument('--detections', type=int, default=10, help='detections per message')
    parser.add_argument('--failsafe-trials', type=int, default=5,
                        help='repetitions of the stale-perception fall-back')
    parser.add_argument('--domain-id', type=int, default=87,
                        help='ROS_DOMAIN_ID for the node measurements (kept private)')
    parser.add_argument('--core-only', action='store_true', help='skip the ROS measurements')
    parser.add_argument('--output', help='also write the JSON to this file')
    parser.set_defaults(run=run)


def _sweep(config: Any, t: float, k: int, rng: Any) -> list[float]:
    # The most uncertain detection sweeps from 0 to 1.5 x down[0] and back; the others sit
    # below it, as in a scene with one doubtful object.
    top = 0.75 * config.thresholds.down[0] * (1.0 - math.cos(2.0 * math.pi * t / SWEEP_PERIOD_S))
    values = rng.uniform(0.3, 1.0, size=k) * top
    values[0] = top
    return [float(v) for v in values]


def _extreme(config: Any, low: bool, k: int) -> list[float]:
    th = config.thresholds
    value = 0.1 * th.up[-1] if low else 2.0 * th.down[0] + 1.0
    return [value] * k


def _summaries(values: list[float]) -> list[Any]:
    from uq_autonomy.arbiter import DetectionSummary

    return [DetectionSummary('known', 0, j, 100.0 + j, 80.0, 20.0, 20.0, v, v, 2)
            for j, v in enumerate(values)]


def _message(values: list[float]) -> Any:
    from uq_msgs.msg import Detection, DetectionArray

    msg = DetectionArray()
    msg.class_names = ['known', 'other']
    for j, v in enumerate(values):
        d = Detection()
        d.class_id, d.class_index, d.score, d.track_id = 'known', 0, 0.9, j
        d.class_probabilities = [0.8, 0.2]
        d.center_x, d.center_y, d.width, d.height = 100.0 + j, 80.0, 20.0, 20.0
        d.uncertainty.gp_variance = v
        d.uncertainty.mutual_information = v
        d.uncertainty.class_variance = [v, v]
        msg.detections.append(d)
    return msg


def _core(config: Any, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    import time

    import numpy as np

    from uq_autonomy.arbiter import Arbiter
    from uq_autonomy.arbitration_node import detection_summaries
    from uq_common.rolling_stats import latency_summary

    rng = np.random.default_rng(0)
    period = 1.0 / args.rate
    frames = [_sweep(config, i * period, args.detections, rng) for i in range(args.messages)]
    results: dict[str, dict[str, Any]] = {}
    for label, prepared in (('core', [_summaries(f) for f in frames]),
                            ('core_with_message_conversion', [_message(f) for f in frames])):
        arbiter = Arbiter(config, 0.0)
        samples = []
        transitions = 0
        for i, item in enumerate(prepared):
            now = (i + 1) * period  # simulated receipt times at the stream's rate
            start = time.perf_counter()
            if label == 'core':
                step = arbiter.observe(now, item, 2)
            else:
                step = arbiter.observe(now, detection_summaries(item), len(item.class_names))
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
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node
    from rclpy.parameter import Parameter
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    from uq_autonomy.arbitration_node import DETECTIONS_TOPIC, STATE_TOPIC, ArbitrationNode
    from uq_common.rolling_stats import latency_summary
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
    driver.create_subscription(AutonomyState, STATE_TOPIC, on_state, QoSProfile(
        depth=100, reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL))
    executor.add_node(node)
    executor.add_node(driver)
    # Spin with a flag rather than executor.spin(): Jazzy's Executor.shutdown() does not
    # wait for a spinning thread, which then trips over the destroyed guard condition.
    spinning = threading.Event()
    spinning.set()

    def spin() -> None:
        while spinning.is_set():
            executor.spin_once(timeout_sec=0.05)

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()

    def wait_for(predicate: Any, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with got_state:
            while not predicate():
                left = end - time.monotonic()
                if left <= 0:
                    return False
                got_state.wait(left)
        return True

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
            publisher.publish(_message(_sweep(config, i * period, k, rng)))
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
        publisher.publish(_message(_extreme(config, False, k)))
        wait_for(lambda: states[-1][1].level == 0, 2.0)
        round_trips = []
        lost = 0
        for i in range(args.round_trips):
            low = i % 2 == 0
            msg = _message(_extreme(config, low, k))
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
                publisher.publish(_message(_extreme(config, True, k)))
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
    finally:
        spinning.clear()
        spinner.join(timeout=5.0)
        executor.shutdown()
        node.destroy_node()
        driver.destroy_node()
        context.try_shutdown()
    return {'node_callback': callback, 'node_end_to_end_transition': end_to_end,
            'failsafe': failsafe, 'min_dwell_s_for_end_to_end_and_failsafe': 0.0}


def run(args: argparse.Namespace) -> int:
    """Run the measurements and print the JSON report; 0 when the latency target is met."""
    import json
    import platform

    from uq_autonomy.arbitration_params import (
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
    return 0 if report['meets_p99_target'] and failsafe_ok else 1
