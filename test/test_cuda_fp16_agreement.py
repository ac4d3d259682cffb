"""FP16 on the ``pytorch-cuda`` backend keeps the uncertainty of FP32: the shipped detector
and GP on a generated simulator split with unknown objects, FP16 CUDA graphs (GPU
preprocessing, the GP variance inside the graph) against eager FP32 on the same GPU.

Agreement where it matters to the robot:

- the GP-variance AUROC of unknown against known objects (detections matched to the
  split's objects, as ``uq eval detector`` scores them) within 0.002;
- the GP variance of each detection (host query on each path's embeddings, as the node
  computes it) within 5 % at the 99th percentile;
- the same detections (as many, each matched at IoU >= 0.5) on at least 99 % of images;
- the graph's own variance of the kept detections equals the host query of their
  embeddings (float32 against float64).

It runs only where CUDA exists; ``test_tensorrt_agreement.py`` checks the TensorRT engine
on machines that have TensorRT.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason='FP16 agreement on pytorch-cuda: no CUDA GPU on this machine '
                              '(torch.cuda.is_available() is False)'),
    pytest.mark.slow,
]

IMAGES = 160
AUROC_TOLERANCE = 0.002
VARIANCE_P99_RTOL = 0.05
SAME_DETECTIONS_SHARE = 0.99
MATCH_IOU = 0.5


def test_fp16_graph_keeps_the_uncertainty_of_fp32_on_a_sim_split():
    pytest.importorskip('mujoco', reason='the split is rendered with MuJoCo')
    from uq_eval.detector.procedural_unknowns import render_procedural_split
    from uq_eval.detector.scoring import matched_objects, safe_auroc
    from uq_perception.detectors.centernet import load_detector
    from uq_perception.detectors.model_files import default_detector_path, default_gp_path
    from uq_perception.ntk import LastLayerNTKGP
    from uq_perception.runtime.backends import CudaGraphBackend, create_backend
    from uq_perception.runtime.cuda_graph import CudaOptions, Precision
    from uq_perception.training.detection_metrics import box_iou
    from uq_perception.training.detection_scoring import (
        OPERATING_MAX_DETECTIONS,
        OPERATING_THRESHOLD,
    )

    model = load_detector(default_detector_path())
    gp = LastLayerNTKGP.load(default_gp_path(), feature_dim=model.embedding_dim,
                             model_id=model.model_id)
    split = render_procedural_split(IMAGES, 0, model.input_size, model.class_names)
    fp32 = create_backend('pytorch-cuda', load_detector(default_detector_path()))
    fp16 = create_backend('pytorch-cuda', load_detector(default_detector_path()), gp=gp,
                          cuda=CudaOptions(cuda_graph=True, precision=Precision.FP16,
                                           gpu_preprocess=True))
    assert isinstance(fp16, CudaGraphBackend)

    detections = {'fp32': [], 'fp16': []}
    relative: list[float] = []
    same = 0
    for image in split.images:
        reference = fp32.infer(image, OPERATING_THRESHOLD, OPERATING_MAX_DETECTIONS)
        got = fp16.infer(image, OPERATING_THRESHOLD, OPERATING_MAX_DETECTIONS)
        detections['fp32'].append(reference)
        detections['fp16'].append(got)
        assert fp16.last_frame is not None and fp16.last_frame.gp_variance is not None
        np.testing.assert_allclose(fp16.last_frame.gp_variance,
                                   gp.gp_variance(got.embeddings), rtol=1e-3)
        if len(reference) == 0 or len(got) == 0:
            same += len(reference) == len(got)
            continue
        iou = box_iou(reference.boxes, got.boxes)
        partner = iou.argmax(axis=1)
        matched = iou[np.arange(len(reference)), partner] >= MATCH_IOU
        same += len(reference) == len(got) and bool(matched.all())
        var_ref = gp.gp_variance(reference.embeddings)[matched]
        var_got = gp.gp_variance(got.embeddings)[partner[matched]]
        relative += (np.abs(var_got - var_ref) / var_ref).tolist()
    assert fp16.runner.graphs_active, fp16.graph_failure

    aurocs = {}
    for name, dets in detections.items():
        variance, unknown = [], []
        for i, det_index, obj_index in matched_objects(split, dets):
            variance += gp.gp_variance(dets[i].embeddings[det_index]).tolist()
            unknown += (split.labels[i][obj_index] < 0).tolist()
        aurocs[name] = safe_auroc(np.array(variance), np.array(unknown, dtype=bool))
    assert aurocs['fp32'] is not None and aurocs['fp16'] is not None, aurocs
    assert abs(aurocs['fp16'] - aurocs['fp32']) <= AUROC_TOLERANCE, aurocs
    assert len(relative) >= IMAGES, f'only {len(relative)} detections compared'
    assert np.percentile(relative, 99) <= VARIANCE_P99_RTOL, np.percentile(relative, 99)
    assert same >= SAME_DETECTIONS_SHARE * IMAGES, f'{same} of {IMAGES} images agree'
