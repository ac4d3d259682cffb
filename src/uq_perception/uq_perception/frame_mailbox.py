"""One-slot mailbox that hands camera frames to an inference thread (ROS-free).

The camera callback must never wait for inference, and inference must never work on a
stale frame. A new frame therefore replaces the one not yet taken, as a keep-last queue of
depth 1 does, and the caller learns that the old one was dropped.
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

Item = TypeVar('Item')


class LatestFrameMailbox(Generic[Item]):
    """Holds at most one item; ``put`` never blocks, ``take`` waits for an item or ``close``."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._item: Item | None = None
        self._full = False
        self._closed = False

    def put(self, item: Item) -> bool:
        """Leave ``item`` for the taker; True when it replaced one that was never taken.

        After :meth:`close` the item is discarded (and False returned).
        """
        with self._ready:
            if self._closed:
                return False
            replaced = self._full
            self._item, self._full = item, True
            self._ready.notify()
            return replaced

    def take(self) -> Item | None:
        """The latest item, waiting until there is one; None once the mailbox is closed."""
        with self._ready:
            self._ready.wait_for(lambda: self._full or self._closed)
            if not self._full:
                return None
            item, self._item, self._full = self._item, None, False
            return item

    def close(self) -> None:
        """Discard any waiting item and release the taker for good."""
        with self._ready:
            self._closed = True
            self._item, self._full = None, False
            self._ready.notify_all()
