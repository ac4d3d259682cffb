"""Unit tests of detector data loading, targets, losses, training and evaluation plumbing.

Synthetic COCO splits of drawn rectangles and ellipses stand in for the simulator here;
the shipped model is tested on simulator renders in ``test/test_detector_sim.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from uq_perception.detectors.centernet import STRIDE, CenterNetDetector, load_detector
from uq_perception.training.detector_data import (
    OUTLIER_LABEL,
    augment,
    build_targets,
    jitter_boxes,
    load_split,
)
from uq_perception.training.train import (
    TrainConfig,
    detection_loss,
    focal_loss,
    object_embeddings,
    refit_gp,
    run_training,
)

CATEGORIES = [
    {'id': 1, 'name': 'rectangle', 'supercategory': 'known'},
    {'id': 2, 'name': 'ellipse', 'supercategory': 'known'},
    {'id': 7, 'name': 'triangle', 'supercategory': 'unknown'},
]


@pytest.fixture(autouse=True)
def _two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, threads))
    yield
    torch.set_num_threads(threads)


def _draw_scene(rng: np.random.Generator, width: int, height: int, unknown: bool
                ) -> tuple[np.ndarray, list[dict]]:
    image = np.full((height, width, 3), rng.integers(60, 120), dtype=np.uint8)
    anns = []
    shapes = [1, 2] + ([7] if unknown else [])
    slots = np.linspace(0, width, len(shapes) + 1)
    for k, category in enumerate(shapes):
        w, h = int(rng.integers(24, 48)), int(rng.integers(24, 48))
        x = int(rng.integers(int(slots[k]), int(slots[k + 1]) - w))
        y = int(rng.integers(0, height - h))
        colour = rng.integers(150, 256, 3).astype(np.uint8)
        mask = np.zeros((height, width), dtype=np.uint8)
        if category == 1:
            cv2.rectangle(mask, (x, y), (x + w - 1, y + h - 1), 1, -1)
        elif category == 2:
            cv2.ellipse(mask, (x + w // 2, y + h // 2), (w // 2, h // 2), 0, 0, 360, 1, -1)
        else:
            pts = np.array([[x, y + h - 1], [x + w - 1, y + h - 1], [x + w // 2, y]])
            cv2.fillPoly(mask, [pts], 1)
        image[mask > 0] = colour
        ys, xs = np.nonzero(mask)
        x0, y0 = int(xs.min()), int(ys.min())
        anns.append({'category_id': category,
                     'bbox': [x0, y0, int(xs.max()) - x0 + 1, int(ys.max()) - y0 + 1],
                     'area': int(xs.size), 'iscrowd': 0, 'occluded': False,
                     'truncated': False, 'visible_fraction': 1.0})
    return image, anns


def _write_split(root: Path, split: str, count: int, seed: int, width: int = 320,
                 height: int = 240) -> Path:
    rng = np.random.default_rng(seed)
    split_dir = root / split
    (split_dir / 'images').mkdir(parents=True)
    images, annotations = [], []
    for i in range(count):
        image, anns = _draw_scene(rng, width, height, unknown=split == 'test_unknown')
        name = f'images/{i + 1:06d}.png'
        cv2.imwrite(str(split_dir / name), image[:, :, ::-1])
        images.append({'id': i + 1, 'file_name': name, 'width': width, 'height': height})
        for ann in anns:
            annotations.append({'id': len(annotations) + 1, 'image_id': i + 1, **ann})
    (split_dir / 'annotations.json').write_text(json.dumps(
        {'images': images, 'annotations': annotations, 'categories': CATEGORIES}))
    return split_dir


@pytest.fixture(scope='module')
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp('synthetic')
    for seed, (split, count) in enumerate([('train', 8), ('val', 4), ('test', 3),
                                           ('test_unknown', 3)]):
        _write_split(root, split, count, seed)
    return root


def test_load_split_reads_labels_and_resizes(dataset):
    split = load_split(dataset / 'test_unknown')
    assert split.class_names == ['rectangle', 'ellipse']
    assert split.images.shape == (3, 240, 320, 3) and split.images.dtype == np.uint8
    assert [lb.tolist() for lb in split.labels] == [[0, 1, -1]] * 3
    assert split.category_names[7] == 'triangle'
    coco = json.loads((dataset / 'test_unknown' / 'annotations.json').read_text())
    x, y, w, h = coco['annotations'][0]['bbox']
    np.testing.assert_allclose(split.boxes[0][0], [x + w / 2, y + h / 2, w, h])

    half = load_split(dataset / 'test_unknown', input_size=(128, 160))
    assert half.images.shape == (3, 128, 160, 3)
    np.testing.assert_allclose(half.boxes[0][0], [(x + w / 2) / 2, (y + h / 2) * 128 / 240,
                                                  w / 2, h * 128 / 240], rtol=1e-5)


def test_load_split_errors(dataset, tmp_path):
    with pytest.raises(ValueError, match='no annotations.json'):
        load_split(tmp_path)
    with pytest.raises(ValueError, match='differ'):
        load_split(dataset / 'val', class_names=['rectangle', 'circle'])
    broken = tmp_path / 'broken'
    broken.mkdir()
    (broken / 'annotations.json').write_text('{"images": []}')
    with pytest.raises(ValueError, match='COCO'):
        load_split(broken)
    missing = tmp_path / 'missing'
    (missing / 'images').mkdir(parents=True)
    (missing / 'annotations.json').write_text(json.dumps({
        'images': [{'id': 1, 'file_name': 'images/000001.png', 'width': 320,
                    'height': 240}], 'annotations': [], 'categories': CATEGORIES}))
    with pytest.raises(ValueError, match='image files not found'):
        load_split(missing)


def test_build_targets_hand_case():
    # A 16x8 box centred at (18, 10) on a 32x48 input: stride-4 cell (4, 2), offset 0.5.
    targets = build_targets([np.array([[18.0, 10.0, 16.0, 8.0]])], [np.array([1])], (8, 12))
    assert targets.heatmap.shape == (1, 1, 8, 12)
    assert targets.heatmap[0, 0, 2, 4] == 1.0
    assert int((targets.heatmap == 1.0).sum()) == 1
    assert targets.index.tolist() == [[2 * 12 + 4]]
    torch.testing.assert_close(targets.offset, torch.tensor([[[0.5, 0.5]]]))
    torch.testing.assert_close(targets.size, torch.tensor([[[math.log(4.0), math.log(2.0)]]]))
    assert targets.label.tolist() == [[1]] and targets.mask.tolist() == [[1.0]]
    # Neighbours get the Gaussian: below 1, above 0, symmetric in x.
    row = targets.heatmap[0, 0, 2]
    assert 0 < row[3] < 1 and row[3] == row[5]


def test_build_targets_pads_images_with_fewer_objects():
    targets = build_targets([np.zeros((0, 4)), np.array([[4.0, 4.0, 8.0, 8.0]] * 2)],
                            [np.zeros(0, dtype=np.int64), np.array([0, -1])], (8, 12))
    assert targets.mask.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    assert targets.label.tolist() == [[-1, -1], [0, -1]]
    assert float(targets.heatmap[0].sum()) == 0.0
    with pytest.raises(ValueError, match='image 0: 1 boxes but 2 labels'):
        build_targets([np.zeros((1, 4))], [np.zeros(2, dtype=np.int64)], (8, 12))


def test_focal_loss_hand_computed_and_ordering():
    target = torch.zeros(1, 1, 1, 2)
    target[0, 0, 0, 0] = 1.0
    # Centre at logit 0 (p = 0.5): -(1 - 0.5)^2 log 0.5; background at logit 0:
    # -(1 - 0)^4 0.5^2 log 0.5; one centre normalises.
    expected = -0.25 * math.log(0.5) * 2
    assert float(focal_loss(torch.zeros(1, 1, 1, 2), target)) == pytest.approx(expected)
    good = torch.tensor([[[[6.0, -6.0]]]])
    bad = torch.tensor([[[[-6.0, 6.0]]]])
    assert float(focal_loss(good, target)) < 1e-3 < float(focal_loss(bad, target))


def test_augment_flips_boxes_and_keeps_range():
    images = np.zeros((16, 24, 40, 3), dtype=np.uint8)
    images[:, :, :10] = 200  # a bright band on the left
    boxes = [np.array([[5.0, 12.0, 10.0, 24.0]])] * 16
    labels = [np.array([1])] * 16
    out, flipped, kept = augment(images, boxes, labels, np.random.default_rng(0))
    assert out.shape == (16, 3, 24, 40) and float(out.min()) >= 0 and float(out.max()) <= 1
    for i in range(16):
        bright_left = float(out[i, :, :, :10].mean()) > float(out[i, :, :, -10:].mean())
        assert flipped[i][0, 0] == (5.0 if bright_left else 35.0)
        assert kept[i].tolist() == [1]
    assert {float(b[0, 0]) for b in flipped} == {5.0, 35.0}


def test_augment_crops_clip_and_drop_boxes():
    images = np.zeros((64, 32, 48, 3), dtype=np.uint8)
    # Box A spans x in [0, 16); box B spans x in [40, 48) (both full height).
    boxes = [np.array([[8.0, 16.0, 16.0, 32.0], [44.0, 16.0, 8.0, 32.0]])] * 64
    labels = [np.array([0, 1])] * 64
    out, cropped, kept = augment(images, boxes, labels, np.random.default_rng(1), crop=(32, 32))
    assert out.shape == (64, 3, 32, 32)
    for bx, lb in zip(cropped, kept, strict=True):
        assert len(bx) == len(lb)
        x1, x2 = bx[:, 0] - bx[:, 2] / 2, bx[:, 0] + bx[:, 2] / 2
        assert np.all(x1 >= 0) and np.all(x2 <= 32)
        np.testing.assert_allclose(bx[:, 3], 32.0)
    # Crops start at x in [0, 16]. Box A keeps half of itself up to a start of 8, box B
    # from a start of 12 on, so a crop holds A alone, nothing, or B alone.
    outcomes = {tuple(lb.tolist()) for lb in kept}
    assert outcomes == {(0,), (), (1,)}
    with pytest.raises(ValueError, match=r'crop \(48, 32\) does not fit images'):
        augment(images[:1], boxes[:1], labels[:1], np.random.default_rng(0), crop=(48, 32))


def test_jitter_boxes_stays_within_bounds():
    boxes = torch.tensor([[[100.0, 50.0, 40.0, 20.0]]]).expand(1, 500, 4)
    jittered = jitter_boxes(boxes, np.random.default_rng(0), scale=0.15, shift=0.1)
    assert jittered.shape == boxes.shape
    ratio = jittered[..., 2:] / boxes[..., 2:]
    shift = (jittered[..., :2] - boxes[..., :2]) / boxes[..., 2:]
    assert float(ratio.min()) >= 0.85 and float(ratio.max()) <= 1.15
    assert float(shift.abs().max()) <= 0.1 and float(shift.abs().max()) > 0.05
    torch.testing.assert_close(jitter_boxes(boxes, np.random.default_rng(0)), jittered)


def test_train_config_validation():
    with pytest.raises(ValueError, match='epochs must be >= 1'):
        TrainConfig(epochs=0)
    with pytest.raises(ValueError, match='learning_rate must be > 0'):
        TrainConfig(learning_rate=0.0)
    with pytest.raises(ValueError, match='crop must be'):
        TrainConfig(crop=(100, 160))
    with pytest.raises(ValueError, match='separation_weight'):
        TrainConfig(separation_weight=-1.0)
    with pytest.raises(ValueError, match='compactness_weight'):
        TrainConfig(compactness_weight=-0.5)


def test_targets_decode_back_to_the_boxes():
    """Maps that equal the training targets decode to the ground-truth boxes exactly."""
    model = CenterNetDetector(['a', 'b'], embedding_dim=4, input_size=(64, 96),
                              channels=(4, 8, 8, 8), neck_channels=8, max_candidates=5).eval()
    boxes = np.array([[18.0, 10.0, 16.0, 8.0], [61.3, 40.7, 30.0, 21.5],
                      [85.0, 52.0, 9.0, 14.0]], dtype=np.float32)
    h, w = 64 // STRIDE, 96 // STRIDE
    targets = build_targets([boxes], [np.array([0, 1, -1])], (h, w))
    maps = model.feature_maps(torch.rand(1, 3, 64, 96))
    size = torch.zeros(1, 2, h * w)
    offset = torch.zeros(1, 2, h * w)
    size[0, :, targets.index[0]] = targets.size[0].T
    offset[0, :, targets.index[0]] = targets.offset[0].T
    heat = targets.heatmap.clamp(1e-6, 1 - 1e-6)
    maps.update(heatmap_logits=torch.log(heat / (1 - heat)), size=size.reshape(1, 2, h, w),
                offset=offset.reshape(1, 2, h, w))
    with torch.no_grad():
        dets = model.decode(model.candidates(maps), score_threshold=0.99, max_detections=5)[0]
    assert len(dets) == 3
    order = np.argsort(dets.boxes[:, 0])
    np.testing.assert_allclose(dets.boxes[order], boxes, rtol=1e-5, atol=1e-4)


def test_detection_loss_ignores_class_term_without_labels():
    model = CenterNetDetector(['a', 'b'], embedding_dim=4, input_size=(32, 48),
                              channels=(4, 8, 8, 8), neck_channels=8)
    targets = build_targets([np.array([[18.0, 10.0, 16.0, 8.0]])], [np.array([-1])],
                            (32 // STRIDE, 48 // STRIDE))
    losses = detection_loss(model, model.feature_maps(torch.rand(1, 3, 32, 48)), targets,
                            TrainConfig())
    assert float(losses['class']) == 0.0
    assert float(losses['total']) == pytest.approx(float(
        losses['heatmap'] + losses['size'] + losses['offset']), rel=1e-6)


def test_auxiliary_objects_are_taught_as_outliers(tmp_path):
    split_dir = _write_split(tmp_path, 'test_unknown', 2, seed=5)
    coco = json.loads((split_dir / 'annotations.json').read_text())
    coco['categories'][2]['supercategory'] = 'auxiliary'
    (split_dir / 'annotations.json').write_text(json.dumps(coco))
    split = load_split(split_dir)
    assert [a.tolist() for a in split.auxiliary] == [[False, False, True]] * 2
    # Still no class of the head, and evaluation counts it as not known.
    assert [lb.tolist() for lb in split.labels] == [[0, 1, -1]] * 2
    assert split.class_targets(0).tolist() == [0, 1, OUTLIER_LABEL]
    # Occluded objects teach nothing, auxiliary or known.
    split.occluded[1][:] = True
    assert split.class_targets(1).tolist() == [-1, -1, -1]


def test_detection_loss_outlier_exposure_and_separation_terms():
    torch.manual_seed(0)
    model = CenterNetDetector(['a', 'b', 'c'], embedding_dim=4, input_size=(32, 48),
                              channels=(4, 8, 8, 8), neck_channels=8)
    targets = build_targets([np.array([[10.0, 10.0, 12.0, 10.0], [34.0, 20.0, 14.0, 12.0]])],
                            [np.array([1, OUTLIER_LABEL])], (32 // STRIDE, 48 // STRIDE))
    maps = model.feature_maps(torch.rand(1, 3, 32, 48))
    config = TrainConfig(outlier_weight=0.5, separation_weight=2.0, compactness_weight=0.0)
    losses = detection_loss(model, maps, targets, config)
    phi = model.embed_cells(maps, targets.index, targets.boxes)[0]
    logits = model.head(phi)
    # Cross-entropy to the uniform distribution over the three known classes.
    assert float(losses['outlier']) == pytest.approx(
        float(-torch.log_softmax(logits[1], dim=-1).mean()), rel=1e-5)
    assert float(losses['outlier']) >= math.log(3) - 1e-6
    assert float(losses['separation']) == pytest.approx(
        float(torch.cosine_similarity(phi[0], phi[1], dim=0) ** 2), rel=1e-4)
    assert float(losses['total']) == pytest.approx(float(
        losses['heatmap'] + losses['size'] + losses['offset'] + losses['class']
        + 0.5 * losses['outlier'] + 2.0 * losses['separation']), rel=1e-5)
    losses['separation'].backward()
    assert model.embedding_mlp[0].weight.grad is not None
    off = detection_loss(model, maps, targets, TrainConfig(
        outlier_weight=0.0, separation_weight=0.0, compactness_weight=0.0))
    assert float(off['total']) == pytest.approx(float(
        off['heatmap'] + off['size'] + off['offset'] + off['class']), rel=1e-5)


def test_detection_loss_compactness_term():
    torch.manual_seed(0)
    model = CenterNetDetector(['a', 'b', 'c'], embedding_dim=4, input_size=(32, 48),
                              channels=(4, 8, 8, 8), neck_channels=8)
    targets = build_targets([np.array([[10.0, 10.0, 12.0, 10.0], [34.0, 20.0, 14.0, 12.0],
                                       [20.0, 24.0, 10.0, 8.0]])],
                            [np.array([2, 0, OUTLIER_LABEL])], (32 // STRIDE, 48 // STRIDE))
    maps = model.feature_maps(torch.rand(1, 3, 32, 48))
    losses = detection_loss(model, maps, targets, TrainConfig(compactness_weight=0.7))
    phi = model.embed_cells(maps, targets.index, targets.boxes)[0]
    rows = model.head.weight
    # Cosine distance of each known object to its class's head row; auxiliary ones excluded.
    expected = 1.0 - (torch.cosine_similarity(phi[0], rows[2], dim=0)
                      + torch.cosine_similarity(phi[1], rows[0], dim=0)) / 2
    assert float(losses['compactness']) == pytest.approx(float(expected), rel=1e-5)
    assert float(losses['total']) == pytest.approx(float(
        losses['heatmap'] + losses['size'] + losses['offset'] + losses['class']
        + 0.5 * losses['outlier'] + losses['separation'] + 0.7 * losses['compactness']),
        rel=1e-5)
    losses['compactness'].backward()
    assert model.head.weight.grad is not None and model.embedding_mlp[0].weight.grad is not None


def test_run_training_and_evaluation_end_to_end(dataset, tmp_path):
    from uq_common.cli import main as uq
    from uq_perception.ntk import LastLayerNTKGP

    out = tmp_path / 'models'
    summary = run_training(dataset, out, TrainConfig(epochs=2, batch_size=4, warmup_steps=1,
                                                     crop=(160, 160)),
                           progress=False, log=lambda _: None)
    model = load_detector(out / 'detector.pt')
    assert model.model_id == summary['model_id']
    gp = LastLayerNTKGP.load(out / 'detector_gp.npz', feature_dim=model.embedding_dim,
                             class_names=model.class_names, model_id=model.model_id)
    assert model.metadata['gp']['num_experts'] == gp.num_experts
    # 8 validation objects are too few to calibrate the box uncertainty: it stays off.
    assert model.metadata['gp']['box_calibration'] is None and gp.box_calibration is None

    val = load_split(dataset / 'val')
    truth_phi, truth_labels = object_embeddings(model, val, use_detections=False)
    assert truth_phi.shape == (8, model.embedding_dim) and truth_labels.tolist() == [0, 1] * 4
    phi, labels = object_embeddings(model, val)
    np.testing.assert_array_equal(labels, truth_labels)
    # The OOD threshold is the configured quantile of the validation objects' GP variances
    # (a threshold from the training set, or a different statistic, would differ).
    assert 0.5 <= gp.config.ood_quantile < 1
    assert gp.ood_threshold == pytest.approx(
        float(np.quantile(gp.gp_variance(phi), gp.config.ood_quantile)), rel=1e-9)
    # Each object's embedding comes from its ground-truth box or from a detection.
    detected = np.concatenate([model.detect(im, score_threshold=0.05, max_detections=50)
                               .embeddings for im in val.images])
    for row, truth_row in zip(phi, truth_phi, strict=True):
        from_detection = detected.size and np.abs(detected - row).max(axis=1).min() < 1e-4
        assert from_detection or np.allclose(row, truth_row, atol=1e-5)

    refit = refit_gp(dataset, out, progress=False, log=lambda _: None)
    again = load_detector(out / 'detector.pt')
    assert again.model_id == model.model_id and again.metadata['gp'] == refit
    LastLayerNTKGP.load(out / 'detector_gp.npz', model_id=model.model_id)

    assert uq(['eval', 'detector', '--data', str(dataset), '--model', str(out / 'detector.pt'),
               '--gp', str(out / 'detector_gp.npz'), '--latency-runs', '3', '--no-progress',
               '--out', str(tmp_path / 'eval.json')]) == 0
    report = json.loads((tmp_path / 'eval.json').read_text())
    assert report['model_id'] == summary['model_id']
    assert report['box_uncertainty']['calibrated'] is False
    assert set(report['detection_test']['ap50_per_class']) == {'rectangle', 'ellipse'}
    uncertainty = report['uncertainty']
    assert uncertainty['unknown_objects'] == 3
    # Per-class separation covers exactly the unknown classes that were detected.
    assert set(uncertainty['auroc_unknown_gp_variance_per_class']) <= {'triangle'}
    assert (uncertainty['ood_matched_unknown'] > 0) == bool(
        uncertainty['auroc_unknown_gp_variance_per_class'])
    # The embedding lies on the sphere of radius sqrt(D) (normalize_embedding), so a
    # norm-aware feature map would only rescale every embedding alike.
    radius = model.embedding_dim ** 0.5
    for group in ('known', 'unknown'):
        spread = uncertainty['embedding_norm'][group]
        if spread is not None:
            assert spread['min'] == pytest.approx(radius, rel=1e-3)
            assert spread['max'] == pytest.approx(radius, rel=1e-3)
    latency = report['latency_ms']
    assert latency['runs'] == 3
    assert latency['threads_1']['forward_p50'] > 0 and latency['threads_2']['forward_p50'] > 0
    backend_latency = report['backend_latency_ms']
    assert backend_latency['backend'] == 'pytorch-cpu' and backend_latency['runs'] == 3
    assert backend_latency['infer_with_gp_p50'] >= backend_latency['infer_p50'] > 0
    json.dumps(report)
