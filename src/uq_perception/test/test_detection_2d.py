"""The vision_msgs Detection2D convention as plain values (no ROS needed)."""

from __future__ import annotations

import numpy as np
import pytest

from uq_perception.detectors.detection_2d import (
    CALIBRATED_SCORE_ID,
    COVARIANCE_SLOTS,
    OUT_OF_DISTRIBUTION_ID,
    RESERVED_PREFIX,
    TRACK_SCORE_ID,
    detection_2d_fields,
)

CLASSES = ['box', 'sphere', 'mug']


def _arrays(count: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return dict(boxes=rng.uniform(5, 100, (count, 4)),
                box_std=rng.uniform(0.1, 5.0, (count, 4)),
                probabilities=rng.dirichlet(np.ones(len(CLASSES)), size=count),
                class_names=CLASSES, track_ids=np.arange(3, 3 + count),
                out_of_distribution=np.arange(count) % 2 == 1,
                calibrated_scores=rng.random(count))


def test_box_centre_size_and_track_id_as_float32_values():
    arrays = _arrays(4)
    fields = detection_2d_fields(**arrays)
    assert len(fields) == 4
    for values, box, track in zip(fields, arrays['boxes'], arrays['track_ids'], strict=True):
        assert [values.center_x, values.center_y, values.size_x, values.size_y] == \
            np.float32(box).tolist()
        assert values.id == str(track)
        assert all(type(v) is float for v in (values.center_x, values.size_y))


def test_covariance_holds_the_box_variances_in_the_documented_slots_and_nothing_else():
    arrays = _arrays(3)
    for values, std in zip(detection_2d_fields(**arrays), arrays['box_std'], strict=True):
        covariance = np.array(values.covariance).reshape(6, 6)
        assert len(values.covariance) == 36
        # x, y, z, rot x diagonal: center_x, center_y, width, height (row-major 6x6).
        expected = np.zeros((6, 6))
        expected[np.diag_indices(4)] = np.float32(std).astype(np.float64) ** 2
        np.testing.assert_array_equal(covariance, expected)
        assert [values.covariance[s] for s in COVARIANCE_SLOTS] == \
            [float(s) ** 2 for s in np.float32(std)]
        assert values.covariance[35] == 0.0  # rot z: theta of an axis-aligned box, exact


def test_class_hypotheses_are_the_probabilities_most_probable_first():
    arrays = _arrays(5)
    for values, row in zip(detection_2d_fields(**arrays), arrays['probabilities'], strict=True):
        classes = values.class_results
        assert sorted(h.class_id for h in classes) == sorted(CLASSES)
        assert {h.class_id: h.score for h in classes} == dict(
            zip(CLASSES, np.float32(row).tolist(), strict=True))
        assert classes[0].class_id == CLASSES[int(np.argmax(row))]
        scores = [h.score for h in classes]
        assert scores == sorted(scores, reverse=True)
        assert values.results[:len(CLASSES)] == classes


def test_tied_probabilities_keep_class_order_as_argmax_does():
    arrays = _arrays(1) | {'probabilities': np.array([[0.25, 0.375, 0.375]])}
    [values] = detection_2d_fields(**arrays)
    assert [h.class_id for h in values.class_results] == ['sphere', 'mug', 'box']


def test_reserved_hypotheses_carry_the_calibrated_score_and_the_ood_flag():
    arrays = _arrays(4)
    for i, values in enumerate(detection_2d_fields(**arrays)):
        reserved = values.results[len(CLASSES):]
        assert [h.class_id for h in reserved] == [CALIBRATED_SCORE_ID, OUT_OF_DISTRIBUTION_ID]
        assert all(h.class_id.startswith(RESERVED_PREFIX) for h in reserved)
        assert reserved[0].score == float(np.float32(arrays['calibrated_scores'][i]))
        assert reserved[1].score == (1.0 if i % 2 else 0.0)


def test_the_track_score_follows_the_calibrated_score_where_the_track_has_one():
    arrays = _arrays(3) | {'track_scores': np.array([0.25, -1.0, 0.75])}
    fields = detection_2d_fields(**arrays)
    for i in (0, 2):
        reserved = fields[i].results[len(CLASSES):]
        assert [h.class_id for h in reserved] == [CALIBRATED_SCORE_ID, TRACK_SCORE_ID,
                                                  OUT_OF_DISTRIBUTION_ID]
        assert reserved[1].score == float(np.float32(arrays['track_scores'][i]))
    assert TRACK_SCORE_ID not in [h.class_id for h in fields[1].results]
    with pytest.raises(ValueError, match='track_scores'):
        detection_2d_fields(**(arrays | {'track_scores': np.array([0.5])}))


def test_an_absent_calibrated_score_has_no_hypothesis():
    arrays = _arrays(2)
    without_reference = detection_2d_fields(**(arrays | {'calibrated_scores': None}))
    one_absent = detection_2d_fields(**(arrays | {'calibrated_scores': np.array([-1.0, 0.5])}))
    for values in without_reference + one_absent[:1]:
        assert [h.class_id for h in values.results[len(CLASSES):]] == [OUT_OF_DISTRIBUTION_ID]
    assert CALIBRATED_SCORE_ID in [h.class_id for h in one_absent[1].results]


def test_an_untracked_detection_has_an_empty_id():
    [values] = detection_2d_fields(**(_arrays(1) | {'track_ids': np.array([-1])}))
    assert values.id == ''


@pytest.mark.parametrize('dtype', [np.int32, np.int64])
def test_every_track_id_from_zero_up_is_the_id_and_only_untracked_is_empty(dtype):
    # Track ids start at 0: the first track must not look untracked ('' is -1 alone). The
    # boundary 0/-1, small ids and the largest id the dtype holds, in one frame.
    tracks = np.array([0, -1, 1, 2, 9, 10, 12345, np.iinfo(dtype).max, -1, 0], dtype=dtype)
    fields = detection_2d_fields(**(_arrays(len(tracks)) | {'track_ids': tracks}))
    for values, track in zip(fields, tracks.tolist(), strict=True):
        if track == -1:
            assert values.id == '', track
        else:
            # The id reads back as the track id: decimal text, no sign, no padding.
            assert values.id == str(track) and int(values.id) == track, track
    # Two detections of one track share its id; the untracked ones share ''.
    assert fields[0].id == fields[-1].id == '0' and fields[1].id == fields[-2].id == ''


def test_no_detections_give_no_fields():
    assert detection_2d_fields(**_arrays(0)) == []


@pytest.mark.parametrize('change', [
    {'box_std': np.zeros((2, 4))},
    {'track_ids': np.arange(4)},
    {'probabilities': np.full((3, 2), 0.5)},
    {'class_names': ['box', 'sphere']},
    {'calibrated_scores': np.zeros(2)},
], ids=['box_std', 'track_ids', 'probabilities', 'class_names', 'calibrated_scores'])
def test_arrays_of_other_lengths_are_refused(change):
    with pytest.raises(ValueError):
        detection_2d_fields(**(_arrays(3) | change))
