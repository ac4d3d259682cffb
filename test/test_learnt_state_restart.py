"""Labels taught to the detector survive a SIGKILL by default: the real detector_node
executable with the shipped model and the shipped config/detector.yaml (no learnt-state path
set) in its own process, this process teaching it over DDS through ``teach_object``.

The learnt state goes to the default place under the ROS home (``$ROS_HOME/uq/learned/<model
id>.npz``, here in a temporary ROS home); after the process is killed with SIGKILL and
started again, the detector still knows the taught class, and its ``/diagnostics`` say that
the GP it runs came from that file, with how many labels. Its messages carry the model's
range for the calibrated score (``reference_variance_max``, ``ood_threshold``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120.0


class DetectorProcess:
    """``detector_node`` with the shipped config, autostarted, in its own process group."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            ['detector_node', '--ros-args', '--params-file', str(REPO / 'config' / 'detector.yaml'),
             '-p', 'autostart:=true', '-p', 'diagnostics_period:=0.5'],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
            start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return ''.join(self.lines)

    def kill(self) -> int:
        """SIGKILL, as a crash or the OOM killer would: no shutdown code runs."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout=20)


class Client:
    """This process's node: teaches through the service, collects detections and the
    detector's diagnostics, publishes camera frames."""

    def __init__(self, context: Any) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image

        from uq_common.image_codec import rgb_to_image_fields
        from uq_msgs.msg import DetectionArray
        from uq_msgs.srv import TeachObject

        self.node = context_node = rclpy.create_node('learnt_state_client', context=context)
        reliable = QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE)
        self.detections: list[Any] = []
        self.diagnostics: list[dict[str, str]] = []
        context_node.create_subscription(DetectionArray, 'detections', self.detections.append,
                                         reliable)
        context_node.create_subscription(DiagnosticArray, '/diagnostics', self._on_diagnostics,
                                         reliable)
        self.teach_client = context_node.create_client(TeachObject, 'teach_object')
        self._request = TeachObject.Request
        publisher = context_node.create_publisher(Image, 'image', 1)
        gray = np.full((240, 320, 3), 128, dtype=np.uint8)
        fields = rgb_to_image_fields(gray)

        def publish() -> None:
            msg = Image(**fields)
            msg.header.stamp = context_node.get_clock().now().to_msg()
            publisher.publish(msg)

        context_node.create_timer(0.2, publish)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(context_node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _on_diagnostics(self, array: Any) -> None:
        for status in array.status:
            if 'uncertainty detector' in status.name:
                self.diagnostics.append({kv.key: kv.value for kv in status.values})

    def teach(self, request_id: str, label: str, embedding: np.ndarray, model_id: str) -> Any:
        assert self.teach_client.wait_for_service(timeout_sec=TIMEOUT_S)
        future = self.teach_client.call_async(self._request(
            request_id=request_id, label=label, embedding=embedding.astype(np.float32).tolist(),
            model_id=model_id))
        _wait(future.done, 30.0, f'the answer to {request_id}')
        return future.result()

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        self.thread.join(timeout=5)


def _wait(predicate: Callable[[], Any], timeout: float, what: str,
          process: DetectorProcess | None = None) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        if process is not None and process.proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f'timed out waiting for {what}'
                         + (f'; detector output:\n{process.output[-3000:]}' if process else ''))


@pytest.fixture
def client(ros_context) -> Iterator[Client]:
    made = Client(ros_context)
    try:
        yield made
    finally:
        made.close()


@pytest.mark.slow
def test_a_taught_class_survives_sigkill_by_default(tmp_path, ros_context, client):
    from uq_perception.detectors.model_files import default_gp_path
    from uq_perception.ntk import LastLayerNTKGP

    shipped = LastLayerNTKGP.load(default_gp_path())
    env = os.environ | {'ROS_DOMAIN_ID': str(ros_context.get_domain_id()),
                        'PYTHONUNBUFFERED': '1', 'ROS_HOME': str(tmp_path / 'ros_home')}
    learnt = tmp_path / 'ros_home' / 'uq' / 'learned' / f'{shipped.model_id}.npz'
    # An embedding of the detector's kind (norm sqrt(D)) far from its known classes.
    direction = np.random.default_rng(0).standard_normal(shipped.feature_dim)
    embedding = direction / np.linalg.norm(direction) * np.sqrt(shipped.feature_dim)

    detector = DetectorProcess(env)
    try:
        first = _wait(lambda: client.diagnostics[-1] if client.diagnostics else None,
                      TIMEOUT_S, 'diagnostics of the first detector', detector)
        assert first['learnt_state'] == f'saved to {learnt}'
        assert first['learnt_state_source'] == 'the shipped GP'
        assert first['labels_learnt'] == '0'
        assert first['score_reference'].startswith(f'{shipped.score_reference.count} known')

        answer = client.teach('teapot-1', 'Teapot', embedding, shipped.model_id)
        assert answer.accepted and 'new class' in answer.message, answer.message
        assert answer.class_index == shipped.num_classes
        assert learnt.exists()
        assert detector.kill() == -signal.SIGKILL
    finally:
        if detector.proc.poll() is None:
            detector.kill()

    client.diagnostics.clear()
    client.detections.clear()
    restarted = DetectorProcess(env)
    try:
        values = _wait(lambda: client.diagnostics[-1] if client.diagnostics else None,
                       TIMEOUT_S, 'diagnostics of the restarted detector', restarted)
        # Where the learnt state came from: the file, with its one label.
        assert values['learnt_state_source'] == f'the learnt state {learnt} (1 labels)'
        assert values['labels_learnt'] == '1' and values['learnt_state'] == f'saved to {learnt}'
        # It still knows the class: in every DetectionArray's classes, and a label for it
        # adds no class.
        message = _wait(lambda: client.detections[-1] if client.detections else None, 60.0,
                        'detections of the restarted detector', restarted)
        assert list(message.class_names) == [*shipped.class_names, 'teapot']
        # The model's range, for consumers of the calibrated score, travels in every message.
        assert message.reference_variance_max == pytest.approx(
            shipped.score_reference.maximum, rel=1e-6)
        assert message.ood_threshold == pytest.approx(shipped.ood_threshold, rel=1e-6)
        assert all(0.0 <= d.uncertainty.calibrated_score <= 1.0 for d in message.detections)
        again = client.teach('teapot-2', 'teapot', embedding, shipped.model_id)
        assert again.accepted and again.class_index == shipped.num_classes, again.message
        assert 'new class' not in again.message
        _wait(lambda: client.diagnostics and client.diagnostics[-1]['labels_learnt'] == '2',
              10.0, 'two labels in the diagnostics', restarted)
    finally:
        restarted.kill()
    assert 'Traceback' not in detector.output + restarted.output, restarted.output[-3000:]


@pytest.mark.parametrize('dockerfile', ['Dockerfile', 'Dockerfile.jetson'])
def test_the_images_keep_the_learnt_state_on_their_volume(dockerfile):
    # In a container the default learnt state ($ROS_HOME/uq/learned) must lie on the volume
    # that outlives the container, as the label store does.
    text = (REPO / 'docker' / dockerfile).read_text()
    volumes = [v.strip('"') for v in
               re.findall(r'^VOLUME \[(.*)\]$', text, re.MULTILINE)[-1].split(', ')]
    [ros_home] = re.findall(r'^ENV ROS_HOME=(\S+)$', text, re.MULTILINE)
    assert any(Path(ros_home).is_relative_to(volume) for volume in volumes), (ros_home, volumes)
