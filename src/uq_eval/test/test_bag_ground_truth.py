"""``uq eval bag --ground-truth FILE``: COCO ground truth from ``uq sim record`` (exhaustive)
and from the ask-for-help loop's ``uq labels export`` (partial), on real bags; the robot
pose recorded by ``uq sim record``; and ``--bench`` on a small bag.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from rosbags.highlevel import AnyReader

from uq_autonomy.help.crops import box_in_region, crop_region, cut, encode_png
from uq_autonomy.labels.coco import export_coco
from uq_autonomy.labels.store import LabelStore, PendingRequest
from uq_eval.bags.types import uq_typestore

FRAMES = 6
RATE_HZ = 2.0


def uq(*argv: str) -> int:
    """Run a ``uq`` subcommand in this process, as the console script does."""
    from uq_common.cli import main
    return main(list(argv))


def _report(out: Path) -> dict:
    return json.loads((out / 'report.json').read_text())


def _stamp_ns(msg) -> int:
    return msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec


def read_topics(bag: Path) -> dict[str, list]:
    """Topic -> deserialised messages in log order."""
    out: dict[str, list] = {}
    with AnyReader([bag], default_typestore=uq_typestore()) as reader:
        for connection, _, raw in reader.messages():
            out.setdefault(connection.topic, []).append(
                reader.deserialize(raw, connection.msgtype))
    return out


@pytest.fixture(scope='module')
def demo_bag(tmp_path_factory) -> Path:
    """``tabletop_demo`` from 8 s: known objects, the unknown torus, and the gripper."""
    bag = tmp_path_factory.mktemp('demo') / 'bag'
    assert uq('sim', 'record', '--scenario', 'tabletop_demo', '--out', str(bag),
              '--start-time', '8.5', '--duration', str(FRAMES / RATE_HZ),
              '--rate', str(RATE_HZ), '--no-progress') == 0
    return bag


@pytest.fixture(scope='module')
def demo_topics(demo_bag) -> dict[str, list]:
    return read_topics(demo_bag)


# --------------------------------------------------------------------------- recording

def test_record_writes_one_finite_robot_pose_per_frame(demo_topics):
    images, poses = demo_topics['image'], demo_topics['robot_pose']
    assert len(images) == len(poses) == FRAMES
    assert [_stamp_ns(p) for p in poses] == [_stamp_ns(i) for i in images]
    for pose in poses:
        assert pose.header.frame_id == 'world'
        p, q = pose.pose.position, pose.pose.orientation
        values = [p.x, p.y, p.z, q.x, q.y, q.z, q.w]
        assert all(math.isfinite(v) for v in values)
        assert q.x**2 + q.y**2 + q.z**2 + q.w**2 == pytest.approx(1.0)
        # The tool point hovers above the table inside the gripper's reach.
        assert 0.0 < p.z < 1.0 and abs(p.x) < 1.0 and abs(p.y) < 1.0


def test_scenario_without_robot_has_no_pose_topic(tmp_path):
    bag = tmp_path / 'bag'
    assert uq('sim', 'record', '--scenario', 'known_static', '--out', str(bag),
              '--duration', '0.5', '--rate', '2', '--no-progress') == 0
    assert 'robot_pose' not in read_topics(bag)


def test_record_writes_the_ground_truth_topic_as_coco(demo_bag, demo_topics):
    coco = json.loads((demo_bag / 'ground_truth.json').read_text())
    assert coco['info']['exhaustive'] is True
    names = {c['id']: c['name'] for c in coco['categories']}
    by_image: dict[int, list] = {}
    for ann in coco['annotations']:
        by_image.setdefault(ann['image_id'], []).append(ann)
    truths = demo_topics['ground_truth']
    assert [img['stamp_ns'] for img in coco['images']] == [_stamp_ns(t) for t in truths]
    for image, truth in zip(coco['images'], truths, strict=True):
        anns = by_image.get(image['id'], [])
        assert [names[a['category_id']] for a in anns] == [d.class_id for d in truth.detections]
        for ann, d in zip(anns, truth.detections, strict=True):
            x, y, w, h = ann['bbox']
            assert (x + w / 2, y + h / 2, w, h) == pytest.approx(
                (d.center_x, d.center_y, d.width, d.height))
            assert ann['attributes']['known'] == (d.class_index >= 0)
    assert 'torus' in names.values()


# --------------------------------------------------------------------------- exhaustive

def test_coco_file_gives_the_same_metrics_as_the_topic(demo_bag, tmp_path):
    by_topic, by_file = tmp_path / 'topic', tmp_path / 'file'
    assert uq('eval', 'bag', str(demo_bag), '--ground-truth', 'ground_truth',
              '--out', str(by_topic), '--no-progress') == 0
    assert uq('eval', 'bag', str(demo_bag), '--ground-truth',
              str(demo_bag / 'ground_truth.json'), '--out', str(by_file),
              '--no-progress') == 0
    topic, file = _report(by_topic)['metrics'], _report(by_file)['metrics']
    assert file['ground_truth_frames'] == FRAMES and file['ground_truth_exhaustive'] is True
    assert file['ground_truth_unmatched_stamps'] == 0
    assert file['matched_unknown'] > 0 and file['map50'] is not None
    for key in ('map50', 'ap50_per_class', 'ece', 'aurc', 'ood_auroc', 'matched_known',
                'matched_unknown', 'ground_truth_frames'):
        assert file[key] == topic[key], key


# --------------------------------------------------------------------------- partial

def _help_store(path: Path, topics: dict[str, list], classes: tuple[str, ...]) -> int:
    """A label store filled as the ask-for-help node fills it: one answered request per
    object of ``classes`` in the first frames (crop, box in the crop, crop origin, frame
    size, stamp in float seconds), plus one from a frame the bag does not have. Returns the
    number of labels in the bag's frames."""
    labelled = 0
    with LabelStore(path) as store:
        for image, truth in list(zip(topics['image'], topics['ground_truth'],
                                     strict=True))[:4]:
            rgb = np.asarray(image.data).reshape(image.height, image.width, 3)
            stamp = image.header.stamp.sec + image.header.stamp.nanosec * 1e-9
            for d in truth.detections:
                if d.class_id not in classes:
                    continue
                box = (d.center_x, d.center_y, d.width, d.height)
                region = crop_region(box, image.width, image.height)
                rid = f'r{labelled}'
                store.add_request(PendingRequest(
                    rid, reason='GP variance high', crop_png=encode_png(cut(rgb, region)),
                    box=box_in_region(box, region),
                    crop_origin=(float(region[0]), float(region[1])),
                    image_size=(image.width, image.height), stamp=stamp,
                    track_id=d.track_id, class_name=d.class_id))
                store.answer(rid, d.class_id, 'tester')
                labelled += 1
        store.add_request(PendingRequest(
            'elsewhere', crop_png=encode_png(np.zeros((20, 20, 3), np.uint8)),
            box=(2.0, 2.0, 10.0, 10.0), crop_origin=(5.0, 5.0), image_size=(320, 240),
            stamp=stamp + 1000.0))
        store.answer('elsewhere', 'mug', 'tester')
    return labelled


