"""The demo's ROS-free scoring and drawing: help precision and latency, who drives, frames."""

from __future__ import annotations

import math

import numpy as np

from uq_eval.closed_loop.demo_report import (
    HelpEvent,
    LoopSnapshot,
    RecordedFrame,
    annotate_frame,
    label_shares,
    match_object,
    object_labels,
    open_requests,
    score_help,
    who_drives,
)

KNOWN = {'box', 'sphere', 'cylinder', 'mug', 'ellipsoid', 'rock'}
TORUS_BOX = (100.0, 80.0, 40.0, 30.0)


def _event(request_id: str, t: float, true_object: str, detected: str,
           answered_t: float | None = None) -> HelpEvent:
    return HelpEvent(request_id, t, t - 0.2, TORUS_BOX, detected, [detected], 'uncertain',
                     true_object=true_object, answer=true_object.rsplit('_', 1)[0],
                     answered_t=answered_t, accepted=answered_t is not None)


def test_a_request_is_justified_for_unknown_or_misclassified_objects_only():
    events = [_event('a', 1.0, 'torus_1', 'ellipsoid', answered_t=2.0),  # unknown object
              _event('b', 3.0, 'mug_3', 'box'),                          # misclassified
              _event('c', 4.0, 'sphere_2', 'sphere'),                    # needless
              _event('d', -5.0, 'torus_1', 'ellipsoid')]                 # before the trial
    levels = [(0.0, 0), (2.5, 1), (3.1, 2), (4.0, 3)]
    scores = score_help(events, KNOWN, {'torus_1': 0.3, 'mug_3': 0.3}, levels)
    assert scores['requests'] == 3 and scores['justified'] == 2
    assert math.isclose(scores['precision'], 2 / 3)
    assert scores['answered'] == 1
    assert math.isclose(scores['answer_latency_s'], 1.0)
    assert math.isclose(scores['resume_after_answer_s'], 1.1)  # answer at 2.0, shared at 3.1
    assert math.isclose(scores['ask_latency_s'], np.mean([0.8 - 0.3, 2.8 - 0.3]))
    assert scores['objects'] == ['mug_3', 'sphere_2', 'torus_1']


def test_no_request_gives_undefined_precision_not_a_perfect_one():
    scores = score_help([], KNOWN, {}, [(0.0, 3)])
    assert scores['requests'] == 0 and math.isnan(scores['precision'])
    assert math.isnan(scores['resume_after_answer_s'])


def test_a_request_is_open_until_its_answer_is_accepted():
    answered = _event('a', 1.0, 'torus_1', 'ellipsoid', answered_t=2.0)
    waiting = _event('b', 1.5, 'mug_3', 'box')
    assert open_requests([answered, waiting], 0.5) == []
    assert open_requests([answered, waiting], 1.8) == [answered, waiting]
    assert open_requests([answered, waiting], 2.5) == [waiting]


def test_who_drives_follows_the_arbitration_levels():
    assert who_drives(0, 0.0, 0.0, 0.02) == 'operator drives'
    assert who_drives(1, 0.9, 0.0, 0.02) == 'operator drives'
    assert who_drives(2, 0.4, 0.05, 0.02) == 'shared: 40 % autonomy'
    assert who_drives(3, 1.0, 0.0, 0.02) == 'autonomy drives'
    assert who_drives(3, 1.0, 0.05, 0.02) == 'operator overrides'


def test_requests_and_detections_are_matched_to_the_object_they_overlap():
    names = ['torus_1', 'mug_3']
    boxes = np.array([TORUS_BOX, (200.0, 80.0, 30.0, 40.0)])
    assert match_object((102.0, 81.0, 38.0, 30.0), names, boxes) == 'torus_1'
    assert match_object((300.0, 200.0, 10.0, 10.0), names, boxes) == ''
    frames = [RecordedFrame(t, names, [False, True], boxes, boxes[:1] + 1.0, np.array([1e-4]),
                            [cls], np.array([False]), 10.0)
              for t, cls in ((0.0, 'ellipsoid'), (1.0, 'ellipsoid'), (2.0, 'torus'),
                             (3.0, 'torus'))]
    labels = object_labels(frames, 'torus_1')
    assert [c for _, c in labels] == ['ellipsoid', 'ellipsoid', 'torus', 'torus']
    assert object_labels(frames, 'mug_3') == []  # never detected
    assert label_shares(labels, -math.inf, 2.0) == {'ellipsoid': 1.0}
    assert label_shares(labels, 1.0, math.inf) == {'ellipsoid': 1 / 3, 'torus': 2 / 3}


def test_annotated_frames_have_one_size_whatever_they_show():
    rgb = np.zeros((240, 320, 3), np.uint8)
    quiet = annotate_frame(rgb, LoopSnapshot(0.5, 0, 0.0, 0.0, 'running', 0.5), [], [],
                           'ellipsoid', 0.02)
    many = [_event(str(k), 1.0, 'torus_1', 'ellipsoid') for k in range(4)]
    busy = annotate_frame(rgb, LoopSnapshot(2.0, 3, 1.0, 0.0, 'running', 2.0), many,
                          [_event('z', 0.5, 'mug_3', 'box', answered_t=1.0)], 'ellipsoid',
                          0.02)
    assert quiet.shape == busy.shape and quiet.shape[1] == 640 and quiet.shape[0] > 480
    # The open requests are boxed in magenta on the image, the level banner is green.
    assert (busy == np.array([220, 40, 220], np.uint8)).all(axis=-1).any()
    assert not (quiet == np.array([220, 40, 220], np.uint8)).all(axis=-1).any()
    assert tuple(busy[5, 5]) == (40, 160, 70)
