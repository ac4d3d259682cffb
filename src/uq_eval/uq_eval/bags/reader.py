"""Streaming a rosbag2 bag (MCAP or sqlite3) for evaluation, with clear errors (ROS-free).

:class:`BagStream` opens a bag with `rosbags`, picks the image topic and the optional
ground-truth and node-output topics, and yields one :class:`BagEvent` per message in log
order, decoding images as it goes: nothing is loaded whole, so memory does not grow with
the bag. Every problem with the bag becomes a :class:`BagError` naming the bag and the
problem; a bag that breaks part-way (truncated file) yields what could be read and records
the problem in :attr:`BagStream.problems`.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from uq_common.image_codec import MAX_IMAGE_PIXELS, ImageFormatError, image_to_rgb

IMAGE_TYPE = 'sensor_msgs/msg/Image'
COMPRESSED_IMAGE_TYPE = 'sensor_msgs/msg/CompressedImage'
DETECTIONS_TYPE = 'uq_msgs/msg/DetectionArray'
AUTONOMY_STATE_TYPE = 'uq_msgs/msg/AutonomyState'
HELP_REQUEST_TYPE = 'uq_msgs/msg/HelpRequest'
IMAGE_TYPES = (IMAGE_TYPE, COMPRESSED_IMAGE_TYPE)
_PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
_JPEG_SIGNATURE = b'\xff\xd8\xff'


class BagError(Exception):
    """A bag cannot be (fully) evaluated; the message names the bag and the problem."""


@dataclass(frozen=True)
class BagEvent:
    """One message of interest.

    ``kind`` is ``image`` (``rgb`` set), ``ground_truth``, ``detections``,
    ``autonomy_state`` or ``help_request`` (``message`` set: the deserialised message).
    ``stamp`` is the header stamp in seconds (``stamp_ns`` exactly, in nanoseconds),
    ``log_time`` the bag's receive time.
    """

    kind: str
    topic: str
    stamp: float
    log_time: float
    rgb: np.ndarray | None = None
    message: Any = None
    stamp_ns: int = 0


@dataclass
class BagStream:
    """A bag opened for streaming.

    Parameters
    ----------
    path
        The bag directory (with ``metadata.yaml``).
    image_topic
        Topic of the camera images; default: the only Image or CompressedImage topic (or
        ``image``/``/image`` when several).
    ground_truth_topic
        Ground-truth DetectionArray topic; ``None``: ``ground_truth`` if the bag has it
        and ``topic_ground_truth`` is true.
    topic_ground_truth
        False when the ground truth comes from elsewhere (a COCO file): no topic is read.
    """

    path: Path
    image_topic: str | None = None
    ground_truth_topic: str | None = None
    topic_ground_truth: bool = True
    problems: list[str] = field(default_factory=list)
    topics: dict[str, str] = field(default_factory=dict)
    message_count: int = 0
    _reader: Any = None
    _typestore: Any = None
    _counts: dict = field(default_factory=dict)
    _sequential_files: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self._open()
        self._choose_topics()

    def _error(self, problem: str) -> BagError:
        return BagError(f'bag {self.path}: {problem}')

    def _open(self) -> None:
        from rosbags.highlevel import AnyReader

        from uq_eval.bags.types import uq_typestore

        if not self.path.exists():
            raise self._error('does not exist')
        if self.path.is_dir() and not (self.path / 'metadata.yaml').is_file():
            raise self._error(
                'missing metadata.yaml: not a rosbag2 bag directory (a bag written by '
                '`ros2 bag record` or `uq sim record` has one; restore it with '
                '`ros2 bag reindex` if it was lost)')
        if not self.path.is_dir():
            raise self._error('is a file; pass the bag directory that holds metadata.yaml')
        self._typestore = uq_typestore()
        try:
            reader = AnyReader([self.path], default_typestore=self._typestore)
            reader.open()
        except Exception as exc:  # rosbags raises several types for corrupt bags
            mcap_files = sorted(self.path.glob('*.mcap'))
            if not mcap_files:
                raise self._error(f'cannot be opened: {exc}') from None
            self._open_sequential(mcap_files, exc)
            return
        self._reader = reader
        self.topics = {c.topic: c.msgtype for c in reader.connections}
        self._counts = {c.topic: c.msgcount for c in reader.connections}
        self.message_count = int(reader.message_count)
        if not self.topics or self.message_count == 0:
            reader.close()
            raise self._error('is empty (no messages)')

    def _open_sequential(self, mcap_files: list[Path], exc: Exception) -> None:
        # An MCAP file whose recorder was killed has no summary or footer, so rosbags cannot
        # index it; its records can still be read front to back up to the cut.
        import yaml

        try:
            meta = yaml.safe_load((self.path / 'metadata.yaml').read_text())
            topics = meta['rosbag2_bagfile_information']['topics_with_message_count']
            self.topics = {t['topic_metadata']['name']: t['topic_metadata']['type']
                           for t in topics}
            self._counts = {t['topic_metadata']['name']: int(t['message_count'])
                            for t in topics}
        except (OSError, KeyError, TypeError, yaml.YAMLError) as err:
            raise self._error(f'cannot be opened ({exc}) and its metadata.yaml is unreadable '
                              f'({err})') from None
        self.message_count = sum(self._counts.values())
        self._sequential_files = mcap_files
        self.problems.append(
            f'bag {self.path}: {", ".join(f.name for f in mcap_files)} has no valid end '
            f'({exc}): the recording was cut off (truncated file); it is read front to back '
            'up to the cut')
        if not self.topics:
            raise self._error('is empty (no topics)')

    def _choose_topics(self) -> None:
        images = sorted(t for t, ty in self.topics.items() if ty in IMAGE_TYPES)
        listing = ', '.join(f'{t} ({ty})' for t, ty in sorted(self.topics.items()))
        if self.image_topic is None:
            if len(images) == 1:
                self.image_topic = images[0]
            elif len(images) > 1:
                preferred = [t for t in images if t.lstrip('/') == 'image']
                if not preferred:
                    raise self._error(f'several image topics ({", ".join(images)}); '
                                      'choose one with --image-topic')
                self.image_topic = preferred[0]
        elif self.image_topic not in self.topics:
            raise self._error(f'has no topic {self.image_topic!r}; its topics: {listing}')
        elif self.topics[self.image_topic] not in IMAGE_TYPES:
            raise self._error(
                f'topic {self.image_topic!r} has type {self.topics[self.image_topic]}, not '
                'sensor_msgs/msg/Image or CompressedImage')
        if (self.ground_truth_topic is None and self.topic_ground_truth
                and 'ground_truth' in self.topics):
            self.ground_truth_topic = 'ground_truth'
        if self.ground_truth_topic is not None:
            if self.ground_truth_topic not in self.topics:
                raise self._error(f'has no ground-truth topic {self.ground_truth_topic!r}; '
                                  f'its topics: {listing}')
            if self.topics[self.ground_truth_topic] != DETECTIONS_TYPE:
                raise self._error(f'ground-truth topic {self.ground_truth_topic!r} has type '
                                  f'{self.topics[self.ground_truth_topic]}, not '
                                  f'{DETECTIONS_TYPE}')
        if self.image_topic is None and self.node_output_topics().get('detections') is None:
            raise self._error(f'has no image topic and no detections; its topics: {listing}')

    def node_output_topics(self) -> dict[str, str]:
        """Kind -> topic of node outputs recorded in the bag (``uq replay --record``)."""
        wanted = {DETECTIONS_TYPE: 'detections', AUTONOMY_STATE_TYPE: 'autonomy_state',
                  HELP_REQUEST_TYPE: 'help_request'}
        out: dict[str, str] = {}
        for topic, msgtype in sorted(self.topics.items()):
            kind = wanted.get(msgtype)
            if kind and topic != self.ground_truth_topic and kind not in out:
                out[kind] = topic
        return out

    def events(self, with_node_outputs: bool = False) -> Iterator[BagEvent]:
        """Yield the image (and ground-truth, node-output) messages in log order.

        Undecodable or oversized images, images that cannot be converted to RGB without
        loss (:func:`decode_image`) and undecodable messages are skipped and counted in
        :attr:`problems`; a
        read error (truncated or corrupt file) ends the iteration and is recorded there.
        """
        kinds = {}
        if self.image_topic:
            kinds[self.image_topic] = 'image'
        if self.ground_truth_topic:
            kinds[self.ground_truth_topic] = 'ground_truth'
        if with_node_outputs:
            kinds.update({t: k for k, t in self.node_output_topics().items()})
        skipped: dict[str, int] = {}
        try:
            for topic, msgtype, log_ns, raw in self._raw_messages(set(kinds)):
                kind = kinds[topic]
                try:
                    msg = self._deserialize(raw, msgtype)
                except Exception as exc:  # rosbags' SerdeError and friends
                    key = (f'{topic}: not a valid {msgtype} for the definition in use '
                           f'({type(exc).__name__}: {exc})')
                    skipped[key] = skipped.get(key, 0) + 1
                    continue
                try:
                    stamp = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
                    stamp_ns = int(msg.header.stamp.sec) * 10**9 + int(msg.header.stamp.nanosec)
                    if kind == 'image':
                        rgb = decode_image(msg, msgtype)
                        yield BagEvent(kind, topic, stamp, log_ns * 1e-9, rgb=rgb,
                                       stamp_ns=stamp_ns)
                    else:
                        yield BagEvent(kind, topic, stamp, log_ns * 1e-9, message=msg,
                                       stamp_ns=stamp_ns)
                except (ImageFormatError, ValueError, KeyError, AssertionError,
                        IndexError, struct.error) as exc:
                    key = f'{topic}: {exc}'
                    skipped[key] = skipped.get(key, 0) + 1
        except Exception as exc:  # a truncated or corrupt file fails inside rosbags/mcap
            self.problems.append(f'bag {self.path}: reading stopped early, the bag is '
                                 f'truncated or corrupt ({type(exc).__name__}: {exc}); '
                                 'results cover the messages before that point')
        for key, count in skipped.items():
            self.problems.append(f'bag {self.path}: {count} message(s) skipped on {key}')

    def _raw_messages(self, topics: set[str]) -> Iterator[tuple[str, str, int, bytes]]:
        """(topic, type, log time ns, CDR bytes) of ``topics`` in log order."""
        if self._reader is not None:
            connections = [c for c in self._reader.connections if c.topic in topics]
            for connection, log_ns, raw in self._reader.messages(connections=connections):
                yield connection.topic, connection.msgtype, log_ns, raw
            return
        from mcap.records import Channel, Message, Schema
        from mcap.stream_reader import StreamReader

        # Record by record: the reader's own message iterator holds messages back to sort
        # them, so a cut file would yield nothing. Files are written in log order anyway.
        for path in self._sequential_files:
            schemas: dict[int, str] = {}
            channels: dict[int, tuple[str, str]] = {}
            with path.open('rb') as stream:
                for record in StreamReader(stream, skip_magic=False).records:
                    if isinstance(record, Schema):
                        schemas[record.id] = record.name
                    elif isinstance(record, Channel):
                        channels[record.id] = (record.topic, schemas.get(record.schema_id, ''))
                    elif isinstance(record, Message):
                        topic, msgtype = channels.get(record.channel_id, ('', ''))
                        if topic in topics:
                            yield topic, msgtype, record.log_time, record.data

    def _deserialize(self, raw: bytes, msgtype: str) -> Any:
        # An indexed bag is decoded with the definitions it embeds (a bag recorded before a
        # message changed still reads); a cut MCAP with this workspace's definitions.
        if self._reader is not None:
            return self._reader.deserialize(raw, msgtype)
        return self._typestore.deserialize_cdr(raw, msgtype)

    def image_message_count(self) -> int:
        """Messages on the image topic according to the bag's index or metadata."""
        return int(self._counts.get(self.image_topic, 0)) if self.image_topic else 0

    def close(self) -> None:
        """Close the underlying reader."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def decode_image(msg: Any, msgtype: str) -> np.ndarray:
    """An ``(H, W, 3)`` uint8 RGB array from a deserialised Image or CompressedImage.

    Frames over :data:`MAX_IMAGE_PIXELS` are refused before their pixels are decoded.
    PNG and JPEG layouts are converted when that loses nothing but alpha (see
    :func:`_pixels_to_rgb`); others are refused.

    Raises
    ------
    ImageFormatError
        On an unsupported encoding, format or pixel layout, an oversized frame, or
        undecodable data.
    """
    if msgtype == IMAGE_TYPE:
        return image_to_rgb(msg.height, msg.width, msg.encoding, msg.step,
                            np.ascontiguousarray(msg.data).data, bool(msg.is_bigendian),
                            MAX_IMAGE_PIXELS)
    return _decode_compressed(msg)


def _decode_compressed(msg: Any) -> np.ndarray:
    """Decode a PNG or JPEG CompressedImage to RGB, reading its size from the header first.

    A JPEG has no alpha channel, so four channels are CMYK (or YCCK), which would need the
    image's colour profile to convert: refused. The decoded pixels go through
    :func:`_pixels_to_rgb`.
    """
    import imageio.v3 as iio

    fmt = msg.format.lower()
    if not any(name in fmt for name in ('jpeg', 'jpg', 'png')):
        raise ImageFormatError(f'unsupported CompressedImage format {msg.format!r}; '
                               'supported: jpeg, png')
    data = np.asarray(msg.data).tobytes()
    if not data.startswith((_PNG_SIGNATURE, _JPEG_SIGNATURE)):
        raise ImageFormatError(f'{msg.format} data is neither a PNG nor a JPEG stream')
    try:
        with iio.imopen(io.BytesIO(data), 'r', plugin='pillow') as image:
            # From the header alone (metadata() would decode a PNG to look for EXIF).
            shape = image.properties(index=0).shape
            height, width = shape[:2]
            if width * height > MAX_IMAGE_PIXELS:
                raise ImageFormatError(f'image {width}x{height} exceeds the maximum of '
                                       f'{MAX_IMAGE_PIXELS} pixels')
            if data.startswith(_JPEG_SIGNATURE) and shape[2:] == (4,):
                raise ImageFormatError(f'{msg.format} image is CMYK, which needs its colour '
                                       'profile to convert to RGB: not supported')
            pixels = image.read(index=0)
    except ImageFormatError:
        raise
    except Exception as exc:  # Pillow raises OSError, SyntaxError, zlib errors and more
        raise ImageFormatError(f'undecodable {msg.format} image: {exc}') from None
    return _pixels_to_rgb(pixels, msg.format)


def _pixels_to_rgb(pixels: np.ndarray, fmt: str) -> np.ndarray:
    """RGB from a decoded PNG or JPEG's ``(H, W[, C])`` array, by its layout.

    JPEG and PNG store colours, not channel order: image_transport's "bgr8; jpeg compressed
    bgr8" was encoded from BGR by OpenCV and decodes to RGB like any other. Grey (one
    channel, or two with alpha) is replicated to three channels, alpha dropped (as
    ``image_to_rgb`` drops it from ``rgba8``; palette images arrive looked up, as RGB or
    RGBA), bilevel scaled to 0/255 and 16-bit samples to 8 bits by their high byte, which is
    what the decoder itself does with 16-bit colour PNGs, so that a grey and a colour 16-bit
    image of the same scene agree. Other layouts are refused.
    """
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    if pixels.dtype == np.bool_:
        pixels = pixels.astype(np.uint8) * np.uint8(255)
    elif pixels.dtype == np.uint16:
        pixels = (pixels >> 8).astype(np.uint8)
    if pixels.ndim != 3 or pixels.dtype != np.uint8 or not 1 <= pixels.shape[2] <= 4:
        raise ImageFormatError(f'{fmt} image decodes to {pixels.dtype} pixels of shape '
                               f'{pixels.shape}, not grey, grey+alpha, RGB or RGBA')
    if pixels.shape[2] <= 2:
        return np.repeat(pixels[..., :1], 3, axis=2)
    return np.ascontiguousarray(pixels[..., :3])
