"""SpinThread runs callbacks in the background and is really gone after stop()."""

import threading

import rclpy
from rclpy.executors import SingleThreadedExecutor

from uq_common.spin_thread import SpinThread


def _spin_a_timer(context):
    node = rclpy.create_node('spin_thread_probe', context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    fired = threading.Event()
    node.create_timer(0.01, fired.set)
    return node, executor, fired


def test_stop_joins_the_thread_before_shutdown():
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=62)
    node, executor, fired = _spin_a_timer(context)
    spinner = SpinThread(executor, name='probe')
    try:
        assert fired.wait(10.0), 'the timer never fired on the spin thread'
    finally:
        spinner.stop()
        executor.shutdown()
        node.destroy_node()
        context.try_shutdown()
    assert not any(t.name == 'probe' for t in threading.enumerate())


def test_a_context_shut_down_under_it_ends_the_thread():
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=62)
    node, executor, fired = _spin_a_timer(context)
    spinner = SpinThread(executor, name='orphan')
    assert fired.wait(10.0)
    context.try_shutdown()
    spinner.stop()
    assert not any(t.name == 'orphan' for t in threading.enumerate())
    node.destroy_node()
