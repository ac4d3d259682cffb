"""``uq bench node``: end-to-end latency of the detector node against its bare forward pass.

The detector node runs as its own process (the console script, autostarted) and a benchmark
node in this process publishes frames (320x240 by default, ``--width``/``--height`` for
camera sizes) at a fixed rate over real DDS and receives the ``DetectionArray`` answers,
matched by stamp; ``delivered_ratio`` is answers over frames sent. ``--duration S`` is a
soak run: the node's RSS over time, the latency drift and the frames lost (``soak``). A
frame's latency runs from just before its publish call to the DDS reception stamp of its
answer in this process (system clock); how long this harness's own executor then takes to
run the callback is reported apart, since it is not the node's. In the same run, once a
frame's answer is in, the same model in this process runs the bare backend call (preprocess
+ forward + decode) on the same frame in what is left of its period, so the node overhead is
a ratio of two figures measured side by side, frame by frame (timed in separate phases,
the forward pass drifts by as much as the overhead itself; docs/performance.md).

Three overhead ratios are reported (overhead: latency less the forward pass, over it).
``node_overhead_ratio`` is end to end, from the harness's publish call to the answer's
arrival, so it also holds both DDS transports between the processes and the harness's own
publish call for each image (``harness_publish_p50_ms``), against the bare forward timed in
this process. Its two terms come from two processes, whose forward passes on the same
frames differ a little (``node_forward_p50_ms`` against ``forward_p50_ms``: the node's runs
after the idle time between frames, this one right after the node's answer).
``end_to_end_over_node_forward_ratio`` is the same latency against the node's own backend
calls on the same frames (the same call as the bare forward, timed in the node).
``node_side_overhead_ratio`` is what happens inside the node, timed there frame by frame:
the p50 of each frame's DDS reception stamp in the node to its DetectionArray published
less that frame's backend call, against the p50 of the backend calls (the node's
diagnostics, over its last 300 frames).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from uq_common.arguments import domain_id, positive_float, positive_int

if TYPE_CHECKING:
    from uq_perception.backends import InferenceBackend


def configure(parser: argparse.ArgumentParser) -> None:
    """Measure detector-node latency and sustained rate against the bare forward pass."""
    from uq_perception.detector_node import PARAMETERS

    defaults = {spec.name: spec.default for spec in PARAMETERS}
    choices = {spec.name: spec.choices for spec in PARAMETERS}
    parser.add_argument('--model', default=defaults['model_path'], help='detector weights')
    parser.add_argument('--gp', default=defaults['gp_path'], help='NTK-GP artefact')
    parser.add_argument('--frames', type=positive_int, default=300, help='frames per rate')
    parser.add_argument('--rate', type=positive_float, action='append',
                        help='publish rate in Hz (repeatable; default 15)')
    parser.add_argument('--threads', type=positive_int, default=1,
                        help='torch CPU threads, the same for the node and the bare forward')
    parser.add_argument('--backend', default=defaults['backend'],
                        choices=choices['backend'],
                        help='inference backend of the node and of the bare forward '
                             '(GPU backends are timed device-synchronised)')
    parser.add_argument('--engine', default='',
                        help='TensorRT engine from `uq build-engine` (backend tensorrt)')
    parser.add_argument('--width', type=positive_int, default=320, help='image width in pixels')
    parser.add_argument('--height', type=positive_int, default=240, help='image height in pixels')
    parser.add_argument('--duration', type=positive_float,
                        help='soak mode: publish for this many seconds (overrides --frames) '
                             'and report the node RSS over time, latency drift and frames lost')
    parser.add_argument('--rss-interval', type=positive_float, default=5.0,
                        help='seconds between RSS samples in soak mode')
    parser.add_argument('--domain-id', type=domain_id, default=77,
                        help='ROS_DOMAIN_ID for the benchmark (keep it private)')
    parser.set_defaults(run=run)


def _resize_nearest(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    rows = (np.arange(height) * frame.shape[0] // height).astype(np.intp)
    cols = (np.arange(width) * frame.shape[1] // width).astype(np.intp)
    return np.ascontiguousarray(frame[rows][:, cols])


def _frames(count: int, height: int = 240, width: int = 320) -> list[np.ndarray]:
    """Frames of the demo scenario (known and unknown objects on the table), rendered at
    320x240 and scaled to ``width`` x ``height`` (nearest neighbour): what matters at camera
    sizes is the bytes moved and the node's resize, not extra scene detail."""
    from uq_sim.scenario import get_scenario
    from uq_sim.scene import SceneRenderer

    scenario = get_scenario('tabletop_demo')
    frames = []
    with SceneRenderer(320, 240) as renderer:
        renderer.load(scenario.spec)
        for t in np.linspace(0.0, scenario.duration, min(count, 30), endpoint=False):
            scenario.apply(renderer, float(t), loop=False)
            frames.append(renderer.render(visibility=False).rgb)
    if (height, width) != (240, 320):
        frames = [_resize_nearest(f, height, width) for f in frames]
    return frames


