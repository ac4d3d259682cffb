"""Every uq_msgs message and service travels between two rclpy nodes over real DDS with
every field intact (nested messages and arrays included)."""

from __future__ import annotations

import time

import pytest
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy

from uq_msgs.msg import AutonomyState, Detection, DetectionArray, HelpRequest, Uncertainty
from uq_msgs.srv import ProvideLabel, SetAutonomyOverride, TeachObject

MESSAGE_TYPES = [Uncertainty, Detection, DetectionArray, AutonomyState, HelpRequest]
SERVICE_TYPES = [ProvideLabel, SetAutonomyOverride, TeachObject]
TIMEOUT_S = 10.0


def _spin_until(executor: SingleThreadedExecutor, done, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        executor.spin_once(timeout_sec=0.05)


@pytest.mark.parametrize('msg_type', MESSAGE_TYPES, ids=lambda t: t.__name__)
def test_message_round_trip_over_dds(ros_context, filled_message, msg_type):
    sent = filled_message(msg_type)
    received = []
    qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    talker = Node('uq_talker', context=ros_context)
    listener = Node('uq_listener', context=ros_context)
    executor = SingleThreadedExecutor(context=ros_context)
    try:
        publisher = talker.create_publisher(msg_type, 'interface_check', qos)
        listener.create_subscription(msg_type, 'interface_check', received.append, qos)
        executor.add_node(talker)
        executor.add_node(listener)
        _spin_until(executor, lambda: publisher.get_subscription_count() > 0)
        publisher.publish(sent)
        _spin_until(executor, lambda: bool(received))
    finally:
        executor.shutdown()
        talker.destroy_node()
        listener.destroy_node()
    assert received, f'no {msg_type.__name__} arrived within {TIMEOUT_S} s'
    assert received[0] == sent
    assert received[0] is not sent


@pytest.mark.parametrize('srv_type', SERVICE_TYPES, ids=lambda t: t.__name__)
def test_service_round_trip_over_dds(ros_context, filled_message, srv_type):
    request = filled_message(srv_type.Request)
    response_template = filled_message(srv_type.Response)
    seen_requests = []

    def serve(req, resp):
        seen_requests.append(req)
        for field in srv_type.Response.get_fields_and_field_types():
            setattr(resp, field, getattr(response_template, field))
        return resp

    server_node = Node('uq_server', context=ros_context)
    client_node = Node('uq_client', context=ros_context)
    executor = SingleThreadedExecutor(context=ros_context)
    try:
        server_node.create_service(srv_type, 'interface_check', serve)
        client = client_node.create_client(srv_type, 'interface_check')
        executor.add_node(server_node)
        executor.add_node(client_node)
        _spin_until(executor, client.service_is_ready)
        assert client.service_is_ready(), 'service did not appear'
        future = client.call_async(request)
        _spin_until(executor, future.done)
    finally:
        executor.shutdown()
        server_node.destroy_node()
        client_node.destroy_node()
    assert future.done(), f'{srv_type.__name__} call did not complete'
    assert seen_requests == [request]
    assert future.result() == response_template


def test_autonomy_level_constants():
    levels = [AutonomyState.TELEOPERATION, AutonomyState.GUIDED, AutonomyState.SHARED,
              AutonomyState.ASSISTANCE]
    assert levels == [0, 1, 2, 3]
