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
``frames_lost`` counts the frames sent but never answered; ``node_frames_dropped`` those the
node's depth-1 queue overwrote at that rate (its diagnostics).

Several backends (``--backend`` repeated) run side by side in one run: one detector node
per backend, in a namespace of its own (:func:`node_namespace`, :func:`node_name`), all of
them loaded and answering before any frame is timed. At each rate the frames go in
``--rounds`` blocks per backend, the backends taking turns block by block on the same
frames, the order reversed every other round, so load that drifts during the run weighs on
each alike. After each backend's JSON line comes a comparison line: every figure of
:data:`COMPARED` over the first backend's (``over_reference``; below 1: faster), and each
backend's frames sent, answered, lost and dropped.

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

``node_stages`` splits a frame by stage, each timed in the node (p50 and p99 over its last
300 frames; ``uq_perception.detector_node.FRAME_STAGES``): the transport from the
publisher's DDS source stamp to the node taking the image, taking and converting it,
resizing and normalising, the network's forward pass and decode, the GP, duplicate
suppression and tracking, building the DetectionArray and publishing it.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from uq_common.arguments import domain_id, positive_float, positive_int

if TYPE_CHECKING:
    from uq_perception.runtime.backends import InferenceBackend

#: Blocks of frames per backend and rate when several backends take turns.
DEFAULT_ROUNDS = 4


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
                        help='CPU threads (torch and ONNX Runtime), the same for the node and '
                             'the bare forward')
    parser.add_argument('--backend', action='append', choices=choices['backend'],
                        help='inference backend of the node and of the bare forward (default '
                             f'{defaults["backend"]}, the node\'s; GPU backends are timed '
                             'device-synchronised). Repeat it to run several side by side: '
                             'one node per backend, taking turns block by block, with each '
                             'figure\'s ratio to the first backend\'s')
    parser.add_argument('--rounds', type=positive_int,
                        help='blocks of frames per backend and rate, the backends taking turns '
                             f'(default {DEFAULT_ROUNDS} with several backends, else 1; a soak '
                             'run is one block)')
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
    """The node's backend in this process, warmed up; the allocator setting and the threads
    (torch and ONNX Runtime) are the node's."""
    import torch

    from uq_perception.detectors.centernet import load_detector
    from uq_perception.runtime.backends import create_backend
    from uq_perception.runtime.memory_tuning import retain_freed_memory

    torch.set_num_threads(threads)
    retain_freed_memory()
    backend = create_backend(kind, load_detector(model_path), engine_path=engine or None,
                             onnx_threads=threads)
    for frame in warmup_frames:
        backend.infer(frame, 0.3, 20)
    backend.synchronize()
    return backend


