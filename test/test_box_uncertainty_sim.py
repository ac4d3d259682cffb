"""Box-coordinate uncertainty of the shipped detector and GP on a rendered simulator scene.

The frame goes through the detector node's pipeline and message conversion; every
published ``Detection.box_std`` must be finite and positive, and the band it spans must
be plausible against the rendered ground truth.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from std_msgs.msg import Header

from uq_perception.detectors.centernet import load_detector
from uq_perception.messages import detection_array_message
from uq_perception.ntk import LastLayerNTKGP
from uq_perception.perception import UncertaintyPerception
from uq_perception.runtime.backends import TorchBackend
from uq_perception.training.detection_metrics import box_iou
from uq_perception.training.detection_scoring import OPERATING_THRESHOLD

MODELS = Path(__file__).resolve().parents[1] / 'models'


def test_detection_array_carries_finite_positive_box_std_from_a_sim_frame():
    from uq_sim.scene import compose_scene, render_scene

    model = load_detector(MODELS / 'detector.pt')
    gp = LastLayerNTKGP.load(MODELS / 'detector_gp.npz', feature_dim=model.embedding_dim,
                             class_names=model.class_names, model_id=model.model_id)
    assert gp.box_calibration is not None, 'the shipped GP state carries no box calibration'
    perception = UncertaintyPerception(TorchBackend(model), gp,
                                       score_threshold=OPERATING_THRESHOLD)
    placements = [('box', (-0.2, 0.0)), ('sphere', (0.0, 0.12)), ('mug', (0.2, -0.05))]
    frame = render_scene(compose_scene(placements, seed=0))
    result = perception.process(frame.rgb)
    message = detection_array_message(result, Header(frame_id='camera'), 'pytorch-cpu',
                                      model.model_id)
    assert len(message.detections) >= 3
    stds = np.array([d.box_std for d in message.detections])
    assert np.isfinite(stds).all() and (stds > 0).all()
    np.testing.assert_array_equal(stds, result.box_std)
    # Pixel scale: a few pixels at most for a 320 x 240 image, not a fraction of a pixel
    # squared or a whole image.
    assert (stds < 40).all() and (stds.max(axis=1) > 0.1).all()
    truth = np.array([[x + w / 2, y + h / 2, w, h]
                      for x, y, w, h in (a.bbox for a in frame.annotations)])
    boxes = np.array([[d.center_x, d.center_y, d.width, d.height] for d in message.detections])
    iou = box_iou(truth, boxes)
    for row in range(len(truth)):
        det = int(iou[row].argmax())
        if iou[row, det] >= 0.5:
            # A found object's true box lies within a few of its sigmas, coordinate-wise.
            assert (np.abs(truth[row] - boxes[det]) <= 6 * stds[det]).all()
