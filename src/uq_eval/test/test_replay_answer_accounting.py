"""``uq replay``'s answer accounting (``AnswerTracker``) on hand-built sends and answers.

A looping bag sends images with the same stamps again on every pass, and an answer names
only its stamp. An answer covers one image: an image counts as answered only while its stamp
has at least as many answers as images sent with it, so frames the nodes drop on a later
pass are reported (and fail the replay) even though an earlier pass was answered. The
tracker is driven without a ROS graph: a stand-in node hands its answer callback to the test,
which delivers ``DetectionArray`` messages as the subscription would.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uq_eval.bags.replay import ANSWER_TOPIC, AnswerTracker
from uq_msgs.msg import DetectionArray

FIRST_STAMP_NS = 1_700_000_000 * 10**9
PERIOD_NS = 50_000_000


class StandInNode:
    """Just what ``AnswerTracker`` asks of a node: one subscription, whose callback is kept."""

    def __init__(self) -> None:
        self.callbacks = {}

    def create_subscription(self, msg_type, topic, callback, qos):
        assert msg_type is DetectionArray and topic == ANSWER_TOPIC
        self.callbacks[topic] = callback
        return SimpleNamespace(topic_name=topic)


class Replay:
    """A tracker and the means to answer it."""

    def __init__(self) -> None:
        self.node = StandInNode()
        self.tracker = AnswerTracker(self.node)

    def answer(self, stamp_ns: int) -> None:
        msg = DetectionArray()
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 10**9)
        self.node.callbacks[ANSWER_TOPIC](msg)


def stamps(n: int) -> list[int]:
    return [FIRST_STAMP_NS + k * PERIOD_NS for k in range(n)]


@pytest.mark.parametrize(('laps', 'answered_laps'), [(2, 1), (3, 1), (3, 2), (5, 1), (5, 4)])
def test_a_later_pass_left_unanswered_is_counted_image_by_image(laps, answered_laps):
    lap = stamps(6)
    replay = Replay()
    for k in range(laps):
        for stamp in lap:
            replay.tracker.sent(stamp)
            if k < answered_laps:  # the nodes answer the first passes only
                replay.answer(stamp)
    assert replay.tracker.images == laps * len(lap)
    # Each image of every pass after the answered ones is unanswered, named in send order.
    assert replay.tracker.unanswered() == lap * (laps - answered_laps)
    # The pacing waits on the same rule: the stamp is not fully answered.
    assert not any(replay.tracker.wait_answered(stamp, 0.0) for stamp in lap)
    # Answers to the missing images, one per image, complete the replay.
    for _ in range(laps - answered_laps):
        for stamp in lap:
            replay.answer(stamp)
    assert replay.tracker.unanswered() == []
    assert all(replay.tracker.wait_answered(stamp, 0.0) for stamp in lap)


def test_one_answer_for_a_stamp_sent_twice_leaves_the_later_image_unanswered():
    replay = Replay()
    first, second = stamps(2)
    for stamp in (first, second, first):  # the loop starts over after two frames
        replay.tracker.sent(stamp)
    replay.answer(first)
    replay.answer(second)
    assert replay.tracker.unanswered() == [first]
    assert not replay.tracker.wait_answered(first, 0.0)
    assert replay.tracker.wait_answered(second, 0.0)


# Events of a replay: ('send', i) sends an image stamped stamps[i], ('answer', i) delivers
# one answer stamped stamps[i] (possibly before any image with it was sent, or more answers
# than images: a second answering node).
EVENTS = st.lists(st.tuples(st.sampled_from(['send', 'answer']), st.integers(0, 3)),
                  max_size=60)


@settings(max_examples=300, deadline=None)
@given(events=EVENTS)
def test_unanswered_images_are_counted_by_send_not_by_stamp(events):
    pool = stamps(4)
    replay = Replay()
    sent: Counter[int] = Counter()
    answers: Counter[int] = Counter()
    order: list[int] = []
    for kind, i in events:
        if kind == 'send':
            replay.tracker.sent(pool[i])
            sent[pool[i]] += 1
            order.append(pool[i])
        else:
            replay.answer(pool[i])
            answers[pool[i]] += 1
    missing = {s: max(0, n - answers[s]) for s, n in sent.items()}
    unanswered = replay.tracker.unanswered()
    assert Counter(unanswered) == +Counter(missing)
    assert replay.tracker.images == len(order) == sum(sent.values())
    # Named in send order (a subsequence of the images sent).
    it = iter(order)
    assert all(stamp in it for stamp in unanswered)
    for s in pool:
        assert replay.tracker.wait_answered(s, 0.0) == (answers[s] >= sent[s])
