"""The ask-for-help loop across processes, as the product runs it: the real detector_node and
ask_for_help_node executables over DDS, this process as the camera, and a person answering
in a real headless Chromium on the node's labelling page.

An unknown object (a torus) in front of the camera becomes a help request with its crop; the
answer typed on the page lands in the label store, the detector learns the new class online,
and keeps it after a restart. A second test kills the node with SIGKILL during a burst of
answers: every acknowledged label is in the store exactly once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = '/usr/bin/chromium'
CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
                 '--disable-component-update', '--no-first-run']
SCENE = (0, ('box', 'sphere', 'mug'), 'torus')
POSITIONS = ((-0.12, -0.06), (0.0, 0.08), (0.12, -0.04), (0.02, -0.1))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return int(s.getsockname()[1])


class Process:
    """A node executable in its own process group, its output collected."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, cwd=REPO, start_new_session=True)
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

    def wait_for_line(self, needle: str, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if needle in self.output:
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f'{needle!r} not seen; output:\n{self.output[-4000:]}')

    def stop(self, sig: int = signal.SIGINT) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(timeout=10)


@pytest.fixture
def env() -> dict[str, str]:
    domain = 150 + os.getpid() % 50
    return os.environ | {'ROS_DOMAIN_ID': str(domain), 'PYTHONUNBUFFERED': '1',
                         'UQ_LABEL_STORE': '/nonexistent-use-the-parameter'}


@pytest.fixture
def camera(env: dict[str, str]) -> Iterator[Any]:
    """This process: publishes the rendered scene at 5 Hz and listens to the loop."""
    import rclpy
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image

    from uq_common.image_codec import rgb_to_image_fields
    from uq_msgs.msg import DetectionArray, HelpRequest
    from uq_sim.scene import compose_scene, render_scene

    seed, known, unknown = SCENE
    frame = render_scene(compose_scene(list(zip(known + (unknown,), POSITIONS, strict=True)),
                                       seed=seed))
    torus = next(a.bbox for a in frame.annotations if a.class_name == unknown)
    fields = rgb_to_image_fields(frame.rgb)

    context = rclpy.Context()
    rclpy.init(context=context, domain_id=int(env['ROS_DOMAIN_ID']))
    node = rclpy.create_node('help_loop_camera', context=context)
    publisher = node.create_publisher(Image, 'image', 5)
    state: dict[str, Any] = {'requests': [], 'detections': [], 'box': torus}
    node.create_subscription(HelpRequest, 'help_request', state['requests'].append, QoSProfile(
        depth=50, reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL))
    node.create_subscription(DetectionArray, 'detections', state['detections'].append, 10)

    def publish() -> None:
        msg = Image(**fields)
        msg.header.stamp = node.get_clock().now().to_msg()
        msg.header.frame_id = 'camera'
        publisher.publish(msg)

    node.create_timer(0.2, publish)
    state['node'] = node
    with spun(context, node):
        yield state


@contextlib.contextmanager
def spun(context: Any, node: Any) -> Iterator[None]:
    """Spin ``node`` on a thread of its own for the block, then shut it and ``context``
    down."""
    from rclpy.executors import SingleThreadedExecutor

    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        yield
    finally:
        executor.shutdown()
        node.destroy_node()
        context.try_shutdown()
        spinner.join(timeout=5)


def _wait(predicate: Callable[[], Any], timeout: float, what: str,
          process: Process | None = None) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f'timed out waiting for {what}'
                         + (f'; its output:\n{process.output[-3000:]}' if process else ''))


def _iou(box: Any, detection: Any) -> float:
    x, y, w, h = box
    dx0, dy0 = detection.center_x - detection.width / 2, detection.center_y - detection.height / 2
    ix = max(0.0, min(x + w, dx0 + detection.width) - max(x, dx0))
    iy = max(0.0, min(y + h, dy0 + detection.height) - max(y, dy0))
    inter = ix * iy
    return inter / (w * h + detection.width * detection.height - inter)


def _detector(env: dict[str, str], learned: Path) -> Process:
    return Process(['detector_node', '--ros-args', '--params-file',
                    str(REPO / 'config' / 'detector.yaml'), '-p', 'autostart:=true',
                    '-p', f'learned_gp_path:={learned}'], env)