def test_help_export_carries_frame_stamp_and_frame_box(demo_topics, tmp_path):
    _help_store(tmp_path / 'labels.sqlite3', demo_topics, ('mug',))
    with LabelStore(tmp_path / 'labels.sqlite3') as store:
        summary = export_coco(store, tmp_path / 'coco')
    coco = json.loads(summary.annotations_file.read_text())
    assert coco['info']['exhaustive'] is False
    image, ann = coco['images'][0], coco['annotations'][0]
    first = demo_topics['image'][0]
    # Float seconds in the store: exact to well under a microsecond.
    assert abs(image['stamp_ns'] - _stamp_ns(first)) < 1000
    assert (image['frame_width'], image['frame_height']) == (first.width, first.height)
    mug = next(d for d in demo_topics['ground_truth'][0].detections if d.class_id == 'mug')
    assert ann['bbox_image'] == pytest.approx(
        [mug.center_x - mug.width / 2, mug.center_y - mug.height / 2, mug.width,
         mug.height], abs=0.01)
    ox, oy = image['crop_origin']
    assert ann['bbox_image'][:2] == pytest.approx([ann['bbox'][0] + ox, ann['bbox'][1] + oy])
    # The fields that CVAT and re-import read are unchanged.
    assert image['file_name'] == f'{image["request_id"]}.png'
    assert (tmp_path / 'coco' / 'images' / image['file_name']).is_file()
    assert ann['attributes']['request_id'] == image['request_id']


