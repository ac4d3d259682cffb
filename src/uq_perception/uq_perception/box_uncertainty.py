"""Box-coordinate standard deviations of detections, in pixels (ROS-free).

The detector's box head outputs, per stride-4 cell, the sub-cell centre offset and the
log of the box size in cells (``uq_perception.detectors.centernet``); a box is decoded as

    center_x = (cell_x + offset_x) * c_x,    width  = exp(log_width)  * c_x,
    center_y = (cell_y + offset_y) * c_y,    height = exp(log_height) * c_y,

with ``c = STRIDE * image size / input size`` the cell size in the published image's
pixels. The variance of the head's outputs comes from the NTK-GP's shared kernel term
(:mod:`uq_perception.ntk.box_calibration`: ``a_j + s_j v``, fitted on validation data) and
is carried to pixels by the decode's Jacobian, which is diagonal:

    d center / d offset = c,       d width / d log_width = width   (the same for y, height).

So ``std(center_x) = c_x sqrt(var_offset_x)`` and ``std(width) = width sqrt(var_log_width)``
(first-order propagation; the width's is relative, as its error is). The Jacobian is taken
at the published box, after clipping to the image. Without a calibration in the GP state
(files written before it existed) every standard deviation is 0: "not estimated".
"""

from __future__ import annotations

import numpy as np

from uq_perception.detectors.centernet_io import STRIDE
from uq_perception.ntk.box_calibration import BoxCalibration

# Published coordinates (Detection.box_std order) and the box head outputs behind them.
BOX_COORDINATES = ('center_x', 'center_y', 'width', 'height')
HEAD_COORDINATES = ('offset_x', 'offset_y', 'log_width', 'log_height')


def cell_size(input_size: tuple[int, int], image_size: tuple[int, int]) -> tuple[float, float]:
    """``(c_x, c_y)``: pixels of an ``image_size = (height, width)`` image per output cell of
    a detector with ``input_size = (height, width)``."""
    (in_h, in_w), (out_h, out_w) = input_size, image_size
    return STRIDE * out_w / in_w, STRIDE * out_h / in_h


def decode_jacobian(boxes: np.ndarray, cells: tuple[float, float]) -> np.ndarray:
    """``(K, 4)`` diagonal of d(center_x, center_y, width, height) / d(head outputs)."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    jacobian = np.empty_like(b)
    jacobian[:, 0], jacobian[:, 1] = cells
    jacobian[:, 2:] = b[:, 2:]
    return jacobian


def box_std(boxes: np.ndarray, gp_variance: np.ndarray, calibration: BoxCalibration | None,
            cells: tuple[float, float]) -> np.ndarray:
    """``(K, 4)`` float32 pixel standard deviations of ``(center_x, center_y, width, height)``.

    Zeros when ``calibration`` is ``None`` (not estimated). Always finite.

    Raises
    ------
    ValueError
        Non-finite boxes or GP variances, or shapes that disagree.
    """
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    v = np.asarray(gp_variance, dtype=np.float64)
    if v.shape != (b.shape[0],):
        raise ValueError(f'gp_variance must have shape ({b.shape[0]},), got {v.shape}')
    if not (np.isfinite(b).all() and np.isfinite(v).all()):
        raise ValueError('boxes and gp_variance must be finite to estimate box_std')
    if calibration is None:
        return np.zeros(b.shape, dtype=np.float32)
    return (np.sqrt(calibration.head_variance(v)) * decode_jacobian(b, cells)).astype(np.float32)
