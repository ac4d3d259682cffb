"""``uq replay``: play a bag over DDS with its original timing and record the nodes' outputs.

The player publishes every message of the bag (or of ``--topics``) on its topic, as the
bag's serialised bytes, at its log time scaled by ``--rate`` from ``--start-offset``
seconds into the bag; with ``--clock`` it also publishes ``/clock`` (the log time of each
message sent, and every 10 ms in between), for nodes run with ``use_sim_time``.

With ``--record OUT`` a recorder subscribes (reliable, deep queues) to the running nodes'
outputs (``detections``, ``autonomy_state``, ``help_request``, ``cmd_vel``) and to the
played image topic, and writes what it receives into a new MCAP bag with the receive
time as log time. ``uq eval bag OUT`` then evaluates the recorded images offline and
reports the node's real latencies: from the image's receipt to its DetectionArray's
receipt, both on the recorder's clock.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import threading
import time
from pathlib import Path
from typing import Any

from uq_common.arguments import non_negative_float, positive_float

OUTPUT_TOPICS = {
    'detections': 'uq_msgs/msg/DetectionArray',
    'autonomy_state': 'uq_msgs/msg/AutonomyState',
    'help_request': 'uq_msgs/msg/HelpRequest',
    'cmd_vel': 'geometry_msgs/msg/Twist',
}
_CLOCK_PERIOD_S = 0.01
# Before the first message: time for the other nodes' endpoints to be discovered, then at
# most this long for every discovered one to be matched.
_DISCOVERY_S = 1.0
_MATCH_TIMEOUT_S = 5.0


def unmatched_endpoints(node: Any, publishers: list, subscriptions: list) -> list[str]:
    """The played and recorded topics on which the graph shows more endpoints than are
    matched yet: a message sent now would not reach all of them."""
    waiting = [f'{p.topic_name}: {p.get_subscription_count()} of '
               f'{node.count_subscribers(p.topic_name)} subscribers matched'
               for p in publishers
               if p.get_subscription_count() < node.count_subscribers(p.topic_name)]
    waiting += [f'{s.topic_name}: {s.get_publisher_count()} of '
                f'{node.count_publishers(s.topic_name)} publishers matched'
                for s in subscriptions
                if s.get_publisher_count() < node.count_publishers(s.topic_name)]
    return waiting


def configure(parser: argparse.ArgumentParser) -> None:
    """Publish a bag over DDS with its timing (and /clock); record the nodes' outputs."""
    parser.add_argument('bag', type=Path, help='rosbag2 bag directory to play')
    parser.add_argument('--rate', type=positive_float, default=1.0, help='playback speed factor')
    parser.add_argument('--start-offset', type=non_negative_float, default=0.0,
                        help='seconds into the bag to start from')
    parser.add_argument('--clock', action='store_true',
                        help='publish /clock with the bag time (for use_sim_time nodes)')
    parser.add_argument('--topics', nargs='+', default=None,
                        help='topics to play (default: all)')
    parser.add_argument('--record', type=Path, default=None, metavar='OUT',
                        help='record the nodes\' outputs and the played images into OUT')
    parser.add_argument('--linger', type=non_negative_float, default=2.0,
                        help='seconds to keep recording after the last message')
    parser.set_defaults(run=run)


def message_class(msgtype: str) -> Any:
    """The rclpy message class of ``pkg/msg/Name``."""
    package, _, name = msgtype.split('/')
    return getattr(importlib.import_module(f'{package}.msg'), name)


class Recorder:
    """Subscribes to ``topics`` (name -> type) with raw subscriptions and writes an MCAP bag."""

    def __init__(self, node: Any, out: Path, topics: dict[str, str]) -> None:
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from rosbags.rosbag2 import StoragePlugin, Writer

        from uq_eval.bags.types import uq_typestore

        typestore = uq_typestore()
        self._lock = threading.Lock()
        self._writer: Writer | None = Writer(out, version=9, storage_plugin=StoragePlugin.MCAP)
        self._writer.open()
        self.counts: dict[str, int] = {}
        self.subscriptions: list = []
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        for topic, msgtype in topics.items():
            connection = self._writer.add_connection(topic, msgtype, typestore=typestore)
            self.counts[topic] = 0
            self.subscriptions.append(node.create_subscription(
                message_class(msgtype), topic,
                lambda raw, c=connection, t=topic: self._write(c, t, raw), qos, raw=True))

    def _write(self, connection: Any, topic: str, raw: bytes) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.write(connection, time.time_ns(), raw)
                self.counts[topic] += 1

    def close(self) -> None:
        """Finish the bag (writes the MCAP summary)."""
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None


