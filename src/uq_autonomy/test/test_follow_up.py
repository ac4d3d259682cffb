"""Follow-up teaching: an answered track is taught again only while it is wrong or uncertain,
a bounded number of times, and never across a track's disappearance or a clock reset."""

from __future__ import annotations

import pytest

from uq_autonomy.help.follow_up import FollowUpConfig, FollowUpTeacher

T = 4e-4  # threshold


def test_an_answered_track_that_is_still_wrong_is_taught_again_up_to_the_cap():
    teacher = FollowUpTeacher(FollowUpConfig(max_per_object=2, min_interval_s=1.0))
    teacher.bind(5, 'r1', 'cone', now=10.0)
    assert teacher.observe(10.2, 5, 'cylinder', 1e-4, T) == 'r1#follow-1'
    assert teacher.observe(10.8, 5, 'cylinder', 1e-4, T) is None      # too soon
    assert teacher.observe(11.3, 5, 'cone', 9e-4, T) == 'r1#follow-2'  # right, uncertain
    assert teacher.observe(12.5, 5, 'cylinder', 9e-4, T) is None      # cap reached
    assert teacher.label_of(5) == 'cone'


def test_a_right_and_certain_track_and_unbound_tracks_are_left_alone():
    teacher = FollowUpTeacher()
    teacher.bind(5, 'r1', 'cone', now=0.0)
    assert teacher.observe(0.5, 5, 'cone', 1e-5, T) is None
    assert teacher.observe(0.5, 6, 'mug', 1e-2, T) is None
    teacher.bind(-1, 'r2', 'torus', now=0.5)                            # no track: not bound
    assert teacher.label_of(-1) is None


def test_a_class_named_with_capitals_matches_its_case_folded_label():
    teacher = FollowUpTeacher()
    teacher.bind(5, 'r1', 'traffic light', now=0.0)
    assert teacher.observe(0.5, 5, 'Traffic Light', 1e-5, T) is None


def test_a_track_unseen_for_the_timeout_or_a_clock_reset_is_forgotten():
    teacher = FollowUpTeacher(FollowUpConfig(track_timeout_s=2.0))
    teacher.bind(5, 'r1', 'cone', now=0.0)
    teacher.bind(6, 'r2', 'torus', now=0.0)
    assert teacher.observe(1.5, 6, 'torus', 1e-5, T) is None
    assert teacher.observe(3.0, 7, 'mug', 1e-5, T) is None              # track 5 timed out
    assert teacher.label_of(5) is None and teacher.label_of(6) == 'torus'
    assert teacher.observe(0.1, 6, 'mug', 1e-5, T) is None              # clock went back
    assert teacher.label_of(6) is None


def test_a_stamp_from_the_future_forgets_once_and_the_clock_restarts():
    teacher = FollowUpTeacher(FollowUpConfig(max_per_object=5, min_interval_s=0.0))
    teacher.observe(1e6, 9, 'mug', 1e-5, T)                             # from the future
    teacher.bind(5, 'r1', 'cone', now=10.0)
    assert teacher.observe(10.1, 5, 'cylinder', 1e-4, T) is None        # jump back: reset
    teacher.bind(5, 'r1', 'cone', now=10.2)
    assert teacher.observe(10.3, 5, 'cylinder', 1e-4, T) == 'r1#follow-1'
    assert teacher.observe(10.4, 5, 'cylinder', 1e-4, T) == 'r1#follow-2'


def test_zero_turns_it_off_and_bad_limits_are_refused():
    teacher = FollowUpTeacher(FollowUpConfig(max_per_object=0))
    teacher.bind(1, 'r', 'cone', now=0.0)
    assert teacher.observe(1.0, 1, 'mug', 1.0, T) is None
    with pytest.raises(ValueError, match='max_per_object'):
        FollowUpConfig(max_per_object=-1)
    with pytest.raises(ValueError, match='min_interval_s'):
        FollowUpConfig(min_interval_s=float('nan'))
