"""``uq replay``: play a bag over DDS with its original timing and record the nodes' outputs.

The player publishes every message of the bag (or of ``--topics``) on its topic, as the
bag's serialised bytes, at its log time scaled by ``--rate`` from ``--start-offset``
seconds into the bag; with ``--clock`` it also publishes ``/clock`` (the log time of each
message sent, and every 10 ms in between), for nodes run with ``use_sim_time``.

Every image is a frame the nodes should answer with a ``DetectionArray`` on ``detections``
stamped like it. The player counts the answers (when some node publishes ``detections``):
with ``--pace answers`` (the default) an image is not sent before the previous one was
answered or ``--answer-timeout`` seconds passed, on top of the bag's timing. The
detector's image input is best effort with a queue of one, as for a camera: a frame sent
while it is still busy with two others is overwritten, which on a loaded machine lost up to
a third of the frames at the bag's own rate. ``--pace bag`` keeps the bag's timing alone,
as a live camera would, and frames the detector drops are lost. Either way the replay ends
by naming the images that were not answered (their stamps) and exits 1 when there are any.

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
from collections import Counter
from pathlib import Path
from typing import Any

from uq_common.arguments import non_negative_float, positive_float
from uq_common.str_enum import StrEnum

OUTPUT_TOPICS = {
    'detections': 'uq_msgs/msg/DetectionArray',
    'autonomy_state': 'uq_msgs/msg/AutonomyState',
    'help_request': 'uq_msgs/msg/HelpRequest',
    'cmd_vel': 'geometry_msgs/msg/Twist',
}
ANSWER_TOPIC = 'detections'
_CLOCK_PERIOD_S = 0.01
# Unanswered stamps printed in full up to this many; the result holds them all.
_STAMPS_SHOWN = 20
# Before the first message: time for the other nodes' endpoints to be discovered, then at
# most this long for a node to take and answer the images and for every discovered
# endpoint to be matched (discovery took several seconds on a loaded machine).
_DISCOVERY_S = 1.0
_MATCH_TIMEOUT_S = 15.0


class Pacing(StrEnum):
    """When the player sends each message."""

    ANSWERS = 'answers'  # the bag's timing, and no image before the previous one's answer
    BAG = 'bag'          # the bag's timing alone, as a live camera


def missing_image_nodes(node: Any, image_publishers: list, answer_subscription: Any
                        ) -> list[str]:
    """What the graph does not show yet of the nodes that take the played images and answer
    them: a subscriber (other than this node) per image topic, a publisher of the answers."""
    missing = [f'{p.topic_name}: no subscriber' for p in image_publishers
               if not _image_subscribed_elsewhere(node, p.topic_name)]
    if image_publishers and node.count_publishers(answer_subscription.topic_name) == 0:
        missing.append(f'{answer_subscription.topic_name}: no publisher')
    return missing


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
    parser.add_argument('--pace', type=Pacing, choices=list(Pacing), default=Pacing.ANSWERS,
                        help='answers: the bag\'s timing, but no image before the nodes '
                             'answered the previous one on detections; bag: the bag\'s timing '
                             'alone (a busy detector drops frames, as live)')
    parser.add_argument('--answer-timeout', type=positive_float, default=5.0,
                        help='seconds an image waits for the previous image\'s answer with '
                             '--pace answers; an image still unanswered then is reported')
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


class AnswerTracker:
    """Counts the nodes' ``DetectionArray`` answers by stamp against the images sent.

    A stamp may recur (a looping bag): an image counts as answered when its stamp has as
    many answers as images sent with it so far.
    """

    def __init__(self, node: Any) -> None:
        from rclpy.qos import QoSProfile, ReliabilityPolicy

        from uq_msgs.msg import DetectionArray

        self._condition = threading.Condition()
        self._sent: Counter[int] = Counter()
        self._answered: Counter[int] = Counter()
        self._order: list[int] = []
        self.answers = 0
        self.subscription = node.create_subscription(
            DetectionArray, ANSWER_TOPIC, self._on_answer,
            QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))

    def _on_answer(self, msg: Any) -> None:
        with self._condition:
            self._answered[_stamp_ns(msg.header.stamp)] += 1
            self.answers += 1
            self._condition.notify_all()

    def sent(self, stamp_ns: int) -> None:
        """Count an image with this stamp as sent."""
        with self._condition:
            self._sent[stamp_ns] += 1
            self._order.append(stamp_ns)

    def wait_answered(self, stamp_ns: int, timeout_s: float) -> bool:
        """Wait until every image sent with ``stamp_ns`` is answered; False on timeout."""
        with self._condition:
            return self._condition.wait_for(
                lambda: self._answered[stamp_ns] >= self._sent[stamp_ns], timeout_s)

    @property
    def images(self) -> int:
        """Images sent."""
        with self._condition:
            return len(self._order)

    def unanswered(self) -> list[int]:
        """Stamps (ns) of the images sent and not answered, in the order sent."""
        with self._condition:
            missing = {s: max(0, n - self._answered[s]) for s, n in self._sent.items()}
            out = []
            for stamp in reversed(self._order):  # the latest images of a stamp lack answers
                if missing[stamp]:
                    missing[stamp] -= 1
                    out.append(stamp)
            return out[::-1]


def _stamp_ns(stamp: Any) -> int:
    return int(stamp.sec) * 10**9 + int(stamp.nanosec)


def _image_subscribed_elsewhere(node: Any, topic: str) -> bool:
    """Whether a node other than the player (and its recorder) subscribes to ``topic``."""
    me = (node.get_name(), node.get_namespace())
    return any((info.node_name, info.node_namespace) != me
               for info in node.get_subscriptions_info_by_topic(topic))


def format_stamps(stamps_ns: list[int]) -> str:
    """Stamps as seconds, the first ones in full and the rest counted."""
    shown = ', '.join(f'{s / 1e9:.3f}' for s in stamps_ns[:_STAMPS_SHOWN])
    rest = len(stamps_ns) - _STAMPS_SHOWN
    return shown + (f' and {rest} more' if rest > 0 else '')


def play(bag: Path, rate: float = 1.0, start_offset: float = 0.0, clock: bool = False,
         topics: list[str] | None = None, record: Path | None = None,
         linger_s: float = 2.0, pace: Pacing | str = Pacing.ANSWERS,
         answer_timeout_s: float = 5.0) -> dict:
    """Play ``bag``; returns counts of messages played and recorded, and the images the
    nodes answered.

    Returns
    -------
    dict
        ``played`` (messages), ``recorded`` (per topic), ``problems`` (of the bag),
        ``images`` (images sent on topics that another node subscribes to), ``answered``
        (of those) and ``unanswered`` (the others' stamps in ns, in the order sent);
        ``images`` and ``answered`` are None when no node publishes ``detections``, and
        images are then not awaited.

    Raises
    ------
    uq_eval.bags.reader.BagError
        When the bag cannot be read.
    ValueError
        On a non-positive rate or answer timeout, a negative offset or an unknown pace.
    """
    import rclpy
    from builtin_interfaces.msg import Time
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from rclpy.serialization import deserialize_message
    from rosgraph_msgs.msg import Clock

    from uq_common.spin_thread import SpinThread
    from uq_eval.bags.reader import IMAGE_TYPES, BagStream

    if not rate > 0.0:
        raise ValueError(f'rate must be > 0, got {rate}')
    if start_offset < 0.0:
        raise ValueError(f'start offset must be >= 0, got {start_offset}')
    if not answer_timeout_s > 0.0:
        raise ValueError(f'answer timeout must be > 0, got {answer_timeout_s}')
    pace = Pacing(pace)
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
    tracker = AnswerTracker(node)
    subscriptions = [tracker.subscription, *(recorder.subscriptions if recorder else [])]
    image_publishers = [p for t, p in publishers.items() if stream.topics[t] in IMAGE_TYPES]
    # A graph entry comes before the match that delivers data, and on a loaded machine the
    # detector's endpoints reached the graph seconds after it was active: a fixed pause, or
    # matching only what the graph showed, lost the first frames.
    time.sleep(_DISCOVERY_S)
    deadline = time.monotonic() + _MATCH_TIMEOUT_S
    while (waiting := missing_image_nodes(node, image_publishers, tracker.subscription)
           + unmatched_endpoints(node, list(publishers.values()), subscriptions)):
        if time.monotonic() > deadline:
            print(f'warning: playing after {_DISCOVERY_S + _MATCH_TIMEOUT_S:g} s without a '
                  f'complete graph: {"; ".join(waiting)}', file=sys.stderr)
            break
        time.sleep(0.05)
    # The images awaited: those another node takes, while some node answers on detections.
    answering = node.count_publishers(tracker.subscription.topic_name) > 0
    awaited = {t for t, p in publishers.items()
               if stream.topics[t] in IMAGE_TYPES and answering
               and _image_subscribed_elsewhere(node, p.topic_name)}
    image_classes = {t: message_class(stream.topics[t]) for t in awaited}
    if not answering:
        print(f'note: no node publishes {tracker.subscription.topic_name}: images are played '
              f'without waiting for answers', file=sys.stderr)
    played = 0
    previous_log: int | None = None
    previous_image: int | None = None  # stamp of the latest awaited image sent
    # After an answer timed out, images are not held until answers come again (a stopped
    # detector must not hold every remaining frame for the timeout).
    held_answers: int | None = None
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
            stamp = None
            if topic in awaited:
                stamp = _stamp_ns(deserialize_message(bytes(raw), image_classes[topic])
                                  .header.stamp)
                if pace is Pacing.ANSWERS and previous_image is not None and (
                        held_answers is None or tracker.answers > held_answers):
                    held_answers = None
                    if not tracker.wait_answered(previous_image, answer_timeout_s):
                        held_answers = tracker.answers
                    # The bag's spacing counts from here: no burst to catch up the wait.
                    due = max(due, time.monotonic())
            publish_clock(log_ns)
            publishers[topic].publish(bytes(raw))
            if stamp is not None:
                tracker.sent(stamp)
                previous_image = stamp
            previous_log = log_ns
            played += 1
        if pace is Pacing.ANSWERS and previous_image is not None:
            tracker.wait_answered(previous_image, answer_timeout_s)
        time.sleep(linger_s)
    finally:
        spinner.stop()
        if recorder is not None:
            recorder.close()
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
        stream.close()
    unanswered = tracker.unanswered() if answering else []
    return {'played': played, 'recorded': recorder.counts if recorder else {},
            'problems': stream.problems, 'images': tracker.images if answering else None,
            'answered': tracker.images - len(unanswered) if answering else None,
            'unanswered': unanswered}


def run(args: argparse.Namespace) -> int:
    """Play (and record); exit 2 on an unreadable bag or bad options, 1 when the nodes left
    images unanswered."""
    from uq_eval.bags.reader import BagError

    try:
        result = play(args.bag, args.rate, args.start_offset, args.clock, args.topics,
                      args.record, args.linger, args.pace, args.answer_timeout)
    except (BagError, ValueError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print(f"played {result['played']} messages from {args.bag}")
    if args.record is not None:
        print(f"recorded into {args.record}: {result['recorded']}")
    if result['images'] is not None:
        print(f"answered {result['answered']} of {result['images']} images "
              f"(a {ANSWER_TOPIC} message with the image's stamp)")
    if result['unanswered']:
        print(f"warning: the nodes did not answer {len(result['unanswered'])} of "
              f"{result['images']} images, stamped {format_stamps(result['unanswered'])}",
              file=sys.stderr)
    for problem in result['problems']:
        print(f'warning: {problem}', file=sys.stderr)
    if result['problems']:
        return 2
    return 1 if result['unanswered'] else 0
