"""The labels people gave retrain the shipped detector: help requests answered in a label
store, exported with ``uq labels export`` (COCO, CVAT's layout), read by ``uq train --coco``
for one short epoch. Then ``uq train``'s answers to bad COCO input."""

from __future__ import annotations

import hashlib
from pathlib import Path

import cv2
import numpy as np
import pytest

from uq_autonomy.help.crops import encode_png
from uq_autonomy.labels.store import LabelStore, PendingRequest
from uq_common.cli import main as uq
from uq_perception.detectors.centernet import load_detector
from uq_perception.ntk import LastLayerNTKGP


def _crop(rng: np.random.Generator, label: str) -> tuple[np.ndarray, tuple[float, ...]]:
    """An RGB crop around one drawn object, and the object's box in it (COCO x, y, w, h)."""
    height, width = int(rng.integers(44, 60)), int(rng.integers(52, 70))
    pixels = np.full((height, width, 3), int(rng.integers(70, 110)), np.uint8)
    w, h = int(rng.integers(22, 32)), int(rng.integers(20, 30))
    x, y = int(rng.integers(4, width - w - 4)), int(rng.integers(4, height - h - 4))
    if label == 'mug':
        cv2.ellipse(pixels, (x + w // 2, y + h // 2), (w // 2, h // 2), 0, 0, 360,
                    (200, 60, 40), -1)
    else:
        cv2.rectangle(pixels, (x, y), (x + w - 1, y + h - 1), (40, 180, 60), -1)
    return pixels, (float(x), float(y), float(w), float(h))


@pytest.fixture
def label_store(tmp_path) -> Path:
    """Ten answered help requests, as the ask-for-help node and a person leave them."""
    path = tmp_path / 'labels.sqlite3'
    rng = np.random.default_rng(4)
    with LabelStore(path) as store:
        for i in range(10):
            label = 'mug' if i % 2 else 'box'
            crop, box = _crop(rng, label)
            request = f'req-{i}'
            store.add_request(PendingRequest(
                request, crop_png=encode_png(crop), box=box, crop_origin=(30.0 + i, 20.0),
                image_size=(320, 240), stamp=1_700_000_000.0 + i, class_name='capsule'))
            store.answer(request, label, 'alice')
    return path


def _run(capsys, *arguments: str) -> tuple[int, str, str]:
    code = uq(list(arguments))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_exported_labels_train_one_epoch(tmp_path, capsys, label_store):
    export = tmp_path / 'export'
    code, _, err = _run(capsys, 'labels', 'export', '--store', str(label_store), '--coco',
                        str(export))
    assert code == 0, err
    annotations = export / 'annotations' / 'instances_default.json'
    out = tmp_path / 'models'
    code, stdout, err = _run(capsys, 'train', '--coco', str(annotations), '--val-fraction', '0.5',
                             '--epochs', '1', '--batch-size', '4', '--input-size', '64', '64',
                             '--embedding-dim', '16', '--out', str(out), '--no-progress')
    assert code == 0, err
    model = load_detector(out / 'detector.pt')
    # The classes are the labels people gave (the export sorts its categories by name).
    assert model.class_names == ['box', 'mug']
    assert model.input_size == (64, 64) and model.embedding_dim == 16
    dataset = model.metadata['dataset']
    assert dataset['sha256'] == hashlib.sha256(annotations.read_bytes()).hexdigest()
    assert (dataset['train_images'], dataset['val_images']) == (5, 5)
    assert len(model.metadata['history']) == 1
    gp = LastLayerNTKGP.load(out / 'detector_gp.npz', feature_dim=16,
                             class_names=['box', 'mug'], model_id=model.model_id)
    assert gp.fitted and gp.ood_threshold is not None
    assert f'"model_id": "{model.model_id}"' in stdout


@pytest.mark.parametrize('change, message', [
    (lambda ann: ann.write_text('{"images": ['), 'is not valid JSON'),
    (lambda ann: next((ann.parent.parent / 'images').iterdir()).unlink(), 'image files not found'),
    (lambda ann: ann.write_text(ann.read_text().replace('"category_id": 1', '"category_id": 7',
                                                        1)), 'names category 7'),
])
def test_bad_coco_exits_2_with_one_line(tmp_path, capsys, label_store, change, message):
    export = tmp_path / 'export'
    assert _run(capsys, 'labels', 'export', '--store', str(label_store), '--coco',
                str(export))[0] == 0
    annotations = export / 'annotations' / 'instances_default.json'
    change(annotations)
    out = tmp_path / 'models'
    code, _, err = _run(capsys, 'train', '--coco', str(annotations), '--epochs', '1',
                        '--input-size', '64', '64', '--out', str(out), '--no-progress')
    assert code == 2 and err.startswith('uq train: error: ') and err.count('\n') == 1, err
    assert message in err
    assert not out.exists()


def test_coco_options_are_checked(tmp_path, capsys):
    code, _, err = _run(capsys, 'train', '--data', str(tmp_path), '--images', str(tmp_path),
                        '--out', str(tmp_path / 'm'))
    assert code == 2 and '--images names the folder of --coco images' in err
    code, _, err = _run(capsys, 'train', '--coco', str(tmp_path / 'a.json'), '--generate-data',
                        '4', '--out', str(tmp_path / 'm'))
    assert code == 2 and 'use it with --data' in err
    code, _, err = _run(capsys, 'train', '--data', str(tmp_path), '--input-size', '60', '64',
                        '--out', str(tmp_path / 'm'))
    assert code == 2 and 'multiples of 16' in err
