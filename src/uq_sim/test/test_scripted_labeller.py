"""The scripted labeller: ground truth at the request's stamp, best IoU, delay, no-match policy."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from uq_sim.scripted_labeller import (
    MAX_PENDING,
    MAX_REMEMBERED_IDS,
    LabellerConfig,
    ScriptedLabeller,
    TruthObject,
    best_match,
    box_iou,
)

MUG = TruthObject(1, 'mug', True, (100.0, 100.0, 40.0, 40.0))
TORUS = TruthObject(7, 'torus', False, (200.0, 120.0, 50.0, 30.0))


def test_box_iou_of_centre_size_boxes():
    assert box_iou((0, 0, 2, 2), (0, 0, 2, 2)) == pytest.approx(1.0)
    assert box_iou((0, 0, 2, 2), (1, 0, 2, 2)) == pytest.approx(2 / 6)
    assert box_iou((0, 0, 2, 2), (5, 5, 2, 2)) == 0.0
    assert box_iou((0, 0, 0, 0), (0, 0, 0, 0)) == 0.0


def test_best_match_picks_the_most_overlapping_object():
    obj, iou = best_match((195.0, 118.0, 50.0, 30.0), [MUG, TORUS])
    assert obj is TORUS and iou > 0.7
    assert best_match((0.0, 0.0, 1.0, 1.0), []) == (None, 0.0)


def test_answers_the_true_class_after_the_delay_once():
    labeller = ScriptedLabeller(LabellerConfig(answer_delay_s=2.0))
    labeller.add_ground_truth(10, [MUG, TORUS])
    labeller.add_ground_truth(20, [MUG])
    assert labeller.add_request('r1', 10, (198.0, 121.0, 48.0, 30.0), now=100.0)
    assert not labeller.add_request('r1', 10, (198.0, 121.0, 48.0, 30.0), now=100.5)
    assert labeller.due(101.9) == []
    (answer,) = labeller.due(102.0)
    assert (answer.request_id, answer.label, answer.object_id) == ('r1', 'torus', 7)
    assert labeller.due(110.0) == [] and labeller.pending == 0


def test_the_stamp_decides_which_frame_is_used():
    # At stamp 20 the torus is gone: the same box then matches nothing.
    labeller = ScriptedLabeller(LabellerConfig(answer_delay_s=0.0))
    labeller.add_ground_truth(10, [MUG, TORUS])
    labeller.add_ground_truth(20, [MUG])
    labeller.add_request('late', 20, TORUS.box, now=0.0)
    (answer,) = labeller.due(0.0)
    assert answer.label is None and 'IoU' in answer.why


def test_no_match_policy_label_answers_the_configured_label():
    labeller = ScriptedLabeller(LabellerConfig(answer_delay_s=0.0, no_match='label',
                                               no_match_label='background'))
    labeller.add_ground_truth(10, [MUG])
    labeller.add_request('r', 10, (300.0, 300.0, 10.0, 10.0), now=0.0)
    (answer,) = labeller.due(0.0)
    assert answer.label == 'background'


def test_waits_for_ground_truth_that_arrives_after_the_request():
    labeller = ScriptedLabeller(LabellerConfig(answer_delay_s=1.0, truth_timeout_s=2.0))
    labeller.add_request('r', 30, MUG.box, now=0.0)
    assert labeller.due(1.5) == []          # no ground truth for stamp 30 yet
    labeller.add_ground_truth(30, [MUG])
    (answer,) = labeller.due(1.6)
    assert answer.label == 'mug'
    labeller.add_request('lost', 40, MUG.box, now=10.0)
    assert labeller.due(12.9) == []
    (answer,) = labeller.due(13.0)          # delay + timeout passed: given up
    assert answer.label is None and 'no ground truth' in answer.why


def test_ground_truth_buffer_is_bounded():
    labeller = ScriptedLabeller(LabellerConfig(answer_delay_s=0.0, truth_buffer=2,
                                               truth_timeout_s=0.0))
    for stamp in (1, 2, 3):
        labeller.add_ground_truth(stamp, [MUG])
    labeller.add_request('old', 1, MUG.box, now=0.0)
    (answer,) = labeller.due(0.0)
    assert answer.label is None


@pytest.mark.parametrize('kwargs, match', [
    ({'answer_delay_s': -1.0}, 'answer_delay_s'),
    ({'min_iou': 0.0}, 'min_iou'),
    ({'no_match': 'guess'}, 'no_match'),
    ({'no_match': 'label', 'no_match_label': ' '}, 'no_match_label'),
    ({'truth_buffer': 0}, 'truth_buffer'),
])
def test_bad_configuration_is_refused_naming_the_parameter(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LabellerConfig(**kwargs)


def test_node_refuses_an_invalid_parameter_at_start():
    result = subprocess.run(
        [sys.executable, '-m', 'uq_sim.scripted_labeller_node', '--ros-args',
         '-p', 'no_match:=guess'], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'no_match' in result.stderr


@pytest.mark.parametrize('request_id, box', [
    ('', MUG.box), ('x' * 129, MUG.box), ('id\nforged log line', MUG.box), ('-lead', MUG.box),
    ('ok', (math.nan, 1.0, 2.0, 2.0)), ('ok', (1.0, 1.0, math.inf, 2.0)),
    ('ok', (1.0, 1.0, 0.0, 2.0)), ('ok', (1.0, 1.0, 2.0, -1.0)),
])
def test_a_malformed_request_is_refused_and_never_answered(request_id, box):
    labeller = ScriptedLabeller(LabellerConfig(answer_delay_s=0.0, no_match='label'))
    labeller.add_ground_truth(10, [MUG])
    with pytest.raises(ValueError):
        labeller.add_request(request_id, 10, box, now=0.0)
    assert labeller.pending == 0 and labeller.due(100.0) == []


def test_a_flood_of_requests_is_bounded():
    labeller = ScriptedLabeller(LabellerConfig(answer_delay_s=10.0))
    for k in range(MAX_PENDING):
        labeller.add_request(f'r{k}', 10, MUG.box, now=0.0)
    with pytest.raises(ValueError, match='wait already'):
        labeller.add_request('one-more', 10, MUG.box, now=0.0)
    assert labeller.pending == MAX_PENDING
    labeller.due(20.0)  # all answered (no ground truth): the ids stay remembered, bounded
    for k in range(MAX_REMEMBERED_IDS):
        labeller.add_request(f's{k}', 10, MUG.box, now=30.0)
        labeller.due(1e9)
    assert len(labeller._seen) == MAX_REMEMBERED_IDS
    assert labeller.add_request('r0', 10, MUG.box, now=40.0), 'the oldest id was forgotten'
