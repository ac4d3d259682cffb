"""A fleet shares what it learns: two robots, each a real detector_node and ask_for_help_node
in its own namespace over DDS, one label store on a private PostgreSQL server.

Robot A sees an unknown object (a torus) and asks about it; a person answers robot A's
request. Robot B never asks (its threshold is out of reach), yet its ask-for-help node reads
the answer from the shared store and teaches it to robot B's detector, which then classifies
the torus in its own camera images.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def _sibling(name: str) -> Any:
    """A module beside this file (no test folder is on ``sys.path``)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


help_loop = _sibling('test_help_loop')
Process, wait, iou = help_loop.Process, help_loop._wait, help_loop._iou
ROBOTS = ('robot_a', 'robot_b')


@pytest.fixture
def env() -> dict[str, str]:
    domain = 150 + (os.getpid() + 25) % 50
    return os.environ | {'ROS_DOMAIN_ID': str(domain), 'PYTHONUNBUFFERED': '1',
                         'UQ_LABEL_STORE': '/nonexistent-use-the-parameter'}


@pytest.fixture
def cameras(env: dict[str, str]) -> Iterator[dict[str, Any]]:
    """This process: the same rendered scene as both robots' camera at 5 Hz; listens to robot
    A's help requests and both robots' detections."""
    import rclpy
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image

    from uq_common.image_codec import rgb_to_image_fields
    from uq_msgs.msg import DetectionArray, HelpRequest
    from uq_sim.scene import compose_scene, render_scene

    seed, known, unknown = help_loop.SCENE
    frame = render_scene(compose_scene(list(zip(known + (unknown,), help_loop.POSITIONS,
                                                strict=True)), seed=seed))
    fields = rgb_to_image_fields(frame.rgb)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=int(env['ROS_DOMAIN_ID']))
    node = rclpy.create_node('fleet_cameras', context=context)
    state: dict[str, Any] = {'requests': [], 'node': node,
                             'box': next(a.bbox for a in frame.annotations
                                         if a.class_name == unknown)}
    publishers = [node.create_publisher(Image, f'/{robot}/image', 5) for robot in ROBOTS]
    for robot in ROBOTS:
        state[robot] = []
        node.create_subscription(DetectionArray, f'/{robot}/detections', state[robot].append,
                                 10)
    node.create_subscription(HelpRequest, '/robot_a/help_request', state['requests'].append,
                             QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE,
                                        durability=DurabilityPolicy.TRANSIENT_LOCAL))

    def publish() -> None:
        msg = Image(**fields)
        msg.header.stamp = node.get_clock().now().to_msg()
        msg.header.frame_id = 'camera'
        for publisher in publishers:
            publisher.publish(msg)

    node.create_timer(0.2, publish)
    with help_loop.spun(context, node):
        yield state


def _robot(env: dict[str, str], robot: str, store_url: str, tmp_path: Path,
           **helper_params: Any) -> tuple[Any, Any]:
    namespace = ['-r', f'__ns:=/{robot}']
    detector = Process(['detector_node', '--ros-args', *namespace, '--params-file',
                        str(REPO / 'config' / 'detector.yaml'), '-p', 'autostart:=true',
                        '-p', f'learned_gp_path:={tmp_path / f"{robot}.npz"}'], env)
    params = {'label_store_url': store_url, 'robot_id': robot.replace('_', '-'),
              'web_enabled': 'false', 'fleet_poll_period_s': '0.5', **helper_params}
    helper = Process(['ask_for_help_node', '--ros-args', *namespace, '--params-file',
                      str(REPO / 'config' / 'ask_for_help.yaml'),
                      *[a for k, v in params.items() for a in ('-p', f'{k}:={v}')]], env)
    return detector, helper


@pytest.mark.slow
def test_an_answer_to_one_robot_teaches_every_robots_detector(tmp_path, env, cameras,
                                                              postgres_url):
    from uq_autonomy.labels.url import open_label_store
    from uq_common.service_calls import call_until_answered
    from uq_msgs.srv import ProvideLabel

    processes = {}
    try:
        processes['a'] = _robot(env, 'robot_a', postgres_url, tmp_path)
        # Robot B never asks: no mutual information reaches 100 nats, OOD flags ignored.
        processes['b'] = _robot(env, 'robot_b', postgres_url, tmp_path,
                                signal='mutual_information',
                                mutual_information_threshold=100.0, ood_mode='ignore')
        for detector, helper in processes.values():
            detector.wait_for_line('active: processing images', 180)
            helper.wait_for_line('asking for help', 60)
        request = wait(lambda: next((r for r in cameras['requests']
                                     if iou(cameras['box'], r.detection) > 0.3), None),
                       120, 'robot A asking about the torus', processes['a'][1])

        client = cameras['node'].create_client(ProvideLabel, '/robot_a/provide_label')
        assert client.wait_for_service(timeout_sec=30)
        response = call_until_answered(client, ProvideLabel.Request(
            request_id=request.request_id, label='torus', labeler='fleet-test'))
        assert response is not None and response.accepted, response
        with open_label_store(postgres_url, readonly=True) as store:
            record = store.get_label(request.request_id)
            assert (record.label, record.robot_id) == ('torus', 'robot-a')
            assert store.pending_requests(robot_id='robot-b') == []  # robot B never asked

        helper_b = processes['b'][1]
        helper_b.wait_for_line(f"label 'torus' for request {request.request_id} of robot "
                               'robot-a from the store', 30)
        processes['b'][0].wait_for_line('learnt new class', 30)

        def knows_torus(robot: str) -> Any:
            for msg in reversed(cameras[robot][-5:]):
                if 'torus' in msg.class_names and msg.detections:
                    return msg
            return None
        for robot in ROBOTS:
            msg = wait(lambda r=robot: knows_torus(r), 60, f'{robot} knowing the torus')
            torus = max(msg.detections, key=lambda d: iou(cameras['box'], d))
            assert torus.class_id == 'torus', (robot, torus.class_id)
    finally:
        codes = {f'{name}.{kind}': process.stop() for name, pair in processes.items()
                 for kind, process in zip(('detector', 'ask_for_help'), pair, strict=True)}
    assert set(codes.values()) <= {0}, codes
    outputs = ''.join(p.output for pair in processes.values() for p in pair)
    assert 'Traceback' not in outputs
