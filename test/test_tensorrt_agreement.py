"""The TensorRT engine (FP16) agrees with the PyTorch CPU path where it matters: the shipped
detector on rendered simulator frames, whose heatmap has distinct peaks (a random model's
is nearly flat, so FP16 ties make the order of its scores arbitrary).

Compared per frame: the full heatmap; the detections well above the operating threshold
(matched by box, since FP16 may reorder near-equal scores); their embeddings; the NTK-GP
variance (the GP runs in float64 on the host from the engine's embeddings); and the OOD
flags, except for detections whose CPU variance lies within the FP16 tolerance of the
threshold. Tolerances are FP16's: a CPU emulation of FP16 embeddings on 75 rendered
detections moved the variance by at most 2.0 %.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from uq_perception.detectors.centernet import load_detector, normalize_images
from uq_perception.detectors.model_files import default_detector_path, default_gp_path
from uq_perception.ntk import LastLayerNTKGP
from uq_perception.runtime.backends import (
    BackendUnavailableError,
    build_tensorrt_engine,
    create_backend,
    import_torch_tensorrt,
)
from uq_perception.training.detection_metrics import box_iou
from uq_perception.training.detection_scoring import OPERATING_THRESHOLD


def _why_not_runnable() -> str | None:
    if not torch.cuda.is_available():
        return 'no CUDA GPU on this machine (torch.cuda.is_available() is False)'
    try:
        import_torch_tensorrt()
    except BackendUnavailableError as exc:
        return str(exc)
    return None


pytestmark = pytest.mark.skipif(_why_not_runnable() is not None,
                                reason=f'TensorRT agreement: {_why_not_runnable()}')

HEATMAP_ATOL = 2e-2          # sigmoid objectness in [0, 1], FP16 through the whole network
EMBEDDING_MIN_COSINE = 0.995
VARIANCE_RTOL = 0.05         # 2.5x the largest shift of the FP16 emulation
MATCH_IOU = 0.8
SCORE_MARGIN = 0.1           # only detections this far above the threshold must match


def _rendered_frames(count: int = 8) -> list[np.ndarray]:
    from uq_sim.scenario import get_scenario
    from uq_sim.scene import SceneRenderer

    scenario = get_scenario('tabletop_demo')
    frames = []
    with SceneRenderer(320, 240) as renderer:
        renderer.load(scenario.spec)
        for t in np.linspace(0.0, scenario.duration, count, endpoint=False):
            scenario.apply(renderer, float(t), loop=False)
            frames.append(renderer.render(visibility=False).rgb)
    return frames


@pytest.mark.slow
def test_fp16_engine_agrees_with_cpu_on_rendered_frames(tmp_path: Path):
    model_path = default_detector_path()
    model = load_detector(model_path)
    gp = LastLayerNTKGP.load(default_gp_path(), feature_dim=model.embedding_dim,
                             class_names=model.class_names, model_id=model.model_id)
    engine_path = build_tensorrt_engine(model, tmp_path / 'detector.ep')
    cpu = create_backend('pytorch-cpu', load_detector(model_path))
    trt = create_backend('tensorrt', load_detector(model_path), engine_path=engine_path)
    compared = 0
    for frame in _rendered_frames():
        with torch.inference_mode():
            images = cpu.model.image_tensor(frame)
            cpu_heatmap = cpu.model(normalize_images(images))['heatmap']
            trt_heatmap = trt._engine(normalize_images(images.cuda(), torch.float16))['heatmap']
        np.testing.assert_allclose(trt_heatmap.float().cpu().numpy(), cpu_heatmap.numpy(),
                                   atol=HEATMAP_ATOL)

        reference = cpu.infer(frame, OPERATING_THRESHOLD, 20)
        got = trt.infer(frame, OPERATING_THRESHOLD, 20)
        if len(reference) == 0:
            continue
        assert len(got) > 0, 'the engine lost every detection of a frame'
        iou = box_iou(reference.boxes, got.boxes)
        ref_out = gp.predict(reference.embeddings, reference.logits)
        got_out = gp.predict(got.embeddings, got.logits)
        for i in np.flatnonzero(reference.scores >= OPERATING_THRESHOLD + SCORE_MARGIN):
            j = int(iou[i].argmax())
            assert iou[i, j] >= MATCH_IOU, f'detection {i} has no FP16 match (IoU {iou[i, j]})'
            a, b = reference.embeddings[i], got.embeddings[j]
            cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
            assert cosine >= EMBEDDING_MIN_COSINE, cosine
            var_ref, var_got = ref_out.gp_variance[i], got_out.gp_variance[j]
            assert abs(var_got - var_ref) <= VARIANCE_RTOL * var_ref, (var_ref, var_got)
            threshold = gp.ood_threshold
            if threshold is not None and abs(var_ref - threshold) > VARIANCE_RTOL * threshold:
                flags = ref_out.out_of_distribution[i], got_out.out_of_distribution[j]
                assert bool(flags[0]) == bool(flags[1]), (var_ref, var_got, threshold)
            compared += 1
    assert compared >= 5, f'only {compared} detections compared: the frames are too empty'
