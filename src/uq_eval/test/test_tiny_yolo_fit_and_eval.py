"""``uq gp fit`` and ``uq eval detector`` on a third-party-style model: a tiny three-scale
YOLO-style network (``TinyYolo`` of ``src/uq_perception/test/conftest.py``) exported to ONNX
in the test, its GP fitted by ``uq gp fit --layout yolo`` (with and without the extra
training points: anchors before NMS, cells of missed objects), then evaluated through the
same adapter options.

The splits are built from the network's own detections, so what the evaluator must report
is known by construction: each annotated object is one detection's box, disjoint from the
other objects and overlapping no other detection at IoU >= 0.5, so it is detected at all,
and detected at the node's operating point exactly when its own detection is among the
operating detections; the GP variance's AUROC is the artefact's on those detections.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

pytest.importorskip('onnx', reason='onnx is part of the CPU install')
pytest.importorskip('onnxruntime', reason='onnxruntime is part of the CPU install')

from uq_common.cli import main as uq  # noqa: E402 - after the skips
from uq_eval.gp.fitting import (  # noqa: E402
    SOURCE_ANCHOR,
    SOURCE_MISSED,
    FitSettings,
    candidate_points,
)
from uq_perception.detectors.contract import Candidates  # noqa: E402
from uq_perception.ntk import LastLayerNTKGP  # noqa: E402
from uq_perception.runtime.onnx_adapter import (  # noqa: E402
    OnnxAdapterConfig,
    OnnxDetector,
    box_iou,
)
from uq_perception.training.detection_scoring import (  # noqa: E402
    AP_MAX_DETECTIONS,
    AP_SCORE_THRESHOLD,
    OPERATING_MAX_DETECTIONS,
    OPERATING_THRESHOLD,
)
from uq_perception.training.detector_data import MIN_EVAL_SIDE  # noqa: E402
from uq_perception.training.metrics import auroc  # noqa: E402
from uq_sim.objects import KNOWN_CLASSES  # noqa: E402

SIZE = (96, 128)
UNKNOWN_CATEGORY = {'id': 101, 'name': 'torus', 'supercategory': 'unknown'}
# Kept detections overlap each other at IoU <= 0.3: each is its own object's only match.
NMS_IOU = 0.3
# Width and height of the objects no detection finds: the detections' boxes are square
# (about 34, 69 and 138 pixels at the three scales), so none overlaps one at IoU 0.5.
MISSED_SIZE = (18, 88)
SPLITS = {'train': (12, 0), 'val': (8, 1), 'test': (6, 2), 'test_unknown': (10, 3)}


def _toy():
    """The tiny networks of the perception tests (their conftest.py, loaded by path)."""
    path = Path(__file__).resolve().parents[2] / 'uq_perception' / 'test' / 'conftest.py'
    spec = importlib.util.spec_from_file_location('perception_test_networks', path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _xyxy(centre_size: np.ndarray) -> np.ndarray:
    c = np.asarray(centre_size, np.float64).reshape(-1, 4)
    return np.column_stack([c[:, :2] - c[:, 2:] / 2, c[:, :2] + c[:, 2:] / 2])


def _objects(detections) -> list[int]:
    """Detections whose boxes become annotated objects: large enough to be scored, none
    overlaps another detection at IoU >= 0.5, and the chosen ones are pairwise disjoint."""
    boxes = _xyxy(detections.boxes)
    chosen: list[int] = []
    for d in range(len(boxes)):
        if detections.boxes[d, 2:].min() < MIN_EVAL_SIDE:
            continue
        others = np.delete(boxes, d, axis=0)
        if len(others) and box_iou(boxes[d], others).max() >= 0.5:
            continue
        if chosen and box_iou(boxes[d], boxes[chosen]).max() > 0.0:
            continue
        chosen.append(d)
    return chosen


def _write_split(root: Path, detector: OnnxDetector, toy, count: int, seed: int,
                 unknown_every: int, missed: bool = False) -> dict:
    """``count`` frames annotated with chosen detections (every ``unknown_every``-th one an
    unknown object, 0: none) and, with ``missed``, one known object per frame that no
    detection finds (a tall thin box: the detections' are square); returns what the
    evaluator must find."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True)
    images, annotations = [], []
    expected = {'known': 0, 'unknown': 0, 'known_operating': 0, 'unknown_operating': 0,
                'variance_objects': []}
    for i in range(count):
        frame = toy.scene(1000 * seed + i, SIZE)
        loose = detector.infer(frame, AP_SCORE_THRESHOLD, AP_MAX_DETECTIONS)
        operating = detector.infer(frame, OPERATING_THRESHOLD, OPERATING_MAX_DETECTIONS)
        for n, d in enumerate(_objects(loose)):
            unknown = unknown_every > 0 and n % unknown_every == unknown_every - 1
            category = UNKNOWN_CATEGORY['id'] if unknown else \
                int(np.argmax(loose.logits[d])) + 1
            cx, cy, w, h = (float(v) for v in loose.boxes[d])
            annotations.append({'id': len(annotations) + 1, 'image_id': i + 1,
                                'category_id': category, 'bbox': [cx - w / 2, cy - h / 2, w, h],
                                'area': w * h, 'iscrowd': 0})
            kind = 'unknown' if unknown else 'known'
            expected[kind] += 1
            at_operating = np.flatnonzero(np.all(np.isclose(operating.boxes, loose.boxes[d]),
                                                 axis=1))
            if at_operating.size:
                expected[f'{kind}_operating'] += 1
                expected['variance_objects'].append(
                    (unknown, operating.embeddings[at_operating[0]]))
        if missed:
            w, h = MISSED_SIZE
            x, y = float(rng.integers(0, SIZE[1] - w)), float(rng.integers(0, SIZE[0] - h))
            annotations.append({'id': len(annotations) + 1, 'image_id': i + 1,
                                'category_id': 1, 'bbox': [x, y, w, h], 'area': w * h,
                                'iscrowd': 0})
        name = f'{i:04d}.png'
        cv2.imwrite(str(root / name), frame[:, :, ::-1])
        images.append({'id': i + 1, 'file_name': name, 'width': SIZE[1], 'height': SIZE[0]})
    categories = [{'id': k + 1, 'name': n, 'supercategory': 'known'}
                  for k, n in enumerate(KNOWN_CLASSES)] + [UNKNOWN_CATEGORY]
    (root / 'annotations.json').write_text(json.dumps(
        {'images': images, 'annotations': annotations, 'categories': categories}))
    return expected


@pytest.fixture(scope='module')
def yolo_eval(tmp_path_factory):
    """The exported tiny YOLO, its dataset (with what each split must give) and its GP."""
    toy = _toy()
    root = tmp_path_factory.mktemp('tiny_yolo')
    torch.manual_seed(0)
    network = toy.TinyYolo(num_classes=len(KNOWN_CLASSES)).eval()
    with torch.no_grad():
        # Class scores spread across the operating threshold; boxes about four cells wide,
        # so neighbouring anchors overlap an object at IoU >= 0.5 before NMS.
        for classifier, box in zip(network.cls_conv, network.box_branch, strict=True):
            classifier.weight.mul_(40.0)
            classifier.bias.fill_(-2.75)
            box[1].bias.add_(2.0)
    model = toy.export(network, SIZE, root / 'tiny_yolo.onnx', ['output0'])
    detector = OnnxDetector(model, OnnxAdapterConfig(layout='yolo', nms_iou=NMS_IOU,
                                                     class_names=tuple(KNOWN_CLASSES)))
    data = root / 'data'
    expected = {name: _write_split(data / name, detector, toy, count, seed,
                                   0 if name in ('train', 'test') else 3, name == 'train')
                for name, (count, seed) in SPLITS.items()}
    gp = root / 'tiny_yolo_gp.npz'
    code = uq(['gp', 'fit', '--no-progress', '--model', str(model), '--layout', 'yolo',
               '--class-names', *KNOWN_CLASSES, '--nms-iou', str(NMS_IOU),
               '--annotations', str(data / 'train' / 'annotations.json'),
               '--val-annotations', str(data / 'val' / 'annotations.json'),
               '--anchors-per-object', '1', '--missed-objects', 'off',
               '--out', str(gp), '--timing-images', '0'])
    assert code == 0
    return model, data, gp, expected


def _evaluate(capsys, model: Path, data: Path, gp: Path, *extra: str
              ) -> tuple[int, dict | None, str]:
    code = uq(['eval', 'detector', '--no-progress', '--latency-runs', '2', '--data', str(data),
               '--model', str(model), '--gp', str(gp), '--layout', 'yolo',
               '--nms-iou', str(NMS_IOU), *extra]
              + ([] if '--class-names' in extra else ['--class-names', *KNOWN_CLASSES]))
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code == 0 else None, captured.err


def test_an_onnx_yolo_is_evaluated_through_the_contract(capsys, yolo_eval):
    model, data, gp_path, expected = yolo_eval
    code, report, stderr = _evaluate(capsys, model, data, gp_path)
    assert code == 0, stderr
    assert report['detector']['format'] == 'onnx'
    assert report['detector']['adapter']['layout'] == 'yolo'
    assert report['detector']['backend'] == 'onnxruntime'
    assert 0.0 <= report['detection_test']['ap50_mean'] <= 1.0
    assert report['detection_test']['images'] == SPLITS['test'][0]

    fixed = expected['test_unknown']
    # The construction holds objects found only below the operating threshold, and both kinds.
    assert fixed['unknown_operating'] < fixed['unknown'] and fixed['unknown_operating'] > 0
    assert fixed['known_operating'] > 0
    assert report['uncertainty']['detected_objects'] == {
        'known': fixed['known'], 'known_detected': fixed['known'],
        'known_detected_at_operating_threshold': fixed['known_operating'],
        'unknown': fixed['unknown'], 'unknown_detected': fixed['unknown'],
        'unknown_detected_at_operating_threshold': fixed['unknown_operating']}

    gp = LastLayerNTKGP.load(gp_path)
    unknown = np.array([u for u, _ in fixed['variance_objects']])
    variance = gp.gp_variance(np.stack([phi for _, phi in fixed['variance_objects']]))
    assert report['uncertainty']['ood_matched_unknown'] == int(unknown.sum())
    assert report['uncertainty']['auroc_unknown']['gp_variance'] == pytest.approx(
        auroc(variance, unknown), abs=1e-4)
    rows = {row['score']: row for row in report['uncertainty']['ood_scores']}
    assert {'gp_variance', 'calibrated_score', 'msp', 'max_logit', 'energy', 'mahalanobis',
            'knn', 'fused_gp_msp'} <= set(rows)
    assert rows['gp_variance']['auroc'] == pytest.approx(auroc(variance, unknown), abs=1e-4)
    assert all(0.0 <= row['fpr95'] <= 1.0 for row in rows.values())
    # No box head: said, not scored.
    assert report['box_uncertainty']['calibrated'] is False
    assert report['backend_latency_ms']['backend'] == 'onnxruntime'


def test_procedural_unknowns_measure_the_onnx_model(capsys, yolo_eval):
    pytest.importorskip('mujoco', reason='the simulator renders the procedural scenes')
    model, data, gp_path, _ = yolo_eval
    code, report, stderr = _evaluate(capsys, model, data, gp_path,
                                     '--procedural-unknowns', '3', '--procedural-seed', '1')
    assert code == 0, stderr
    procedural = report['procedural_unknowns']
    counts = procedural['detected_objects']
    # One procedural object per scene, none occluded: each counted once.
    assert counts['unknown'] + procedural['ignored'] == 3
    assert counts['unknown_detected_at_operating_threshold'] <= counts['unknown_detected'] \
        <= counts['unknown']
    assert procedural['missed'] == counts['unknown'] - \
        counts['unknown_detected_at_operating_threshold']


@pytest.mark.parametrize('arguments, message', [
    (['--backend', 'pytorch-cuda'], 'an ONNX model runs on ONNX Runtime'),
    (['--class-names', 'a', 'b', 'c', 'd', 'e', 'f', '--procedural-unknowns', '2'],
     "procedural scenes hold the simulator's known classes"),
    (['--resize', 'sideways'], 'resize must be one of'),
])
def test_bad_settings_are_one_line_exit_2(capsys, yolo_eval, arguments, message):
    model, data, gp_path, _ = yolo_eval
    code, _, stderr = _evaluate(capsys, model, data, gp_path, *arguments)
    assert code == 2 and stderr.count('\n') == 1 and message in stderr, stderr


def test_a_gp_of_another_model_is_refused(capsys, yolo_eval):
    _, data, gp_path, _ = yolo_eval
    # The shipped CenterNet is committed in models/: its GP is not this model's.
    shipped = Path(__file__).resolve().parents[3] / 'models' / 'detector.pt'
    code = uq(['eval', 'detector', '--no-progress', '--data', str(data), '--model',
               str(shipped), '--gp', str(gp_path)])
    stderr = capsys.readouterr().err
    assert code == 2 and stderr.count('\n') == 1, stderr


# ------------------------------------------------------------- extra training points


def test_candidate_points_follow_their_rules():
    # Two objects side by side (cx, cy, w, h) and one crowd region; object 1 is missed.
    boxes = np.array([[20, 20, 20, 20], [60, 20, 20, 20], [20, 60, 10, 10]], np.float32)
    crowd = np.array([False, False, True])
    candidate_boxes = np.array([
        [20, 20, 20, 20],  # 0: object 0, score 0.9
        [21, 20, 20, 20],  # 1: object 0, score 0.8
        [22, 21, 20, 20],  # 2: object 0, score 0.01: under the score threshold
        [45, 20, 20, 20],  # 3: overlaps object 1 at IoU 0.14 only: nobody's
        [19, 19, 20, 20],  # 4: object 0, score 0.7
        [60, 20, 18, 18],  # 5: object 1's box, cell in it at scale 1
        [60, 20, 30, 30],  # 6: IoU 0.44 with object 1, cell in it at scale 0
        [58, 22, 20, 20],  # 7: cell in object 1 at scale 1, IoU 0.67
    ], np.float32)
    scores = np.array([0.9, 0.8, 0.01, 0.5, 0.7, 0.02, 0.02, 0.02], np.float32)
    cells = np.array([[20, 20], [20, 20], [20, 20], [45, 20], [20, 20], [60, 20], [62, 22],
                      [55, 15]], np.float32)
    scale = np.array([0, 0, 0, 0, 0, 1, 0, 1])
    candidates = Candidates(candidate_boxes, scores, np.eye(8, dtype=np.float32),
                            np.zeros((8, 2), np.float32), cells, scale)
    settings = FitSettings()
    points = {obj: (kind, rows.tolist()) for obj, kind, rows in candidate_points(
        candidates, boxes, crowd, [0, 1], {0}, 2, settings)}
    # Object 0: its two best-scoring anchors; object 1 (missed): the cells of scale 1 (its
    # best-overlapping in-box cell's), by overlap.
    assert points == {0: (SOURCE_ANCHOR, [0, 1]), 1: (SOURCE_MISSED, [5, 7])}
    more = {obj: rows.tolist() for obj, _, rows in candidate_points(
        candidates, boxes, crowd, [0, 1], {0}, 5, settings)}
    assert more == {0: [0, 1, 4], 1: [5, 7]}
    # No grid (set prediction): a missed object gives nothing.
    no_grid = Candidates(candidate_boxes, scores, np.eye(8, dtype=np.float32),
                         np.zeros((8, 2), np.float32))
    assert [obj for obj, _, _ in candidate_points(no_grid, boxes, crowd, [0, 1], {0}, 2,
                                                  settings)] == [0]


def test_adapter_candidates_hold_the_detections_and_their_cells(yolo_eval):
    toy = _toy()
    model, _, _, _ = yolo_eval
    detector = OnnxDetector(model, OnnxAdapterConfig(layout='yolo',
                                                     class_names=tuple(KNOWN_CLASSES)))
    # Another aspect than the network's: letterboxed, so cells map back through the pad.
    frame = toy.scene(5, (150, 260))
    candidates = detector.candidates(frame)
    kept = detector.infer(frame, AP_SCORE_THRESHOLD, AP_MAX_DETECTIONS)
    assert len(kept) > 0
    for d in range(len(kept)):
        same = np.all(candidates.embeddings == kept.embeddings[d], axis=1) & np.all(
            np.abs(candidates.boxes - kept.boxes[d]) <= 1e-3, axis=1)
        assert same.any()
        assert candidates.scores[same][0] == pytest.approx(kept.scores[d], abs=1e-6)
    height, width = SIZE
    sizes = [(height // s) * (width // s) for s in (8, 16, 32)]
    assert np.bincount(candidates.scale).tolist() == sizes
    ratio = min(height / 150, width / 260)
    new_h, new_w = round(150 * ratio), round(260 * ratio)
    pad_x, pad_y = (width - new_w) // 2, (height - new_h) // 2
    # The first cell of the stride-8 map: centre (4, 4) in network pixels.
    np.testing.assert_allclose(candidates.cells[0], [(4 - pad_x) * 260 / new_w,
                                                     (4 - pad_y) * 150 / new_h], rtol=1e-5)


def _fit_report(tmp_path, data: Path, model: Path, *extra: str) -> tuple[int, dict | None]:
    out = tmp_path / f'gp{len(list(tmp_path.iterdir()))}.npz'
    code = uq(['gp', 'fit', '--no-progress', '--model', str(model), '--layout', 'yolo',
               '--class-names', *KNOWN_CLASSES, '--timing-images', '0',
               '--nms-iou', str(NMS_IOU), '--annotations', str(data / 'train' / 'annotations.json'),
               '--val-annotations', str(data / 'val' / 'annotations.json'),
               '--out', str(out), *extra])
    return code, json.loads(out.with_suffix('.json').read_text()) if code == 0 else None


def test_fit_takes_anchors_before_nms_and_chooses_on_validation(tmp_path, capsys, yolo_eval):
    model, data, _, _ = yolo_eval
    code, report = _fit_report(tmp_path, data, model)
    assert code == 0, capsys.readouterr().err
    found = report['counts']['train']['known']['found']
    record = report['gp']['training_points']
    options = {(o['anchors_per_object'], o['missed_objects']): o
               for o in record['validation_nll']}
    assert set(options) == {(k, m) for k in (1, 3, 5) for m in (False, True)}
    points = {option: o['train_points'] for option, o in options.items()}
    # One point per found object as before; up to k anchors each, at least its best one.
    assert points[(1, False)] == found
    assert found < points[(3, False)] <= 3 * found
    assert points[(3, False)] <= points[(5, False)] <= 5 * found
    # Each training frame's missed object gives one cell, k cells with k anchors.
    assert report['counts']['train']['known']['missed_read_in_box'] == SPLITS['train'][0]
    assert points[(1, True)] == found + SPLITS['train'][0]
    assert SPLITS['train'][0] <= points[(3, True)] - points[(3, False)] <= 3 * SPLITS['train'][0]
    nll = {option: o['validation_nll'] for option, o in options.items()}
    assert nll[(record['anchors_per_object'], record['missed_objects'])] == min(nll.values())
    assert record['train_points'] == points[(record['anchors_per_object'],
                                             record['missed_objects'])]


def test_extra_points_the_detector_cannot_give_are_refused(tmp_path, capsys,
                                                           quadrant_detector):
    quadrants = quadrant_detector
    model = quadrants.export_onnx(tmp_path / 'quadrants.onnx')
    annotations = quadrants.write_quadrant_coco(tmp_path / 'export', 12)
    code = uq(['gp', 'fit', '--no-progress', '--model', str(model), '--annotations',
               str(annotations), '--class-names', 'red', 'green', '--unknown', 'blue',
               '--missed-objects', 'on', '--out', str(tmp_path / 'gp.npz')])
    stderr = capsys.readouterr().err
    assert code == 2 and stderr.count('\n') == 1 and 'has no grid' in stderr, stderr
    assert not (tmp_path / 'gp.npz').exists()
