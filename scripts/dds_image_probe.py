#!/usr/bin/env python3
"""How many camera-sized images reach another process over DDS on this host.

    source scripts/env.sh
    python scripts/dds_image_probe.py --width 1280 --height 720                 # shipped profile
    python scripts/dds_image_probe.py --width 1280 --height 720 --profile ''    # Fast DDS defaults

Starts a subscriber process and a publisher process (this script, ``--role sub`` and
``--role pub``) on a private ROS domain. The publisher sends ``--frames`` rgb8
``sensor_msgs/Image`` frames at ``--rate`` Hz, best-effort as a camera driver does, once the
subscriber is matched; the subscriber counts what arrives. Both load ``--profile`` as
``FASTRTPS_DEFAULT_PROFILES_FILE`` (default: the shipped ``config/dds/fastdds_large_images.xml``;
an empty value gives Fast DDS's defaults). Prints one JSON line: size, profile, frames sent
and the stamps received. ``test/test_large_images_dds.py`` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

WORKSPACE = Path(__file__).resolve().parents[1]
PROFILE = WORKSPACE / 'config' / 'dds' / 'fastdds_large_images.xml'
#: Seconds the subscriber waits for the stream, and the publisher for the subscriber.
WAIT_S = 120.0


def _subscribe(width: int, height: int, frames: int) -> None:
    import rclpy
    from rclpy.node import Node
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image

    rclpy.init()
    node = Node('large_image_sub')
    got: set[int] = set()

    def on_image(msg: Image) -> None:
        if (msg.width, msg.height) == (width, height):
            got.add(msg.header.stamp.sec)

    node.create_subscription(Image, 'camera/image_raw', on_image,
                             QoSProfile(depth=5, reliability=ReliabilityPolicy.BEST_EFFORT))
    print('ready', flush=True)
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end and len(got) < frames:
        rclpy.spin_once(node, timeout_sec=0.1)
        if got and max(got) == frames:
            # The last frame is in: stragglers get one second more.
            stop = time.monotonic() + 1.0
            while time.monotonic() < stop and len(got) < frames:
                rclpy.spin_once(node, timeout_sec=0.1)
            break
    print('received', ' '.join(map(str, sorted(got))), flush=True)
    node.destroy_node()
    rclpy.shutdown()


def _publish(width: int, height: int, frames: int, rate: float) -> None:
    import rclpy
    from rclpy.node import Node
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image

    rclpy.init()
    node = Node('large_image_pub')
    publisher = node.create_publisher(
        Image, 'camera/image_raw', QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT))
    msg = Image(width=width, height=height, encoding='rgb8', step=width * 3,
                data=bytes(width * height * 3))
    end = time.monotonic() + WAIT_S
    while publisher.get_subscription_count() == 0 and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(1.0)  # discovery of the reader's locators settles
    start = time.monotonic()
    for i in range(frames):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        msg.header.stamp.sec = i + 1
        publisher.publish(msg)
    # A large frame leaves in fragments after publish() returns: destroying the writer at once
    # can cut the last one off, which is no loss of the transport.
    time.sleep(1.0)
    print('sent', frames, flush=True)
    node.destroy_node()
    rclpy.shutdown()


def probe(width: int, height: int, frames: int, rate: float, profile: str,
          domain_id: int) -> dict:
    """Run subscriber and publisher processes; what was sent and what arrived."""
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain_id))
    # Fast DDS reads its defaults only without the variable (an empty one is not the same).
    env.pop('FASTRTPS_DEFAULT_PROFILES_FILE', None)
    if profile:
        env['FASTRTPS_DEFAULT_PROFILES_FILE'] = profile
    args = ['--width', str(width), '--height', str(height), '--frames', str(frames),
            '--rate', str(rate)]
    subscriber = subprocess.Popen([sys.executable, __file__, '--role', 'sub', *args], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert subscriber.stdout is not None
        ready = subscriber.stdout.readline().strip()
        if ready != 'ready':
            subscriber.kill()
            raise RuntimeError(f'the subscriber did not start: {ready} '
                               f'{subscriber.communicate()[1]}')
        publisher = subprocess.run([sys.executable, __file__, '--role', 'pub', *args], env=env,
                                   capture_output=True, text=True, timeout=WAIT_S + 60)
        if publisher.returncode != 0:
            raise RuntimeError(f'the publisher failed: {publisher.stderr}')
        out, err = subscriber.communicate(timeout=WAIT_S + 60)
    finally:
        if subscriber.poll() is None:
            subscriber.kill()
            subscriber.wait()
    if subscriber.returncode != 0:
        raise RuntimeError(f'the subscriber failed: {err}')
    return {'width': width, 'height': height, 'mib': round(width * height * 3 / 2**20, 2),
            'profile': profile or 'Fast DDS defaults', 'rate_hz': rate,
            'sent': int(publisher.stdout.split()[1]),
            'received': [int(v) for v in out.split()[1:]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--width', type=int, default=1280)
    parser.add_argument('--height', type=int, default=720)
    parser.add_argument('--frames', type=int, default=45)
    parser.add_argument('--rate', type=float, default=15.0, help='frames per second')
    parser.add_argument('--profile', default=str(PROFILE),
                        help="Fast DDS XML profile of both processes ('' for the defaults)")
    parser.add_argument('--domain-id', type=int, default=77, help='private ROS domain')
    parser.add_argument('--role', choices=('sub', 'pub'), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.width, args.height, args.frames) < 1 or not args.rate > 0:
        parser.error('width, height and frames must be >= 1 and rate > 0')
    if args.role == 'sub':
        _subscribe(args.width, args.height, args.frames)
    elif args.role == 'pub':
        _publish(args.width, args.height, args.frames, args.rate)
    else:
        result = probe(args.width, args.height, args.frames, args.rate, args.profile,
                       args.domain_id)
        print(json.dumps({**result, 'delivered': f"{len(result['received'])} / {result['sent']}"}))
    return 0


if __name__ == '__main__':
    sys.exit(main())