def _latency_trend(latencies_ms: np.ndarray) -> float:
    """Median latency of the last third over that of the first third (1 = no growth)."""
    third = max(len(latencies_ms) // 3, 1)
    return float(np.median(latencies_ms[-third:]) / np.median(latencies_ms[:third]))


def node_name(backend: str) -> str:
    """The name of the detector node that runs ``backend`` (one node per backend, each in
    its own namespace: see :func:`node_namespace`)."""
    return 'detector_node_' + backend.replace('-', '_')


def node_namespace(backend: str) -> str:
    """The namespace of the detector node that runs ``backend``: its image and detections
    topics are apart from every other node's."""
    return '/uq_bench_' + backend.replace('-', '_')


def block_sizes(count: int, rounds: int) -> list[int]:
    """``count`` frames in ``rounds`` blocks as equal as can be (the first ones larger)."""
    base, extra = divmod(count, rounds)
    return [base + (1 if i < extra else 0) for i in range(rounds)]


def turn_order(backends: list[str], round_index: int) -> list[str]:
    """The backends' order in round ``round_index``: as given, reversed every other round,
    so a drift of the machine's load weighs on each backend alike."""
    return list(backends) if round_index % 2 == 0 else list(reversed(backends))


@dataclass
class _Block:
    """One stretch of frames sent to one detector node, and what came back."""

    sent: dict[tuple[int, int], int] = field(default_factory=dict)  # stamp -> send time, ns
    latencies: dict[tuple[int, int], float] = field(default_factory=dict)
    harness_dispatch: list[float] = field(default_factory=list)
    harness_publish: list[float] = field(default_factory=list)
    inference_ms: list[float] = field(default_factory=list)
    forward_ms: list[float] = field(default_factory=list)
    answered: threading.Event = field(default_factory=threading.Event)
    elapsed: float = math.nan
    stream_start: float = math.nan


class _DetectorClient:
    """This harness's side of one detector node: a publisher of frames on the node's image
    topic, the node's DetectionArrays (timed into the block being recorded) and its
    diagnostics."""

    def __init__(self, backend: str) -> None:
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.node import Node
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image

        from uq_msgs.msg import DetectionArray

        self.backend = backend
        self.node = Node('uq_bench_node', namespace=node_namespace(backend))
        self.block: _Block | None = None
        # The node's own figures split the end-to-end latency: image transport (DDS source
        # -> reception stamps), waiting for the executor (reception -> callback), callback ->
        # DetectionArray published; the rest is the answer's way back to this process.
        self.report: dict[str, str] = {}
        self._status_name = f'{node_name(backend)}: uncertainty detector'
        # rclpy passes the message info to a two-argument callback; its annotation omits it.
        self.node.create_subscription(
            DetectionArray, 'detections', self._on_detections,  # type: ignore[arg-type]
            QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
        self.node.create_subscription(DiagnosticArray, '/diagnostics', self._on_diagnostics,
                                      QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
        self.publisher = self.node.create_publisher(Image, 'image', QoSProfile(
            depth=1, reliability=ReliabilityPolicy.BEST_EFFORT))

    def _on_detections(self, msg: Any, info: dict) -> None:
        callback_start = time.time_ns()
        block = self.block
        key = (msg.header.stamp.sec, msg.header.stamp.nanosec)
        if block is None or key not in block.sent:
            return
        # The answer is timed where DDS hands it to this process (its reception stamp), not
        # when this harness's executor gets round to the callback: that dispatch delay is
        # the harness's, not the node's (reported apart, as harness_dispatch_p50_ms).
        received = info.get('received_timestamp') or callback_start
        block.latencies[key] = (received - block.sent[key]) * 1e-6
        block.harness_dispatch.append((callback_start - received) * 1e-6)
        block.inference_ms.append(msg.inference_time_ms)
        block.answered.set()

    def _on_diagnostics(self, msg: Any) -> None:
        for status in msg.status:
            if status.name == self._status_name:
                self.report.update((kv.key, kv.value) for kv in status.values)


class _Harness:
    """Every detector node's client on one executor, spun by the thread that calls
    :meth:`await_answer` and :meth:`run_block`, while frames go out from a thread of their
    own; frame stamps are unique over the whole run."""

    def __init__(self, backends: list[str]) -> None:
        from rclpy.executors import SingleThreadedExecutor

        self.clients = {backend: _DetectorClient(backend) for backend in backends}
        self.executor = SingleThreadedExecutor()
        for client in self.clients.values():
            self.executor.add_node(client.node)
        self._next_stamp = 1

    def _stamps(self, count: int) -> int:
        first = self._next_stamp
        self._next_stamp += count
        return first

    def await_answer(self, backend: str, frame: np.ndarray, timeout_s: float = 120.0) -> None:
        """Publish ``frame`` to ``backend``'s node until it answers (discovery, model load)."""
        from sensor_msgs.msg import Image

        from uq_common.image_codec import rgb_to_image_fields

        client = self.clients[backend]
        client.block = block = _Block()
        deadline = time.monotonic() + timeout_s
        while not block.latencies and time.monotonic() < deadline:
            msg = Image(**rgb_to_image_fields(frame))
            msg.header.stamp.sec = self._stamps(1)
            block.sent[(msg.header.stamp.sec, 0)] = time.time_ns()
            client.publisher.publish(msg)
            self.executor.spin_once(timeout_sec=0.2)
        client.block = None
        if not block.latencies:
            raise RuntimeError(f'the detector node of backend {backend} never answered (is '
                               'the model path right?)')

    def run_block(self, backend: str, rate_hz: float, frames: list[np.ndarray],
                  first_frame: int, count: int, bare: InferenceBackend) -> _Block:
        """``count`` frames to ``backend``'s node at ``rate_hz``, each answer timed, and the
        bare backend call on the same frame where the period leaves room for it."""
        from rclpy.serialization import serialize_message
        from rclpy.task import Future
        from sensor_msgs.msg import Image

        from uq_common.image_codec import rgb_to_image_fields

        client = self.clients[backend]
        self.await_answer(backend, frames[first_frame % len(frames)])
        client.block = block = _Block()
        first_stamp = self._stamps(count)
        # Frames go out from their own thread, paced by sleeping, while this thread blocks
        # in the executor: a spin_once(timeout) loop here would build a timer and a wait set
        # per call and add its own wake-up delay to every answer it times.
        period = 1.0 / rate_hz
        finished = Future()
        forward_ms = block.forward_ms

        def publish_frames() -> None:
            try:
                # A thread's first forward passes are slow (one took 28 ms against 13): they
                # are run here untimed, not taken as the measure of what fits in a period.
                for frame in frames[:3]:
                    bare.infer(frame, 0.3, 20)
                start = time.perf_counter()
                block.stream_start = time.monotonic()
                for i in range(count):
                    index = (first_frame + i) % len(frames)
                    msg = Image(**rgb_to_image_fields(frames[index]))
                    key = (first_stamp + i, 0)
                    msg.header.stamp.sec = key[0]
                    # Serialised ahead of its send time, as a camera driver has its frame
                    # ready: the conversion is this harness's work, not the node's.
                    serialized = serialize_message(msg)
                    time.sleep(max(0.0, start + i * period - time.perf_counter()))
                    block.answered.clear()
                    block.sent[key] = time.time_ns()
                    client.publisher.publish(serialized)
                    block.harness_publish.append((time.time_ns() - block.sent[key]) * 1e-6)
                    # Once the node has answered, the bare forward on the same frame, when
                    # it fits well before the next frame is due (it must never delay the
                    # node's).
                    next_due = start + (i + 1) * period
                    budget = 2e-3 * float(np.median(forward_ms[-10:])) if forward_ms \
                        else period / 2
                    if block.answered.wait(max(0.0, next_due - time.perf_counter() - budget)) \
                            and key in block.latencies \
                            and next_due - time.perf_counter() > budget:
                        begin = time.perf_counter()
                        bare.infer(frames[index], 0.3, 20)
                        bare.synchronize()  # a GPU's queued work counts to the forward
                        forward_ms.append((time.perf_counter() - begin) * 1e3)
                # The block lasts until its last frame's period ends: the rates of short
                # blocks are then not counted over one period too few.
                time.sleep(max(0.0, start + count * period - time.perf_counter()))
                block.elapsed = time.perf_counter() - start
                drain = time.perf_counter() + 2.0
                while time.perf_counter() < drain and len(block.latencies) < len(block.sent):
                    time.sleep(0.01)
            finally:
                # Also on an error, so the executor below stops waiting.
                finished.set_result(True)

        sender = threading.Thread(target=publish_frames, name='uq_bench_frames', daemon=True)
        sender.start()
        self.executor.spin_until_future_complete(finished)
        sender.join()
        client.block = None
        if math.isnan(block.elapsed):
            raise RuntimeError('publishing the benchmark frames failed (see the error above)')
        return block

    def collect_reports(self, seconds: float = 1.5) -> None:
        """Spin for a diagnostics period and more, so each node's figures cover its frames."""
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            self.executor.spin_once(timeout_sec=0.05)

    def close(self) -> None:
        self.executor.shutdown()
        for client in self.clients.values():
            client.node.destroy_node()


def summarise_blocks(blocks: list[_Block], rate_hz: float, report: dict[str, str],
                     dropped_before: int) -> dict:
    """One backend's figures at one rate from its blocks, and its node's diagnostics
    (``dropped_before``: the node's dropped-frame count before these blocks)."""
    latencies = [b.latencies[k] for b in blocks for k in sorted(b.latencies)]
    ordered = np.array(latencies)
    sent = sum(len(b.sent) for b in blocks)
    elapsed = sum(b.elapsed for b in blocks)
    if not len(ordered):
        raise RuntimeError(f'none of the {sent} frames at {rate_hz} Hz was answered')
    forward_ms = [f for b in blocks for f in b.forward_ms]
    if len(forward_ms) < len(ordered) / 2:
        # Delivery and latency still stand; the ratios to the bare forward pass do not.
        print(f'[bench node] only {len(forward_ms)} of {len(ordered)} periods at {rate_hz} Hz '
              'left room for the bare forward pass: the overhead ratios are NaN (use a lower '
              '--rate for them)', file=sys.stderr)
        forward_ms = [math.nan]
    forward_p50 = float(np.percentile(forward_ms, 50))
    latency_p50 = float(np.percentile(ordered, 50))
    node_forward_p50 = float(report.get('forward_p50_ms', 'nan'))
    node_overhead_p50 = float(report.get('overhead_p50_ms', 'nan'))
    dropped = int(report.get('frames_dropped', -1))
    return {
        'latencies_ms': ordered,
        'stream_start': blocks[0].stream_start,
        'rate_hz_requested': rate_hz,
        'rate_hz_published': sent / elapsed,
        'rate_hz_answered': len(ordered) / elapsed,
        'frames_sent': sent,
        'frames_answered': len(ordered),
        'frames_lost': sent - len(ordered),
        'latency_p50_ms': latency_p50,
        'latency_p99_ms': float(np.percentile(ordered, 99)),
        'latency_trend': _latency_trend(ordered),
        'harness_dispatch_p50_ms': float(np.percentile(
            [d for b in blocks for d in b.harness_dispatch], 50)),
        'harness_publish_p50_ms': float(np.percentile(
            [d for b in blocks for d in b.harness_publish], 50)),
        'node_inference_p50_ms': float(np.percentile(
            [d for b in blocks for d in b.inference_ms], 50)),
        'node_latency_p50_ms': float(report.get('latency_p50_ms', 'nan')),
        'node_latency_p99_ms': float(report.get('latency_p99_ms', 'nan')),
        'node_transport_p50_ms': float(report.get('transport_p50_ms', 'nan')),
        'node_dispatch_p50_ms': float(report.get('dispatch_p50_ms', 'nan')),
        'node_forward_p50_ms': node_forward_p50,
        'node_overhead_p50_ms': node_overhead_p50,
        'node_overhead_p99_ms': float(report.get('overhead_p99_ms', 'nan')),
        'node_frames_dropped': dropped - dropped_before if dropped >= 0 else -1,
        'node_backend': report.get('backend', ''),
        'forward_p50_ms': forward_p50,
        'forward_p99_ms': float(np.percentile(forward_ms, 99)),
        'forward_samples': len(forward_ms) if not math.isnan(forward_ms[0]) else 0,
        'latency_over_forward': latency_p50 / forward_p50,
        'node_overhead_ratio': (latency_p50 - forward_p50) / forward_p50,
        'end_to_end_over_node_forward_ratio': (latency_p50 - node_forward_p50)
        / node_forward_p50,
        'node_side_overhead_ratio': node_overhead_p50 / node_forward_p50,
        'node_stages': node_stages(report),
    }


def node_stages(report: dict[str, str]) -> dict[str, dict[str, float]]:
    """p50 and p99 (ms) of each stage of a frame as the node timed it (its diagnostics,
    over its last 300 frames; NaN for a stage it did not report)."""
    from uq_perception.detector_node import FRAME_STAGES

    return {name: {f'{q}_ms': float(report.get(f'stage_{name}_{q}_ms', 'nan'))
                   for q in ('p50', 'p99')} for name in FRAME_STAGES}


#: Figures compared between backends, each as its ratio to the reference backend's.
COMPARED = ('latency_p50_ms', 'latency_p99_ms', 'node_forward_p50_ms', 'forward_p50_ms')


def compare_backends(results: dict[str, dict]) -> dict:
    """The backends of one rate side by side: for each figure of :data:`COMPARED`, every
    backend's value over the first backend's (the reference; below 1: faster), and each
    backend's frames sent, lost and dropped."""
    reference, *_ = results
    base = results[reference]
    return {
        'reference_backend': reference,
        'over_reference': {
            backend: {name.removesuffix('_ms'): result[name] / base[name] for name in COMPARED}
            for backend, result in results.items() if backend != reference},
        'figures': {backend: {name: result[name] for name in (
            *COMPARED, 'frames_sent', 'frames_answered', 'frames_lost', 'node_frames_dropped',
            'sustained', 'node_backend')} for backend, result in results.items()},
    }


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        # A loaded machine may take a while to unwind the node's executor and DDS.
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        print('[bench node] a detector node did not stop on SIGTERM; killed it',
              file=sys.stderr)
        process.kill()
        process.wait(timeout=10)


def _start_node(args: argparse.Namespace, backend: str, env: dict[str, str]
                ) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, '-m', 'uq_perception.detector_node', '--ros-args',
         '-r', f'__node:={node_name(backend)}', '-r', f'__ns:={node_namespace(backend)}',
         '-p', 'autostart:=true', '-p', f'model_path:={args.model}',
         '-p', f'gp_path:={args.gp}', '-p', f'torch_threads:={args.threads}',
         '-p', f'onnx_threads:={args.threads}', '-p', f'backend:={backend}',
         # rcl cannot parse an empty override ("engine_path:="): pass it only when set.
         *(['-p', f'engine_path:={args.engine}'] if args.engine else []),
         '--log-level', 'warn'], env=env)


def run(args: argparse.Namespace) -> int:
    import rclpy

    from uq_perception.runtime.backends import DEFAULT_CPU_BACKEND

    # The node's default backend when none is given; each backend once.
    backends = list(dict.fromkeys(args.backend or [DEFAULT_CPU_BACKEND.value]))
    if args.duration and len(backends) > 1:
        print('uq bench node: --duration (soak) runs one backend; give one --backend',
              file=sys.stderr)
        return 2
    rounds = 1 if args.duration else args.rounds or (DEFAULT_ROUNDS if len(backends) > 1
                                                     else 1)
    for path in (args.model, args.gp):
        if not Path(path).is_file():
            print(f'uq bench node: {path} not found', file=sys.stderr)
            return 2
    env = os.environ | {'ROS_DOMAIN_ID': str(args.domain_id)}
    os.environ['ROS_DOMAIN_ID'] = str(args.domain_id)
    frames = _frames(args.frames, args.height, args.width)
    from uq_perception.runtime.backends import BackendUnavailableError
    from uq_perception.runtime.onnx_export import OnnxExportError
    from uq_perception.runtime.onnx_runtime import OnnxRuntimeUnavailableError

    try:
        bare = {backend: _bare_backend(args.model, args.threads, frames[:5], backend,
                                       args.engine) for backend in backends}
    except (BackendUnavailableError, OnnxRuntimeUnavailableError, OnnxExportError,
            ValueError) as exc:
        print(f'uq bench node: {" ".join(str(exc).split())}', file=sys.stderr)
        return 2
    # Started after the bare backends: the onnxruntime node finds the export they cached.
    processes = {backend: _start_node(args, backend, env) for backend in backends}
    rclpy.init()
    harness: _Harness | None = None
    try:
        harness = _Harness(backends)
        # Every node loaded and answering before any frame is timed.
        for backend in backends:
            harness.await_answer(backend, frames[0])
        dropped_before = dict.fromkeys(backends, 0)
        for rate in args.rate or [15.0]:
            count = int(round(args.duration * rate)) if args.duration else args.frames
            print(f'[bench node] {count} frames of {args.width}x{args.height} at {rate} Hz '
                  f'per backend ({", ".join(backends)}; {rounds} round(s)) ...',
                  file=sys.stderr)
            sampler = RssSampler(processes[backends[0]].pid, args.rss_interval) \
                if args.duration else None
            blocks: dict[str, list[_Block]] = {backend: [] for backend in backends}
            first_frame = 0
            for round_index, size in enumerate(block_sizes(count, rounds)):
                for backend in turn_order(backends, round_index):
                    if size:
                        blocks[backend].append(harness.run_block(
                            backend, rate, frames, first_frame, size, bare[backend]))
                first_frame += size
            harness.collect_reports()
            results = {}
            for backend in backends:
                report = harness.clients[backend].report
                result = summarise_blocks(blocks[backend], rate, report,
                                          dropped_before[backend])
                dropped_before[backend] = int(report.get('frames_dropped', 0))
                latencies = result.pop('latencies_ms')
                stream_start = result.pop('stream_start')
                if sampler is not None:
                    result['soak'] = _soak_summary(latencies, rate, sampler.stop(), count,
                                                   stream_start)
                result |= {
                    'sustained': bool(result['frames_answered'] >= 0.95 * result['frames_sent']
                                      and result['latency_trend'] < 1.5),
                    'delivered_ratio': result['frames_answered'] / result['frames_sent'],
                    'image_size': f'{args.width}x{args.height}',
                    'fastdds_profile': os.environ.get('FASTRTPS_DEFAULT_PROFILES_FILE'),
                    'torch_threads': args.threads, 'onnx_threads': args.threads,
                    'backend': backend, 'device': bare[backend].device_name,
                    'rounds': rounds,
                    'load_average_1min': os.getloadavg()[0],
                }
                results[backend] = result
                print(json.dumps(result), flush=True)
            if len(backends) > 1:
                print(json.dumps({
                    'comparison': True, 'rate_hz_requested': rate,
                    'image_size': f'{args.width}x{args.height}', 'rounds': rounds,
                    'threads': args.threads, **compare_backends(results),
                    'load_average_1min': os.getloadavg()[0]}), flush=True)
    except RuntimeError as exc:
        print(f'uq bench node: {exc}', file=sys.stderr)
        return 1
    finally:
        if harness is not None:
            harness.close()
        for process in processes.values():
            _stop(process)
        rclpy.try_shutdown()
    return 0
