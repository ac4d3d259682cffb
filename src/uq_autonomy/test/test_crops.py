"""Crops for help requests: region around a box, box inside the crop, PNG bytes (decoded by
OpenCV, an independent decoder)."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from uq_autonomy.help.crops import box_in_region, crop_region, cut, encode_png, png_size


def test_crop_region_adds_margin_and_clips_to_the_image() -> None:
    assert crop_region((50, 40, 20, 10), 320, 240, margin=0.25) == (35, 32, 30, 16)
    assert crop_region((5, 5, 20, 20), 320, 240, margin=0.5) == (0, 0, 25, 25)
    assert crop_region((318, 238, 10, 10), 320, 240, margin=0.0, min_size=4) == (313, 233, 7, 7)
    assert crop_region((100, 100, 2, 2), 320, 240, margin=0.0, min_size=16) == (92, 92, 16, 16)
    assert crop_region((-50, -50, 10, 10), 320, 240) == (0, 0, 1, 1)  # outside: one pixel


@pytest.mark.parametrize(('args', 'message'), [
    (((1, 1, 1, math.nan), 10, 10), r'box must be 4 finite numbers'),
    (((1, 1, 1), 10, 10), r'box must be 4 finite numbers'),
    (((1, 1, 1, 1), 0, 10), r'image size must be positive, got 0x10'),
])
def test_crop_region_rejects_bad_input(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        crop_region(*args)
    with pytest.raises(ValueError, match='margin must be a finite number >= 0'):
        crop_region((1, 1, 1, 1), 10, 10, margin=-0.1)


def test_box_in_region_is_coco_xywh_clipped() -> None:
    region = crop_region((50, 40, 20, 10), 320, 240, margin=0.25)
    assert box_in_region((50, 40, 20, 10), region) == (5.0, 3.0, 20.0, 10.0)
    assert box_in_region((2, 2, 10, 10), (0, 0, 5, 5)) == (0.0, 0.0, 5.0, 5.0)


@pytest.mark.parametrize('shape', [(7, 9), (7, 9, 3), (7, 9, 4), (1, 1, 3)])
def test_png_round_trips_through_opencv(shape: tuple[int, ...]) -> None:
    pixels = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    data = encode_png(pixels)
    assert png_size(data) == (shape[1], shape[0])
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if len(shape) == 3:  # OpenCV decodes to BGR(A)
        order = [2, 1, 0] if shape[2] == 3 else [2, 1, 0, 3]
        decoded = decoded[..., order]
    np.testing.assert_array_equal(decoded, pixels)


def test_cut_takes_the_region() -> None:
    image = np.arange(5 * 6 * 3, dtype=np.uint8).reshape(5, 6, 3)
    np.testing.assert_array_equal(cut(image, (1, 2, 3, 2)), image[2:4, 1:4])


@pytest.mark.parametrize(('pixels', 'message'), [
    (np.zeros((2, 2), np.float32), 'PNG encoding needs uint8 pixels, got float32'),
    (np.zeros((2, 2, 2), np.uint8), r'needs HxW, HxWx3 or HxWx4 pixels, got \(2, 2, 2\)'),
    (np.zeros((0, 4, 3), np.uint8), r'cannot encode an empty image \(4x0\)'),
])
def test_encode_png_rejects_bad_pixels(pixels: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        encode_png(pixels)


def test_png_size_rejects_other_data() -> None:
    with pytest.raises(ValueError, match='not PNG data'):
        png_size(b'GIF89a' + bytes(30))