def test_help_export_as_partial_ground_truth(demo_bag, demo_topics, tmp_path):
    labelled = _help_store(tmp_path / 'labels.sqlite3', demo_topics, ('mug', 'torus'))
    with LabelStore(tmp_path / 'labels.sqlite3') as store:
        annotations = export_coco(store, tmp_path / 'coco').annotations_file
    out = tmp_path / 'report'
    assert uq('eval', 'bag', str(demo_bag), '--ground-truth', str(annotations),
              '--out', str(out), '--no-progress') == 0
    report = _report(out)
    metrics = report['metrics']
    assert metrics['ground_truth_exhaustive'] is False
    assert metrics['ground_truth_frames'] == 4
    assert 'map50' not in metrics and 'ap50_per_class' not in metrics
    # Each label is the detector's own object: every one is matched, mug known, torus not.
    assert metrics['matched_known'] + metrics['matched_unknown'] == labelled
    assert metrics['matched_unknown'] == 4 and metrics['matched_known'] == 4
    for key in ('ece', 'accuracy_matched', 'aurc', 'ood_auroc'):
        assert metrics[key] is not None and 0.0 <= metrics[key] <= 1.0, key
    assert metrics['ground_truth_unmatched_stamps'] == 1
    assert any('1 of 5 labelled stamp(s) match no image' in n for n in report['notes'])
    text = (out / 'report.md').read_text()
    assert 'AP needs exhaustive labels' in text and 'mAP@0.5' not in text


# --------------------------------------------------------------------------- bad files

def _fails(capsys, *argv: str) -> str:
    assert uq(*argv) == 2
    err = capsys.readouterr().err
    assert 'Traceback' not in err
    return err


def _valid() -> dict:
    return {'info': {'exhaustive': True},
            'images': [{'id': 1, 'file_name': 'a.png', 'width': 320, 'height': 240,
                        'stamp_ns': 1}],
            'annotations': [{'id': 7, 'image_id': 1, 'category_id': 1,
                             'bbox': [1.0, 2.0, 3.0, 4.0]}],
            'categories': [{'id': 1, 'name': 'mug'}]}


def _with(path: tuple, value) -> dict:
    data = _valid()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


@pytest.mark.parametrize(('content', 'problem'), [
    (None, 'does not exist'),
    ('{"images": [', 'is not valid JSON'),
    (json.dumps({'images': []}), 'is not a COCO annotations file'),
    (json.dumps(_with(('annotations', 0, 'bbox'), [1.0, float('nan'), 3.0, 4.0])),
     'annotation 7: bbox must be 4 finite numbers >= 0'),
    (json.dumps(_with(('annotations', 0, 'bbox'), [1.0, 2.0, -3.0, 4.0])),
     'annotation 7: bbox must be 4 finite numbers >= 0'),
    (json.dumps(_with(('annotations', 0, 'bbox_image'), [-1.0, 2.0, 3.0, 4.0])),
     'annotation 7: bbox_image must be 4 finite numbers >= 0'),
    # Numbers past float range or int64 are refused by the same rules, not an overflow.
    (json.dumps(_with(('annotations', 0, 'bbox'), [1.0, 2.0, 10**400, 4.0])),
     'annotation 7: bbox must be 4 finite numbers >= 0 and <= 1000000'),
    (json.dumps(_with(('annotations', 0, 'bbox'), [1.0, 2.0, 3e6, 4.0])),
     'annotation 7: bbox must be 4 finite numbers >= 0 and <= 1000000'),
    (json.dumps(_with(('images', 0, 'stamp_ns'), 1.5)), 'stamp_ns must be a non-negative'),
    (json.dumps(_with(('images', 0, 'stamp_ns'), 2**63)),
     'stamp_ns must be a non-negative integer below 2**63'),
    (json.dumps(_with(('images', 0, 'stamp_ns'), 10**30)),
     'stamp_ns must be a non-negative integer below 2**63'),
    ('{"images": [{"id": 1, "stamp_ns": ' + '9' * 5000 + '}]}', 'is not usable JSON'),
    ('[' * 100_000 + ']' * 100_000, 'is nested too deeply'),
    (json.dumps(_with(('annotations', 0, 'image_id'), [1])), 'image_id [1] is not an image'),
    (json.dumps(_with(('images', 0, 'id'), {'a': 1})), 'image 0 needs an "id"'),
    (json.dumps(_with(('images', 0, 'stamp_ns'), None)), 'no image has a "stamp_ns"'),
    (json.dumps(_with(('annotations', 0, 'category_id'), 3)), 'category_id 3 is not'),
    (json.dumps(_with(('info', 'exhaustive'), 'yes')), 'info.exhaustive must be true'),
])
def test_bad_ground_truth_files_are_refused_clearly(demo_bag, tmp_path, capsys, content,
                                                    problem):
    path = tmp_path / 'truth.json'
    if content is not None:
        path.write_text(content)
    err = _fails(capsys, 'eval', 'bag', str(demo_bag), '--ground-truth', str(path),
                 '--out', str(tmp_path / 'r'))
    assert err.startswith(f'error: ground truth {path}: ')
    assert problem in err and len(err.strip().splitlines()) == 1


