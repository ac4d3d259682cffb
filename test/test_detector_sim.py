"""The shipped detector and NTK-GP on rendered simulator scenes (its acceptance test).

Each scene holds three known objects and one unknown shape at fixed table positions,
rendered by MuJoCo, and runs through the same pipeline as the detector node
(:class:`~uq_perception.perception.UncertaintyPerception` at the node's default objectness
threshold). Every known object must be found with its class and a box at IoU >= 0.5, and
the unknown object must be found and be more uncertain (GP variance) than every known
object in the same image. The five scenes were fixed before the shipped model was trained;
they are not chosen from its results.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from uq_perception.detectors.centernet import load_detector
from uq_perception.ntk import LastLayerNTKGP
from uq_perception.perception import FrameResult, UncertaintyPerception
from uq_perception.runtime.backends import TorchBackend
from uq_perception.training.detection_metrics import box_iou
from uq_perception.training.detection_scoring import IOU_THRESHOLD, OPERATING_THRESHOLD

MODELS = Path(__file__).resolve().parents[1] / 'models'
POSITIONS = [(-0.2, 0.0), (0.0, 0.12), (0.2, -0.05), (0.03, -0.15)]
# (seed, three known classes, one unknown class); every unknown shape appears once.
SCENES = [
    (0, ('box', 'sphere', 'mug'), 'torus'),
    (1, ('cylinder', 'capsule', 'ellipsoid'), 'cone'),
    (2, ('mug', 'box', 'capsule'), 'tetrahedron'),
    (3, ('sphere', 'ellipsoid', 'cylinder'), 'dumbbell'),
    (4, ('capsule', 'mug', 'sphere'), 'star'),
]
# The shipped model fails this scene (models/MODEL_CARD.md). Strict: if a new model passes
# it, the suite says so and the mark must go.
KNOWN_FAILURES = {
    'tetrahedron': 'shipped model: the tetrahedron is not detected (best IoU 0.00)',
    'dumbbell': 'shipped model: the dumbbell is found only as a part (IoU 0.45 < 0.5)',
}


def load_perception(model_dir: Path) -> UncertaintyPerception:
    """The pipeline of the detector node over ``model_dir``'s detector and GP."""
    model = load_detector(model_dir / 'detector.pt')
    gp = LastLayerNTKGP.load(model_dir / 'detector_gp.npz', feature_dim=model.embedding_dim,
                             class_names=model.class_names, model_id=model.model_id)
    return UncertaintyPerception(TorchBackend(model), gp, score_threshold=OPERATING_THRESHOLD)


def render_scene_with_truth(seed: int, known: tuple[str, ...], unknown: str
                            ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Render one scene; returns the image and each object's box (centre-size, pixels)."""
    from uq_sim.scene import compose_scene, render_scene

    placements = list(zip(known + (unknown,), POSITIONS, strict=True))
    frame = render_scene(compose_scene(placements, seed=seed))
    boxes = {}
    for ann in frame.annotations:
        x, y, w, h = ann.bbox
        boxes[ann.class_name] = np.array([x + w / 2, y + h / 2, w, h], dtype=np.float32)
    return frame.rgb, boxes


def check_scene(result: FrameResult, boxes: dict[str, np.ndarray], known: tuple[str, ...],
                unknown: str) -> list[str]:
    """What the pipeline got wrong on one scene (empty when it passes)."""
    problems = []
    if len(result) == 0:
        return ['no detections at all']
    iou = box_iou(np.stack([boxes[c] for c in known + (unknown,)]), result.detections.boxes)
    predicted = result.uncertainty.probabilities.argmax(axis=1)
    variance = result.uncertainty.gp_variance
    matched = iou.argmax(axis=1)
    for row, cls in enumerate(known):
        det = int(matched[row])
        if iou[row, det] < IOU_THRESHOLD:
            problems.append(f'known {cls} not found (best IoU {iou[row, det]:.2f})')
        elif result.class_names[predicted[det]] != cls:
            problems.append(f'known {cls} classified as {result.class_names[predicted[det]]}')
    det = int(matched[-1])
    if iou[-1, det] < IOU_THRESHOLD:
        problems.append(f'unknown {unknown} not found (best IoU {iou[-1, det]:.2f})')
        return problems
    known_variance = [variance[int(matched[row])] for row in range(len(known))
                      if iou[row, int(matched[row])] >= IOU_THRESHOLD]
    if known_variance and variance[det] <= max(known_variance):
        problems.append(f'unknown {unknown} GP variance {variance[det]:.4g} not above the '
                        f'known objects\' {max(known_variance):.4g}')
    return problems


@pytest.fixture(scope='module')
def perception():
    if not (MODELS / 'detector.pt').is_file():
        pytest.fail(f'the shipped model is missing from {MODELS}')
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_perception(MODELS)
    torch.set_num_threads(threads)


@pytest.mark.parametrize(('seed', 'known', 'unknown'), [
    pytest.param(*scene, id=scene[2], marks=[pytest.mark.xfail(
        strict=True, raises=AssertionError, reason=KNOWN_FAILURES[scene[2]])]
        if scene[2] in KNOWN_FAILURES else [])
    for scene in SCENES])
def test_shipped_model_finds_known_objects_and_is_most_uncertain_about_the_unknown(
        perception, seed, known, unknown):
    rgb, boxes = render_scene_with_truth(seed, known, unknown)
    assert set(boxes) == set(known) | {unknown}, 'every object is visible in the render'
    assert check_scene(perception.process(rgb), boxes, known, unknown) == []


@pytest.mark.parametrize(('seed', 'known', 'unknown'), SCENES, ids=[s[2] for s in SCENES])
def test_shipped_model_finds_the_known_objects_in_every_scene(perception, seed, known, unknown):
    # Also in the scenes whose unknown object the model fails on (the expected failures
    # above): there the known objects must still be found and classified.
    rgb, boxes = render_scene_with_truth(seed, known, unknown)
    problems = check_scene(perception.process(rgb), boxes, known, unknown)
    assert [p for p in problems if p.startswith('known ')] == []


def test_frame_result_times_the_backend_call_within_the_frame(perception):
    rgb, _ = render_scene_with_truth(*SCENES[0])
    result = perception.process(rgb)
    # The node's overhead figure is the frame's latency less this backend call.
    assert 0 < result.forward_ms < result.inference_ms
