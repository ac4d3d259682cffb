"""Ask-for-help de-duplication over long tracks of a turning object.

An object that turns changes its appearance, so its embedding drifts away from the one it
had when the person was asked about it. The track is still the same object: once asked
about, a track is never asked about again, whatever its embedding does, and the embedding
match only decides for new track ids (a track break). The examples elsewhere keep each
object's embedding fixed, where matching every frame against the objects asked about would
look the same; here the embedding turns far past ``embedding_match_threshold`` over hundreds
of frames, and the counters must come out exact: one request, and one suppression per track
break, none for the frames of a track already bound.

Pure logic on hand-built observations and invented clocks (no rclpy).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uq_autonomy.help.policy import (
    HelpPolicy,
    HelpPolicyConfig,
    Suppression,
    TrackObservation,
)

DIM = 16
UNCERTAIN = 0.99  # calibrated score above the default threshold 0.96 in every frame


def facing(angle_rad: float) -> np.ndarray:
    """The object's embedding when turned by ``angle_rad`` from its start: a rotation in
    one plane of the feature space, so the cosine to the start is cos(angle)."""
    v = np.zeros(DIM)
    v[0], v[1] = math.cos(angle_rad), math.sin(angle_rad)
    return v


def seen(track_id: int, angle_rad: float) -> TrackObservation:
    return TrackObservation(track_id=track_id, class_index=0, class_name='mug',
                            calibrated_score=UNCERTAIN, box=(320.0, 240.0, 40.0, 40.0),
                            embedding=facing(angle_rad))


def ids():
    counter = itertools.count(1)
    return lambda: f'req-{next(counter)}'


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize(('frames', 'turn_deg', 'rate_hz'), [
    (300, 90.0, 10.0),    # a quarter turn over 30 s
    (600, 180.0, 30.0),   # half a turn over 20 s
    (500, 360.0, 10.0),   # a full turn over 50 s: back to where it was asked about
])
def test_a_turning_track_is_asked_about_once(frames, turn_deg, rate_hz):
    cfg = HelpPolicyConfig()  # the shipped defaults: 4 of 5 frames, 5 s cooldown, 3/min
    policy = HelpPolicy(cfg, new_request_id=ids())
    step = math.radians(turn_deg) / (frames - 1)
    decisions = []
    farthest = 1.0
    for k in range(frames):
        decisions += policy.observe(k / rate_hz, [seen(7, k * step)])
        if decisions:
            farthest = min(farthest, cosine(decisions[0].embedding, facing(k * step)))
    # The turn took the track far out of the embedding match of the object asked about:
    # only the once-per-track rule can keep it from being asked again.
    assert farthest < cfg.embedding_match_threshold - 0.5
    assert [(d.request_id, d.track_id) for d in decisions] == [('req-1', 7)]
    assert decisions[0].stamp == (cfg.min_frames_above - 1) / rate_hz  # asked on evidence
    # Exact over the track: one request, and no suppression -- the frames after it were
    # never candidates, so neither the embedding match nor the budget saw them.
    assert policy.counters == Counter({'requests': 1})
    assert policy.pending() == ['req-1']


def test_a_turning_track_answered_midway_is_not_asked_again():
    policy = HelpPolicy(HelpPolicyConfig(), new_request_id=ids())
    decisions = []
    for k in range(400):
        decisions += policy.observe(k * 0.1, [seen(3, math.radians(0.5 * k))])
        if k == 100:
            assert policy.mark_answered('req-1', 'teapot')
    assert [d.request_id for d in decisions] == ['req-1']
    assert policy.counters == Counter({'requests': 1})
    assert policy.pending() == [] and policy.label_of('req-1') == 'teapot'


def test_track_breaks_of_a_turning_object_are_each_suppressed_once():
    # The object swings back and forth by 90 degrees (period 100 frames at 10 Hz) and the
    # tracker loses it every 50 frames, each time facing the front again: every new track
    # matches the object asked about when it earns its request (one suppression per break),
    # then swings out of the match while bound to it (no suppression, no request).
    period, breaks_every, frames = 100, 50, 800
    policy = HelpPolicy(HelpPolicyConfig(), new_request_id=ids())
    decisions = []
    for k in range(frames):
        angle = math.radians(90.0) * math.sin(2 * math.pi * k / period)
        decisions += policy.observe(k * 0.1, [seen(100 + k // breaks_every, angle)])
    tracks = frames // breaks_every
    assert [(d.request_id, d.track_id) for d in decisions] == [('req-1', 100)]
    assert policy.counters == Counter({'requests': 1,
                                       Suppression.SAME_OBJECT_EMBEDDING.value: tracks - 1})


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), frames=st.integers(100, 600),
       cooldown_s=st.sampled_from([0.0, 1.0, 5.0]),
       max_step_deg=st.sampled_from([0.5, 2.0, 5.0]))
def test_any_turning_of_one_track_costs_exactly_one_request(seed, frames, cooldown_s,
                                                            max_step_deg):
    # The object turns at random (a random walk of its angle) at random frame intervals;
    # whatever the path, the one track is asked about once and nothing else is counted.
    rng = np.random.default_rng(seed)
    policy = HelpPolicy(HelpPolicyConfig(cooldown_s=cooldown_s), new_request_id=ids())
    angles = np.cumsum(rng.uniform(-1.0, 1.0, frames) * math.radians(max_step_deg))
    stamps = np.cumsum(rng.uniform(0.02, 0.5, frames))  # within the 5 s track timeout
    decisions = []
    for stamp, angle in zip(stamps, angles, strict=True):
        decisions += policy.observe(float(stamp), [seen(1, float(angle))])
    assert [d.request_id for d in decisions] == ['req-1']
    assert policy.counters == Counter({'requests': 1})
