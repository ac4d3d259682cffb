"""Unit tests of the CenterNet detector: shapes, decoding, input checks, save/load."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from uq_perception.detectors.centernet import (
    STRIDE,
    CenterNetDetector,
    Detections,
    load_detector,
    save_detector,
)

CLASSES = ['box', 'sphere', 'cylinder']


@pytest.fixture(autouse=True)
def _single_thread():
    # Tiny tensors: thread hand-off costs more than it saves, badly so on a loaded machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _tiny_model(seed: int = 0, **overrides) -> CenterNetDetector:
    torch.manual_seed(seed)
    kwargs = dict(class_names=CLASSES, embedding_dim=6, input_size=(32, 48),
                  channels=(4, 8, 8, 8), neck_channels=8, embedding_channels=8,
                  max_candidates=10)
    kwargs.update(overrides)
    return CenterNetDetector(**kwargs).eval()


def _random_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def test_forward_shapes_and_candidate_order():
    model = _tiny_model()
    out = model(torch.rand(2, 3, 32, 48))
    h, w = 32 // STRIDE, 48 // STRIDE
    assert out['heatmap'].shape == (2, 1, h, w)
    assert out['size'].shape == (2, 2, h, w)
    assert out['offset'].shape == (2, 2, h, w)
    assert out['scores'].shape == (2, 10)
    assert out['boxes'].shape == (2, 10, 4)
    assert out['embeddings'].shape == (2, 10, 6)
    assert out['logits'].shape == (2, 10, 3)
    scores = out['scores'].detach().numpy()
    assert np.all(np.diff(scores, axis=1) <= 0)
    assert np.all((scores >= 0) & (scores <= 1))
    torch.testing.assert_close(out['logits'], model.head(out['embeddings']))


def test_candidates_are_local_maxima_of_the_heatmap():
    model = _tiny_model()
    out = model(torch.rand(1, 3, 32, 48))
    heat = out['heatmap'][0, 0].detach().numpy()
    padded = np.pad(heat, 1, constant_values=-np.inf)
    for score in out['scores'][0].detach().numpy():
        if score <= 0:
            continue
        y, x = np.argwhere(heat == score)[0]
        assert score == padded[y:y + 3, x:x + 3].max()


def test_embed_cells_matches_forward_embeddings():
    model = _tiny_model()
    images = torch.rand(1, 3, 32, 48)
    out = model(images)
    maps = model.feature_maps(images)
    heat = out['heatmap'][0, 0].flatten()
    index = torch.stack([torch.nonzero(heat == s)[0, 0] for s in out['scores'][0]])
    torch.testing.assert_close(model.embed_cells(maps, index[None], out['boxes']),
                               out['embeddings'])


def _hand_outputs() -> dict[str, torch.Tensor]:
    scores = torch.tensor([[0.9, 0.6, 0.2], [0.1, 0.05, 0.0]])
    boxes = torch.tensor([[[10.0, 8.0, 4.0, 6.0], [40.0, 20.0, 20.0, 10.0],
                           [1.0, 1.0, 2.0, 2.0]],
                          [[5.0, 5.0, 2.0, 2.0]] * 3])
    embeddings = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)
    logits = torch.arange(2 * 3 * 3, dtype=torch.float32).reshape(2, 3, 3)
    return {'scores': scores, 'boxes': boxes, 'embeddings': embeddings, 'logits': logits}


def test_decode_thresholds_cuts_and_rescales():
    model = _tiny_model()
    out = _hand_outputs()
    dets = model.decode(out, score_threshold=0.5, max_detections=20)
    assert len(dets) == 2
    assert len(dets[0]) == 2 and len(dets[1]) == 0
    np.testing.assert_allclose(dets[0].scores, [0.9, 0.6])
    np.testing.assert_allclose(dets[0].boxes[0], [10.0, 8.0, 4.0, 6.0])
    # The second box ends at x = 50 > 48: clipped to [30, 48].
    np.testing.assert_allclose(dets[0].boxes[1], [39.0, 20.0, 18.0, 10.0])
    np.testing.assert_array_equal(dets[0].embeddings, out['embeddings'][0, :2].numpy())
    np.testing.assert_array_equal(dets[0].logits, out['logits'][0, :2].numpy())
    assert dets[1].boxes.shape == (0, 4) and dets[1].embeddings.shape == (0, 2)
    assert dets[0].boxes.dtype == np.float32

    top1 = model.decode(out, score_threshold=0.0, max_detections=1)
    assert [len(d) for d in top1] == [1, 1]

    # Original images twice the input size: coordinates double.
    scaled = model.decode(out, 0.5, 20, image_sizes=[(64, 96), (64, 96)])
    np.testing.assert_allclose(scaled[0].boxes[0], [20.0, 16.0, 8.0, 12.0])


@pytest.mark.parametrize('kwargs,message', [
    ({'score_threshold': 1.5}, r'score_threshold must be in \[0, 1\]'),
    ({'score_threshold': -0.1}, r'score_threshold must be in \[0, 1\]'),
    ({'max_detections': -1}, 'max_detections must be >= 0'),
    ({'image_sizes': [(32, 48)]}, 'image_sizes has 1 entries for a batch of 2'),
])
def test_decode_rejects_bad_arguments(kwargs, message):
    model = _tiny_model()
    args = {'score_threshold': 0.3, 'max_detections': 5, **kwargs}
    with pytest.raises(ValueError, match=message):
        model.decode(_hand_outputs(), **args)


def test_detect_resizes_and_maps_boxes_back():
    model = _tiny_model()
    big = _random_image(64, 96)
    small = cv2.resize(big, (48, 32), interpolation=cv2.INTER_AREA)
    dets_big = model.detect(big, score_threshold=0.0, max_detections=5)
    dets_small = model.detect(small, score_threshold=0.0, max_detections=5)
    assert isinstance(dets_big, Detections)
    np.testing.assert_allclose(dets_big.scores, dets_small.scores, rtol=1e-6)
    np.testing.assert_allclose(dets_big.boxes, dets_small.boxes * 2, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dets_big.embeddings, dets_small.embeddings, rtol=1e-5)


@pytest.mark.parametrize('image,message', [
    (np.zeros((32, 48), dtype=np.uint8), r'must have shape \(H, W, 3\)'),
    (np.zeros((32, 48, 4), dtype=np.uint8), r'must have shape \(H, W, 3\)'),
    (np.zeros((32, 48, 3), dtype=np.float32), 'must be uint8 RGB'),
    (np.zeros((0, 48, 3), dtype=np.uint8), 'image is empty'),
    ([[0, 0, 0]], 'must be a numpy array'),
])
def test_detect_rejects_bad_images(image, message):
    with pytest.raises(ValueError, match=message):
        _tiny_model().detect(image)


@pytest.mark.parametrize('kwargs,message', [
    ({'input_size': (30, 48)}, 'input_size must be positive multiples of 16'),
    ({'class_names': ['a', 'a']}, 'class_names must be non-empty and unique'),
    ({'class_names': []}, 'class_names must be non-empty and unique'),
    ({'embedding_dim': 0}, 'embedding_dim must be positive'),
    ({'channels': (4, 8, 8)}, 'channels must list 4 stage widths'),
    ({'max_candidates': 0}, 'max_candidates must be positive'),
    ({'embedding_activation': 'tanh'}, 'embedding_activation must be one of'),
])
def test_constructor_rejects_bad_configuration(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _tiny_model(**kwargs)


def _trained_statistics(model: CenterNetDetector) -> CenterNetDetector:
    # A few training-mode passes move the batch-norm statistics away from identity, so
    # folding is tested on non-trivial numbers.
    model.train()
    with torch.no_grad():
        for seed in range(3):
            model(torch.rand(4, 3, *model.input_size, generator=torch.Generator().manual_seed(
                seed)) * 0.5)
    return model.eval()


def test_fold_batchnorm_keeps_outputs():
    model = _trained_statistics(_tiny_model())
    images = torch.rand(2, 3, 32, 48)
    before = model(images)
    model.fold_batchnorm()
    after = model(images)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    for key in ('heatmap', 'scores', 'boxes', 'embeddings', 'logits'):
        torch.testing.assert_close(after[key], before[key], rtol=1e-4, atol=1e-5)


def test_save_load_round_trip(tmp_path):
    model = _trained_statistics(_tiny_model())
    path = tmp_path / 'sub' / 'detector.pt'
    save_detector(model, path, model_id='tiny-1', metadata={'seed': 3})
    loaded = load_detector(path)
    assert loaded.model_id == 'tiny-1'
    assert loaded.metadata == {'seed': 3}
    assert loaded.class_names == CLASSES and loaded.input_size == (32, 48)
    assert loaded.batchnorm_folded and not loaded.training
    images = torch.rand(1, 3, 32, 48)
    torch.testing.assert_close(loaded(images)['embeddings'], model(images)['embeddings'],
                               rtol=1e-4, atol=1e-5)
    unfolded = load_detector(path, fold_batchnorm=False)
    torch.testing.assert_close(unfolded(images)['logits'], model(images)['logits'])


@pytest.mark.parametrize('activation', ['relu', 'leaky_relu'])
def test_embedding_activation_round_trips(tmp_path, activation):
    model = _tiny_model(embedding_activation=activation)
    save_detector(model, tmp_path / 'detector.pt', model_id='tiny-act')
    loaded = load_detector(tmp_path / 'detector.pt', fold_batchnorm=False)
    assert loaded.embedding_activation == activation
    images = torch.rand(1, 3, 32, 48)
    torch.testing.assert_close(loaded(images)['embeddings'], model(images)['embeddings'])


def test_files_without_an_activation_entry_load_with_relu(tmp_path):
    # Detectors saved before the activation was configurable used ReLU in the embedding MLP.
    model = _tiny_model(embedding_activation='relu')
    save_detector(model, tmp_path / 'detector.pt', model_id='tiny-old')
    payload = torch.load(tmp_path / 'detector.pt', weights_only=True)
    del payload['config']['embedding_activation']
    torch.save(payload, tmp_path / 'detector.pt')
    loaded = load_detector(tmp_path / 'detector.pt', fold_batchnorm=False)
    assert isinstance(loaded.embedding_mlp[1], torch.nn.ReLU)
    images = torch.rand(1, 3, 32, 48)
    torch.testing.assert_close(loaded(images)['embeddings'], model(images)['embeddings'])


def test_save_rejects_folded_model_and_empty_id(tmp_path):
    model = _tiny_model()
    with pytest.raises(ValueError, match='model_id'):
        save_detector(model, tmp_path / 'a.pt', model_id='')
    model.fold_batchnorm()
    with pytest.raises(ValueError, match='folded'):
        save_detector(model, tmp_path / 'a.pt', model_id='x')


def test_load_rejects_missing_corrupt_and_mismatched_files(tmp_path):
    with pytest.raises(ValueError, match='not found'):
        load_detector(tmp_path / 'missing.pt')

    garbage = tmp_path / 'garbage.pt'
    garbage.write_bytes(b'not a torch file at all')
    with pytest.raises(ValueError, match='cannot read'):
        load_detector(garbage)

    other = tmp_path / 'other.pt'
    torch.save({'format': 'something-else'}, other)
    with pytest.raises(ValueError, match='is not a'):
        load_detector(other)

    good = tmp_path / 'good.pt'
    save_detector(_tiny_model(), good, model_id='m')
    payload = torch.load(good, weights_only=True)

    tampered = dict(payload, state_dict=dict(payload['state_dict']))
    tampered['state_dict']['head.bias'] = tampered['state_dict']['head.bias'] + 1.0
    torch.save(tampered, tmp_path / 'tampered.pt')
    with pytest.raises(ValueError, match='checksum'):
        load_detector(tmp_path / 'tampered.pt')

    mismatched = dict(payload, config=dict(payload['config'], embedding_dim=7))
    torch.save(mismatched, tmp_path / 'mismatched.pt')
    with pytest.raises(ValueError, match='do not match'):
        load_detector(tmp_path / 'mismatched.pt')

    newer = dict(payload, version=99)
    torch.save(newer, tmp_path / 'newer.pt')
    with pytest.raises(ValueError, match='version'):
        load_detector(tmp_path / 'newer.pt')

    truncated = tmp_path / 'truncated.pt'
    truncated.write_bytes(good.read_bytes()[:200])
    with pytest.raises(ValueError, match='cannot read'):
        load_detector(truncated)
