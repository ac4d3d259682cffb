"""``uq replay`` against a real answering node over DDS: every image is answered or named.

The answering node stands where the detector does: it takes ``image`` best effort with a
queue of one, spends a fixed time on each frame (on its executor thread, as inference
does) and publishes a ``uq_msgs/DetectionArray`` stamped like the image. ``uq replay`` runs
as its own process, as users run it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from rosbags.rosbag2 import StoragePlugin, Writer

from uq_eval.bags.types import uq_typestore

DOMAIN_ID = 100 + zlib.crc32(b'test_replay_answers') % 100
FRAMES = 12
PERIOD_NS = 50_000_000  # 20 Hz in the bag
FIRST_STAMP_NS = 1_700_000_000 * 10**9
STAMPS = [FIRST_STAMP_NS + k * PERIOD_NS for k in range(FRAMES)]


@pytest.fixture(scope='module')
def bag(tmp_path_factory: pytest.TempPathFactory) -> Path:
    typestore = uq_typestore()
    Header = typestore.types['std_msgs/msg/Header']
    Time = typestore.types['builtin_interfaces/msg/Time']
    Image = typestore.types['sensor_msgs/msg/Image']
    path = tmp_path_factory.mktemp('replay') / 'bag'
    pixels = np.zeros(16 * 16 * 3, dtype=np.uint8)
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        connection = writer.add_connection('image', 'sensor_msgs/msg/Image',
                                           typestore=typestore)
        for stamp in STAMPS:
            msg = Image(header=Header(stamp=Time(sec=stamp // 10**9, nanosec=stamp % 10**9),
                                      frame_id='camera'),
                        height=16, width=16, encoding='rgb8', is_bigendian=0, step=48,
                        data=pixels)
            writer.write(connection, stamp, typestore.serialize_cdr(msg, Image.__msgtype__))
    return path


@pytest.fixture(scope='module')
def looping_bag(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bag's frames twice over: the second pass repeats the first pass's stamps, logged
    after it (a bag read sorts by log time, so repeated log times would interleave them)."""
    typestore = uq_typestore()
    Header = typestore.types['std_msgs/msg/Header']
    Time = typestore.types['builtin_interfaces/msg/Time']
    Image = typestore.types['sensor_msgs/msg/Image']
    path = tmp_path_factory.mktemp('replay') / 'looping'
    pixels = np.zeros(16 * 16 * 3, dtype=np.uint8)
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        connection = writer.add_connection('image', 'sensor_msgs/msg/Image',
                                           typestore=typestore)
        for k, stamp in enumerate(STAMPS + STAMPS):
            msg = Image(header=Header(stamp=Time(sec=stamp // 10**9, nanosec=stamp % 10**9),
                                      frame_id='camera'),
                        height=16, width=16, encoding='rgb8', is_bigendian=0, step=48,
                        data=pixels)
            writer.write(connection, FIRST_STAMP_NS + k * PERIOD_NS,
                         typestore.serialize_cdr(msg, Image.__msgtype__))
    return path


class Answerer:
    """A node answering each image it takes after ``work_s``, except stamps in ``silent``
    (and, with ``answer_once``, stamps it answered already)."""

    def __init__(self, work_s: float, silent: frozenset[int] = frozenset(),
                 answer_once: bool = False) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image

        from uq_common.spin_thread import SpinThread
        from uq_msgs.msg import DetectionArray

        self.work_s = work_s
        self.silent = silent
        # With answer_once, an image whose stamp was answered before is taken and dropped.
        self.answer_once = answer_once
        self._answered: set[int] = set()
        self.received: list[int] = []
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=DOMAIN_ID)
        self.node = rclpy.create_node('answerer', context=self.context)
        self._publisher = self.node.create_publisher(
            DetectionArray, 'detections', QoSProfile(depth=10,
                                                     reliability=ReliabilityPolicy.RELIABLE))
        self.node.create_subscription(
            Image, 'image', self._on_image,
            QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT))
        self._message = DetectionArray
        executor = SingleThreadedExecutor(context=self.context)
        executor.add_node(self.node)
        self._spinner = SpinThread(executor, name='answerer')

    def _on_image(self, msg: object) -> None:
        stamp = msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec
        self.received.append(stamp)
        time.sleep(self.work_s)
        if stamp in self.silent or (self.answer_once and stamp in self._answered):
            return
        self._answered.add(stamp)
        self._publisher.publish(self._message(header=msg.header))

    def close(self) -> None:
        self._spinner.stop()
        self.node.destroy_node()
        self.context.try_shutdown()


def replay(bag: Path, *options: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN_ID), PYTHONUNBUFFERED='1')
    return subprocess.run([sys.executable, '-m', 'uq_common.cli', 'replay', str(bag),
                           '--linger', '0.5', *options],
                          env=env, capture_output=True, text=True, timeout=120)


def seconds(stamps: list[int]) -> str:
    return ', '.join(f'{s / 1e9:.3f}' for s in stamps)


def test_each_image_waits_for_the_answer_to_the_previous_one(bag: Path) -> None:
    # 150 ms of work per frame against 50 ms between frames: at the bag's pace the queue of
    # one would overwrite two frames in three.
    answerer = Answerer(work_s=0.15)
    try:
        result = replay(bag)
    finally:
        answerer.close()
    assert result.returncode == 0, result.stderr
    assert f'answered {FRAMES} of {FRAMES} images' in result.stdout, result.stdout
    assert answerer.received == STAMPS


def test_unanswered_images_are_named_and_fail_the_replay(bag: Path) -> None:
    silent = [STAMPS[3], STAMPS[7]]
    answerer = Answerer(work_s=0.0, silent=frozenset(silent))
    try:
        result = replay(bag, '--answer-timeout', '0.5')
    finally:
        answerer.close()
    assert result.returncode == 1, result.stdout + result.stderr
    assert answerer.received == STAMPS  # each image still sent once, after the timeout
    assert f'answered {FRAMES - 2} of {FRAMES} images' in result.stdout, result.stdout
    assert (f'the nodes did not answer 2 of {FRAMES} images, stamped {seconds(silent)}'
            in result.stderr), result.stderr


def test_a_looping_bag_counts_the_images_of_each_pass(looping_bag: Path) -> None:
    # The nodes answer the first pass and drop the second: one answer per stamp, which must
    # not stand for both images sent with it.
    answerer = Answerer(work_s=0.0, answer_once=True)
    try:
        result = replay(looping_bag, '--answer-timeout', '0.5')
    finally:
        answerer.close()
    assert answerer.received == STAMPS + STAMPS  # both passes reached the node
    assert result.returncode == 1, result.stdout + result.stderr
    assert f'answered {FRAMES} of {2 * FRAMES} images' in result.stdout, result.stdout
    assert (f'the nodes did not answer {FRAMES} of {2 * FRAMES} images, stamped '
            f'{seconds(STAMPS)}' in result.stderr), result.stderr


def test_at_the_bag_pace_the_frames_a_busy_node_drops_are_named(bag: Path) -> None:
    answerer = Answerer(work_s=0.15)
    try:
        result = replay(bag, '--pace', 'bag')
    finally:
        answerer.close()
    dropped = [s for s in STAMPS if s not in answerer.received]
    assert dropped, 'a node busy for three frame periods took every frame'
    assert result.returncode == 1, result.stdout + result.stderr
    assert (f'answered {FRAMES - len(dropped)} of {FRAMES} images' in result.stdout), \
        result.stdout
    assert (f'did not answer {len(dropped)} of {FRAMES} images, stamped {seconds(dropped)}'
            in result.stderr), result.stderr
