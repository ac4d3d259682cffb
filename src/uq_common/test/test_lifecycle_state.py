"""A watcher asking ``get_state`` over DDS sees a real lifecycle node become active, and only
then; it stops waiting when told to."""

import threading
import time

import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.lifecycle import Node as LifecycleNode

from uq_common.lifecycle_state import wait_for_state
from uq_common.spin_thread import SpinThread


def _spun(node, context):
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    return executor, SpinThread(executor, node.get_name())


def test_the_wait_ends_when_the_node_answers_active_and_not_before(ros_context):
    managed = LifecycleNode('managed', namespace='watched', context=ros_context)
    watcher = rclpy.create_node('watcher', context=ros_context)
    spun = [_spun(managed, ros_context), _spun(watcher, ros_context)]
    result, activated_at, answered_at = [], [], []

    def watch():
        result.append(wait_for_state(watcher, '/watched/managed', 'active', lambda: False,
                                     period_s=0.05))
        answered_at.append(time.monotonic())

    thread = threading.Thread(target=watch, daemon=True)
    try:
        thread.start()
        time.sleep(1.5)  # long enough to be answered 'unconfigured', then 'inactive'
        assert not answered_at, 'the wait ended while the node was unconfigured'
        managed.trigger_configure()
        time.sleep(0.5)
        assert not answered_at, 'the wait ended while the node was inactive'
        managed.trigger_activate()
        activated_at.append(time.monotonic())
        thread.join(10.0)
        assert result == [True]
        assert answered_at[0] >= activated_at[0]
    finally:
        for executor, spinner in spun:
            spinner.stop()
            executor.shutdown()
        managed.destroy_node()
        watcher.destroy_node()


def test_the_wait_stops_when_told_to_even_without_the_node(ros_context):
    watcher = rclpy.create_node('lonely_watcher', context=ros_context)
    executor, spinner = _spun(watcher, ros_context)
    deadline = time.monotonic() + 0.5
    try:
        assert not wait_for_state(watcher, '/nobody/detector_node', 'active',
                                  lambda: time.monotonic() > deadline, period_s=0.05)
        assert time.monotonic() - deadline < 0.5
        assert list(watcher.clients) == [], 'the client was left behind'
    finally:
        spinner.stop()
        executor.shutdown()
        watcher.destroy_node()
