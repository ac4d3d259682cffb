"""``ros2 launch uq_bringup uq_stack.launch.py model_format:=onnx model_path:=M gp_path:=G``
with a detector of one's own, as the README's "Use your own detector" takes it: an ONNX
file, a GP fitted on a COCO folder with ``uq gp fit``, the stack launched with both.

The detector is the DETR-style quadrant network of ``src/uq_eval/test/quadrant_detector.py``
(classes red and green; blue is unknown to it), exported to ONNX here. Its GP is fitted on a
generated COCO folder by ``uq gp fit``. The stack runs its installed executables in their
own processes; this test publishes camera frames over real DDS, on a ROS domain of its own,
and checks the ``DetectionArray`` answers: the ONNX model's id, backend onnxruntime, the GP's
classes, finite GP variances and calibrated scores that put the unknown blue object above
the known ones, and features read from the frame as the parameter file's ``onnx_resize``
says (the adapter settings reach the node through ``overlay_params``). A model file of the
other format fails the launch before any node starts, naming ``model_format``.

Needs the real ``ros2 launch`` (launch, launch_ros, ros2cli), which the ROS apt repository
publishes but PyPI does not: where ``launch_ros`` cannot be imported or ``ros2`` is not on
PATH this module is skipped with that reason (docs/deployment.md, "Tests of the launch
files"):

    source <launch virtualenv>/bin/activate && source install/setup.bash
    python -m pytest test/test_launch_onnx_model.py
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import math
import os
import shutil
import signal
import subprocess
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip('launch_ros', reason='launch_ros is not importable: ROS 2 launch is not on '
                    'PyPI; docs/deployment.md, "Tests of the launch files", says how to get it')
if shutil.which('ros2') is None:
    pytest.skip('the ros2 command is not on PATH (docs/deployment.md, "Tests of the launch '
                'files")', allow_module_level=True)
pytest.importorskip('onnxruntime', reason='onnxruntime is part of the CPU install')

WORKSPACE = Path(__file__).resolve().parents[1]
# One domain per run: two runs at once on one host must not drive each other's nodes.
DOMAIN_ID = 100 + (zlib.crc32(b'test_launch_onnx_model') + os.getpid()) % 100
NAMESPACE = 'own_detector_test'
START_TIMEOUT_S = 180.0     # torch and onnxruntime imports, model load, on a shared 2-core host
FRAME = (120, 160)          # a 4:3 camera frame for the model's square input
QUADRANT_COLOURS = {'red': (210, 40, 40), 'green': (40, 210, 40), 'blue': (40, 40, 210),
                    'empty': (128, 128, 128)}  # row-major quadrants of the frame


def _load_quadrant_detector():
    path = WORKSPACE / 'src' / 'uq_eval' / 'test' / 'quadrant_detector.py'
    spec = importlib.util.spec_from_file_location('quadrant_detector', path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def own_detector(tmp_path_factory) -> dict[str, Path]:
    """The ONNX file, its GP from ``uq gp fit`` on a COCO folder, and a parameter file with
    the adapter settings the camera's frames need."""
    from uq_common.cli import main as uq

    quadrants = _load_quadrant_detector()
    folder = tmp_path_factory.mktemp('own_detector')
    model = quadrants.export_onnx(folder / 'quadrants.onnx')
    annotations = quadrants.write_quadrant_coco(folder / 'coco', 40)
    gp = folder / 'quadrants_gp.npz'
    assert uq(['gp', 'fit', '--no-progress', '--model', str(model), '--annotations',
               str(annotations), '--class-names', 'red', 'green', '--unknown', 'blue',
               '--out', str(gp)]) == 0
    # The frame is 4:3, the network square: stretched, each frame quadrant is a network
    # quadrant (letterboxed, the default, it would hold padding too). Blue scores
    # about 0.1 (no class of the model fits it), below the shipped threshold of 0.3.
    params = folder / 'own_detector.yaml'
    params.write_text(yaml.safe_dump({'detector_node': {'ros__parameters': {
        'onnx_resize': 'stretch', 'score_threshold': 0.05}}}))
    return {'model': model, 'gp': gp, 'params': params}


