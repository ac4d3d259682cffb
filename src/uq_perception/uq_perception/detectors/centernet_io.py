"""The shipped CenterNet's input and output on the host, in numpy (ROS-free, torch-free).

The frame as the network's uint8 input (:func:`image_array`) and its top-K candidates as
:class:`~uq_perception.detectors.contract.Detections` (:func:`decode_candidates`): what every
runtime of the network shares, here without torch, so that a runtime which does not run the
network in torch (an ONNX Runtime session of its export) needs none.
:class:`~uq_perception.detectors.centernet.CenterNetDetector` uses these too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from uq_perception.detectors.contract import Detections, check_rgb_image

#: Pixels of the input image per cell of the network's feature maps.
STRIDE = 4


def image_array(image_rgb: np.ndarray, input_size: tuple[int, int]) -> np.ndarray:
    """Validate an RGB uint8 image and return it as a ``(1, 3, H, W)`` uint8 view of
    ``input_size`` (resized when it differs), unnormalised and not made contiguous.

    Raises
    ------
    ValueError
        If the image is not a non-empty ``(H, W, 3)`` uint8 array.
    """
    check_rgb_image(image_rgb)
    in_h, in_w = input_size
    if image_rgb.shape[:2] != (in_h, in_w):
        import cv2  # deferred: only needed when the camera size differs from the model's

        image_rgb = cv2.resize(image_rgb, (in_w, in_h), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(image_rgb).transpose(2, 0, 1)[None]


def decode_candidates(scores: np.ndarray, boxes: np.ndarray, embeddings: np.ndarray,
                      logits: np.ndarray, input_size: tuple[int, int],
                      score_threshold: float = 0.3, max_detections: int = 20,
                      image_sizes: Sequence[tuple[int, int]] | None = None
                      ) -> list[Detections]:
    """Per-image :class:`Detections` of a batch of top-K candidates.

    Parameters
    ----------
    scores, boxes, embeddings, logits : np.ndarray
        float32 ``(B, K)``, ``(B, K, 4)`` centre-size boxes in input pixels, ``(B, K, D)``,
        ``(B, K, C)``.
    input_size : tuple[int, int]
        The network's ``(height, width)``.
    score_threshold : float
        Minimum objectness, in ``[0, 1]``.
    max_detections : int
        Maximum detections per image.
    image_sizes : Sequence[tuple[int, int]] | None
        Original ``(height, width)`` per image; boxes are scaled from ``input_size`` to it
        and clipped to the image. ``None`` keeps input coordinates.

    Raises
    ------
    ValueError
        On a threshold outside ``[0, 1]``, a negative ``max_detections`` or an
        ``image_sizes`` of another length than the batch.
    """
    if not 0.0 <= score_threshold <= 1.0:
        raise ValueError(f'score_threshold must be in [0, 1], got {score_threshold}')
    if max_detections < 0:
        raise ValueError(f'max_detections must be >= 0, got {max_detections}')
    batch = scores.shape[0]
    if image_sizes is not None and len(image_sizes) != batch:
        raise ValueError(f'image_sizes has {len(image_sizes)} entries for a batch of {batch}')
    in_h, in_w = input_size
    result = []
    for i in range(batch):
        order = np.argsort(-scores[i], kind='stable')
        order = order[scores[i][order] >= score_threshold][:max_detections]
        bx = boxes[i][order].copy()
        out_h, out_w = (in_h, in_w) if image_sizes is None else image_sizes[i]
        bx[:, [0, 2]] *= out_w / in_w
        bx[:, [1, 3]] *= out_h / in_h
        result.append(Detections(
            boxes=clip_boxes(bx, out_w, out_h),
            scores=scores[i][order].copy(),
            embeddings=embeddings[i][order].copy(),
            logits=logits[i][order].copy(),
        ))
    return result


def clip_boxes(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    """Clip centre-size boxes to the image rectangle, keeping the centre-size format."""
    x1 = np.clip(boxes[:, 0] - boxes[:, 2] / 2, 0.0, width)
    y1 = np.clip(boxes[:, 1] - boxes[:, 3] / 2, 0.0, height)
    x2 = np.clip(boxes[:, 0] + boxes[:, 2] / 2, 0.0, width)
    y2 = np.clip(boxes[:, 1] + boxes[:, 3] / 2, 0.0, height)
    return np.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], axis=1).astype(
        np.float32).reshape(-1, 4)