def play(bag: Path, rate: float = 1.0, start_offset: float = 0.0, clock: bool = False,
         topics: list[str] | None = None, record: Path | None = None,
         linger_s: float = 2.0) -> dict:
    """Play ``bag``; returns counts of messages played and recorded.

    Raises
    ------
    uq_eval.bags.reader.BagError
        When the bag cannot be read.
    ValueError
        On a non-positive rate or a negative offset.
    """
    import rclpy
    from builtin_interfaces.msg import Time
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from rosgraph_msgs.msg import Clock

    from uq_common.spin_thread import SpinThread
    from uq_eval.bags.reader import IMAGE_TYPES, BagStream

    if not rate > 0.0:
        raise ValueError(f'rate must be > 0, got {rate}')
    if start_offset < 0.0:
        raise ValueError(f'start offset must be >= 0, got {start_offset}')
    stream = BagStream(bag)
    wanted = set(topics) if topics else set(stream.topics)
    rclpy.init()
    node = rclpy.create_node('bag_player')
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    spinner = SpinThread(executor, name='bag_player')
    qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    publishers = {t: node.create_publisher(message_class(ty), t, qos)
                  for t, ty in stream.topics.items() if t in wanted}
    clock_pub = node.create_publisher(Clock, '/clock', 10) if clock else None
    recorder = None
    if record is not None:
        record_topics = dict(OUTPUT_TOPICS)
        record_topics.update({t: ty for t, ty in stream.topics.items()
                              if t in wanted and ty in IMAGE_TYPES})
        recorder = Recorder(node, record, record_topics)
    # A graph entry comes before the match that delivers data: a fixed pause lost the first
    # frames to the detector or the recorder when discovery was slow.
    time.sleep(_DISCOVERY_S)
    deadline = time.monotonic() + _MATCH_TIMEOUT_S
    while (waiting := unmatched_endpoints(node, list(publishers.values()),
                                          recorder.subscriptions if recorder else [])):
        if time.monotonic() > deadline:
            print(f'warning: playing although not every endpoint is matched after '
                  f'{_DISCOVERY_S + _MATCH_TIMEOUT_S:g} s: {"; ".join(waiting)}',
                  file=sys.stderr)
            break
        time.sleep(0.05)
    played = 0
    previous_log: int | None = None
    bag_time = 0.0          # seconds of bag played so far, counting forward steps only
    due = time.monotonic()

    def publish_clock(log_ns: int) -> None:
        if clock_pub is not None:
            clock_pub.publish(Clock(clock=Time(sec=log_ns // 10**9, nanosec=log_ns % 10**9)))

    try:
        for topic, _, log_ns, raw in stream._raw_messages(wanted):
            # A log time going back (a looping or spliced bag) is played at once and
            # published as is on /clock: the nodes must cope with time jumping back.
            step = 0.0 if previous_log is None else max(0.0, (log_ns - previous_log) * 1e-9)
            bag_time += step
            if bag_time < start_offset:
                previous_log = log_ns
                continue
            due += step / rate if played else 0.0
            while (wait := due - time.monotonic()) > 0.0:
                time.sleep(min(wait, _CLOCK_PERIOD_S))
                if previous_log is not None:
                    ahead = min(step, (time.monotonic() - (due - step / rate)) * rate)
                    publish_clock(previous_log + int(max(0.0, ahead) * 1e9))
            publish_clock(log_ns)
            publishers[topic].publish(bytes(raw))
            previous_log = log_ns
            played += 1
        time.sleep(linger_s)
    finally:
        spinner.stop()
        if recorder is not None:
            recorder.close()
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
        stream.close()
    return {'played': played, 'recorded': recorder.counts if recorder else {},
            'problems': stream.problems}


def run(args: argparse.Namespace) -> int:
    """Play (and record); exit 2 on an unreadable bag or bad options."""
    from uq_eval.bags.reader import BagError

    try:
        result = play(args.bag, args.rate, args.start_offset, args.clock, args.topics,
                      args.record, args.linger)
    except (BagError, ValueError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print(f"played {result['played']} messages from {args.bag}")
    if args.record is not None:
        print(f"recorded into {args.record}: {result['recorded']}")
    for problem in result['problems']:
        print(f'warning: {problem}', file=sys.stderr)
    return 2 if result['problems'] else 0