def _rss_mib(pid: int) -> float | None:
    """Resident set size of a process (Linux /proc), MiB."""
    try:
        for line in Path(f'/proc/{pid}/status').read_text().splitlines():
            if line.startswith('VmRSS:'):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


class RssSampler:
    """Samples a process's RSS every ``interval`` seconds from its own thread."""

    def __init__(self, pid: int, interval: float) -> None:
        self.samples: list[tuple[float, float]] = []
        self._pid, self._interval = pid, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name='uq_bench_rss', daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            rss = _rss_mib(self._pid)
            if rss is not None:
                self.samples.append((time.monotonic(), round(rss, 1)))
            if self._stop.wait(self._interval):
                return

    def stop(self) -> list[tuple[float, float]]:
        self._stop.set()
        self._thread.join()
        return self.samples


def _soak_summary(latencies_ms: np.ndarray, rate_hz: float, rss: list[tuple[float, float]],
                  sent: int, stream_start: float) -> dict:
    """Latency drift (p99 of the last window over the first; windows of a minute, or a third
    of the run when shorter), RSS growth after warm-up (the first 10 % of the timed stream;
    node start-up and model loading come before it) and frames lost. RSS times are seconds
    from the start of the timed stream (negative: start-up)."""
    duration = sent / rate_hz
    rss = [(round(t - stream_start, 1), r) for t, r in rss]
    window = int(rate_hz * min(60.0, duration / 3.0))
    first = float(np.percentile(latencies_ms[:window], 99))
    last = float(np.percentile(latencies_ms[-window:], 99))
    warm = [r for t, r in rss if t >= 0.1 * duration] or [r for _, r in rss]
    return {
        'duration_s': duration,
        'window_s': window / rate_hz,
        'latency_p99_first_window_ms': first,
        'latency_p99_last_window_ms': last,
        'latency_p99_drift': last / first,
        'rss_mib_over_time': rss,
        'rss_growth_after_warmup_mib': (warm[-1] - warm[0]) if warm else None,
        'frames_lost': sent - len(latencies_ms),
    }


def _bare_backend(model_path: str, threads: int, warmup_frames: list[np.ndarray],
                  kind: str = 'pytorch-cpu', engine: str = '') -> InferenceBackend:
    """The node's backend in this process, warmed up; the allocator setting is the node's."""
    import torch

    from uq_perception.backends import create_backend
    from uq_perception.detector import load_detector
    from uq_perception.memory_tuning import retain_freed_memory

    torch.set_num_threads(threads)
    retain_freed_memory()
    backend = create_backend(kind, load_detector(model_path), engine_path=engine or None)
    for frame in warmup_frames:
        backend.infer(frame, 0.3, 20)
    backend.synchronize()
    return backend


