"""The one-slot mailbox between the detector node's camera callback and inference thread."""

from __future__ import annotations

import threading

from uq_perception.frame_mailbox import LatestFrameMailbox


def test_newest_item_wins_and_replacements_are_reported():
    mailbox: LatestFrameMailbox[int] = LatestFrameMailbox()
    assert mailbox.put(1) is False
    assert mailbox.put(2) is True  # 1 was never taken: dropped
    assert mailbox.take() == 2
    assert mailbox.put(3) is False
    assert mailbox.take() == 3


def test_take_waits_for_a_put_from_another_thread():
    mailbox: LatestFrameMailbox[str] = LatestFrameMailbox()
    taken: list[str | None] = []
    taker = threading.Thread(target=lambda: taken.append(mailbox.take()))
    taker.start()
    taker.join(timeout=0.2)
    assert taker.is_alive(), 'take() must wait while the mailbox is empty'
    mailbox.put('frame')
    taker.join(timeout=5)
    assert taken == ['frame']


def test_close_releases_the_taker_and_discards_items():
    mailbox: LatestFrameMailbox[int] = LatestFrameMailbox()
    results: list[int | None] = []
    taker = threading.Thread(target=lambda: results.append(mailbox.take()))
    taker.start()
    mailbox.close()
    taker.join(timeout=5)
    assert results == [None]
    assert mailbox.put(7) is False
    assert mailbox.take() is None
