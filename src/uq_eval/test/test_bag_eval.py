"""``uq sim record`` and ``uq eval bag`` on real rosbag2 bags (MCAP and sqlite3).

Bags come from ``uq sim record`` (rclpy-serialised messages) and from `rosbags`' own
writer (rosbags' CDR serialiser), including CompressedImage topics, and are broken on
purpose for the bad-input tests: cut mid-chunk, without metadata.yaml, empty, with unknown
types, without an image topic, with out-of-order stamps.
"""

from __future__ import annotations

import copy
import io
import json
import shutil
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
from rosbags.highlevel import AnyReader
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import get_types_from_msg

from uq_common.image_codec import MAX_IMAGE_PIXELS, ImageFormatError
from uq_eval.bags.reader import COMPRESSED_IMAGE_TYPE, IMAGE_TYPE, decode_image
from uq_eval.bags.types import uq_typestore

STORAGE = {'mcap': StoragePlugin.MCAP, 'sqlite3': StoragePlugin.SQLITE3}


def read_frames(bag: Path) -> list[tuple[int, np.ndarray, object]]:
    """(stamp ns, RGB image, ground-truth message) of each frame of a ``uq sim record`` bag."""
    typestore = uq_typestore()
    images, truths = {}, {}
    with AnyReader([bag], default_typestore=typestore) as reader:
        for connection, _, raw in reader.messages():
            msg = reader.deserialize(raw, connection.msgtype)
            stamp = msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec
            if connection.topic == 'image':
                images[stamp] = np.asarray(msg.data).reshape(msg.height, msg.width, 3)
            elif connection.topic == 'ground_truth':
                truths[stamp] = msg
    return [(s, images[s], truths.get(s)) for s in sorted(images)]


def _header(typestore, stamp_ns: int):
    Header = typestore.types['std_msgs/msg/Header']
    Time = typestore.types['builtin_interfaces/msg/Time']
    return Header(stamp=Time(sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9),
                  frame_id='camera_optical_frame')


def image_message(typestore, stamp_ns: int, rgb: np.ndarray, encoding: str = 'rgb8'):
    """A rosbags ``sensor_msgs/Image`` of ``rgb`` in ``encoding`` (rgb8, bgr8 or mono8)."""
    if encoding == 'bgr8':
        pixels = rgb[..., ::-1]
    elif encoding == 'mono8':
        pixels = rgb.mean(axis=2).astype(np.uint8)
    else:
        pixels = rgb
    pixels = np.ascontiguousarray(pixels)
    channels = 1 if pixels.ndim == 2 else 3
    return typestore.types['sensor_msgs/msg/Image'](
        header=_header(typestore, stamp_ns), height=pixels.shape[0], width=pixels.shape[1],
        encoding=encoding, is_bigendian=0, step=pixels.shape[1] * channels,
        data=pixels.reshape(-1))


def compressed_message(typestore, stamp_ns: int, rgb: np.ndarray, fmt: str):
    """A rosbags ``sensor_msgs/CompressedImage`` (``fmt`` jpeg or png)."""
    import imageio.v3 as iio

    buffer = io.BytesIO()
    iio.imwrite(buffer, rgb, extension='.jpg' if fmt == 'jpeg' else '.png')
    return typestore.types['sensor_msgs/msg/CompressedImage'](
        header=_header(typestore, stamp_ns), format=fmt,
        data=np.frombuffer(buffer.getvalue(), dtype=np.uint8))


def encoded_message(typestore, stamp_ns: int, data: bytes, fmt: str = 'png'):
    """A rosbags ``sensor_msgs/CompressedImage`` holding ``data`` as it is."""
    return typestore.types['sensor_msgs/msg/CompressedImage'](
        header=_header(typestore, stamp_ns), format=fmt,
        data=np.frombuffer(data, dtype=np.uint8))


