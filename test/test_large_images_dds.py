"""Camera-sized images between processes over Fast DDS with the shipped profile.

A 1280x720 rgb8 stream (2.6 MiB a frame) at 15 Hz, best-effort as a camera driver publishes
it, goes from one process to a subscriber in another, both started with the workspace's
``config/dds/fastdds_large_images.xml`` (what ``scripts/env.sh`` exports). Every frame must
arrive: with Fast DDS's default 512 KiB shared-memory segment most of them are lost
(docs/dds.md gives the measured figures).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / 'config' / 'dds' / 'fastdds_large_images.xml'
WIDTH, HEIGHT, RATE_HZ, FRAMES = 1280, 720, 15.0, 45

# Publisher and subscriber in one script, the role chosen by argv. The subscriber prints the
# stamps it received; the publisher waits for it to match, then sends FRAMES frames at the
# camera rate, stamp sec = 1..FRAMES.
PROBE = r'''
import sys, time
import rclpy
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image

role, width, height, frames, rate = sys.argv[1], *map(int, sys.argv[2:5]), float(sys.argv[5])
rclpy.init()
node = Node(f'large_image_{role}')
if role == 'sub':
    got = set()
    node.create_subscription(Image, 'camera/image_raw', lambda m: got.add(m.header.stamp.sec),
                             QoSProfile(depth=5, reliability=ReliabilityPolicy.BEST_EFFORT))
    print('ready', flush=True)
    end = time.monotonic() + 120.0
    while time.monotonic() < end and len(got) < frames:
        rclpy.spin_once(node, timeout_sec=0.1)
        if got and max(got) == frames:
            # the last frame is in: give stragglers one second more
            stop = time.monotonic() + 1.0
            while time.monotonic() < stop and len(got) < frames:
                rclpy.spin_once(node, timeout_sec=0.1)
            break
    print('received', ' '.join(map(str, sorted(got))), flush=True)
else:
    pub = node.create_publisher(Image, 'camera/image_raw',
                                QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT))
    msg = Image(width=width, height=height, encoding='rgb8', step=width * 3,
                data=bytes(width * height * 3))
    end = time.monotonic() + 60.0
    while pub.get_subscription_count() == 0 and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(1.0)  # discovery of the reader's locators settles
    start = time.monotonic()
    for i in range(frames):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        msg.header.stamp.sec = i + 1
        pub.publish(msg)
    print('sent', frames, flush=True)
'''


def test_1280x720_stream_reaches_another_process_at_15_hz(tmp_path):
    assert PROFILE.is_file()
    script = tmp_path / 'probe.py'
    script.write_text(PROBE, encoding='utf-8')
    env = os.environ | {
        'FASTRTPS_DEFAULT_PROFILES_FILE': str(PROFILE),
        'ROS_DOMAIN_ID': str(100 + zlib.crc32(__name__.encode()) % 100),
    }
    args = [str(WIDTH), str(HEIGHT), str(FRAMES), str(RATE_HZ)]
    subscriber = subprocess.Popen([sys.executable, str(script), 'sub', *args], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert subscriber.stdout is not None
        assert subscriber.stdout.readline().strip() == 'ready'
        publisher = subprocess.run([sys.executable, str(script), 'pub', *args], env=env,
                                   capture_output=True, text=True, timeout=180)
        assert publisher.returncode == 0, publisher.stderr
        assert publisher.stdout.split() == ['sent', str(FRAMES)], publisher.stdout
        out, err = subscriber.communicate(timeout=180)
    finally:
        if subscriber.poll() is None:
            subscriber.kill()
            subscriber.wait()
    assert subscriber.returncode == 0, err
    received = [int(v) for v in out.split()[1:]]
    missing = sorted(set(range(1, FRAMES + 1)) - set(received))
    assert not missing, f'{len(missing)} of {FRAMES} frames lost: {missing}'
