"""Convert raw ``sensor_msgs/Image`` fields to RGB arrays and back, with numpy (ROS-free).

There is no cv_bridge from PyPI, and a perception node must never crash or process
garbage on a malformed frame, so every field is checked before the buffer is
reinterpreted: encoding, ``step`` against ``width`` times the pixel size, buffer length
against ``height * step``, empty and oversized frames, and non-finite values in float
images. Each violation raises :class:`ImageFormatError` whose message names it.

:func:`parse_image_cdr` reads a serialised ``sensor_msgs/Image`` (as a subscription takes
it raw) with the pixel data left in place: rclpy's own conversion copies the pixels into a
Python array element by element, which costs milliseconds per megabyte.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum

import numpy as np


class Encoding(str, Enum):
    """Image encodings the detector accepts (names as in sensor_msgs/image_encodings)."""

    RGB8 = 'rgb8'
    BGR8 = 'bgr8'
    RGBA8 = 'rgba8'
    BGRA8 = 'bgra8'
    MONO8 = 'mono8'
    # Float intensity images in [0, 1] (e.g. from simulators); NaN/inf are rejected.
    TYPE_32FC1 = '32FC1'
    TYPE_32FC3 = '32FC3'


@dataclass(frozen=True)
class _Layout:
    channels: int
    dtype: np.dtype
    # Slice of the stored channels that reads them in RGB order; None for one grey channel.
    # A slice keeps the conversion a view plus one copy: a fancy index on the channel axis
    # made converting a 320x240 rgb8 frame about ten times slower.
    to_rgb: slice | None


_RGB, _BGR = slice(0, 3), slice(2, None, -1)
_LAYOUTS = {
    Encoding.RGB8: _Layout(3, np.dtype(np.uint8), _RGB),
    Encoding.BGR8: _Layout(3, np.dtype(np.uint8), _BGR),
    Encoding.RGBA8: _Layout(4, np.dtype(np.uint8), _RGB),
    Encoding.BGRA8: _Layout(4, np.dtype(np.uint8), _BGR),
    Encoding.MONO8: _Layout(1, np.dtype(np.uint8), None),
    Encoding.TYPE_32FC1: _Layout(1, np.dtype(np.float32), None),
    Encoding.TYPE_32FC3: _Layout(3, np.dtype(np.float32), _RGB),
}

SUPPORTED_ENCODINGS = tuple(e.value for e in Encoding)


# Default cap on the pixels of one frame, for every image path (the detector node, the
# ask-for-help node's buffer, bag evaluation): no camera of this product has more, and a
# corrupt or hostile header must not make a node allocate gigabytes.
MAX_IMAGE_PIXELS = 4096 * 4096


class ImageFormatError(ValueError):
    """A raw image that cannot be interpreted; the message says which check failed."""


def image_to_rgb(height: int, width: int, encoding: str, step: int, data: bytes | memoryview,
                 is_bigendian: bool = False, max_pixels: int = MAX_IMAGE_PIXELS,
                 copy: bool = True) -> np.ndarray:
    """Interpret the fields of a ``sensor_msgs/Image`` as an ``(H, W, 3)`` uint8 RGB array.

    Parameters
    ----------
    height, width, encoding, step, data, is_bigendian
        The message fields. Rows may be padded (``step`` larger than ``width`` times the
        pixel size); padding is skipped.
    max_pixels
        Frames larger than this are rejected before any copy is made (a corrupt header
        must not make the node allocate gigabytes).
    copy
        False: an unpadded ``rgb8`` frame comes back as a view of ``data`` (read-only when
        ``data`` is), the copy a camera-sized frame costs saved; every other frame is
        converted into a new array all the same.

    Returns
    -------
    np.ndarray
        A contiguous ``(height, width, 3)`` uint8 array, new unless ``copy`` is False.
        Float images are scaled from ``[0, 1]`` to ``[0, 255]`` (clipped).

    Raises
    ------
    ImageFormatError
        On an unsupported encoding, an empty or oversized frame, a ``step`` smaller than a
        row, a buffer whose size is not ``height * step``, or non-finite float pixels.
    """
    try:
        layout = _LAYOUTS[Encoding(encoding)]
    except ValueError:
        raise ImageFormatError(
            f'unsupported encoding {encoding!r}; supported: {", ".join(SUPPORTED_ENCODINGS)}'
        ) from None
    if height <= 0 or width <= 0:
        raise ImageFormatError(f'empty image {width}x{height}')
    if height * width > max_pixels:
        raise ImageFormatError(
            f'image {width}x{height} exceeds the maximum of {max_pixels} pixels')
    row_bytes = width * layout.channels * layout.dtype.itemsize
    if step < row_bytes:
        raise ImageFormatError(
            f'step {step} is smaller than width x pixel size = {width} x '
            f'{layout.channels * layout.dtype.itemsize} = {row_bytes} bytes')
    if len(data) != height * step:
        raise ImageFormatError(
            f'data has {len(data)} bytes but height x step = {height} x {step} = '
            f'{height * step}')
    dtype = layout.dtype.newbyteorder('>' if is_bigendian else '<')
    rows = np.frombuffer(data, dtype=np.uint8).reshape(height, step)[:, :row_bytes]
    pixels = np.ascontiguousarray(rows).view(dtype).reshape(height, width, layout.channels)
    if layout.dtype.kind == 'f':
        if not np.isfinite(pixels).all():
            bad = int((~np.isfinite(pixels)).sum())
            raise ImageFormatError(f'float image has {bad} non-finite (NaN/inf) values')
        pixels = np.clip(pixels.astype(np.float32) * 255.0 + 0.5, 0, 255).astype(np.uint8)
    if layout.to_rgb is None:
        return np.array(np.broadcast_to(pixels, (height, width, 3)), order='C')
    return np.array(pixels[:, :, layout.to_rgb], order='C', copy=copy or None)


def rgb_to_image_fields(rgb: np.ndarray) -> dict:
    """Fields of an ``rgb8`` ``sensor_msgs/Image`` holding ``rgb`` (H, W, 3) uint8."""
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f'expected an (H, W, 3) uint8 array, got {rgb.shape} {rgb.dtype}')
    height, width = rgb.shape[:2]
    return {'height': height, 'width': width, 'encoding': Encoding.RGB8.value,
            'is_bigendian': 0, 'step': width * 3, 'data': np.ascontiguousarray(rgb).tobytes()}


@dataclass(frozen=True)
class ImageFields:
    """The fields of a serialised ``sensor_msgs/Image``; ``data`` is a view of the buffer."""

    stamp_sec: int
    stamp_nanosec: int
    frame_id: str
    height: int
    width: int
    encoding: str
    is_bigendian: bool
    step: int
    data: memoryview


# CDR encapsulation identifiers (OMG DDS-XTypes, 7.6.3.1.2): plain CDR, big and little
# endian; the ROS 2 middlewares serialise ROS messages in it.
_PLAIN_CDR = {b'\x00\x00': '>', b'\x00\x01': '<'}


class _CdrReader:
    """Reads plain CDR primitives: each aligned to its size from the start of the payload
    (after the 4-byte encapsulation header)."""

    def __init__(self, buffer: memoryview, order: str) -> None:
        self.buffer, self.order, self.offset = buffer, order, 4

    def _take(self, size: int) -> int:
        start = 4 + -(-(self.offset - 4) // size) * size if size > 1 else self.offset
        self.offset = start + size
        if self.offset > len(self.buffer):
            raise ImageFormatError(f'serialised image ends at byte {len(self.buffer)}, '
                                   f'a field needs byte {self.offset}')
        return start

    def uint32(self, signed: bool = False) -> int:
        start = self._take(4)
        return struct.unpack_from(self.order + ('i' if signed else 'I'), self.buffer, start)[0]

    def uint8(self) -> int:
        return self.buffer[self._take(1)]

    def bytes(self, count: int) -> memoryview:
        start = self.offset
        self.offset += count
        if self.offset > len(self.buffer):
            raise ImageFormatError(f'serialised image has {len(self.buffer) - start} bytes '
                                   f'left for a field of {count}')
        return self.buffer[start:self.offset]

    def string(self) -> str:
        length = self.uint32()
        if length == 0:
            return ''
        raw = self.bytes(length)
        if raw[-1] != 0:
            raise ImageFormatError('serialised image has a string without its terminating NUL')
        return bytes(raw[:-1]).decode('utf-8', errors='replace')


def parse_image_cdr(buffer: bytes | memoryview) -> ImageFields | None:
    """The fields of a ``sensor_msgs/Image`` serialised in plain CDR, the pixel data a view of
    ``buffer`` (no copy); ``None`` for another encapsulation (the caller deserialises it
    with the middleware's own conversion then).

    Raises
    ------
    ImageFormatError
        If the buffer is cut short, a string lacks its terminator, or bytes follow the
        data (alignment padding aside).
    """
    view = memoryview(buffer).cast('B')
    order = _PLAIN_CDR.get(bytes(view[:2]))
    if order is None:
        return None
    reader = _CdrReader(view, order)
    sec, nanosec = reader.uint32(signed=True), reader.uint32()
    frame_id = reader.string()
    height, width = reader.uint32(), reader.uint32()
    encoding = reader.string()
    is_bigendian = bool(reader.uint8())
    step = reader.uint32()
    data = reader.bytes(reader.uint32())
    # A serialiser pads the payload to a multiple of 4 bytes; more than that is not an Image.
    if len(view) - reader.offset > 3:
        raise ImageFormatError(f'serialised image has {len(view) - reader.offset} bytes after '
                               'its data')
    return ImageFields(sec, nanosec, frame_id, height, width, encoding, is_bigendian, step,
                       data)