def png_bytes(pixels: np.ndarray, color_type: int, bit_depth: int,
              palette: np.ndarray | None = None, width: int | None = None,
              height: int | None = None) -> bytes:
    """A PNG written by the specification (the layouts imageio's writer cannot make: 16-bit
    colour, palette): ``pixels`` ``(H, W, C)`` of the colour type's samples, big-endian;
    ``width``/``height`` override the header's size (a header that lies)."""
    rows, cols = pixels.shape[:2]
    samples = pixels.astype('>u2' if bit_depth == 16 else np.uint8)
    raw = b''.join(b'\x00' + samples[r].tobytes() for r in range(rows))

    def chunk(tag: bytes, body: bytes) -> bytes:
        return (struct.pack('>I', len(body)) + tag + body
                + struct.pack('>I', zlib.crc32(tag + body)))

    header = struct.pack('>IIBBBBB', width or cols, height or rows, bit_depth, color_type,
                         0, 0, 0)
    return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', header)
            + (chunk(b'PLTE', palette.astype(np.uint8).tobytes()) if palette is not None
               else b'')
            + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))


def write_bag(path: Path, storage: str,
              messages: Iterable[tuple[str, str, int, object]],
              typestore=None, topics: dict[str, str] | None = None) -> Path:
    """Write (topic, type, log time ns, rosbags message) tuples with rosbags' own CDR
    serialiser; ``topics`` adds connections that get no messages."""
    typestore = typestore or uq_typestore()
    connections = {}
    with Writer(path, version=9, storage_plugin=STORAGE[storage]) as writer:
        for topic, msgtype in (topics or {}).items():
            connections[topic] = writer.add_connection(topic, msgtype, typestore=typestore)
        for topic, msgtype, log_ns, msg in messages:
            if topic not in connections:
                connections[topic] = writer.add_connection(topic, msgtype,
                                                           typestore=typestore)
            writer.write(connections[topic], log_ns, typestore.serialize_cdr(msg, msgtype))
    return path


# --------------------------------------------------------------------------- fixtures

FRAMES = 12
RATE_HZ = 2.0


def uq(*argv: str) -> int:
    """Run a ``uq`` subcommand in this process, as the console script does."""
    from uq_common.cli import main
    return main(list(argv))


@pytest.fixture(scope='module')
def sim_bag(tmp_path_factory) -> Path:
    """A real ``uq sim record`` bag (MCAP, rclpy-serialised): known and unknown objects."""
    bag = tmp_path_factory.mktemp('sim') / 'unknown_static'
    assert uq('sim', 'record', '--scenario', 'unknown_static', '--out', str(bag),
              '--duration', str(FRAMES / RATE_HZ), '--rate', str(RATE_HZ),
              '--no-progress') == 0
    return bag


@pytest.fixture(scope='module')
def sim_frames(sim_bag) -> list:
    return read_frames(sim_bag)


def _report(out: Path) -> dict:
    return json.loads((out / 'report.json').read_text())


# --------------------------------------------------------------------------- recording

@pytest.mark.parametrize('storage', ['mcap', 'sqlite3'])
def test_sim_record_writes_image_camera_info_and_ground_truth(tmp_path, storage):
    bag = tmp_path / 'bag'
    assert uq('sim', 'record', '--scenario', 'tabletop_demo', '--out', str(bag),
              '--storage', storage, '--start-time', '9', '--duration', '1.5',
              '--rate', '2', '--no-progress') == 0
    with AnyReader([bag], default_typestore=uq_typestore()) as reader:
        assert {c.topic: (c.msgtype, c.msgcount) for c in reader.connections} == {
            'image': ('sensor_msgs/msg/Image', 3),
            'camera_info': ('sensor_msgs/msg/CameraInfo', 3),
            'ground_truth': ('uq_msgs/msg/DetectionArray', 3),
            'robot_pose': ('geometry_msgs/msg/PoseStamped', 3)}
        stamps: dict[str, list[int]] = {}
        for connection, _, raw in reader.messages():
            msg = reader.deserialize(raw, connection.msgtype)
            stamps.setdefault(connection.topic, []).append(
                msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec)
            if connection.topic == 'image':
                assert (msg.encoding, msg.width, msg.height) == ('rgb8', 320, 240)
            if connection.topic == 'ground_truth':
                # At 9 s of tabletop_demo the unknown torus is on the table.
                classes = {d.class_id: d.class_index for d in msg.detections}
                assert classes['torus'] == -1 and classes['mug'] >= 0
    # One stamp per frame, shared by the four topics, 0.5 s apart.
    assert stamps['image'] == stamps['camera_info'] == stamps['ground_truth'] \
        == stamps['robot_pose']
    assert np.diff(stamps['image']).tolist() == [500_000_000, 500_000_000]


