"""Waiting, from another process, until a lifecycle node is in a given state.

The detector configures and activates itself at start (its ``autostart`` parameter), so a
respawned process does not wait for anybody's ``ChangeState`` request. Its transition
events are volatile: one published before a watcher's subscription has been matched is lost,
which after a SIGKILL and respawn is the usual case. Asking the node's ``get_state`` service
until it answers the state wanted does not depend on that timing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lifecycle_msgs.srv import GetState

from uq_common.service_calls import call_until_answered


def wait_for_state(node: Any, lifecycle_node: str, label: str,
                   should_stop: Callable[[], bool], *, period_s: float = 0.1,
                   attempt_timeout_s: float = 1.0) -> bool:
    """Ask ``<lifecycle_node>/get_state`` every ``period_s`` until it answers ``label``.

    For a caller outside the executor of ``node`` while another thread spins it. A request
    left unanswered for ``attempt_timeout_s`` (a server of a dead process, still in the DDS
    graph until its lease ends) is abandoned and asked again.

    Parameters
    ----------
    node
        An rclpy node spun by another thread; the client is created on it and destroyed.
    lifecycle_node
        Fully qualified name of the lifecycle node, e.g. ``/robot/detector_node``.
    label
        State label wanted: ``unconfigured``, ``inactive``, ``active`` or ``finalized``.
    should_stop
        Checked before each question; True ends the wait.

    Returns
    -------
    bool
        True once the node answered ``label``; False when ``should_stop`` ended the wait.
    """
    client = node.create_client(GetState, f'{lifecycle_node.rstrip("/")}/get_state')
    try:
        while not should_stop():
            if client.service_is_ready():
                response = call_until_answered(client, GetState.Request(),
                                               attempt_timeout_s=attempt_timeout_s,
                                               timeout_s=attempt_timeout_s)
                if response is not None and response.current_state.label == label:
                    return True
            time.sleep(period_s)
        return False
    finally:
        node.destroy_client(client)
