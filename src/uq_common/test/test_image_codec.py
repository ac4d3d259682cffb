"""Raw sensor_msgs/Image fields -> RGB: every supported encoding, every malformation."""

import numpy as np
import pytest

from uq_common.image_codec import ImageFormatError, image_to_rgb, rgb_to_image_fields

RNG = np.random.default_rng(0)
RGB = RNG.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)


def _fields(pixels: np.ndarray, encoding: str, pad: int = 0, bigendian: bool = False):
    h, w = pixels.shape[:2]
    row = pixels.reshape(h, -1).view(np.uint8).reshape(h, -1)
    data = np.concatenate([row, np.zeros((h, pad), np.uint8)], axis=1).tobytes()
    return dict(height=h, width=w, encoding=encoding, step=row.shape[1] + pad, data=data,
                is_bigendian=bigendian)


@pytest.mark.parametrize('encoding,pixels', [
    ('rgb8', RGB),
    ('bgr8', RGB[:, :, ::-1]),
    ('rgba8', np.dstack([RGB, np.full(RGB.shape[:2], 9, np.uint8)])),
    ('bgra8', np.dstack([RGB[:, :, ::-1], np.full(RGB.shape[:2], 9, np.uint8)])),
])
@pytest.mark.parametrize('pad', [0, 3])
def test_colour_encodings_give_rgb(encoding, pixels, pad):
    out = image_to_rgb(**_fields(np.ascontiguousarray(pixels), encoding, pad))
    np.testing.assert_array_equal(out, RGB)


def test_mono8_is_replicated_to_three_channels():
    mono = RGB[:, :, 0].copy()
    out = image_to_rgb(**_fields(mono[:, :, None], 'mono8'))
    np.testing.assert_array_equal(out, np.dstack([mono] * 3))


@pytest.mark.parametrize('bigendian', [False, True])
def test_float_image_is_scaled(bigendian):
    values = np.linspace(0, 1, 35, dtype=np.float32).reshape(5, 7, 1)
    stored = values.astype('>f4' if bigendian else '<f4')
    out = image_to_rgb(**_fields(stored, '32FC1', bigendian=bigendian))
    expected = np.floor(values[:, :, 0] * 255 + 0.5).astype(np.uint8)
    np.testing.assert_array_equal(out[:, :, 1], expected)


@pytest.mark.parametrize('mutate,message', [
    (dict(encoding='yuv422'), 'unsupported encoding'),
    (dict(encoding='16UC1'), 'unsupported encoding'),
    (dict(step=20), 'step 20 is smaller'),
    (dict(height=6), 'data has'),
    (dict(data=b'\x00' * 10), 'data has'),
    (dict(height=0, width=0, data=b'', step=0), 'empty image 0x0'),
    # Zero width or zero height alone is empty too (0x128: no columns; 96x0: no rows).
    (dict(height=128, width=0, data=b'', step=0), 'empty image 0x128'),
    (dict(height=0, width=96, data=b'', step=96 * 3), 'empty image 96x0'),
    (dict(max_pixels=34), 'exceeds the maximum'),
])
def test_malformed_frames_are_rejected_with_the_reason(mutate, message):
    fields = _fields(RGB, 'rgb8') | mutate
    with pytest.raises(ImageFormatError, match=message):
        image_to_rgb(**fields)


def test_a_frame_of_exactly_max_pixels_is_accepted():
    # The limit is inclusive: 5 x 7 = 35 pixels pass at max_pixels=35, fail at 34 (above).
    out = image_to_rgb(**_fields(RGB, 'rgb8'), max_pixels=RGB.shape[0] * RGB.shape[1])
    np.testing.assert_array_equal(out, RGB)


@pytest.mark.parametrize('bad', [np.nan, np.inf])
def test_non_finite_float_pixels_are_rejected(bad):
    values = np.zeros((5, 7, 3), np.float32)
    values[2, 3, 1] = bad
    with pytest.raises(ImageFormatError, match='non-finite'):
        image_to_rgb(**_fields(values, '32FC3'))


def test_round_trip_through_message_fields():
    fields = rgb_to_image_fields(RGB)
    out = image_to_rgb(fields['height'], fields['width'], fields['encoding'], fields['step'],
                       fields['data'])
    np.testing.assert_array_equal(out, RGB)


def test_rgb_to_fields_rejects_wrong_arrays():
    with pytest.raises(ValueError, match=r'expected an \(H, W, 3\) uint8 array'):
        rgb_to_image_fields(RGB.astype(np.float32))