def test_sim_record_refuses_an_existing_directory(tmp_path, capsys):
    assert uq('sim', 'record', '--out', str(tmp_path), '--duration', '1') == 2
    assert 'already exists' in capsys.readouterr().err


def test_output_bag_is_foxglove_ready_mcap(sim_bag):
    """Foxglove reads MCAP channels with ``ros2msg`` schemas that embed every definition."""
    from mcap.reader import make_reader
    from mcap_ros2.decoder import DecoderFactory

    (path,) = sim_bag.glob('*.mcap')
    with path.open('rb') as stream:
        reader = make_reader(stream, decoder_factories=[DecoderFactory()])
        summary = reader.get_summary()
        schemas = {s.name: s for s in summary.schemas.values()}
        assert {s.encoding for s in schemas.values()} == {'ros2msg'}
        assert {c.message_encoding for c in summary.channels.values()} == {'cdr'}
        definition = schemas['uq_msgs/msg/DetectionArray'].data.decode()
        assert 'MSG: uq_msgs/Detection' in definition
        assert 'MSG: uq_msgs/Uncertainty' in definition
        decoded = next(m for _, c, _, m in reader.iter_decoded_messages(topics=['ground_truth']))
        assert decoded.class_names and {d.class_id for d in decoded.detections} >= {'torus'}


# --------------------------------------------------------------------------- evaluation

def test_eval_bag_reports_metrics_levels_and_plots(sim_bag, tmp_path, capsys):
    out = tmp_path / 'report'
    assert uq('eval', 'bag', str(sim_bag), '--out', str(out), '--no-progress') == 0
    report = _report(out)
    metrics = report['metrics']
    assert metrics['frames'] == FRAMES and metrics['ground_truth_frames'] == FRAMES
    # unknown_static has two unknown objects among four: OOD AUROC is defined.
    assert metrics['matched_unknown'] > 0 and metrics['matched_known'] > 0
    for key in ('map50', 'ece', 'aurc', 'ood_auroc'):
        assert metrics[key] is not None and 0.0 <= metrics[key] <= 1.0, key
    assert sum(metrics['time_per_level_s'].values()) == pytest.approx(FRAMES / RATE_HZ)
    assert len(report['level_timeline']) == FRAMES
    assert set(report['plots']) == {'uncertainty_timeline', 'latency_histogram',
                                    'reliability_diagram', 'risk_coverage', 'ood_roc'}
    for name in report['plots'].values():
        assert (out / name).stat().st_size > 1000
    for request in report['help_requests']:
        assert (out / request['crop']).read_bytes()[:4] == b'\x89PNG'
    text = (out / 'report.md').read_text()
    assert 'mAP@0.5' in text and 'OOD AUROC' in text


def test_eval_is_deterministic(sim_bag, tmp_path):
    for name in ('a', 'b'):
        assert uq('eval', 'bag', str(sim_bag), '--out', str(tmp_path / name),
                  '--no-progress') == 0
    a, b = (_report(tmp_path / n) for n in ('a', 'b'))
    for report in (a, b):
        report['metrics'].pop('latency_ms')
    assert a['metrics'] == b['metrics']
    assert a['level_timeline'] == b['level_timeline']
    assert a['help_requests'] == b['help_requests']


def test_a_failure_in_a_replay_stage_is_raised_and_stops_every_thread(sim_bag):
    """The replay runs on two threads and a process; a failing stage must not leave one
    blocked."""
    import multiprocessing
    import threading

    from uq_eval.bags.evaluation import BagEvaluator, load_shipped_perception, run_evaluation
    from uq_eval.bags.reader import BagStream

    class FailsOnThirdFrame(BagEvaluator):
        def record(self, stamp, *args, **kwargs):
            if len(self.data.frames) == 2:
                raise RuntimeError('record failed on frame 3')
            super().record(stamp, *args, **kwargs)

    stream = BagStream(sim_bag)
    try:
        evaluator = FailsOnThirdFrame(load_shipped_perception(), bag_name=sim_bag.name)
        with pytest.raises(RuntimeError, match='frame 3'):
            run_evaluation(stream, evaluator, progress=False, repeat=50)
    finally:
        stream.close()
    assert not [t.name for t in threading.enumerate() if t.name.startswith('bag-')]
    assert not multiprocessing.active_children()


