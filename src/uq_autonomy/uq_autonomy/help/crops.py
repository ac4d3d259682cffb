"""Image crops for help requests: the region around a box, and PNG bytes (stdlib + NumPy).

The ask-for-help node crops the camera image around the detection that needs a label, sends
the crop in ``HelpRequest.crop`` and stores it as PNG in the label store; the COCO export
writes these PNGs as its images, with the object's box in crop coordinates.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence

import numpy as np

PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
_COLOUR_TYPES = {1: 0, 3: 2, 4: 6}  # channels -> PNG colour type (grey, RGB, RGBA)


def crop_region(box: Sequence[float], image_width: int, image_height: int,
                margin: float = 0.25, min_size: int = 16) -> tuple[int, int, int, int]:
    """Integer region ``(x, y, width, height)`` around a box, grown and clipped to the image.

    Parameters
    ----------
    box : 4 floats
        ``(center_x, center_y, width, height)`` in pixels (``uq_msgs/Detection``).
    image_width, image_height : int
        Image size.
    margin : float
        Fraction of the box size added on each side (context helps a person recognise it).
    min_size : int
        Smallest crop side before clipping, so tiny boxes still give a viewable crop.

    Raises
    ------
    ValueError
        On a non-finite box, a negative margin or an empty image.
    """
    if image_width < 1 or image_height < 1:
        raise ValueError(f'image size must be positive, got {image_width}x{image_height}')
    if not all(math.isfinite(float(v)) for v in box) or len(box) != 4:
        raise ValueError(f'box must be 4 finite numbers (cx, cy, w, h), got {list(box)}')
    if not math.isfinite(margin) or margin < 0.0:
        raise ValueError(f'margin must be a finite number >= 0, got {margin}')
    cx, cy, w, h = (float(v) for v in box)
    half_w = max(abs(w) * (0.5 + margin), min_size / 2)
    half_h = max(abs(h) * (0.5 + margin), min_size / 2)
    x0 = int(max(0, math.floor(cx - half_w)))
    y0 = int(max(0, math.floor(cy - half_h)))
    x1 = int(min(image_width, math.ceil(cx + half_w)))
    y1 = int(min(image_height, math.ceil(cy + half_h)))
    if x1 <= x0 or y1 <= y0:  # box entirely outside the image: take the nearest pixel
        x0 = min(max(x0, 0), image_width - 1)
        y0 = min(max(y0, 0), image_height - 1)
        x1, y1 = x0 + 1, y0 + 1
    return x0, y0, x1 - x0, y1 - y0


def box_in_region(box: Sequence[float],
                  region: Sequence[int]) -> tuple[float, float, float, float]:
    """The box ``(cx, cy, w, h)`` as COCO ``(x, y, width, height)`` relative to ``region``,
    clipped to it."""
    cx, cy, w, h = (float(v) for v in box)
    rx, ry, rw, rh = (float(v) for v in region)
    x0 = min(max(cx - w / 2 - rx, 0.0), rw)
    y0 = min(max(cy - h / 2 - ry, 0.0), rh)
    x1 = min(max(cx + w / 2 - rx, 0.0), rw)
    y1 = min(max(cy + h / 2 - ry, 0.0), rh)
    return x0, y0, x1 - x0, y1 - y0


def cut(rgb: np.ndarray, region: Sequence[int]) -> np.ndarray:
    """The pixels of ``region`` (from :func:`crop_region`) as a contiguous copy."""
    x, y, w, h = (int(v) for v in region)
    return np.ascontiguousarray(rgb[y:y + h, x:x + w])


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return (struct.pack('>I', len(payload)) + kind + payload
            + struct.pack('>I', zlib.crc32(kind + payload) & 0xFFFFFFFF))


def encode_png(pixels: np.ndarray, compression: int = 6) -> bytes:
    """Encode an 8-bit grey (HxW), RGB (HxWx3) or RGBA (HxWx4) image as PNG bytes.

    Raises
    ------
    ValueError
        On another dtype, shape or an empty image.
    """
    image = np.asarray(pixels)
    if image.dtype != np.uint8:
        raise ValueError(f'PNG encoding needs uint8 pixels, got {image.dtype}')
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in _COLOUR_TYPES:
        raise ValueError(f'PNG encoding needs HxW, HxWx3 or HxWx4 pixels, got {image.shape}')
    height, width, channels = image.shape
    if height == 0 or width == 0:
        raise ValueError(f'cannot encode an empty image ({width}x{height})')
    rows = np.ascontiguousarray(image).reshape(height, width * channels)
    raw = np.hstack([np.zeros((height, 1), np.uint8), rows]).tobytes()  # filter 0 per row
    header = struct.pack('>IIBBBBB', width, height, 8, _COLOUR_TYPES[channels], 0, 0, 0)
    return (PNG_SIGNATURE + _chunk(b'IHDR', header)
            + _chunk(b'IDAT', zlib.compress(raw, compression)) + _chunk(b'IEND', b''))


def png_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` from a PNG's header.

    Raises
    ------
    ValueError
        When ``data`` does not start like a PNG file.
    """
    if len(data) < 24 or data[:8] != PNG_SIGNATURE or data[12:16] != b'IHDR':
        raise ValueError('not PNG data (bad signature or missing IHDR)')
    width, height = struct.unpack('>II', data[16:24])
    return int(width), int(height)
