"""`uq eval duplicates`: what the duplicate suppression removes and loses on a split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from uq_eval.detector.duplicates_study import SuppressionCounts, count_split, markdown_table
from uq_perception.detectors.centernet import Detections
from uq_perception.duplicate_suppression import DuplicateSuppression
from uq_perception.training.detector_data import DetectionSplit

WORKSPACE = Path(__file__).resolve().parents[3]
MODELS = WORKSPACE / 'models'


def centre_size(*xywh: tuple[float, float, float, float]) -> np.ndarray:
    table = np.array(xywh, dtype=np.float32).reshape(-1, 4)
    return np.concatenate([table[:, :2] + table[:, 2:] / 2, table[:, 2:]], axis=1)


def one_image_split(boxes: np.ndarray, labels: list[int], occluded: list[bool]
                    ) -> DetectionSplit:
    count = len(labels)
    return DetectionSplit(
        name='val', images=np.zeros((1, 240, 320, 3), np.uint8), image_ids=np.array([1]),
        boxes=[boxes], labels=[np.array(labels, np.int64)],
        category_ids=[np.arange(1, count + 1)], occluded=[np.array(occluded, bool)],
        truncated=[np.zeros(count, bool)], auxiliary=[np.zeros(count, bool)],
        class_names=['box', 'mug'], category_names={1: 'mug', 2: 'torus', 3: 'box'})


def detections(boxes: np.ndarray, scores: list[float]) -> Detections:
    count = len(scores)
    return Detections(boxes=boxes, scores=np.array(scores, np.float32),
                      embeddings=np.zeros((count, 4), np.float32),
                      logits=np.zeros((count, 2), np.float32))


def test_counts_a_removed_duplicate_and_a_lost_occluded_object():
    # A mug (known), a torus (unknown) and a box mostly hidden behind the mug (occluded,
    # ignored by evaluation). Detected: the mug, a weak box on its handle (no object), the
    # torus, and a weak box on the hidden box, inside the mug's box.
    truth = centre_size((100, 50, 60, 60), (200, 50, 40, 40), (104, 70, 30, 30))
    found = centre_size((100, 50, 60, 60), (148, 70, 15, 20), (200, 50, 40, 40),
                        (104, 70, 30, 30))
    split = one_image_split(truth, [1, -1, 0], [False, False, True])
    dets = [detections(found, [0.8, 0.3, 0.7, 0.3])]

    counts = count_split('val', split, dets, DuplicateSuppression())
    assert counts == SuppressionCounts(
        split='val', score_ratio=0.6, detections=4, suppressed=2, false_positives_before=1,
        false_positives_after=0, known_found=1, known_lost=0, unknown_found=1, unknown_lost=0,
        ignored_found=1, ignored_lost=1)
    off = count_split('val', split, dets, DuplicateSuppression(score_ratio=0.0))
    assert (off.suppressed, off.false_positives_after, off.ignored_lost) == (0, 1, 0)
    assert '| val | 0.6 | 2/4 | 1 → 0 | 0/1 | 0/1 | 1/1 |' in markdown_table([counts])


def test_an_image_without_detections_counts_nothing():
    split = one_image_split(centre_size((10, 10, 20, 20)), [0], [False])
    counts = count_split('val', split, [detections(np.zeros((0, 4), np.float32), [])],
                         DuplicateSuppression())
    assert counts.detections == counts.suppressed == counts.known_found == 0


@pytest.mark.skipif(not (MODELS / 'detector.pt').is_file(),
                    reason='models/detector.pt (the shipped detector) is not in this checkout')
def test_command_runs_on_a_small_split_and_writes_json(tmp_path, capsys):
    from uq_common.cli import main
    from uq_sim.dataset import generate_dataset

    generate_dataset(tmp_path, n=10, seed=0, splits=['val'], progress=False)
    out = tmp_path / 'report.json'
    code = main(['eval', 'duplicates', '--data', str(tmp_path), '--splits', 'val',
                 '--model', str(MODELS / 'detector.pt'), '--score-ratios', '0', '0.6',
                 '--out', str(out)])
    assert code == 0
    rows = json.loads(out.read_text())['rows']
    assert [r['score_ratio'] for r in rows] == [0.0, 0.6]
    assert rows[0]['detections'] == rows[1]['detections'] > 0
    assert '| split | score ratio |' in capsys.readouterr().err


@pytest.mark.parametrize('arguments, message', [
    (['--splits', 'val'], 'is not a split'),
    (['--splits', 'val', '--score-ratios', '1.0'], 'a score ratio is in [0, 1)'),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, arguments, message):
    from uq_common.cli import main

    try:
        code = main(['eval', 'duplicates', '--data', str(tmp_path), *arguments])
    except SystemExit as exc:  # argparse refuses a malformed option value itself
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err