@pytest.mark.parametrize(('storage', 'encoding'), [('sqlite3', 'bgr8'), ('mcap', 'mono8')])
def test_rosbags_written_bag_without_ground_truth(sim_frames, tmp_path, storage, encoding):
    typestore = uq_typestore()
    bag = write_bag(tmp_path / 'bag', storage, [
        ('/camera/image_raw', 'sensor_msgs/msg/Image', stamp,
         image_message(typestore, stamp, rgb, encoding))
        for stamp, rgb, _ in sim_frames[:4]], typestore)
    out = tmp_path / 'report'
    assert uq('eval', 'bag', str(bag), '--out', str(out), '--no-progress') == 0
    report = _report(out)
    assert report['metrics']['frames'] == 4 and report['metrics']['ground_truth_frames'] == 0
    assert 'ood_auroc' not in report['metrics']
    assert 'accuracy, calibration and OOD metrics need labels' in (out / 'report.md').read_text()


@pytest.mark.parametrize('fmt', ['jpeg', 'png'])
def test_compressed_image_topic_with_ground_truth(sim_frames, tmp_path, fmt):
    typestore = uq_typestore()
    messages = []
    for stamp, rgb, truth in sim_frames[:4]:
        messages.append(('image/compressed', 'sensor_msgs/msg/CompressedImage', stamp,
                         compressed_message(typestore, stamp, rgb, fmt)))
        messages.append(('ground_truth', 'uq_msgs/msg/DetectionArray', stamp, truth))
    bag = write_bag(tmp_path / 'bag', 'mcap', messages, typestore)
    out = tmp_path / 'report'
    assert uq('eval', 'bag', str(bag), '--out', str(out), '--no-progress') == 0
    metrics = _report(out)['metrics']
    assert metrics['frames'] == 4 and metrics['ground_truth_frames'] == 4
    assert metrics['map50'] > 0.5


def test_decode_image_agrees_across_encodings(sim_frames):
    typestore = uq_typestore()
    stamp, rgb, _ = sim_frames[0]
    assert np.array_equal(decode_image(image_message(typestore, stamp, rgb, 'rgb8'),
                                       IMAGE_TYPE), rgb)
    assert np.array_equal(decode_image(image_message(typestore, stamp, rgb, 'bgr8'),
                                       IMAGE_TYPE), rgb)
    png = decode_image(compressed_message(typestore, stamp, rgb, 'png'), COMPRESSED_IMAGE_TYPE)
    assert np.array_equal(png, rgb)
    with pytest.raises(ImageFormatError, match='unsupported CompressedImage format'):
        msg = compressed_message(typestore, stamp, rgb, 'png')
        msg.format = 'tiff'
        decode_image(msg, COMPRESSED_IMAGE_TYPE)