@pytest.mark.slow
def test_a_person_answers_in_the_browser_and_the_detector_learns_the_object(
        tmp_path, env, camera):
    playwright = pytest.importorskip('playwright.sync_api')
    if not Path(CHROMIUM).exists():
        pytest.skip(f'{CHROMIUM} is not installed (make setup installs Debian\'s chromium)')
    from uq_autonomy.labels.store import LabelStore

    store_path, learned, port = tmp_path / 'labels.sqlite3', tmp_path / 'learnt.npz', _free_port()
    detector = _detector(env, learned)
    helper = Process(['ask_for_help_node', '--ros-args', '--params-file',
                      str(REPO / 'config' / 'ask_for_help.yaml'),
                      '-p', f'label_store_url:={store_path}', '-p', f'web_port:={port}'], env)
    try:
        detector.wait_for_line('active: processing images', 120)
        helper.wait_for_line('labelling page', 60)
        request = _wait(lambda: next((r for r in camera['requests']
                                      if _iou(camera['box'], r.detection) > 0.3), None),
                        90, 'a help request on the torus', helper)
        assert request.crop.width > 0 and request.crop.height > 0
        assert len(request.crop.data) == request.crop.height * request.crop.step
        assert request.reason and list(request.candidate_labels)
        assert len(request.detection.embedding) > 0
        # Asked once about this object, however many frames it stays uncertain for.
        time.sleep(3.0)
        assert sum(_iou(camera['box'], r.detection) > 0.3 for r in camera['requests']) == 1

        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                        headless=True)
            try:
                page = browser.new_page()
                page.set_default_timeout(30_000)
                page.goto(f'http://127.0.0.1:{port}/')
                card = page.locator(f'[data-testid=request-card]'
                                    f'[data-request-id="{request.request_id}"]')
                card.wait_for()
                crop = card.locator('[data-testid=crop]')
                page.wait_for_function('img => img.complete && img.naturalWidth > 0',
                                       arg=crop.element_handle())
                assert crop.evaluate('img => img.naturalWidth') == request.crop.width
                assert card.locator('[data-testid=candidate]').count() == len(
                    request.candidate_labels)
                page.fill('[data-testid=labeler]', 'browser-test')
                card.locator('[data-testid=new-label]').fill('torus')
                card.locator('[data-testid=submit-new]').click()
                card.locator('[data-testid=status]').wait_for()
            finally:
                browser.close()

        with LabelStore(store_path, readonly=True) as store:
            (record,) = [r for r in store.labels() if r.request_id == request.request_id]
        assert record.label == 'torus' and record.labeler == 'browser-test'
        helper.wait_for_line('learnt new class', 30)

        def learnt() -> Any:
            for msg in reversed(camera['detections'][-5:]):
                if 'torus' in msg.class_names:
                    return msg
            return None
        msg = _wait(learnt, 30, 'a DetectionArray that knows the torus')
        torus = max(msg.detections, key=lambda d: _iou(camera['box'], d))
        assert torus.class_id == 'torus', (torus.class_id, list(torus.class_probabilities))

        # Kept across a restart of the detector.
        assert detector.stop() == 0, detector.output[-3000:]
        assert learned.exists()
        camera['detections'].clear()
        detector = _detector(env, learned)
        detector.wait_for_line('loaded the learnt state', 120)
        msg = _wait(lambda: camera['detections'][-1] if camera['detections'] else None, 60,
                    'detections after the restart')
        assert 'torus' in msg.class_names
    finally:
        codes = {'detector': detector.stop(), 'ask_for_help': helper.stop()}
    assert codes == {'detector': 0, 'ask_for_help': 0}, helper.output[-3000:]
    assert 'Traceback' not in helper.output + detector.output


@pytest.mark.slow
def test_labels_acknowledged_before_a_sigkill_are_stored_exactly_once(tmp_path, env):
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    from uq_autonomy.labels.store import LabelStore, PendingRequest
    from uq_common.service_calls import call_until_answered
    from uq_msgs.srv import ProvideLabel

    store_path = tmp_path / 'labels.sqlite3'
    ids = [f'req-{i:04d}' for i in range(400)]
    with LabelStore(store_path) as store:
        for rid in ids:
            store.add_request(PendingRequest(rid, reason='test',
                                             embedding=np.zeros(8, np.float32)))
    helper = Process(['ask_for_help_node', '--ros-args', '-p', f'label_store_url:={store_path}',
                      '-p', 'web_enabled:=false'], env)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=int(env['ROS_DOMAIN_ID']))
    node = rclpy.create_node('label_burst', context=context)
    client = node.create_client(ProvideLabel, 'provide_label')
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    acknowledged: list[str] = []
    try:
        helper.wait_for_line('asking for help', 60)
        assert client.wait_for_service(timeout_sec=30)
        # Bad answers are refused with a reason, and the node keeps serving. Refusals are
        # idempotent, so a response lost in discovery is asked for again.
        for rid, label, needle in (('no-such-request', 'mug', 'unknown'),
                                   (ids[0], '', 'empty'), (ids[0], 'x' * 10_000, 'long')):
            response = call_until_answered(
                client, ProvideLabel.Request(request_id=rid, label=label, labeler='test'))
            assert response is not None, f'no answer; node output:\n{helper.output[-3000:]}'
            assert not response.accepted
            assert needle in response.message.lower(), response.message
        killer = threading.Timer(1.5, lambda: os.killpg(helper.proc.pid, signal.SIGKILL))
        killer.start()
        for rid in ids:
            response = call_until_answered(
                client, ProvideLabel.Request(request_id=rid, label='mug', labeler='burst'),
                attempt_timeout_s=3.0, timeout_s=3.0)
            if response is None:
                break
            assert response.accepted, response.message
            acknowledged.append(rid)
        killer.join()
    finally:
        executor.shutdown()
        node.destroy_node()
        context.try_shutdown()
        helper.stop(signal.SIGKILL)
    assert 0 < len(acknowledged) < len(ids), 'the kill did not land inside the burst'
    with LabelStore(store_path) as store:
        assert store.integrity_check() == ['ok']
        labels = [r.request_id for r in store.labels()]
    assert len(labels) == len(set(labels))
    assert set(acknowledged) <= set(labels)
