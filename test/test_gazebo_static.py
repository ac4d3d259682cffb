"""Static checks of the Gazebo world and bridge (Gazebo itself cannot be installed here).

- ``worlds/tabletop.sdf`` is well-formed SDF with one world; every geometry is an SDF
  built-in shape or a mesh file that exists next to it and is a closed triangle mesh;
- the world is exactly what ``generate_tabletop_world.py`` makes from the current MuJoCo
  scene (so the two simulators show the same table, objects and camera);
- ``config/gazebo_bridge.yaml`` bridges the camera sensor's own Gazebo topics, with ROS/Gazebo
  type pairs ros_gz_bridge converts, to ROS topics and types that a running detector node
  really subscribes to (read from the ROS graph of the real node, over DDS).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
import zlib
from collections import Counter
from pathlib import Path

import pytest
import rclpy
import yaml
from lifecycle_msgs.srv import GetState
from rclpy.executors import SingleThreadedExecutor

WORKSPACE = Path(__file__).resolve().parents[1]
WORLD_DIR = WORKSPACE / 'src' / 'uq_sim_bringup' / 'worlds'
WORLD = WORLD_DIR / 'tabletop.sdf'
GENERATOR = WORKSPACE / 'src' / 'uq_sim_bringup' / 'scripts' / 'generate_tabletop_world.py'
BRIDGE = WORKSPACE / 'config' / 'gazebo_bridge.yaml'
BUILTIN_SHAPES = {'box', 'sphere', 'cylinder', 'capsule', 'ellipsoid', 'plane', 'cone'}
# ROS <-> Gazebo message pairs that ros_gz_bridge converts (its README's table).
BRIDGE_PAIRS = {
    'sensor_msgs/msg/Image': 'gz.msgs.Image',
    'sensor_msgs/msg/CameraInfo': 'gz.msgs.CameraInfo',
    'rosgraph_msgs/msg/Clock': 'gz.msgs.Clock',
}
DOMAIN_ID = 100 + zlib.crc32(b'test_gazebo_static') % 100
NAMESPACE = 'gazebo_static_test'


@pytest.fixture(scope='module')
def world() -> ET.Element:
    root = ET.parse(WORLD).getroot()  # raises on malformed XML
    return root


@pytest.fixture(scope='module')
def bridge() -> list[dict]:
    entries = yaml.safe_load(BRIDGE.read_text(encoding='utf-8'))
    assert isinstance(entries, list) and entries
    return entries


def test_world_is_sdf_with_one_world_of_static_models(world):
    assert world.tag == 'sdf' and world.get('version')
    worlds = world.findall('world')
    assert len(worlds) == 1
    models = worlds[0].findall('model')
    names = [m.get('name') for m in models]
    assert len(names) == len(set(names)), 'model names must be unique'
    assert {'table', 'camera', 'box', 'sphere', 'mug', 'cylinder', 'torus', 'cone',
            'tetrahedron'} <= set(names)
    assert all(m.findtext('static') == 'true' for m in models)


def test_every_geometry_is_builtin_or_an_existing_closed_mesh(world):
    geometries = world.iter('geometry')
    meshes = 0
    for geometry in geometries:
        (shape,) = list(geometry)
        if shape.tag != 'mesh':
            assert shape.tag in BUILTIN_SHAPES, shape.tag
            continue
        meshes += 1
        uri = shape.findtext('uri')
        assert uri and '://' not in uri, f'mesh uri {uri!r} must be relative to the world'
        path = WORLD_DIR / uri
        assert path.is_file(), f'{uri} does not exist'
        vertices, faces = [], []
        for line in path.read_text(encoding='utf-8').splitlines():
            if line.startswith('v '):
                vertices.append(tuple(float(x) for x in line.split()[1:]))
            elif line.startswith('f '):
                faces.append(tuple(int(item.split('/')[0]) - 1 for item in line.split()[1:]))
        assert vertices and faces and all(len(f) == 3 for f in faces), uri
        assert all(0 <= i < len(vertices) for f in faces for i in f), uri
        # Closed: every edge is shared by exactly two faces, in opposite directions.
        edges = Counter((f[k], f[(k + 1) % 3]) for f in faces for k in range(3))
        assert all(edges[(b, a)] == 1 and n == 1 for (a, b), n in edges.items()), uri
    assert meshes >= 3, 'the unknown objects (torus, cone, tetrahedron) are meshes'


def test_world_is_what_the_generator_makes_from_the_mujoco_scene():
    result = subprocess.run([sys.executable, str(GENERATOR), '--check'], capture_output=True,
                            text=True, timeout=300, env=dict(os.environ, MUJOCO_GL='egl'))
    assert result.returncode == 0, (result.stderr + '\nregenerate with: python '
                                    'src/uq_sim_bringup/scripts/generate_tabletop_world.py')


def test_generator_pose_convention_round_trips():
    import importlib.util

    import numpy as np
    spec = importlib.util.spec_from_file_location('generate_tabletop_world', GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rng = np.random.default_rng(0)
    for _ in range(200):
        q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
        rot = q * np.sign(np.linalg.det(q))
        assert np.allclose(module.matrix_from_rpy(*module.rpy_from_matrix(rot)), rot, atol=1e-9)
    for pitch in (np.pi / 2, -np.pi / 2):  # gimbal lock
        rot = module.matrix_from_rpy(0.3, pitch, 1.1)
        assert np.allclose(module.matrix_from_rpy(*module.rpy_from_matrix(rot)), rot, atol=1e-9)


def _camera_topics(world: ET.Element) -> dict[str, str]:
    (sensor,) = [s for s in world.iter('sensor') if s.get('type') == 'camera']
    return {'gz.msgs.Image': sensor.findtext('topic'),
            'gz.msgs.CameraInfo': sensor.find('camera').findtext('camera_info_topic')}


def test_bridge_takes_the_camera_sensor_topics_with_convertible_types(world, bridge):
    camera = _camera_topics(world)
    by_gz_type = {e['gz_type_name']: e for e in bridge}
    for gz_type, topic in camera.items():
        entry = by_gz_type[gz_type]
        assert entry['gz_topic_name'] == topic
        assert entry['direction'] == 'GZ_TO_ROS'
    for entry in bridge:
        assert BRIDGE_PAIRS.get(entry['ros_type_name']) == entry['gz_type_name'], entry


def test_bridged_ros_topics_are_what_a_running_detector_subscribes_to(bridge):
    """The detector node (shipped model, autostart, use_sim_time as under Gazebo) runs in its
    own process; the test reads its subscriptions from the ROS graph."""
    executable = WORKSPACE / 'install' / 'uq_perception' / 'lib' / 'uq_perception' / 'detector_node'
    assert executable.is_file(), f'{executable} not installed (make setup)'
    process = subprocess.Popen(
        [str(executable), '--ros-args', '-r', f'__ns:=/{NAMESPACE}', '-p', 'autostart:=true',
         '-p', 'use_sim_time:=true'],
        env=dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN_ID)), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    try:
        probe = rclpy.create_node('gazebo_bridge_probe', context=context)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(probe)
        client = probe.create_client(GetState, f'/{NAMESPACE}/detector_node/get_state')
        assert client.wait_for_service(timeout_sec=120.0), 'detector_node did not come up'
        deadline, state = time.monotonic() + 120.0, ''
        while state != 'active' and time.monotonic() < deadline:
            future = client.call_async(GetState.Request())
            executor.spin_until_future_complete(future, timeout_sec=10.0)
            state = future.result().current_state.label if future.done() else ''
            time.sleep(0.2)
        assert state == 'active', f'detector_node is {state!r}'
        subscribed: dict[str, set[str]] = {}
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            subscribed = {}
            for name, namespace in probe.get_node_names_and_namespaces():
                if namespace == f'/{NAMESPACE}' and name.startswith('detector_node'):
                    for topic, types in probe.get_subscriber_names_and_types_by_node(
                            name, namespace):
                        subscribed.setdefault(topic, set()).update(types)
            if all(_resolve(e['ros_topic_name']) in subscribed for e in bridge):
                break
            time.sleep(0.2)
        for entry in bridge:
            topic = _resolve(entry['ros_topic_name'])
            assert entry['ros_type_name'] in subscribed.get(topic, set()), \
                f'{topic} ({entry["ros_type_name"]}) is not subscribed: {subscribed}'
    finally:
        context.try_shutdown()
        process.send_signal(signal.SIGINT)
        try:
            output = process.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            process.kill()
            output = process.communicate()[0]
    assert process.returncode == 0, output


def _resolve(topic: str) -> str:
    return topic if topic.startswith('/') else f'/{NAMESPACE}/{topic}'