def test_decode_image_converts_png_pixel_modes_by_their_definition(sim_frames):
    """Grey is replicated, alpha dropped, a palette looked up and 16-bit samples scaled by
    their high byte, whichever layout the PNG has."""
    import imageio.v3 as iio

    typestore = uq_typestore()
    stamp, rgb, _ = sim_frames[0]
    grey = rgb[..., 1]
    wide = rgb.astype(np.uint16) * 256 + 128  # 16-bit samples whose high byte is rgb
    palette = np.array([[0, 0, 0], [255, 0, 0], [0, 128, 255], [10, 20, 30]])
    indices = grey // 64
    cases = {
        'grey': (iio.imwrite('<bytes>', grey, extension='.png'), np.dstack([grey] * 3)),
        'grey+alpha': (iio.imwrite('<bytes>', np.dstack([grey, grey // 2]), extension='.png'),
                       np.dstack([grey] * 3)),
        'rgba': (iio.imwrite('<bytes>', np.dstack([rgb, grey]), extension='.png'), rgb),
        '16-bit grey': (iio.imwrite('<bytes>', wide[..., 1], extension='.png'),
                        np.dstack([grey] * 3)),
        '16-bit rgb': (png_bytes(wide, color_type=2, bit_depth=16), rgb),
        'palette': (png_bytes(indices[..., None], color_type=3, bit_depth=8, palette=palette),
                    palette[indices]),
    }
    for name, (data, expected) in cases.items():
        decoded = decode_image(encoded_message(typestore, stamp, data), COMPRESSED_IMAGE_TYPE)
        assert decoded.dtype == np.uint8 and decoded.shape == rgb.shape, name
        assert np.array_equal(decoded, expected), name


def test_decode_image_refuses_what_it_cannot_convert_faithfully(sim_frames):
    import imageio.v3 as iio

    typestore = uq_typestore()
    stamp, rgb, _ = sim_frames[0]
    side = int(np.sqrt(MAX_IMAGE_PIXELS)) + 1
    cases = [
        (iio.imwrite('<bytes>', np.dstack([rgb, rgb[..., 0]]), extension='.jpg', mode='CMYK'),
         'jpeg', 'jpeg image is CMYK, which needs its colour profile'),
        (iio.imwrite('<bytes>', rgb, extension='.bmp'), 'png', 'neither a PNG nor a JPEG'),
        # The size is read from the header before any pixel is decoded: this one has one.
        (png_bytes(rgb[:1, :1], color_type=2, bit_depth=8, width=side, height=side), 'png',
         f'image {side}x{side} exceeds the maximum of {MAX_IMAGE_PIXELS} pixels'),
        (iio.imwrite('<bytes>', rgb, extension='.png')[:2000], 'png', 'undecodable png image'),
    ]
    for data, fmt, problem in cases:
        with pytest.raises(ImageFormatError, match=problem):
            decode_image(encoded_message(typestore, stamp, data, fmt), COMPRESSED_IMAGE_TYPE)


def test_bag_looping_back_in_time_restarts_the_arbiter(tmp_path):
    """A looping bag must not carry the level reached before the jump across it."""
    # Known objects only: with the default thresholds the first lap climbs.
    known = tmp_path / 'known_static'
    assert uq('sim', 'record', '--scenario', 'known_static', '--out', str(known),
              '--duration', str(FRAMES / RATE_HZ), '--rate', str(RATE_HZ),
              '--no-progress') == 0
    frames = read_frames(known)
    typestore = uq_typestore()
    messages = []
    for lap in range(2):
        for i, (stamp, rgb, _) in enumerate(frames):
            log = (lap * len(frames) + i) * 500_000_000
            messages.append(('image', 'sensor_msgs/msg/Image', log,
                             image_message(typestore, stamp, rgb)))
    bag = write_bag(tmp_path / 'bag', 'sqlite3', messages, typestore)
    out = tmp_path / 'report'
    assert uq('eval', 'bag', str(bag), '--out', str(out), '--no-progress') == 0
    report = _report(out)
    levels = [f['level'] for f in report['level_timeline']]
    assert len(levels) == 2 * FRAMES
    assert levels[FRAMES - 1] != 'teleoperation'  # the first lap climbed
    assert levels[FRAMES] == 'teleoperation'     # the restart begins again from the bottom
    assert any('time jumped back' in n for n in report['notes'])
    assert report['problems'] == []


# --------------------------------------------------------------------------- bad input

def _fails(capsys, *argv: str) -> str:
    assert uq(*argv) == 2
    err = capsys.readouterr().err
    assert 'Traceback' not in err
    return err


def test_truncated_mcap_gives_partial_results(sim_frames, tmp_path, capsys):
    typestore = uq_typestore()
    bag = write_bag(tmp_path / 'bag', 'mcap', [
        ('image', 'sensor_msgs/msg/Image', s, image_message(typestore, s, rgb))
        for s, rgb, _ in sim_frames], typestore)
    (mcap,) = bag.glob('*.mcap')
    data = mcap.read_bytes()
    # rosbags closes an MCAP chunk past 1 MiB (four 230 kB images): cut inside the second.
    mcap.write_bytes(data[:int(1.5 * 2**20)])
    out = tmp_path / 'report'
    err = _fails(capsys, 'eval', 'bag', str(bag), '--out', str(out), '--no-progress')
    assert str(bag) in err and 'truncated' in err
    frames = _report(out)['metrics']['frames']
    assert 0 < frames < len(sim_frames)


def test_truncated_sqlite3_is_refused_clearly(sim_bag, tmp_path, capsys):
    typestore = uq_typestore()
    bag = write_bag(tmp_path / 'bag', 'sqlite3', [
        ('image', 'sensor_msgs/msg/Image', s, image_message(typestore, s, rgb))
        for s, rgb, _ in read_frames(sim_bag)[:6]], typestore)
    (db,) = bag.glob('*.db3')
    db.write_bytes(db.read_bytes()[:200_000])
    err = _fails(capsys, 'eval', 'bag', str(bag), '--out', str(tmp_path / 'r'))
    assert f'bag {bag}: cannot be opened' in err


def test_missing_metadata_yaml(sim_bag, tmp_path, capsys):
    bag = tmp_path / 'bag'
    shutil.copytree(sim_bag, bag)
    (bag / 'metadata.yaml').unlink()
    err = _fails(capsys, 'eval', 'bag', str(bag), '--out', str(tmp_path / 'r'))
    assert f'bag {bag}: missing metadata.yaml' in err


def test_missing_bag(tmp_path, capsys):
    err = _fails(capsys, 'eval', 'bag', str(tmp_path / 'nope'), '--out', str(tmp_path / 'r'))
    assert 'nope: does not exist' in err


def test_unknown_message_types(sim_frames, tmp_path, capsys):
    typestore = uq_typestore()
    typestore.register(get_types_from_msg('float64 value\n', 'acme_msgs/msg/Mystery'))
    stamp, rgb, _ = sim_frames[0]
    mystery = typestore.types['acme_msgs/msg/Mystery'](value=1.0)
    bag = write_bag(tmp_path / 'bag', 'sqlite3', [
        ('image', 'sensor_msgs/msg/Image', stamp, image_message(typestore, stamp, rgb)),
        ('mystery', 'acme_msgs/msg/Mystery', stamp, mystery)], typestore)
    # A topic of a type nobody here knows is left aside ...
    assert uq('eval', 'bag', str(bag), '--out', str(tmp_path / 'r'), '--no-progress') == 0
    assert _report(tmp_path / 'r')['metrics']['frames'] == 1
    # ... and is refused by name when it is asked for as the image topic.
    err = _fails(capsys, 'eval', 'bag', str(bag), '--image-topic', 'mystery',
                 '--out', str(tmp_path / 'r2'))
    assert "topic 'mystery' has type acme_msgs/msg/Mystery" in err


def test_missing_image_topic(sim_frames, tmp_path, capsys):
    bag = write_bag(tmp_path / 'bag', 'mcap', [
        ('ground_truth', 'uq_msgs/msg/DetectionArray', s, truth)
        for s, _, truth in sim_frames[:2]])
    err = _fails(capsys, 'eval', 'bag', str(bag), '--out', str(tmp_path / 'r'))
    assert f'bag {bag}: has no image topic' in err
    err = _fails(capsys, 'eval', 'bag', str(bag), '--image-topic', '/camera/image_raw',
                 '--out', str(tmp_path / 'r'))
    assert "has no topic '/camera/image_raw'" in err


@pytest.mark.parametrize('storage', ['mcap', 'sqlite3'])
def test_empty_bag(tmp_path, capsys, storage):
    bag = write_bag(tmp_path / 'bag', storage, [],
                    topics={'image': 'sensor_msgs/msg/Image'})
    err = _fails(capsys, 'eval', 'bag', str(bag), '--out', str(tmp_path / 'r'))
    assert f'bag {bag}: is empty' in err


def test_bad_messages_are_skipped_counted_and_the_run_goes_on(sim_frames, tmp_path, capsys):
    """Images that cannot be converted and ground truth that breaks the rules are skipped,
    each counted under its topic and reason in the report; every other message is
    evaluated."""
    import imageio.v3 as iio

    typestore = uq_typestore()
    frames = sim_frames[:7]
    images = [compressed_message(typestore, stamp, rgb, 'png') for stamp, rgb, _ in frames]
    truths = [copy.deepcopy(truth) for _, _, truth in frames]
    grey = frames[1][1][..., 1]
    images[1] = encoded_message(  # grey+alpha: converted and evaluated
        typestore, frames[1][0], iio.imwrite('<bytes>', np.dstack([grey, grey]),
                                             extension='.png'))
    images[4] = encoded_message(
        typestore, frames[4][0],
        iio.imwrite('<bytes>', np.dstack([frames[4][1], grey]), extension='.jpg',
                    mode='CMYK'), 'jpeg')
    images[5] = encoded_message(  # 12 kB of PNG, 16.8 million pixels
        typestore, frames[5][0], iio.imwrite('<bytes>', np.zeros((4097, 4097), np.uint8),
                                             extension='.png'))
    truths[1].detections[0].center_x = float('nan')
    truths[2].detections[0].class_index = 99
    truths[3].detections[0].width = -4.0
    messages = []
    for (stamp, _, _), image, truth in zip(frames, images, truths, strict=True):
        messages += [('image', COMPRESSED_IMAGE_TYPE, stamp, image),
                     ('ground_truth', 'uq_msgs/msg/DetectionArray', stamp, truth)]
    bag = write_bag(tmp_path / 'bag', 'mcap', messages, typestore)
    out = tmp_path / 'report'
    err = _fails(capsys, 'eval', 'bag', str(bag), '--out', str(out), '--no-progress')
    report = _report(out)
    # Frames 0-3 and 6; ground truth of frames 0 and 6 (4 and 5 have no image left).
    assert report['metrics']['frames'] == 5
    assert report['metrics']['ground_truth_frames'] == 2
    skipped = [
        'image: jpeg image is CMYK, which needs its colour profile',
        f'image: image 4097x4097 exceeds the maximum of {MAX_IMAGE_PIXELS} pixels',
        'ground_truth: a ground-truth box has a non-finite (NaN or inf) value',
        "ground_truth: a ground-truth detection's class_index is neither -1 nor the index "
        'of its class_id in class_names',
        'ground_truth: a ground-truth box has a negative width or height']
    for problem in skipped:
        line = f'bag {bag}: 1 message(s) skipped on {problem}'
        assert sum(p.startswith(line) for p in report['problems']) == 1, problem
        assert f'warning: {line}' in err
    assert len(report['problems']) == len(skipped)
    assert '## Problems' in (out / 'report.md').read_text()


def test_an_image_the_pipeline_cannot_take_is_skipped_not_fatal(sim_frames, tmp_path,
                                                                  monkeypatch):
    """Should a decoder hand over an image that is not (H, W, 3) uint8, perception refuses
    it before anything changes and the replay skips it, counted."""
    from uq_eval.bags import reader as bag_reader
    from uq_eval.bags.evaluation import (
        BagEvaluator,
        InvalidMessage,
        load_shipped_perception,
        run_evaluation,
    )

    typestore = uq_typestore()
    bag = write_bag(tmp_path / 'bag', 'mcap', [
        ('image', IMAGE_TYPE, stamp, image_message(typestore, stamp, rgb))
        for stamp, rgb, _ in sim_frames[:3]], typestore)
    decode, calls = bag_reader.decode_image, []

    def two_channels_on_the_second_image(msg, msgtype):
        calls.append(msgtype)
        rgb = decode(msg, msgtype)
        return rgb[..., :2] if len(calls) == 2 else rgb

    monkeypatch.setattr(bag_reader, 'decode_image', two_channels_on_the_second_image)
    evaluator = BagEvaluator(load_shipped_perception(), bag_name=str(bag))
    with pytest.raises(InvalidMessage, match='got shape'):
        evaluator.perceive(0.0, sim_frames[0][1][..., :2])
    # Had the refused call been taken as the first frame, the bag's first frame would not
    # start the arbiter and the replay below would fail.
    stream = bag_reader.BagStream(bag)
    try:
        data = run_evaluation(stream, evaluator, progress=False)
    finally:
        stream.close()
    assert [f['stamp'] for f in data.frames] == pytest.approx(
        [sim_frames[i][0] * 1e-9 for i in (0, 2)])
    assert data.problems == [
        f'bag {bag}: 1 message(s) skipped on image: image must be an (H, W, 3) uint8 RGB '
        'array, got shape (240, 320, 2), uint8']


def test_out_of_order_stamps_are_reported_with_full_results(sim_frames, tmp_path, capsys):
    typestore = uq_typestore()
    frames = sim_frames[:6]
    order = [0, 2, 1, 3, 5, 4]  # neighbours swapped: 0.5 s back, within one frame period
    bag = write_bag(tmp_path / 'bag', 'mcap', [
        ('image', 'sensor_msgs/msg/Image', 10**9 * k, image_message(typestore, frames[i][0],
                                                                     frames[i][1]))
        for k, i in enumerate(order)], typestore)
    out = tmp_path / 'report'
    err = _fails(capsys, 'eval', 'bag', str(bag), '--out', str(out), '--no-progress')
    assert f'bag {bag}: 2 image(s) stamped earlier than a previous one' in err
    assert _report(out)['metrics']['frames'] == 6


# --------------------------------------------------------------------------- node replay

@pytest.mark.slow
def test_replay_through_running_nodes_with_a_looping_bag(sim_frames, tmp_path):
    """``uq replay --clock --record`` into a real detector and arbitration node (separate
    processes, use_sim_time), the bag's time jumping back halfway: both nodes survive, keep
    answering after the jump, and ``uq eval bag`` reports their latencies."""
    import os
    import subprocess
    import sys
    import threading
    import time

    typestore = uq_typestore()
    messages = []
    # Half the module's frames a lap: the replay plays the bag at its pace, so each frame is
    # half a second of the test, and three seconds a lap leave every node several frames
    # before and after the jump.
    lap = sim_frames[:FRAMES // 2]
    for _lap in range(2):  # the same stamps and log times twice: /clock jumps back 2.5 s
        for stamp, rgb, _ in lap:
            messages.append(('image', 'sensor_msgs/msg/Image', stamp,
                             image_message(typestore, stamp, rgb)))
    bag = write_bag(tmp_path / 'looping', 'mcap', messages, typestore)
    env = os.environ | {'ROS_DOMAIN_ID': '58', 'PYTHONUNBUFFERED': '1'}
    nodes = [subprocess.Popen([sys.executable, '-m', module, '--ros-args',
                               '-p', 'use_sim_time:=true', *extra],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
             for module, extra in (('uq_perception.detector_node', ['-p', 'autostart:=true']),
                                   ('uq_autonomy.arbitration_node', []))]
    detector_log: list[str] = []
    reader = threading.Thread(target=lambda: detector_log.extend(nodes[0].stderr or []),
                              daemon=True)
    reader.start()
    try:
        # Model loading takes seconds to tens of seconds on a loaded machine: replay only
        # once the detector processes images, or the first lap is lost.
        deadline = time.monotonic() + 120
        while not any('active: processing images' in line for line in detector_log):
            assert time.monotonic() < deadline and nodes[0].poll() is None, ''.join(detector_log)
            time.sleep(0.2)
        # No pause for discovery here: uq replay itself waits until the graph shows a node
        # taking the images and one answering, and every endpoint it sees is matched.
        out = tmp_path / 'recorded'
        # Recording goes on 1.5 s after the last image: the answers to it take milliseconds,
        # and the checks need answers after the jump, not the very last one.
        replay = subprocess.run([sys.executable, '-m', 'uq_common.cli', 'replay', str(bag),
                                 '--clock', '--record', str(out), '--linger', '1.5'],
                                env=env, capture_output=True, text=True, timeout=180)
        assert replay.returncode == 0, replay.stderr
        assert all(node.poll() is None for node in nodes), 'a node fell over'
    finally:
        for node in nodes:
            node.terminate()
            node.wait(timeout=30)
    with AnyReader([out], default_typestore=uq_typestore()) as reader:
        counts = {c.topic: c.msgcount for c in reader.connections}
        states = [(log, reader.deserialize(raw, c.msgtype)) for c, log, raw in
                  reader.messages([c for c in reader.connections
                                   if c.topic == 'autonomy_state'])]
        images = sorted(log for _, log, _ in reader.messages(
            [c for c in reader.connections if c.topic == 'image']))
        detections = sorted(log for _, log, _ in reader.messages(
            [c for c in reader.connections if c.topic == 'detections']))
    assert counts['image'] == 2 * len(lap)
    # Best-effort input: frames may be dropped; the detector answers in both laps, before
    # and after the jump back in time, and so does the arbitration node.
    jump = images[len(lap)]
    assert any(log < jump for log in detections) and any(log > jump for log in detections)
    assert any(log > jump for log, _ in states)
    report_dir = tmp_path / 'report'
    assert uq('eval', 'bag', str(out), '--out', str(report_dir), '--no-progress') == 0
    metrics = _report(report_dir)['metrics']
    assert metrics['node_end_to_end_ms']['count'] == counts['detections']
    assert metrics['node_end_to_end_ms']['p50'] > 0
