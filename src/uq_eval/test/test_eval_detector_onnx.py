"""``uq eval detector`` on a third-party-style model: a tiny three-scale YOLO-style network
(``TinyYolo`` of ``src/uq_perception/test/conftest.py``) exported to ONNX in the test, its
GP fitted by ``uq gp fit --layout yolo``, then evaluated through the same adapter options.

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
                 unknown_every: int) -> dict:
    """``count`` frames annotated with chosen detections (every ``unknown_every``-th one an
    unknown object, 0: none); returns what the evaluator must find."""
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
    with torch.no_grad():  # class scores spread across the operating threshold
        for classifier in network.cls_conv:
            classifier.weight.mul_(40.0)
            classifier.bias.fill_(-2.75)
    model = toy.export(network, SIZE, root / 'tiny_yolo.onnx', ['output0'])
    detector = OnnxDetector(model, OnnxAdapterConfig(layout='yolo',
                                                     class_names=tuple(KNOWN_CLASSES)))
    data = root / 'data'
    expected = {name: _write_split(data / name, detector, toy, count, seed,
                                   0 if name in ('train', 'test') else 3)
                for name, (count, seed) in SPLITS.items()}
    gp = root / 'tiny_yolo_gp.npz'
    code = uq(['gp', 'fit', '--no-progress', '--model', str(model), '--layout', 'yolo',
               '--class-names', *KNOWN_CLASSES,
               '--annotations', str(data / 'train' / 'annotations.json'),
               '--val-annotations', str(data / 'val' / 'annotations.json'),
               '--out', str(gp), '--timing-images', '0'])
    assert code == 0
    return model, data, gp, expected


def _evaluate(capsys, model: Path, data: Path, gp: Path, *extra: str
              ) -> tuple[int, dict | None, str]:
    code = uq(['eval', 'detector', '--no-progress', '--latency-runs', '2', '--data', str(data),
               '--model', str(model), '--gp', str(gp), '--layout', 'yolo', *extra]
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
    shipped = Path(__file__).resolve().parents[3] / 'models' / 'detector.pt'
    if not shipped.is_file():
        pytest.skip('no shipped detector')
    code = uq(['eval', 'detector', '--no-progress', '--data', str(data), '--model',
               str(shipped), '--gp', str(gp_path)])
    stderr = capsys.readouterr().err
    assert code == 2 and stderr.count('\n') == 1, stderr
