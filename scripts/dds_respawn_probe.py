#!/usr/bin/env python3
"""How soon a camera's images reach a subscriber process that was killed and started again.

    source scripts/env.sh
    python scripts/dds_respawn_probe.py                   # shipped profile
    python scripts/dds_respawn_probe.py --profile ''      # Fast DDS defaults

Starts a publisher process (this script, ``--role pub``) sending 320x240 rgb8
``sensor_msgs/Image`` frames at ``--rate`` Hz, best-effort as a camera driver does, and a
subscriber process (``--role sub``) on a private ROS domain. Once the subscriber receives
images it is killed with SIGKILL and started again ``--respawn-delay`` seconds later, as
``ros2 launch`` respawns a node, ``--runs`` times. For each restart it times, from the kill,
the new process's first image, and how long the process itself took to subscribe (Python,
rclpy, its participant). Both processes load ``--profile`` as
``FASTRTPS_DEFAULT_PROFILES_FILE`` (default: the shipped
``config/dds/fastdds_large_images.xml``; an empty value gives Fast DDS's defaults). Prints
one JSON line. docs/dds.md explains the difference; ``test/test_dds_respawn.py`` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

WORKSPACE = Path(__file__).resolve().parents[1]
PROFILE = WORKSPACE / 'config' / 'dds' / 'fastdds_large_images.xml'
WIDTH, HEIGHT = 320, 240
TOPIC = 'probe/image_raw'


def _spin_until_signalled(node) -> None:
    """Spin until SIGINT or SIGTERM (rclpy's handlers shut the context down), quietly."""
    import rclpy
    from rclpy.executors import ExternalShutdownException

    try:
        rclpy.spin(node)
    except (ExternalShutdownException, KeyboardInterrupt):
        pass


def _subscribe() -> None:
    import rclpy
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image

    rclpy.init()
    node = rclpy.create_node('respawn_probe_sub')
    qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                     reliability=ReliabilityPolicy.BEST_EFFORT,
                     durability=DurabilityPolicy.VOLATILE)  # the detector's image QoS
    node.create_subscription(Image, TOPIC, lambda _: print('image', time.time(), flush=True),
                             qos)
    print('subscribed', time.time(), flush=True)
    _spin_until_signalled(node)


def _publish(rate: float) -> None:
    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image

    rclpy.init()
    node = rclpy.create_node('respawn_probe_pub')
    publisher = node.create_publisher(
        Image, TOPIC, QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT))
    msg = Image(width=WIDTH, height=HEIGHT, encoding='rgb8', step=WIDTH * 3,
                data=bytes(WIDTH * HEIGHT * 3))
    node.create_timer(1.0 / rate, lambda: publisher.publish(msg))
    _spin_until_signalled(node)


class _OutputLines:
    """A process's output lines, read on a thread so that a silent process cannot block
    the wait past its deadline."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)  # the process ended

    def stamp_of(self, word: str, deadline: float) -> float | None:
        """The time stamp on the next line that starts with ``word``; None if the process
        ends or the deadline passes first."""
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                return None
            parts = line.split()
            if parts and parts[0] == word:
                return float(parts[1])
        return None


def probe(runs: int, rate: float, respawn_delay: float, profile: str, domain_id: int,
          wait_s: float) -> dict:
    """Kill and restart the subscriber ``runs`` times; seconds from each kill."""
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain_id))
    # Fast DDS reads its defaults only without the variable (an empty one is not the same).
    env.pop('FASTRTPS_DEFAULT_PROFILES_FILE', None)
    if profile:
        env['FASTRTPS_DEFAULT_PROFILES_FILE'] = profile

    def start(role: str, *args: str) -> _OutputLines:
        return _OutputLines(subprocess.Popen(
            [sys.executable, __file__, '--role', role, *args], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))

    publisher = start('pub', '--rate', str(rate))
    subscriber = start('sub')
    restarts: list[dict] = []
    try:
        if subscriber.stamp_of('image', time.monotonic() + wait_s) is None:
            raise RuntimeError(f'the first subscriber received no image in {wait_s:g} s')
        for run in range(runs):
            # Kill at a different phase of the others' once-a-second transport watchdog.
            time.sleep(1.0 + 0.37 * run)
            subscriber.process.send_signal(signal.SIGKILL)
            killed = time.time()
            subscriber.process.wait()
            time.sleep(respawn_delay)
            subscriber = start('sub')
            deadline = time.monotonic() + wait_s
            subscribed = subscriber.stamp_of('subscribed', deadline)
            first = subscriber.stamp_of('image', deadline)
            restarts.append({
                'subscribed_s': None if subscribed is None else round(subscribed - killed, 3),
                'first_image_s': None if first is None else round(first - killed, 3)})
            print(f'restart {run + 1}/{runs}: {restarts[-1]}', file=sys.stderr, flush=True)
    finally:
        processes = (subscriber.process, publisher.process)
        for process in processes:
            process.send_signal(signal.SIGINT)  # a clean exit releases its shared memory
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    firsts = [r['first_image_s'] for r in restarts if r['first_image_s'] is not None]
    return {'profile': profile or 'Fast DDS defaults', 'rate_hz': rate,
            'respawn_delay_s': respawn_delay, 'restarts': restarts,
            'without_image': runs - len(firsts),
            'first_image_s': {'min': min(firsts), 'median': statistics.median(firsts),
                              'max': max(firsts)} if firsts else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--runs', type=int, default=5, help='kills and restarts')
    parser.add_argument('--rate', type=float, default=15.0, help='frames per second')
    parser.add_argument('--respawn-delay', type=float, default=0.1,
                        help='seconds between the kill and the new process')
    parser.add_argument('--profile', default=str(PROFILE),
                        help="Fast DDS XML profile of both processes ('' for the defaults)")
    parser.add_argument('--domain-id', type=int, default=78, help='private ROS domain')
    parser.add_argument('--wait', type=float, default=30.0,
                        help='seconds a subscriber waits for its first image before giving up')
    parser.add_argument('--role', choices=('sub', 'pub'), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.runs < 1 or not args.rate > 0 or not args.respawn_delay >= 0 or not args.wait > 0:
        parser.error('runs must be >= 1, rate > 0, respawn-delay >= 0 and wait > 0')
    if args.profile and not Path(args.profile).is_file():
        parser.error(f'--profile: no such file {args.profile!r}')
    if args.role == 'sub':
        _subscribe()
    elif args.role == 'pub':
        _publish(args.rate)
    else:
        try:
            report = probe(args.runs, args.rate, args.respawn_delay, args.profile,
                           args.domain_id, args.wait)
        except RuntimeError as err:
            print(f'error: {err}', file=sys.stderr)
            return 1
        print(json.dumps(report))
    return 0


if __name__ == '__main__':
    sys.exit(main())