@contextlib.contextmanager
def ros2_launch(log: Path, *arguments: str) -> Iterator[subprocess.Popen]:
    """``ros2 launch uq_bringup uq_stack.launch.py ARGUMENTS`` in a process group of its own,
    its output in ``log``; whatever is left of the group is killed on the way out."""
    env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN_ID), PYTHONUNBUFFERED='1')
    with log.open('w') as output:
        process = subprocess.Popen(
            ['ros2', 'launch', 'uq_bringup', 'uq_stack.launch.py', 'ask_for_help:=false',
             *arguments], stdout=output, stderr=subprocess.STDOUT, env=env,
            start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _frame() -> np.ndarray:
    """The camera frame: a coloured object in each quadrant, inside a grey border of 1/16
    of the quadrant (as the objects of the training images)."""
    rgb = np.full((*FRAME, 3), 128, np.uint8)
    height, width = FRAME[0] // 2, FRAME[1] // 2
    inset_y, inset_x = round(height / 16), round(width / 16)
    for q, colour in enumerate(QUADRANT_COLOURS.values()):
        row, col = divmod(q, 2)
        rgb[row * height + inset_y:(row + 1) * height - inset_y,
            col * width + inset_x:(col + 1) * width - inset_x] = colour
    return rgb


def _answers(count: int, launch: subprocess.Popen, log: Path) -> list:
    """Publish the frame until ``count`` DetectionArrays answered it; the answers."""
    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
    from sensor_msgs.msg import Image

    from uq_common.image_codec import rgb_to_image_fields
    from uq_msgs.msg import DetectionArray

    context = rclpy.Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    received: list[DetectionArray] = []
    try:
        node = rclpy.create_node('own_detector_camera', namespace=NAMESPACE, context=context)
        node.create_subscription(DetectionArray, 'detections', received.append,
                                 QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE))
        publisher = node.create_publisher(Image, 'image', qos_profile_sensor_data)
        executor = rclpy.executors.SingleThreadedExecutor(context=context)
        executor.add_node(node)
        image = Image(**rgb_to_image_fields(_frame()))
        image.header.frame_id = 'own_camera'
        sent = set()
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(received) < count and time.monotonic() < deadline:
            assert launch.poll() is None, log.read_text()[-4000:]
            image.header.stamp = node.get_clock().now().to_msg()
            sent.add((image.header.stamp.sec, image.header.stamp.nanosec))
            publisher.publish(image)
            until = time.monotonic() + 0.25
            while time.monotonic() < until:
                executor.spin_once(timeout_sec=0.05)
        assert len(received) >= count, f'{len(received)} answers; log:\n' + \
            log.read_text()[-4000:]
        assert {(m.header.stamp.sec, m.header.stamp.nanosec) for m in received} <= sent
        return received
    finally:
        context.try_shutdown()