def _latency_trend(latencies_ms: np.ndarray) -> float:
    """Median latency of the last third over that of the first third (1 = no growth)."""
    third = max(len(latencies_ms) // 3, 1)
    return float(np.median(latencies_ms[-third:]) / np.median(latencies_ms[:third]))


def _run_rate(rate_hz: float, frames: list[np.ndarray], count: int,
              backend: InferenceBackend) -> dict:
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from rclpy.serialization import serialize_message
    from rclpy.task import Future
    from sensor_msgs.msg import Image

    from uq_common.image_codec import rgb_to_image_fields
    from uq_msgs.msg import DetectionArray

    node = Node('uq_bench_node')
    # Send times on the system clock (ns), the clock of the DDS reception stamps.
    sent: dict[tuple[int, int], int] = {}
    # The answer is timed where DDS hands it to this process (its reception stamp), not
    # when this harness's executor gets round to the callback: that dispatch delay is the
    # harness's, not the node's (it is reported apart, as harness_dispatch_p50_ms).
    latencies: dict[tuple[int, int], float] = {}
    harness_dispatch: list[float] = []
    # How long this harness's publish call takes (conversion, serialisation, hand-over to
    # DDS): part of every end-to-end latency, paid by any camera driver, not by the node.
    harness_publish: list[float] = []
    inference_ms: list[float] = []
    forward_ms: list[float] = []
    answered = threading.Event()
    # The node's own figures split the end-to-end latency: image transport (DDS source ->
    # reception stamps), waiting for the executor (reception -> callback), callback ->
    # DetectionArray published; the rest is the answer's way back to this process.
    node_report: dict[str, str] = {}

    def on_detections(msg: DetectionArray, info: dict) -> None:
        callback_start = time.time_ns()
        key = (msg.header.stamp.sec, msg.header.stamp.nanosec)
        if key in sent:
            received = info.get('received_timestamp') or callback_start
            latencies[key] = (received - sent[key]) * 1e-6
            harness_dispatch.append((callback_start - received) * 1e-6)
            inference_ms.append(msg.inference_time_ms)
            answered.set()

    def on_diagnostics(msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name.endswith('uncertainty detector'):
                node_report.update((kv.key, kv.value) for kv in status.values)

    # rclpy passes the message info to a two-argument callback; its annotation omits that.
    node.create_subscription(DetectionArray, 'detections', on_detections,  # type: ignore[arg-type]
                             QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
    node.create_subscription(DiagnosticArray, '/diagnostics', on_diagnostics,
                             QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
    publisher = node.create_publisher(Image, 'image', QoSProfile(
        depth=1, reliability=ReliabilityPolicy.BEST_EFFORT))
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    fields = [rgb_to_image_fields(f) for f in frames]
    # Warm-up: wait until the node answers at all (discovery, model load).
    deadline = time.monotonic() + 120
    warm = 0
    while not latencies and time.monotonic() < deadline:
        msg = Image(**fields[0])
        msg.header.stamp.sec, msg.header.stamp.nanosec = 0, warm
        sent[(0, warm)] = time.time_ns()
        publisher.publish(msg)
        warm += 1
        executor.spin_once(timeout_sec=0.2)
    if not latencies:
        raise RuntimeError('the detector node never answered (is the model path right?)')
    sent.clear()
    latencies.clear()
    inference_ms.clear()
    harness_dispatch.clear()
    # Frames go out from their own thread, paced by sleeping, while this thread blocks in
    # the executor: a spin_once(timeout) loop here would build a timer and a wait set per
    # call and add its own wake-up delay to every answer it times.
    period = 1.0 / rate_hz
    finished = Future()
    timing: dict[str, float] = {}

    def publish_frames() -> None:
        try:
            # A thread's first forward passes are slow (one took 28 ms against 13): they are
            # run here untimed, not taken as the measure of what fits in a period.
            for frame in frames[:3]:
                backend.infer(frame, 0.3, 20)
            start = time.perf_counter()
            timing['stream_start'] = time.monotonic()
            for i in range(count):
                msg = Image(**fields[i % len(fields)])
                msg.header.stamp.sec, msg.header.stamp.nanosec = 1 + i, 0
                # Serialised ahead of its send time, as a camera driver has its frame ready:
                # the conversion is this harness's work, not the node's (0.17 ms here).
                serialized = serialize_message(msg)
                time.sleep(max(0.0, start + i * period - time.perf_counter()))
                answered.clear()
                sent[(1 + i, 0)] = time.time_ns()
                publisher.publish(serialized)
                harness_publish.append((time.time_ns() - sent[(1 + i, 0)]) * 1e-6)
                # Once the node has answered, the bare forward on the same frame, when it
                # fits well before the next frame is due (it must never delay the node's).
                next_due = start + (i + 1) * period
                budget = 2e-3 * float(np.median(forward_ms[-10:])) if forward_ms \
                    else period / 2
                if answered.wait(max(0.0, next_due - time.perf_counter() - budget)) and \
                        (1 + i, 0) in latencies and next_due - time.perf_counter() > budget:
                    begin = time.perf_counter()
                    backend.infer(frames[i % len(frames)], 0.3, 20)
                    backend.synchronize()  # a GPU's queued work counts to the forward
                    forward_ms.append((time.perf_counter() - begin) * 1e3)
            timing['elapsed'] = time.perf_counter() - start
            drain = time.perf_counter() + 2.0
            while time.perf_counter() < drain and len(latencies) < len(sent):
                time.sleep(0.01)
        finally:
            # Also on an error, so the executor below stops waiting.
            finished.set_result(True)

    sender = threading.Thread(target=publish_frames, name='uq_bench_frames', daemon=True)
    sender.start()
    executor.spin_until_future_complete(finished)
    sender.join()
    if 'elapsed' not in timing:
        raise RuntimeError('publishing the benchmark frames failed (see the error above)')
    elapsed = timing['elapsed']
    # One more diagnostics period, so the node's figures cover the whole run.
    report_until = time.perf_counter() + 1.5
    while time.perf_counter() < report_until:
        executor.spin_once(timeout_sec=0.05)
    executor.shutdown()
    node.destroy_node()
    ordered = np.array([latencies[k] for k in sorted(latencies)])
    if not len(ordered):
        raise RuntimeError(f'none of the {count} frames at {rate_hz} Hz was answered')
    if len(forward_ms) < len(ordered) / 2:
        # Delivery and latency still stand; the ratios to the bare forward pass do not.
        print(f'[bench node] only {len(forward_ms)} of {len(ordered)} periods at {rate_hz} Hz '
              'left room for the bare forward pass: the overhead ratios are NaN (use a lower '
              '--rate for them)', file=sys.stderr)
        forward_ms = [math.nan]
    forward_p50 = float(np.percentile(forward_ms, 50))
    latency_p50 = float(np.percentile(ordered, 50))
    node_latency_p50 = float(node_report.get('latency_p50_ms', 'nan'))
    node_forward_p50 = float(node_report.get('forward_p50_ms', 'nan'))
    node_overhead_p50 = float(node_report.get('overhead_p50_ms', 'nan'))
    return {
        'latencies_ms': ordered,
        'stream_start': timing['stream_start'],
        'rate_hz_requested': rate_hz,
        'rate_hz_published': count / elapsed,
        'rate_hz_answered': len(ordered) / elapsed,
        'frames_sent': count,
        'frames_answered': len(ordered),
        'latency_p50_ms': latency_p50,
        'latency_p99_ms': float(np.percentile(ordered, 99)),
        'latency_trend': _latency_trend(ordered),
        'harness_dispatch_p50_ms': float(np.percentile(harness_dispatch, 50)),
        'harness_publish_p50_ms': float(np.percentile(harness_publish, 50)),
        'node_inference_p50_ms': float(np.percentile(inference_ms, 50)),
        'node_latency_p50_ms': node_latency_p50,
        'node_latency_p99_ms': float(node_report.get('latency_p99_ms', 'nan')),
        'node_transport_p50_ms': float(node_report.get('transport_p50_ms', 'nan')),
        'node_dispatch_p50_ms': float(node_report.get('dispatch_p50_ms', 'nan')),
        'node_forward_p50_ms': node_forward_p50,
        'node_overhead_p50_ms': node_overhead_p50,
        'node_overhead_p99_ms': float(node_report.get('overhead_p99_ms', 'nan')),
        'node_frames_dropped': int(node_report.get('frames_dropped', -1)),
        'forward_p50_ms': forward_p50,
        'forward_p99_ms': float(np.percentile(forward_ms, 99)),
        'forward_samples': len(forward_ms),
        'latency_over_forward': latency_p50 / forward_p50,
        'node_overhead_ratio': (latency_p50 - forward_p50) / forward_p50,
        'end_to_end_over_node_forward_ratio': (latency_p50 - node_forward_p50)
        / node_forward_p50,
        'node_side_overhead_ratio': node_overhead_p50 / node_forward_p50,
    }


def run(args: argparse.Namespace) -> int:
    import rclpy

    for path in (args.model, args.gp):
        if not Path(path).is_file():
            print(f'uq bench node: {path} not found', file=sys.stderr)
            return 2
    env = os.environ | {'ROS_DOMAIN_ID': str(args.domain_id)}
    os.environ['ROS_DOMAIN_ID'] = str(args.domain_id)
    frames = _frames(args.frames, args.height, args.width)
    from uq_perception.backends import BackendUnavailableError

    try:
        backend = _bare_backend(args.model, args.threads, frames[:5], args.backend, args.engine)
    except (BackendUnavailableError, ValueError) as exc:
        print(f'uq bench node: {exc}', file=sys.stderr)
        return 2
    node_process = subprocess.Popen(
        [sys.executable, '-m', 'uq_perception.detector_node', '--ros-args',
         '-p', 'autostart:=true', '-p', f'model_path:={args.model}',
         '-p', f'gp_path:={args.gp}', '-p', f'torch_threads:={args.threads}',
         '-p', f'backend:={args.backend}',
         # rcl cannot parse an empty override ("engine_path:="): pass it only when set.
         *(['-p', f'engine_path:={args.engine}'] if args.engine else []),
         '--log-level', 'warn'], env=env)
    rclpy.init()
    try:
        for rate in args.rate or [15.0]:
            count = int(round(args.duration * rate)) if args.duration else args.frames
            print(f'[bench node] {count} frames of {args.width}x{args.height} at {rate} Hz ...',
                  file=sys.stderr)
            sampler = RssSampler(node_process.pid, args.rss_interval) if args.duration else None
            result = _run_rate(rate, frames, count, backend)
            latencies = result.pop('latencies_ms')
            if sampler is not None:
                result['soak'] = _soak_summary(latencies, rate, sampler.stop(), count,
                                               result.pop('stream_start'))
            result.pop('stream_start', None)
            result |= {
                'sustained': bool(result['frames_answered'] >= 0.95 * result['frames_sent']
                                  and result['latency_trend'] < 1.5),
                'delivered_ratio': result['frames_answered'] / result['frames_sent'],
                'image_size': f'{args.width}x{args.height}',
                'fastdds_profile': os.environ.get('FASTRTPS_DEFAULT_PROFILES_FILE'),
                'torch_threads': args.threads,
                'backend': args.backend, 'device': backend.device_name,
                'load_average_1min': os.getloadavg()[0],
            }
            print(json.dumps(result), flush=True)
    finally:
        node_process.terminate()
        try:
            # A loaded machine may take a while to unwind the node's executor and DDS.
            node_process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            print('[bench node] the detector node did not stop on SIGTERM; killed it',
                  file=sys.stderr)
            node_process.kill()
            node_process.wait(timeout=10)
        rclpy.try_shutdown()
    return 0
