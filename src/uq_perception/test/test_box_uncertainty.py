"""Box-coordinate uncertainty: calibration fit, pixel propagation, persistence, coverage,
overlay band (ROS-free)."""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest
import torch

from uq_perception.box_uncertainty import (
    BOX_COORDINATES,
    HEAD_COORDINATES,
    box_std,
    cell_size,
    decode_jacobian,
)
from uq_perception.detectors.centernet import CenterNetDetector, Detections
from uq_perception.ntk import LastLayerNTKGP, NTKGPConfig
from uq_perception.ntk.box_calibration import BoxCalibration, fit_box_calibration
from uq_perception.ntk.config import UncertaintyOutput
from uq_perception.ntk.persistence import read_state, write_state
from uq_perception.overlay import MAX_DRAWN, draw_box_band, draw_overlay, render_overlay
from uq_perception.perception import FrameResult
from uq_perception.training.box_fit import coverage, evaluate_box_uncertainty, head_residuals

CLASSES = ['a', 'b', 'c']


def _calibration(noise: float = 0.01, scale: float = 2.0) -> BoxCalibration:
    return BoxCalibration(HEAD_COORDINATES, (noise,) * 4, (scale,) * 4, 100)


@pytest.fixture(scope='module')
def clustered_gp() -> LastLayerNTKGP:
    """A GP fitted on three tight clusters of 8-D features."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 8)) * 3.0
    labels = np.repeat(np.arange(3), 200)
    features = centres[labels] + 0.2 * rng.normal(size=(600, 8))
    weight = rng.normal(size=(3, 8))
    gp = LastLayerNTKGP(weight, np.zeros(3), NTKGPConfig(), CLASSES, model_id='m')
    gp.fit(features, labels)
    gp.box_calibration = _calibration()
    return gp


# ------------------------------------------------------------------ calibration fit

def test_fit_recovers_known_noise_and_scale():
    rng = np.random.default_rng(1)
    v = rng.gamma(1.0, 0.5, 40000)
    noise, scale = np.array([0.02, 0.05, 0.001, 0.3]), np.array([0.5, 0.0, 2.0, 0.1])
    residuals = rng.normal(size=(v.size, 4)) * np.sqrt(noise + np.outer(v, scale))
    fitted = fit_box_calibration(residuals, v, HEAD_COORDINATES)
    np.testing.assert_allclose(fitted.noise, noise, rtol=0.1, atol=0.003)
    np.testing.assert_allclose(fitted.scale, scale, rtol=0.1, atol=0.02)
    # Maximum likelihood over the scale: normalised residuals have unit mean square.
    normalised = residuals ** 2 / fitted.head_variance(v)
    np.testing.assert_allclose(normalised.mean(axis=0), 1.0, rtol=0.01)


def test_fit_without_spread_in_the_variance_puts_everything_in_the_noise():
    residuals = np.random.default_rng(2).normal(size=(500, 4)) * 0.3
    fitted = fit_box_calibration(residuals, np.full(500, 0.7), HEAD_COORDINATES)
    assert fitted.scale == (0.0,) * 4
    np.testing.assert_allclose(fitted.noise, (residuals ** 2).mean(axis=0))


@pytest.mark.parametrize('residuals, variance, message', [
    (np.zeros((5, 4)), np.ones(5), 'all zero'),
    (np.ones((1, 4)), np.ones(1), 'at least 2'),
    (np.ones((5, 3)), np.ones(5), r'\(N, 4\)'),
    (np.full((5, 4), np.nan), np.ones(5), 'finite'),
])
def test_fit_rejects_bad_input(residuals, variance, message):
    with pytest.raises(ValueError, match=message):
        fit_box_calibration(residuals, variance, HEAD_COORDINATES)


@pytest.mark.parametrize('noise, scale', [(-1.0, 1.0), (0.0, 0.0), (float('nan'), 1.0)])
def test_calibration_rejects_values_that_would_give_a_bad_sigma(noise, scale):
    with pytest.raises(ValueError, match='box calibration'):
        BoxCalibration(HEAD_COORDINATES, (noise,) * 4, (scale,) * 4, 10)


# ------------------------------------------------------------------ sigma in pixels

def test_sigma_is_finite_and_larger_for_novel_than_for_dense_features(clustered_gp):
    rng = np.random.default_rng(3)
    dense = clustered_gp.centroids[0] + 0.1 * rng.normal(size=(5, 8))
    # Far from every cluster, in random directions: where the GP has seen no data.
    novel = 10.0 * rng.normal(size=(5, 8))
    features = np.concatenate([dense, novel])
    boxes = np.tile([[100.0, 80.0, 40.0, 30.0]], (10, 1))
    std = box_std(boxes, clustered_gp.gp_variance(features), clustered_gp.box_calibration,
                  (4.0, 4.0))
    assert std.dtype == np.float32 and std.shape == (10, 4)
    assert np.isfinite(std).all() and (std > 0).all()
    assert (std[5:].min(axis=0) > std[:5].max(axis=0)).all()


def test_sigma_scales_with_the_calibration():
    v = np.array([0.0, 0.1, 2.0])
    boxes = np.tile([[50.0, 50.0, 20.0, 10.0]], (3, 1))
    base = box_std(boxes, v, _calibration(0.01, 2.0), (4.0, 4.0))
    doubled = box_std(boxes, v, _calibration(0.04, 8.0), (4.0, 4.0))
    np.testing.assert_allclose(doubled, 2.0 * base, rtol=1e-6)
    expected = np.sqrt(0.01 + 2.0 * v)[:, None] * np.array([4.0, 4.0, 20.0, 10.0])
    np.testing.assert_allclose(base, expected, rtol=1e-6)


def test_without_calibration_sigma_is_zero_and_bad_boxes_are_rejected():
    boxes = np.array([[10.0, 10.0, 5.0, 5.0]])
    assert (box_std(boxes, np.array([0.3]), None, (4.0, 4.0)) == 0).all()
    assert box_std(np.zeros((0, 4)), np.zeros(0), _calibration(), (4.0, 4.0)).shape == (0, 4)
    with pytest.raises(ValueError, match='finite'):
        box_std(np.array([[np.nan, 1, 1, 1]]), np.array([0.3]), _calibration(), (4.0, 4.0))
    with pytest.raises(ValueError, match='shape'):
        box_std(boxes, np.array([0.3, 0.2]), _calibration(), (4.0, 4.0))


@pytest.mark.parametrize('image_size', [(240, 320), (480, 640), (120, 400)])
def test_decode_jacobian_matches_finite_differences_of_the_detector_decode(image_size):
    torch.manual_seed(0)
    model = CenterNetDetector(CLASSES, embedding_dim=8, channels=(8, 8, 16, 16),
                              neck_channels=16, embedding_channels=8, max_candidates=32).eval()
    with torch.no_grad():
        maps = model.feature_maps(torch.rand(1, 3, *model.input_size))
        # Sizes well inside the clamp of the log-size, so the decode is smooth there.
        maps['size'] = torch.full_like(maps['size'], 2.0) + 0.3 * torch.rand_like(maps['size'])
    eps = 1e-3

    def decoded(head: int) -> Detections:
        shifted = dict(maps)
        key, channel = ('offset', head) if head < 2 else ('size', head - 2)
        if head >= 0:
            shifted[key] = maps[key].clone()
            shifted[key][:, channel] += eps
        with torch.no_grad():
            out = model.candidates(shifted)
        return model.decode(out, 0.0, 64, image_sizes=[image_size])[0]

    base = decoded(-1)
    height, width = image_size
    inside = ((base.boxes[:, 0] - base.boxes[:, 2] / 2 > 1) & (base.boxes[:, 1]
              - base.boxes[:, 3] / 2 > 1) & (base.boxes[:, 0] + base.boxes[:, 2] / 2 < width - 1)
              & (base.boxes[:, 1] + base.boxes[:, 3] / 2 < height - 1))
    assert inside.sum() >= 5  # unclipped boxes, where the decode is differentiable
    jacobian = decode_jacobian(base.boxes, cell_size(model.input_size, image_size))
    for head in range(4):
        numeric = (decoded(head).boxes.astype(np.float64) - base.boxes) / eps
        # Only the coordinate this head output drives moves: the Jacobian is diagonal.
        off_diagonal = np.delete(numeric[inside], head, axis=1)
        np.testing.assert_allclose(off_diagonal, 0.0, atol=0.05)
        np.testing.assert_allclose(numeric[inside, head], jacobian[inside, head], rtol=0.02)


def test_head_residuals_invert_the_decode():
    predicted = np.array([[40.0, 30.0, 20.0, 10.0]])
    truth = np.array([[44.0, 28.0, 40.0, 5.0]])
    np.testing.assert_allclose(head_residuals(predicted, truth, (4.0, 2.0)),
                               [[1.0, -1.0, np.log(2.0), -np.log(2.0)]])
    with pytest.raises(ValueError, match='positive width'):
        head_residuals(predicted, np.array([[44.0, 28.0, 0.0, 5.0]]), (4.0, 4.0))


# ------------------------------------------------------------------ persistence

def test_calibration_survives_save_and_load(clustered_gp, tmp_path):
    clustered_gp.save(tmp_path / 'gp.npz')
    loaded = LastLayerNTKGP.load(tmp_path / 'gp.npz')
    assert loaded.box_calibration == clustered_gp.box_calibration


def test_old_state_without_calibration_loads_with_zero_sigma_and_says_why(
        clustered_gp, tmp_path, caplog):
    clustered_gp.save(tmp_path / 'gp.npz')
    meta, arrays = read_state(tmp_path / 'gp.npz')
    del meta['box_calibration'], meta['digest']
    write_state(tmp_path / 'old.npz', meta, arrays)  # as files written before it existed
    with caplog.at_level(logging.INFO, logger='uq_perception.ntk.model'):
        old = LastLayerNTKGP.load(tmp_path / 'old.npz')
    assert old.box_calibration is None
    assert 'old.npz has no box calibration' in caplog.text and 'box_std is 0' in caplog.text
    features = np.random.default_rng(5).normal(size=(2, 8))
    assert (box_std(np.ones((2, 4)), old.gp_variance(features), old.box_calibration,
                    (4.0, 4.0)) == 0).all()


def test_corrupt_calibration_is_an_error_naming_the_file(clustered_gp, tmp_path):
    clustered_gp.save(tmp_path / 'gp.npz')
    meta, arrays = read_state(tmp_path / 'gp.npz')
    meta['box_calibration']['noise'] = [-1.0] * 4
    del meta['digest']
    write_state(tmp_path / 'bad.npz', meta, arrays)
    with pytest.raises(ValueError, match=r'bad\.npz.*box calibration noise'):
        LastLayerNTKGP.load(tmp_path / 'bad.npz')


def test_a_new_fit_voids_the_calibration():
    gp = LastLayerNTKGP(np.eye(3, 8), np.zeros(3), NTKGPConfig(), CLASSES)
    gp.box_calibration = _calibration()
    gp.fit(np.random.default_rng(6).normal(size=(30, 8)), np.arange(30) % 3)
    assert gp.box_calibration is None


# ------------------------------------------------------------------ coverage

def test_coverage_counts_coordinates_within_one_and_two_sigma():
    predicted = np.zeros((4, 4))
    std = np.ones((4, 4))
    # Per coordinate column: errors 0.5 (inside 1 sigma), 1.5 (inside 2), 2.5 (outside both).
    errors = np.array([[0.5, 1.5, 2.5, 0.5], [0.5, 1.5, 2.5, 1.5], [0.5, 1.5, 2.5, 2.5],
                       [-0.5, -1.5, -2.5, -0.5]])
    result = coverage(predicted, std, predicted + errors)
    assert result['objects'] == 4
    assert result['within_1_sigma'] == {'center_x': 1.0, 'center_y': 0.0, 'width': 0.0,
                                        'height': 0.5, 'all': 6 / 16}
    assert result['within_2_sigma'] == {'center_x': 1.0, 'center_y': 1.0, 'width': 0.0,
                                        'height': 0.75, 'all': 11 / 16}
    assert result['ideal'] == {'within_1_sigma': 0.6827, 'within_2_sigma': 0.9545}


def test_coverage_of_gaussian_errors_is_the_gaussian_share():
    rng = np.random.default_rng(4)
    std = rng.uniform(0.5, 5.0, (50000, 4))
    truth = rng.normal(size=std.shape) * std
    result = coverage(np.zeros_like(std), std, truth)
    for name in BOX_COORDINATES + ('all',):
        assert result['within_1_sigma'][name] == pytest.approx(0.6827, abs=0.01)
        assert result['within_2_sigma'][name] == pytest.approx(0.9545, abs=0.005)
    for name in BOX_COORDINATES:
        assert result['normalised_mean_square'][name] == pytest.approx(1.0, abs=0.03)
        assert result['normalised_excess_kurtosis'][name] == pytest.approx(0.0, abs=0.15)
    empty = coverage(np.zeros((0, 4)), np.zeros((0, 4)), np.zeros((0, 4)))
    assert empty['objects'] == 0 and empty['within_1_sigma']['all'] is None
    unestimated = coverage(np.zeros((3, 4)), np.zeros((3, 4)), np.ones((3, 4)))
    assert unestimated['within_2_sigma']['all'] == 0.0
    assert unestimated['normalised_mean_square']['width'] is None


def test_evaluation_without_calibration_reports_why_instead_of_zeros():
    gp = LastLayerNTKGP(np.eye(3, 8), np.zeros(3), NTKGPConfig(), CLASSES)
    report = evaluate_box_uncertainty(None, gp, None, None, 0.3, 20)  # type: ignore[arg-type]
    assert report['calibrated'] is False and 'gp-only' in report['reason']


# ------------------------------------------------------------------ overlay

def _frame(boxes: np.ndarray, stds: np.ndarray) -> FrameResult:
    k = len(boxes)
    probabilities = np.full((k, 3), 1 / 3)
    uncertainty = UncertaintyOutput(
        logits=np.zeros((k, 3)), gp_variance=np.linspace(0.0, 2.0, k),
        class_variance=np.zeros((k, 3)), probabilities=probabilities,
        predictive_entropy=np.zeros(k), expected_entropy=np.zeros(k),
        mutual_information=np.zeros(k), out_of_distribution=np.arange(k) % 2 == 1,
        expert_id=np.zeros(k, dtype=np.int64))
    detections = Detections(np.asarray(boxes, np.float32), np.ones(k, np.float32),
                            np.zeros((k, 4), np.float32), np.zeros((k, 3), np.float32))
    return FrameResult(detections, uncertainty, np.full(k, -1), CLASSES, 1.0, 1.0,
                       np.asarray(stds, np.float32))


def test_overlay_draws_bands_on_edge_and_degenerate_boxes():
    image = np.full((60, 80, 3), 128, dtype=np.uint8)
    boxes = np.array([[0.0, 0.0, 20.0, 20.0],        # centre on the corner
                      [80.0, 60.0, 30.0, 30.0],      # centre on the far corner
                      [40.0, 30.0, 200.0, 200.0],    # larger than the image
                      [-50.0, -50.0, 10.0, 10.0],    # wholly outside
                      [40.0, 30.0, 0.0, 0.0],        # empty box
                      [40.0, 30.0, 10.0, 10.0]])     # band wider than half the box
    stds = np.array([[1, 1, 2, 2], [3, 3, 1, 1], [5, 5, 5, 5], [1, 1, 1, 1], [2, 2, 2, 2],
                     [20, 20, 20, 20]], dtype=np.float32)
    out = draw_overlay(image, _frame(boxes, stds), ood_threshold=1.0)
    assert out.shape == image.shape and out.dtype == np.uint8
    assert (image == 128).all()  # the input is left alone


def test_overlay_skips_and_counts_hostile_detections_without_raising():
    image = np.full((60, 80, 3), 128, dtype=np.uint8)
    boxes = np.array([[40.0, 30.0, 10.0, 10.0],      # the only valid one
                      [np.nan, 30.0, 10.0, 10.0],
                      [np.inf, 30.0, 10.0, 10.0],
                      [40.0, 30.0, -10.0, 10.0],
                      [1e30, 30.0, 10.0, 10.0]])
    stds = np.array([[np.nan, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1],
                     [1, 1, 1, 1]], dtype=np.float32)
    frame = _frame(boxes, stds)
    out, skipped = render_overlay(image, frame, ood_threshold=float('nan'))
    assert skipped == 4 and out.shape == image.shape and (out != 128).any()
    frame.uncertainty.gp_variance[0] = np.nan
    assert render_overlay(image, frame, ood_threshold=1.0)[1] == 5
    # Class names with control characters, megabytes long, or fewer than the classes.
    good = _frame(boxes[:1], np.zeros((1, 4)))
    hostile = replace(good, class_names=['a\x1b[2J\n' + 'x' * 2_000_000] * len(CLASSES))
    assert render_overlay(image, hostile, 1.0)[1] == 0
    assert render_overlay(image, replace(good, class_names=['only one']), 1.0)[1] == 1
    # A wrong image shape or dtype comes back unchanged.
    odd = np.zeros((60, 80), dtype=np.float32)
    assert np.array_equal(render_overlay(odd, _frame(boxes, stds), 1.0)[0], odd)
    many = _frame(np.tile([[40.0, 30.0, 10.0, 10.0]], (5000, 1)), np.zeros((5000, 4)))
    assert render_overlay(image, many, 1.0)[1] == 5000 - MAX_DRAWN
    draw_box_band(image.copy(), np.array([40.0, 30.0, 10.0, 10.0]),
                  np.array([1e308, 1e308, 1e308, 1e308]), (255, 0, 0))


def test_band_spans_the_edges_moved_by_one_sigma():
    canvas = np.zeros((100, 100, 3), dtype=np.uint8)
    # Edge sigmas: hypot(3, 8 / 2) = 5 px in x, hypot(0, 4 / 2) = 2 px in y. Box edges at
    # x = 30, 70 and y = 40, 60; the band covers 1 sigma on either side (inclusive pixels).
    draw_box_band(canvas, np.array([50.0, 50.0, 40.0, 20.0]), np.array([3.0, 0.0, 8.0, 4.0]),
                  (255, 255, 255))
    row = canvas[50, :, 0] > 0
    assert np.flatnonzero(row).tolist() == list(range(25, 35)) + list(range(66, 76))
    column = canvas[:, 50, 0] > 0
    assert np.flatnonzero(column).tolist() == list(range(38, 42)) + list(range(59, 63))
    # A box just above the image: its shrunk box is off the image, the band's lower strip
    # (rows 0-4: bottom edge at y = 1, edge sigma 3) is on it.
    strip = np.zeros_like(canvas)
    draw_box_band(strip, np.array([50.0, -14.0, 20.0, 30.0]), np.array([3.0, 3.0, 0.0, 0.0]),
                  (255, 255, 255))
    assert np.flatnonzero(strip[:, 50, 0]).tolist() == [0, 1, 2, 3, 4]
    untouched = np.zeros_like(canvas)
    draw_box_band(untouched, np.array([50.0, 50.0, 40.0, 20.0]), np.zeros(4), (255, 0, 0))
    assert not untouched.any()