def test_stamps_not_in_the_bag_are_counted_not_fatal(demo_bag, tmp_path):
    coco = json.loads((demo_bag / 'ground_truth.json').read_text())
    for image in coco['images'][::2]:
        image['stamp_ns'] += 10**9 // 4  # between two frames of a 2 Hz bag
    path = tmp_path / 'shifted.json'
    path.write_text(json.dumps(coco))
    out = tmp_path / 'report'
    assert uq('eval', 'bag', str(demo_bag), '--ground-truth', str(path), '--out', str(out),
              '--no-progress') == 0
    report = _report(out)
    assert report['metrics']['ground_truth_frames'] == FRAMES // 2
    assert report['metrics']['ground_truth_unmatched_stamps'] == FRAMES // 2
    assert any(f'{FRAMES // 2} of {FRAMES} labelled stamp(s) match no image' in n
               for n in report['notes'])


# --------------------------------------------------------------------------- bench

@pytest.mark.slow
def test_bench_reports_rates_their_ratio_and_peak_memory(tmp_path, capsys):
    """``--bench`` on a three-frame bag: the figures are there and consistent (their values
    depend on the machine and are not asserted). The rounds are shortened with
    ``--bench-frames``/``--bench-rounds``: the default 3 rounds of 300 frames took most of
    the test's half minute and check nothing more than 2 rounds of 30 (passes, frames and
    ratio follow from the options alike)."""
    from uq_eval.bags.evaluation import BENCH_MIN_FRAMES, BENCH_ROUNDS

    bag = tmp_path / 'bag'
    assert uq('sim', 'record', '--scenario', 'known_static', '--out', str(bag),
              '--duration', '1.5', '--rate', '2', '--no-progress') == 0
    capsys.readouterr()
    out = tmp_path / 'report'
    min_frames, rounds = 30, 2
    assert uq('eval', 'bag', str(bag), '--out', str(out), '--bench', '--no-progress',
              '--bench-frames', str(min_frames), '--bench-rounds', str(rounds)) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert f'{rounds} rounds of at least {min_frames} frames each' in captured.err
    bench = _report(out)['bench']
    assert bench['bag_frames'] == 3
    # Whole passes of the bag reaching the frames asked for: 10 passes of 3 frames a round.
    assert bench['passes_per_round'] == math.ceil(min_frames / 3) == 10
    assert bench['rounds'] == rounds
    assert bench['frames'] == rounds * bench['passes_per_round'] * bench['bag_frames'] == 60
    # Without the options a run keeps the measured figures: 3 rounds of at least 300 frames.
    assert (BENCH_MIN_FRAMES, BENCH_ROUNDS) == (300, 3)
    keys = ('replay_frames_per_s', 'bare_forward_frames_per_s', 'replay_over_forward',
            'peak_rss_mib_1x', 'peak_rss_mib_10x')
    for key in keys:
        assert math.isfinite(bench[key]) and bench[key] > 0.0, key
        assert f'"{key}"' in printed
    assert bench['replay_over_forward'] == pytest.approx(
        bench['replay_frames_per_s'] / bench['bare_forward_frames_per_s'], rel=1e-9)
    # A child that loaded torch and the model: tens of MiB at least, below the machine.
    for key in ('peak_rss_mib_1x', 'peak_rss_mib_10x'):
        assert 50.0 < bench[key] < 64 * 1024
    assert '## Benchmark' in (out / 'report.md').read_text()
