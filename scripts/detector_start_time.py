#!/usr/bin/env python3
"""Seconds from the start of a detector process to its first published detections.

    source scripts/env.sh
    python scripts/detector_start_time.py                # one cold start, then 5 warm ones
    python scripts/detector_start_time.py --warm-runs 10 --backend pytorch-cpu

Runs the detector node (``python -m uq_perception.detector_node``, what the installed
``detector_node`` runs) with ``autostart:=true`` on a private ROS domain, with a cache
folder (``UQ_CACHE_DIR``) and a ROS home of its own, while
this script publishes camera frames (``--width`` x ``--height`` rgb8 at ``--rate`` Hz,
best effort, as a camera driver does). Each start is timed from just before the process is
spawned to the arrival of its first ``DetectionArray``; the CPU time the process used until
then is read from ``/proc``, a figure a machine shared with other programs delays less. The
first start finds the cache empty (``cold``: the ONNX export is built and checked; skipped
when ``--cache-dir`` already holds one); the next ``--warm-runs`` find it filled (``warm``).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib

#: Seconds a start may take before the run gives up (a cold start exports the model).
START_TIMEOUT_S = 600.0


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a running process, from /proc."""
    with open(f'/proc/{pid}/stat', encoding='ascii') as stream:
        fields = stream.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--warm-runs', type=int, default=5,
                        help='starts with the cache filled (default 5)')
    parser.add_argument('--no-cold', action='store_true',
                        help='fill an empty cache without reporting that start')
    parser.add_argument('--backend', default='onnxruntime', help='detector backend')
    parser.add_argument('--width', type=int, default=640)
    parser.add_argument('--height', type=int, default=480)
    parser.add_argument('--rate', type=float, default=15.0, help='frames per second')
    parser.add_argument('--cache-dir', default='',
                        help='cache folder of the ONNX export (default: a new empty one, so '
                             'the first start is cold)')
    parser.add_argument('--pythonpath', default='',
                        help='put before PYTHONPATH of the detector process (the packages of '
                             'another checkout, to compare two versions on one machine)')
    args = parser.parse_args()
    if args.warm_runs < 0 or args.width < 1 or args.height < 1 or not args.rate > 0:
        parser.error('--warm-runs >= 0, --width, --height and --rate > 0')

    domain = 100 + (zlib.crc32(b'detector_start_time') + os.getpid()) % 100
    os.environ['ROS_DOMAIN_ID'] = str(domain)
    import numpy as np
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image

    from uq_msgs.msg import DetectionArray

    rclpy.init()
    node = rclpy.create_node('detector_start_time', namespace='start_time')
    first: dict[str, float] = {}
    lock = threading.Lock()

    def on_detections(_: DetectionArray) -> None:
        with lock:
            first.setdefault('at', time.monotonic())

    node.create_subscription(DetectionArray, 'detections', on_detections,
                             QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
    publisher = node.create_publisher(
        Image, 'image', QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT))
    rng = np.random.default_rng(0)
    frame = Image(height=args.height, width=args.width, encoding='rgb8', step=3 * args.width,
                  data=(rng.random((args.height, args.width, 3)) * 255).astype(np.uint8)
                  .tobytes())

    def publish() -> None:
        frame.header.stamp = node.get_clock().now().to_msg()
        publisher.publish(frame)

    node.create_timer(1.0 / args.rate, publish)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()

    home = tempfile.mkdtemp(prefix='uq_start_time_')
    env = dict(os.environ, UQ_CACHE_DIR=args.cache_dir or os.path.join(home, 'cache'),
               ROS_HOME=home)
    if args.pythonpath:
        env['PYTHONPATH'] = os.pathsep.join(filter(None, [args.pythonpath,
                                                          env.get('PYTHONPATH')]))
    # What the installed detector_node executable runs.
    command = [sys.executable, '-m', 'uq_perception.detector_node', '--ros-args',
               '-r', '__ns:=/start_time',
               '-p', 'autostart:=true', '-p', f'backend:={args.backend}',
               '--log-level', 'warn']

    def start() -> tuple[float, float]:
        with lock:
            first.clear()
        spawned = time.monotonic()
        process = subprocess.Popen(command, env=env)
        try:
            while time.monotonic() - spawned < START_TIMEOUT_S:
                with lock:
                    at = first.get('at')
                if at is not None:
                    return at - spawned, _cpu_seconds(process.pid)
                if process.poll() is not None:
                    raise RuntimeError(f'detector_node exited with {process.returncode} '
                                       'before publishing')
                time.sleep(0.005)
            raise RuntimeError(f'no detections within {START_TIMEOUT_S:g} s')
        finally:
            process.terminate()
            process.wait(timeout=60)

    result: dict[str, object] = {'backend': args.backend, 'image': f'{args.width}x{args.height}',
                                 'rate_hz': args.rate, 'cpus': os.cpu_count(),
                                 'load_average_1min': os.getloadavg()[0]}
    cache = env['UQ_CACHE_DIR']
    try:
        if not (os.path.isdir(cache) and os.listdir(cache)):
            cold = start()
            if not args.no_cold:
                result['cold'] = {'wall_s': round(cold[0], 3), 'cpu_s': round(cold[1], 3)}
        warm = [start() for _ in range(args.warm_runs)]
    except RuntimeError as exc:
        print(f'detector_start_time: {exc}', file=sys.stderr)
        return 1
    finally:
        executor.shutdown(timeout_sec=2.0)
        spinner.join(timeout=5.0)
        node.destroy_node()
        rclpy.try_shutdown()
    if warm:
        result['warm'] = {
            'wall_s': [round(w, 3) for w, _ in warm],
            'cpu_s': [round(c, 3) for _, c in warm],
            'wall_median_s': round(statistics.median(w for w, _ in warm), 3),
            'cpu_median_s': round(statistics.median(c for _, c in warm), 3)}
    print(json.dumps(result))
    return 0


if __name__ == '__main__':
    sys.exit(main())
