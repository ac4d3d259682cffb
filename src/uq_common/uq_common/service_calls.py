"""Service calls that are sent again when their response is lost.

``wait_for_service()`` returning True does not promise that the first call is answered. Over
Fast DDS the request can reach the server before the server has matched the client's
response reader; the server then waits briefly, gives up and drops the response (rclpy logs
``failed to send response (timeout)``). The request itself was executed, so only idempotent
requests may be sent again. This project's ``ProvideLabel`` and ``TeachObject`` are: a label
delivered twice is stored once and applied once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any


@dataclass
class _Call:
    request: Any
    on_done: Callable[[Any], None]
    future: Any
    sent_at: float
    attempts: int


class ResendingCalls:
    """The in-flight idempotent calls of one client, by key, for a node's own executor.

    :meth:`send` starts a call unless one with the same key is in flight; a call with no
    response ``timeout_s`` after it was sent is abandoned and sent again by
    :meth:`resend_overdue`, which the node calls from a timer. ``on_done`` gets the finished
    future once, from the executor, after the key has left the in-flight set.
    """

    def __init__(self, client: Any, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not timeout_s > 0:
            raise ValueError(f'timeout_s must be positive, got {timeout_s!r}')
        self._client = client
        self._timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._calls: dict[Hashable, _Call] = {}

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._calls

    def __len__(self) -> int:
        with self._lock:
            return len(self._calls)

    def send(self, key: Hashable, request: Any, on_done: Callable[[Any], None]) -> bool:
        """Call the service with ``request``; False (nothing sent) while ``key`` is in flight."""
        with self._lock:
            if key in self._calls:
                return False
            call = _Call(request, on_done, None, self._clock(), 1)
            self._calls[key] = call
        self._start(key, call)
        return True

    def resend_overdue(self) -> list[tuple[Hashable, int]]:
        """Send again every call unanswered for ``timeout_s``; returns (key, attempt) pairs."""
        now = self._clock()
        with self._lock:
            overdue = [(key, call) for key, call in self._calls.items()
                       if now - call.sent_at >= self._timeout_s]
            for _, call in overdue:
                self._client.remove_pending_request(call.future)
                call.sent_at, call.attempts = now, call.attempts + 1
        for key, call in overdue:
            self._start(key, call)
        return [(key, call.attempts) for key, call in overdue]

    def _start(self, key: Hashable, call: _Call) -> None:
        future = self._client.call_async(call.request)
        with self._lock:
            call.future = future
        future.add_done_callback(lambda f, k=key, c=call: self._finished(k, c, f))

    def _finished(self, key: Hashable, call: _Call, future: Any) -> None:
        with self._lock:
            # A response to an abandoned attempt can still arrive; the first one counts.
            if self._calls.get(key) is not call:
                return
            del self._calls[key]
        call.on_done(future)


def call_until_answered(client: Any, request: Any, *, attempt_timeout_s: float = 5.0,
                        timeout_s: float = 30.0, poll_s: float = 0.01) -> Any | None:
    """Send an idempotent ``request`` until a response arrives; None after ``timeout_s``.

    For callers outside the executor (command-line tools, tests) while another thread spins
    the client's node.
    """
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        future = client.call_async(request)
        attempt_end = min(end, time.monotonic() + attempt_timeout_s)
        while not future.done() and time.monotonic() < attempt_end:
            time.sleep(poll_s)
        if future.done():
            return future.result()
        client.remove_pending_request(future)
    return None
