"""Raw sensor_msgs/Image fields -> RGB: every supported encoding, every malformation."""

import numpy as np
import pytest

from uq_common.image_codec import (
    ImageFormatError,
    image_to_rgb,
    parse_image_cdr,
    rgb_to_image_fields,
)

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


def test_an_unpadded_rgb8_frame_can_be_a_view_of_its_buffer():
    fields = _fields(RGB, 'rgb8')
    view = image_to_rgb(**fields, copy=False)
    np.testing.assert_array_equal(view, RGB)
    assert np.shares_memory(view, np.frombuffer(fields['data'], np.uint8))
    # Anything that needs converting is a new array all the same.
    for encoding, pixels, pad in (('bgr8', RGB[:, :, ::-1], 0), ('rgb8', RGB, 3)):
        other = _fields(np.ascontiguousarray(pixels), encoding, pad)
        out = image_to_rgb(**other, copy=False)
        np.testing.assert_array_equal(out, RGB)
        assert not np.shares_memory(out, np.frombuffer(other['data'], np.uint8))


def _serialized_image(frame_id: str, encoding: str, pixels: np.ndarray, pad: int = 0,
                      stamp: tuple[int, int] = (-3, 999_999_999)) -> tuple[bytes, dict]:
    """A sensor_msgs/Image serialised by rclpy (the middleware's own CDR) and its fields."""
    from rclpy.serialization import serialize_message
    from sensor_msgs.msg import Image

    fields = _fields(pixels, encoding, pad, bigendian=True)
    msg = Image(**fields)
    msg.header.frame_id = frame_id
    msg.header.stamp.sec, msg.header.stamp.nanosec = stamp
    return serialize_message(msg), fields


@pytest.mark.parametrize('frame_id', ['', 'c', 'cam', 'camera_optical_frame', 'kamera_é'])
@pytest.mark.parametrize('encoding,pixels,pad', [
    ('rgb8', RGB, 0), ('rgb8', RGB, 1), ('mono8', RGB[:, :, 0], 2),
    ('32FC1', RNG.random((3, 4), dtype=np.float32), 0)])
def test_a_serialised_image_is_read_with_its_pixels_in_place(frame_id, encoding, pixels, pad):
    serialized, fields = _serialized_image(frame_id, encoding, pixels, pad)
    parsed = parse_image_cdr(serialized)
    assert parsed is not None
    assert (parsed.stamp_sec, parsed.stamp_nanosec, parsed.frame_id) == (-3, 999_999_999,
                                                                         frame_id)
    assert (parsed.height, parsed.width, parsed.encoding, parsed.is_bigendian, parsed.step) \
        == (fields['height'], fields['width'], encoding, True, fields['step'])
    assert bytes(parsed.data) == fields['data']
    assert np.shares_memory(np.frombuffer(parsed.data, np.uint8),
                            np.frombuffer(serialized, np.uint8))


def test_a_malformed_serialised_image_is_refused_and_another_encapsulation_left_alone():
    serialized, _ = _serialized_image('cam', 'rgb8', RGB)
    for cut in (2 + 2, 20, len(serialized) - 1 - 3):
        with pytest.raises(ImageFormatError, match='serialised image'):
            parse_image_cdr(serialized[:cut])
    with pytest.raises(ImageFormatError, match='after its data'):
        parse_image_cdr(serialized + bytes(8))
    # XCDR2 (encapsulation 0x0007): not plain CDR, for the middleware's own reader.
    assert parse_image_cdr(b'\x00\x07' + serialized[2:]) is None
