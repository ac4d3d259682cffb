"""``uq sim record``: a simulated run written as a real rosbag2 bag (MCAP or sqlite3).

The scenario is rendered at ``--rate`` Hz for ``--duration`` seconds of scenario time, and
each frame is written with one stamp (the one the sim camera node would publish at that
scenario time) on these topics:

- ``image`` (sensor_msgs/Image, rgb8);
- ``camera_info`` (sensor_msgs/CameraInfo);
- ``ground_truth`` (uq_msgs/DetectionArray): one detection per visible object, its class
  name in ``class_id`` and ``class_index`` -1 for unknown classes, exactly the message
  of :func:`uq_sim.sim_camera_node.ground_truth_message` (docs/bag_evaluation.md says why
  ground truth is a topic);
- ``robot_pose`` (geometry_msgs/PoseStamped, frame ``world``), in scenarios with a gripper:
  its tool point, as the sim robot node publishes it, with the scenario's gripper yaw.

The same ground truth is also written as COCO, ``<bag>/ground_truth.json`` (one image per
frame keyed by ``stamp_ns``, every visible object annotated, ``info.exhaustive`` true), for
tools that read COCO and for ``uq eval bag --ground-truth FILE``; rosbag2 readers ignore
files in the bag directory that ``metadata.yaml`` does not list.

Messages are built as rclpy messages and serialised by rclpy, so the bytes are those a
running node puts on the wire; `rosbags` writes them with the ``uq_msgs`` definitions
embedded (:mod:`uq_eval.bags.types`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from uq_common.arguments import non_negative_float, positive_float, positive_int
from uq_sim.scenario import SCENARIO_NAMES

STORAGES = ('mcap', 'sqlite3')
IMAGE_TOPIC = 'image'
CAMERA_INFO_TOPIC = 'camera_info'
GROUND_TRUTH_TOPIC = 'ground_truth'
ROBOT_POSE_TOPIC = 'robot_pose'
GROUND_TRUTH_FILE = 'ground_truth.json'
# Stamps start here rather than at 0 so that bags look like wall-clock recordings.
_EPOCH_NS = 1_700_000_000 * 10**9


def configure(parser: argparse.ArgumentParser) -> None:
    """Record a simulated scenario into a rosbag2 bag (image, camera_info, ground_truth,
    robot_pose) with its ground truth also as COCO, BAG/ground_truth.json."""
    parser.add_argument('--scenario', default='tabletop_demo', choices=SCENARIO_NAMES,
                        help='scripted scenario to render')
    parser.add_argument('--out', required=True, type=Path,
                        help='bag directory to create (must not exist)')
    parser.add_argument('--storage', default='mcap', choices=STORAGES,
                        help='rosbag2 storage plugin')
    parser.add_argument('--duration', type=positive_float, default=None,
                        help='seconds of scenario time (default: one pass of the scenario)')
    parser.add_argument('--rate', type=positive_float, default=5.0, help='frames per second')
    parser.add_argument('--start-time', type=non_negative_float, default=0.0,
                        help='scenario time of the first frame, seconds')
    parser.add_argument('--width', type=positive_int, default=320, help='image width, pixels')
    parser.add_argument('--height', type=positive_int, default=240, help='image height, pixels')
    parser.add_argument('--no-progress', action='store_true', help='hide the progress bar')
    parser.set_defaults(run=run)


def record_scenario(out: Path, scenario_name: str, storage: str = 'mcap',
                    duration: float | None = None, rate_hz: float = 5.0,
                    start_time: float = 0.0, width: int = 320, height: int = 240,
                    progress: bool = False) -> int:
    """Render ``scenario_name`` and write it to the bag ``out``; returns the frame count.

    Raises
    ------
    ValueError
        On a non-positive rate or duration, an unknown scenario or storage, or an
        existing ``out``.
    """
    from builtin_interfaces.msg import Time
    from geometry_msgs.msg import PoseStamped
    from rclpy.serialization import serialize_message
    from rosbags.rosbag2 import StoragePlugin, Writer
    from sensor_msgs.msg import Image
    from std_msgs.msg import Header
    from tqdm import tqdm

    from uq_common.image_codec import rgb_to_image_fields
    from uq_eval.bags.types import uq_typestore
    from uq_sim.scenario import get_scenario
    from uq_sim.scene import SceneRenderer
    from uq_sim.sim_camera_node import camera_info_message, ground_truth_message

    if storage not in STORAGES:
        raise ValueError(f'unknown storage {storage!r}; expected one of {STORAGES}')
    if not rate_hz > 0.0:
        raise ValueError(f'rate must be > 0, got {rate_hz}')
    scenario = get_scenario(scenario_name)
    duration = scenario.duration if duration is None else duration
    if not duration > 0.0:
        raise ValueError(f'duration must be > 0, got {duration}')
    if out.exists():
        raise ValueError(f'{out} already exists; choose a new bag directory')
    frames = max(1, int(round(duration * rate_hz)))
    typestore = uq_typestore()
    plugin = StoragePlugin.MCAP if storage == 'mcap' else StoragePlugin.SQLITE3
    with SceneRenderer(width, height) as renderer, \
            Writer(out, version=9, storage_plugin=plugin) as writer:
        renderer.load(scenario.spec)
        connections = {
            IMAGE_TOPIC: writer.add_connection(IMAGE_TOPIC, 'sensor_msgs/msg/Image',
                                               typestore=typestore),
            CAMERA_INFO_TOPIC: writer.add_connection(
                CAMERA_INFO_TOPIC, 'sensor_msgs/msg/CameraInfo', typestore=typestore),
            GROUND_TRUTH_TOPIC: writer.add_connection(
                GROUND_TRUTH_TOPIC, 'uq_msgs/msg/DetectionArray', typestore=typestore),
        }
        has_robot = scenario.state_at(start_time).gripper_pos is not None
        if has_robot:
            connections[ROBOT_POSE_TOPIC] = writer.add_connection(
                ROBOT_POSE_TOPIC, 'geometry_msgs/msg/PoseStamped', typestore=typestore)
        coco = _CocoGroundTruth(scenario.name, width, height)
        for i in tqdm(range(frames), desc=f'recording {scenario.name}', unit='frame',
                      disable=not progress):
            elapsed = start_time + i / rate_hz
            state = scenario.apply(renderer, elapsed, loop=True)
            frame = renderer.render(visibility=False)
            stamp_ns = _EPOCH_NS + int(round(i * 1e9 / rate_hz))
            header = Header(stamp=Time(sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9),
                            frame_id='camera_optical_frame')
            truth = ground_truth_message(header, frame, scenario.name, 0.0)
            messages = {
                IMAGE_TOPIC: Image(header=header, **rgb_to_image_fields(frame.rgb)),
                CAMERA_INFO_TOPIC: camera_info_message(header, frame.intrinsics),
                GROUND_TRUTH_TOPIC: truth,
            }
            if has_robot and state.gripper_pos is not None:
                pose = PoseStamped(header=Header(stamp=header.stamp, frame_id='world'))
                (pose.pose.position.x, pose.pose.position.y,
                 pose.pose.position.z) = (float(v) for v in state.gripper_pos)
                # A turn about the vertical axis by the gripper's yaw.
                pose.pose.orientation.z = math.sin(state.gripper_yaw / 2.0)
                pose.pose.orientation.w = math.cos(state.gripper_yaw / 2.0)
                messages[ROBOT_POSE_TOPIC] = pose
            for topic, message in messages.items():
                writer.write(connections[topic], stamp_ns, serialize_message(message))
            coco.add(stamp_ns, truth)
    (out / GROUND_TRUTH_FILE).write_text(json.dumps(coco.dataset(), indent=1))
    return frames


class _CocoGroundTruth:
    """The ``ground_truth`` messages of a recording as one COCO dataset keyed by stamp."""

    def __init__(self, scenario_name: str, width: int, height: int) -> None:
        self.scenario_name = scenario_name
        self.width, self.height = width, height
        self.images: list[dict] = []
        self.annotations: list[dict] = []
        self.categories: dict[str, dict] = {}

    def add(self, stamp_ns: int, truth: Any) -> None:
        image_id = len(self.images) + 1
        # The frame itself is in the bag (topic IMAGE_TOPIC at this stamp), not on disk.
        self.images.append({'id': image_id, 'file_name': f'{IMAGE_TOPIC}/{stamp_ns}',
                            'width': self.width, 'height': self.height,
                            'stamp_ns': stamp_ns})
        for d in truth.detections:
            known = d.class_index >= 0
            category = self.categories.setdefault(d.class_id, {
                'id': len(self.categories) + 1, 'name': d.class_id,
                'supercategory': 'known' if known else 'unknown'})
            x, y = d.center_x - d.width / 2.0, d.center_y - d.height / 2.0
            self.annotations.append({
                'id': len(self.annotations) + 1, 'image_id': image_id,
                'category_id': category['id'], 'bbox': [x, y, d.width, d.height],
                'area': d.width * d.height, 'iscrowd': 0, 'segmentation': [],
                'attributes': {'known': known, 'object_id': int(d.track_id)}})

    def dataset(self) -> dict:
        return {
            'info': {'description': f'uq sim record ground truth, scenario '
                                    f'{self.scenario_name}',
                     'exhaustive': True, 'image_topic': IMAGE_TOPIC},
            'licenses': [], 'images': self.images, 'annotations': self.annotations,
            'categories': sorted(self.categories.values(), key=lambda c: c['id'])}


def run(args: argparse.Namespace) -> int:
    """Record the bag described by ``args``; prints its path."""
    try:
        frames = record_scenario(args.out, args.scenario, args.storage, args.duration,
                                 args.rate, args.start_time, args.width, args.height,
                                 progress=not args.no_progress)
    except (ValueError, FileNotFoundError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    print(f'{args.out}: {frames} frames of {args.scenario} ({args.storage})')
    return 0
