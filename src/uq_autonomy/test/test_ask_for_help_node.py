"""The ask-for-help node's inputs over real DDS: the node and a peer that plays camera and
detector, each spun by its own executor, on a private domain.

Covers what must not reach the policy or the label store: a DetectionArray stamped in the
future, class names the store refuses, images larger than the detector accepts, and bad
``labeler`` / ``teach_service`` values; each is refused with its reason and counted in the
diagnostics, and the node keeps asking about the valid objects.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from sensor_msgs.msg import Image

from uq_autonomy import ask_for_help_node
from uq_autonomy.ask_for_help_node import AskForHelpNode
from uq_autonomy.labels.store import LabelStore
from uq_common.image_codec import rgb_to_image_fields
from uq_common.qos import HELP_REQUEST_QOS
from uq_common.spin_thread import SpinThread
from uq_msgs.msg import Detection, DetectionArray, HelpRequest
from uq_msgs.srv import ProvideLabel

TIMEOUT_S = 10.0
FRAME_PERIOD_S = 0.05
IMAGE = rgb_to_image_fields(np.full((48, 64, 3), 128, np.uint8))


def detection(track_id: int, class_id: str = 'mug',
              probabilities: tuple[float, ...] = (0.6, 0.4)) -> Detection:
    d = Detection()
    d.class_id, d.class_index, d.score, d.track_id = class_id, 0, 0.9, track_id
    d.class_probabilities = list(probabilities)
    d.center_x, d.center_y, d.width, d.height = 32.0, 24.0, 20.0, 16.0
    # Above the default threshold (more uncertain than 99.9 % of the model's known
    # validation objects): asked after 4 frames.
    d.uncertainty.calibrated_score = 0.999
    d.uncertainty.gp_variance = 1e-3
    d.embedding = [1.0, 0.0, 0.0, 0.0]
    return d


class Harness:
    """The node under test (no web page, a fresh store) and a peer publishing its inputs."""

    def __init__(self, context: Any, store_path: Path, **params: Any) -> None:
        params = {'label_store_url': str(store_path), 'web_enabled': False,
                  'diagnostics_period_s': 0.1, **params}
        self.node = AskForHelpNode(
            context=context,
            parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
        self.peer = Node('ask_for_help_test_peer', context=context)
        self.lock = threading.Lock()
        self.requests: list[HelpRequest] = []
        self.counters: dict[str, str] = {}
        self.image_pub = self.peer.create_publisher(Image, 'image', 10)
        self.det_pub = self.peer.create_publisher(DetectionArray, 'detections', 10)
        self.peer.create_subscription(HelpRequest, 'help_request', self._on_request,
                                      HELP_REQUEST_QOS)
        self.peer.create_subscription(DiagnosticArray, '/diagnostics', self._on_diag, 10)
        self.label_client = self.peer.create_client(ProvideLabel, 'provide_label')
        self._spinners: list[tuple[SingleThreadedExecutor, SpinThread]] = []
        for node in (self.node, self.peer):
            executor = SingleThreadedExecutor(context=context)
            executor.add_node(node)
            self._spinners.append((executor, SpinThread(executor)))
        self.wait(lambda: self.det_pub.get_subscription_count() > 0
                  and self.image_pub.get_subscription_count() > 0 and self.counters,
                  'discovery of the node')

    def _on_request(self, msg: HelpRequest) -> None:
        with self.lock:
            self.requests.append(msg)

    def _on_diag(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name.endswith('ask for help'):
                with self.lock:
                    self.counters = {kv.key: kv.value for kv in status.values}

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = TIMEOUT_S) -> Any:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                result = predicate()
            if result:
                return result
            time.sleep(0.02)
        raise AssertionError(f'timed out waiting for {what}')

    def counter(self, name: str) -> int:
        return int(self.counters.get(name, '0'))

    def send(self, detections: list[Detection], class_names: tuple[str, ...] = ('mug', 'box'),
             ahead_s: float = 0.0, image: dict | None = None,
             reference_variance_max: float = 1.06e-3) -> None:
        """One camera frame and its detections, stamped now (plus ``ahead_s``), from a model
        whose known validation objects reach ``reference_variance_max`` (-1: no score
        reference)."""
        sec, nanosec = divmod(self.peer.get_clock().now().nanoseconds + int(ahead_s * 1e9),
                              1_000_000_000)
        header_stamp = Time(sec=sec, nanosec=nanosec)
        msg = Image(**(image or IMAGE))
        msg.header.stamp = header_stamp
        self.image_pub.publish(msg)
        array = DetectionArray(class_names=list(class_names), detections=detections,
                               model_id='m1', reference_variance_max=reference_variance_max)
        array.header.stamp = header_stamp
        self.det_pub.publish(array)
        time.sleep(FRAME_PERIOD_S)

    def close(self) -> None:
        for executor, spinner in self._spinners:
            spinner.stop()
            executor.shutdown()
        self.peer.destroy_node()
        self.node.destroy_node()


@pytest.fixture
def harness(ros_context: Any, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(ros_context, tmp_path / 'labels.sqlite3')
    yield h
    h.close()


def test_a_frame_stamped_in_the_future_is_refused_and_asking_goes_on(harness: Harness) -> None:
    h = harness
    for _ in range(3):
        h.send([detection(1)])
    h.send([detection(99)], ahead_s=1e6)
    for _ in range(12):
        h.send([detection(1)])
    h.wait(lambda: h.counter('future_stamps') == 1, 'the future frame counted')
    request = h.wait(lambda: h.requests and h.requests[0], 'a help request on track 1')
    assert request.detection.track_id == 1
    assert abs(request.header.stamp.sec - time.time()) < 60.0  # a real frame's stamp
    assert h.counter('malformed') == 0


def test_class_names_the_store_refuses_are_left_out_and_counted(harness: Harness,
                                                                 tmp_path: Path) -> None:
    h = harness
    names = ('mug', 'm' * 65, 'mug\nred')
    for _ in range(12):  # several frames past the 4 that earn the request
        h.send([detection(1, class_id='m' * 65, probabilities=(0.2, 0.5, 0.3))], names)
    request = h.wait(lambda: h.requests and h.requests[0], 'a help request on track 1')
    assert list(request.candidate_labels) == ['mug']  # the refused names are left out
    h.wait(lambda: h.counter('invalid_class_names') > 0, 'the refused class names counted')
    time.sleep(0.3)  # asked once, not cancelled and retried frame after frame
    assert len(h.requests) == 1
    assert h.counter('requests_not_raised') == 0 and h.counter('malformed') == 0
    with LabelStore(tmp_path / 'labels.sqlite3') as store:
        (stored,) = store.pending_requests()
    assert stored.request_id == request.request_id and stored.class_name == ''
    assert stored.candidates == (('mug', pytest.approx(0.2)),)


def test_oversized_images_are_not_kept(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    h = harness
    h.image_pub.publish(Image(height=5000, width=5000, encoding='rgb8', step=15000))
    h.wait(lambda: h.counter('oversized_images') == 1, 'the 25-megapixel image counted')
    monkeypatch.setattr(ask_for_help_node, 'MAX_IMAGE_BYTES', len(IMAGE['data']) - 1)
    for _ in range(6):
        h.send([detection(1)])  # over the byte cap now: no crop, nothing asked
    h.wait(lambda: h.counter('no_image') > 0, 'a request that found no image to crop')
    assert h.requests == [] and h.counter('oversized_images') > 1


@pytest.mark.parametrize(('name', 'value', 'reason'), [
    ('labeler', '   ', 'labeler must not be empty'),
    ('labeler', 'x' * 100, 'labeler is 100 characters long'),
    ('labeler', 'a\tb', "labeler contains the non-printable character '\\t'"),
    ('teach_service', 'teach object', "teach_service 'teach object' is not a service name"),
])
def test_bad_string_parameters_are_refused_at_start(ros_context: Any, tmp_path: Path,
                                                    name: str, value: str, reason: str) -> None:
    with pytest.raises(ValueError, match='invalid parameters') as refused:
        Harness(ros_context, tmp_path / 'labels.sqlite3', **{name: value})
    assert reason in str(refused.value)


def test_a_bad_labeler_is_refused_when_set_and_answers_keep_working(harness: Harness) -> None:
    h = harness
    client = AsyncParameterClient(h.peer, 'ask_for_help_node')
    assert client.wait_for_services(timeout_sec=TIMEOUT_S)
    for value, reason in (('   ', 'must not be empty'), ('x' * 100, 'at most 64'),
                          ('a\tb', 'non-printable')):
        future = client.set_parameters([Parameter('labeler', value=value)])
        h.wait(future.done, 'set_parameters response')
        (result,) = future.result().results
        assert not result.successful and reason in result.reason
    assert h.node.get_parameter('labeler').value == 'ros'
    for _ in range(6):
        h.send([detection(1)])
    request = h.wait(lambda: h.requests and h.requests[0], 'a help request')
    assert h.label_client.wait_for_service(timeout_sec=TIMEOUT_S)
    future = h.label_client.call_async(ProvideLabel.Request(
        request_id=request.request_id, label='teapot', labeler=''))
    h.wait(future.done, 'the answer acknowledged')
    assert future.result().accepted, future.result().message


def test_a_signal_the_model_cannot_give_is_reported_and_ood_flags_still_ask(
        ros_context: Any, tmp_path: Path) -> None:
    # 0.5 logit^2 is far above ten times the model's largest validation variance, 1.06e-3.
    h = Harness(ros_context, tmp_path / 'a.sqlite3', signal='gp_variance',
                gp_variance_threshold=0.5)
    try:
        for _ in range(6):
            h.send([detection(1)])
        h.wait(lambda: 'cannot fire' in h.counters.get('signal_problem', ''), 'the report')
        assert 'gp_variance_threshold [0.5]' in h.counters['signal_problem']
        assert '0.00106 logit^2' in h.counters['signal_problem']
        assert not h.requests  # 1e-3 is below 0.5: the threshold alone never asks
        flagged = detection(2)
        flagged.uncertainty.out_of_distribution = True
        for _ in range(4):
            h.send([flagged])
        request = h.wait(lambda: h.requests and h.requests[0], 'a request from the OOD flag')
        assert request.detection.track_id == 2 and 'out-of-distribution' in request.reason
    finally:
        h.close()
    # A model without a score reference cannot give the default signal either.
    h = Harness(ros_context, tmp_path / 'b.sqlite3')
    try:
        h.send([detection(3)], reference_variance_max=-1.0)
        h.wait(lambda: 'no score reference' in h.counters.get('signal_problem', ''), 'report')
    finally:
        h.close()
