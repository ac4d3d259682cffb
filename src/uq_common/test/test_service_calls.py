"""A call whose response does not come in time is sent again, and answered once, over DDS.

The server holds its first answer back for longer than the client waits, as a response lost
in discovery looks to the client; the late answer must not be delivered a second time.
"""

import threading
import time

import pytest
import rclpy
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor
from std_srvs.srv import Trigger

from uq_common.service_calls import ResendingCalls, call_until_answered
from uq_common.spin_thread import SpinThread

FIRST_ANSWER_DELAY_S = 1.5
CLIENT_TIMEOUT_S = 0.4


class SlowFirstServer:
    def __init__(self, context):
        self.node = rclpy.create_node('slow_first_server', context=context)
        self.calls = 0
        self.busy = 0
        self._lock = threading.Lock()
        self.node.create_service(Trigger, 'slow_first', self._serve,
                                 callback_group=ReentrantCallbackGroup())

    def _serve(self, request, response):
        with self._lock:
            self.calls += 1
            self.busy += 1
            call = self.calls
        if call == 1:
            time.sleep(FIRST_ANSWER_DELAY_S)
        response.success, response.message = True, f'answer {call}'
        with self._lock:
            self.busy -= 1
        return response

    def wait_idle(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while self.busy and time.monotonic() < end:
            time.sleep(0.05)


@pytest.fixture
def ros():
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=63)
    server = SlowFirstServer(context)
    client_node = rclpy.create_node('resending_client', context=context)
    client = client_node.create_client(Trigger, 'slow_first')
    server_executor = MultiThreadedExecutor(num_threads=3, context=context)
    server_executor.add_node(server.node)
    client_executor = SingleThreadedExecutor(context=context)
    client_executor.add_node(client_node)
    spinners = [SpinThread(server_executor, 'server'), SpinThread(client_executor, 'client')]
    try:
        assert client.wait_for_service(timeout_sec=20.0)
        yield server, client
    finally:
        server.wait_idle(FIRST_ANSWER_DELAY_S + 1.0)
        for spinner in spinners:
            spinner.stop()
        server_executor.shutdown()
        client_executor.shutdown()
        server.node.destroy_node()
        client_node.destroy_node()
        context.try_shutdown()


def test_an_unanswered_call_is_sent_again_and_finishes_once(ros):
    server, client = ros
    calls = ResendingCalls(client, timeout_s=CLIENT_TIMEOUT_S)
    done = []
    assert calls.send('label-1', Trigger.Request(), done.append)
    assert not calls.send('label-1', Trigger.Request(), done.append), 'sent twice in flight'
    assert 'label-1' in calls
    resent = []
    end = time.monotonic() + 10.0
    while not done and time.monotonic() < end:
        resent += calls.resend_overdue()
        time.sleep(0.05)
    assert len(done) == 1, 'no response after resending'
    assert resent and resent[0] == ('label-1', 2)
    assert done[0].result().message != 'answer 1', 'the slow first answer was not abandoned'
    time.sleep(FIRST_ANSWER_DELAY_S + 0.5)  # the held-back answer arrives now, and is dropped
    assert len(done) == 1
    assert len(calls) == 0 and calls.resend_overdue() == []
    assert server.calls >= 2


def test_call_until_answered_waits_out_a_lost_first_answer(ros):
    server, client = ros
    response = call_until_answered(client, Trigger.Request(), attempt_timeout_s=CLIENT_TIMEOUT_S,
                                   timeout_s=10.0)
    assert response is not None and response.message != 'answer 1'
    assert server.calls >= 2


def test_call_until_answered_gives_up_after_its_timeout(ros):
    _, client = ros
    start = time.monotonic()
    assert call_until_answered(client, Trigger.Request(), attempt_timeout_s=1.0,
                               timeout_s=0.3) is None
    assert time.monotonic() - start < 1.0


def test_the_timeout_must_be_positive(ros):
    _, client = ros
    for bad in (0.0, -1.0, float('nan')):
        with pytest.raises(ValueError, match='timeout_s'):
            ResendingCalls(client, timeout_s=bad)