def _quadrant_of(detection) -> str:
    """The frame quadrant whose centre the detection's box centre is nearest to."""
    height, width = FRAME[0] / 2, FRAME[1] / 2
    centres = {name: ((q % 2 + 0.5) * width, (q // 2 + 0.5) * height)
               for q, name in enumerate(QUADRANT_COLOURS)}
    return min(centres, key=lambda name: math.dist(
        centres[name], (detection.center_x, detection.center_y)))


@pytest.mark.slow
def test_the_stack_runs_an_onnx_model_with_its_gp(own_detector, tmp_path):
    from uq_perception.ntk import LastLayerNTKGP

    model, gp_path = own_detector['model'], own_detector['gp']
    gp = LastLayerNTKGP.load(gp_path)
    # The documented identity of an ONNX model, recorded by uq gp fit in the GP artefact.
    model_id = 'onnx-' + hashlib.sha256(model.read_bytes()).hexdigest()[:16]
    assert gp.model_id == model_id
    log = tmp_path / 'launch.log'
    with ros2_launch(log, 'model_format:=onnx', f'model_path:={model}', f'gp_path:={gp_path}',
                     f'overlay_params:={own_detector["params"]}', f'namespace:={NAMESPACE}'
                     ) as launch:
        answers = _answers(3, launch, log)
        launch.send_signal(signal.SIGINT)
        assert launch.wait(timeout=60) == 0, log.read_text()[-4000:]
    output, frame = log.read_text(), _frame()
    assert f'configured: model {model_id} from {model} on onnxruntime' in output, output[-4000:]
    assert output.count('process has finished cleanly') >= 2, output[-4000:]
    for answer in answers:
        assert answer.backend == 'onnxruntime' and answer.model_id == model_id
        assert answer.class_names == ['red', 'green']
        assert answer.header.frame_id == 'own_camera'
        assert answer.ood_threshold == pytest.approx(gp.ood_threshold, rel=1e-6)
        assert answer.reference_variance_max > 0
        found = {_quadrant_of(d): d for d in answer.detections}
        # Blue (score about 0.1) is there: the parameter file's threshold reached the node.
        assert {'red', 'green', 'blue'} <= set(found), sorted(found)
        for name, detection in found.items():
            u = detection.uncertainty
            assert len(detection.embedding) == 3, name
            assert math.isfinite(u.gp_variance) and u.gp_variance > 0, name
            assert 0.0 <= u.calibrated_score <= 1.0, name
            row, col = divmod(list(QUADRANT_COLOURS).index(name), 2)
            box = (detection.center_x, detection.center_y, detection.width, detection.height)
            assert box == pytest.approx(((col + 0.5) * 80, (row + 0.5) * 60, 80, 60), abs=1.0)
            # Stretched, the network's quadrant is the frame's: phi is its mean colour
            # (letterboxed, a quarter of it would be padding, 0.07 off for red).
            quadrant = frame[row * 60:(row + 1) * 60, col * 80:(col + 1) * 80]
            assert np.array(detection.embedding) == pytest.approx(
                quadrant.reshape(-1, 3).mean(0) / 255, abs=0.01), name
        for name in ('red', 'green'):
            assert found[name].class_id == name
            assert not found[name].uncertainty.out_of_distribution
        blue = found['blue'].uncertainty
        assert blue.out_of_distribution and blue.gp_variance > answer.ood_threshold
        assert blue.calibrated_score > max(found[n].uncertainty.calibrated_score
                                           for n in ('red', 'green'))
        assert blue.calibrated_score == pytest.approx(1.0)


def test_an_onnx_format_with_a_torch_file_fails_the_launch_naming_it(tmp_path):
    shipped = WORKSPACE / 'models' / 'detector.pt'
    log = tmp_path / 'launch.log'
    with ros2_launch(log, 'model_format:=onnx', f'model_path:={shipped}') as launch:
        code = launch.wait(timeout=120)
    output = log.read_text()
    assert code != 0, output
    assert ("launch argument 'model_format': model_format onnx reads ONNX files, but "
            f'{shipped} is a PyTorch checkpoint (torch.save zip archive') in output, output
    assert 'a detector saved by uq_perception needs model_format torch' in output
    assert 'process started' not in output, 'a node started despite the wrong format'


def test_an_onnx_file_without_model_format_fails_the_launch_naming_it(own_detector, tmp_path):
    # model_format defaults to torch, the shipped detector's format.
    model, log = own_detector['model'], tmp_path / 'launch.log'
    with ros2_launch(log, f'model_path:={model}', f'gp_path:={own_detector["gp"]}') as launch:
        code = launch.wait(timeout=120)
    output = log.read_text()
    assert code != 0, output
    assert ("launch argument 'model_format': model_format torch reads detectors saved by "
            f'uq_perception (torch.save zip archives), but {model} is not one: an ONNX file '
            'needs model_format onnx') in output, output
    assert 'process started' not in output, 'a node started despite the wrong format'
