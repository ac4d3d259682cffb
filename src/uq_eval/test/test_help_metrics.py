"""Scoring of the ask-for-help loop on hand-built recordings with known answers."""

from __future__ import annotations

import json

import pytest

from uq_eval.closed_loop.help_metrics import (
    AnswerRecord,
    DetectionFrame,
    DetectionRecord,
    RequestRecord,
    RunRecording,
    check_targets,
    recording_from_json,
    recording_to_json,
    score_run,
    summarise,
)
from uq_sim.scripted_labeller import TruthObject

OOD = 3.7e-4
MUG = TruthObject(1, 'mug', True, (50.0, 50.0, 20.0, 20.0))
TORUS = TruthObject(2, 'torus', False, (150.0, 50.0, 20.0, 20.0))
CONE = TruthObject(3, 'cone', False, (250.0, 50.0, 20.0, 20.0))
S = 1_000_000_000  # one second in ns


def _recording() -> RunRecording:
    run = RunRecording('synthetic')
    for k in range(20):
        stamp = k * S // 5
        run.truth[stamp] = (MUG, TORUS, CONE)
        after = stamp > 2 * S
        run.frames.append(DetectionFrame(stamp, ('mug', 'torus') if after else ('mug',), (
            DetectionRecord(1, 'mug', MUG.box, 1e-5),
            # The torus is learnt at 2 s: right class and low variance afterwards, except
            # in one frame where it is called a mug.
            DetectionRecord(2, ('mug' if k == 15 else 'torus') if after else 'mug',
                            TORUS.box, 1e-5 if after else 1e-3),
            # The cone is never detected.
        )))
    run.requests = [
        RequestRecord('q-torus', S, TORUS.box, 'mug', 2, 1e-3),
        RequestRecord('q-torus-again', 2 * S, (151.0, 50.0, 20.0, 20.0), 'mug', 5, 1e-3),
        RequestRecord('q-mug', S, MUG.box, 'mug', 1, 1e-3),          # a known, right object
        RequestRecord('q-nothing', S, (400.0, 400.0, 5.0, 5.0), 'mug', 9, 1e-3),
    ]
    run.answers = [AnswerRecord('q-torus', 'torus', 'scripted', 2 * S)]
    return run


def test_precision_recall_queries_and_post_answer_figures():
    score = score_run(_recording(), OOD)
    assert score['requests'] == 4
    assert score['request_kinds'] == {'unknown_object': 2, 'misclassified_known': 0,
                                      'correct_known': 1, 'unmatched': 1,
                                      'no_ground_truth': 0}
    assert score['help_precision'] == pytest.approx(2 / 4)
    assert score['novel_objects'] == 2 and score['novel_objects_asked'] == 1
    assert score['recall'] == pytest.approx(0.5)
    assert score['queries_per_novel_object'] == pytest.approx(2.0)
    # Frames after 2 s: k = 11..19, nine frames, one of them wrong.
    assert score['post_answer_frames'] == 9
    assert score['post_answer_accuracy'] == pytest.approx(8 / 9)
    assert score['post_answer_low_variance_share'] == pytest.approx(1.0)
    assert score['per_answered_object']['2']['label'] == 'torus'


def test_a_known_object_with_a_wrong_class_is_a_useful_request():
    run = _recording()
    run.requests = [RequestRecord('q', S, MUG.box, 'cylinder', 1, 1e-3)]
    score = score_run(run, OOD)
    assert score['request_kinds']['misclassified_known'] == 1
    assert score['help_precision'] == 1.0


def test_a_request_on_a_stamp_without_ground_truth_is_not_useful():
    run = _recording()
    run.requests = [RequestRecord('q', 123, TORUS.box, 'mug', 2, 1e-3)]
    score = score_run(run, OOD)
    assert score['request_kinds']['no_ground_truth'] == 1 and score['help_precision'] == 0.0


def test_empty_recording_gives_no_ratios():
    score = score_run(RunRecording('empty'), OOD)
    assert score['help_precision'] is None and score['recall'] is None
    assert check_targets(summarise([score])) == dict.fromkeys(
        ('help_precision', 'queries_per_novel_object', 'recall', 'post_answer_accuracy'))


def test_summary_pools_counts_and_checks_targets():
    a, b = score_run(_recording(), OOD), score_run(_recording(), OOD)
    summary = summarise([a, b])
    assert summary['requests'] == 8 and summary['novel_objects'] == 4
    assert summary['help_precision'] == pytest.approx(0.5)
    assert summary['post_answer_accuracy'] == pytest.approx(16 / 18)
    assert check_targets(summary) == {'help_precision': False,
                                      'queries_per_novel_object': False, 'recall': False,
                                      'post_answer_accuracy': False}


def test_recording_round_trips_through_json():
    run = _recording()
    again = recording_from_json(json.loads(json.dumps(recording_to_json(run))))
    assert score_run(again, OOD) == score_run(run, OOD)
