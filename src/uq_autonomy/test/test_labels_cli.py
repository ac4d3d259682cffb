"""``uq labels list | export --coco DIR | import FILE``, through the ``uq`` command host.

The COCO export is checked by loading it with pycocotools (what CVAT, FiftyOne and the
detector training read) and by scoring the exported boxes against themselves with COCOeval.
"""

from __future__ import annotations

import contextlib
import io
import json
from importlib.metadata import EntryPoint
from pathlib import Path

import numpy as np
import pytest
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from uq_autonomy.help.crops import encode_png
from uq_autonomy.labels.store import LabelRecord, LabelStore, PendingRequest
from uq_common.cli import build_parser

COMMANDS = [
    EntryPoint(name=f'labels.{verb}', value=f'uq_autonomy.labels.cli:configure_{verb}',
               group='uq.commands')
    for verb in ('list', 'export', 'import', 'serve')
]


def uq(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        args = build_parser(COMMANDS).parse_args(list(argv))
        code = int(args.run(args) or 0)
    return code, out.getvalue(), err.getvalue()


def pixels(seed: int, h: int, w: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    path = tmp_path / 'labels.sqlite3'
    with LabelStore(path, clock=lambda: 1_700_000_000.0) as store:
        specs = [('r1', 'mug', (30, 40), (5.0, 4.0, 20.0, 22.0)),
                 ('r2', 'teapot', (24, 24), (2.5, 3.0, 18.0, 17.5)),
                 ('r3', 'mug', (50, 36), None)]
        for i, (rid, label, (h, w), box) in enumerate(specs):
            store.add_request(PendingRequest(
                rid, reason='GP variance high', candidates=(('mug', 0.7), ('box', 0.2)),
                crop_png=encode_png(pixels(i, h, w)), box=box, embedding=np.ones(8),
                model_id='centernet-1', track_id=i))
            store.answer(rid, label, 'alice')
        store.add_request(PendingRequest('r4', reason='still waiting'))
        store.add_request(PendingRequest('r5', reason='no crop either'))
        store.answer('r5', 'cone', 'bob')  # a label without a crop: no COCO image
    return path


def test_commands_take_their_help_from_the_docstrings() -> None:
    parser = build_parser(COMMANDS)
    text = parser._subparsers._group_actions[0].choices['labels'].format_help()
    assert 'List the labels in the label store' in text
    assert 'Export the stored labels as a COCO dataset' in text
    assert 'Import labels from a COCO annotations file' in text
    export_help = build_parser(COMMANDS).parse_args(['labels', 'export', '--coco', 'x'])
    assert export_help.store is None
    with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit, match='^0$'):
        build_parser(COMMANDS).parse_args(['labels', 'list', '--help'])
    assert '(default: None)' not in out.getvalue()
    assert '$UQ_LABEL_STORE' in out.getvalue()


def test_list_prints_labels_and_pending_requests(filled: Path) -> None:
    code, out, err = uq('labels', 'list', '--store', str(filled))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ['request_id', 'robot_id', 'label', 'labeler', 'time',
                                'model_id', 'box']
    assert lines[1].split()[:5] == ['r1', '-', 'mug', 'alice', '2023-11-14T22:13:20Z']
    assert '5.0,4.0,20.0,22.0' in lines[1]
    assert f'4 labels in {filled}' in err

    code, out, _ = uq('labels', 'list', '--store', str(filled), '--json', '--limit', '2')
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r['request_id'] for r in rows] == ['r1', 'r2']
    assert rows[1]['label'] == 'teapot' and rows[1]['box'] == [2.5, 3.0, 18.0, 17.5]

    code, out, _ = uq('labels', 'list', '--store', str(filled), '--pending', '--json')
    assert code == 0
    assert [json.loads(line)['request_id'] for line in out.splitlines()] == ['r4']


def test_list_uses_the_store_named_by_the_environment(filled: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('UQ_LABEL_STORE', str(filled))
    code, out, _ = uq('labels', 'list', '--json')
    assert code == 0 and len(out.splitlines()) == 4


def test_list_reports_bad_stores_without_a_traceback(tmp_path: Path) -> None:
    code, _, err = uq('labels', 'list', '--store', str(tmp_path / 'none.sqlite3'))
    assert code == 1 and err.startswith('error: label store') and 'does not exist' in err
    garbage = tmp_path / 'garbage.sqlite3'
    garbage.write_bytes(b'not sqlite' * 500)
    code, _, err = uq('labels', 'list', '--store', str(garbage))
    assert code == 1 and f'label store {garbage} is damaged' in err


def test_export_loads_in_pycocotools_with_boxes_in_crop_coordinates(filled: Path,
                                                                    tmp_path: Path) -> None:
    out_dir = tmp_path / 'coco'
    code, out, err = uq('labels', 'export', '--store', str(filled), '--coco', str(out_dir))
    assert code == 0, err
    annotations = out_dir / 'annotations' / 'instances_default.json'
    assert out.strip() == str(annotations)
    assert '3 images, 2 categories (mug, teapot)' in err
    assert '1 labels without a crop left out: r5' in err

    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(annotations))
    assert [c['name'] for c in coco.loadCats(coco.getCatIds())] == ['mug', 'teapot']
    assert len(coco.getImgIds()) == 3 and len(coco.getAnnIds()) == 3
    mug = coco.getCatIds(catNms=['mug'])[0]
    assert len(coco.getAnnIds(catIds=[mug])) == 2
    by_request = {coco.imgs[a['image_id']]['request_id']: a for a in coco.anns.values()}
    assert by_request['r1']['bbox'] == [5.0, 4.0, 20.0, 22.0]
    assert by_request['r1']['area'] == pytest.approx(440.0)
    assert by_request['r3']['bbox'] == [0.0, 0.0, 36.0, 50.0]  # no box: the whole crop
    assert by_request['r2']['attributes']['labeler'] == 'alice'
    assert by_request['r2']['attributes']['model_id'] == 'centernet-1'
    for image in coco.imgs.values():
        png = out_dir / 'images' / image['file_name']
        assert png.is_file()
        import cv2
        decoded = cv2.imread(str(png))
        assert decoded.shape[:2] == (image['height'], image['width'])

    # The exported boxes are well-formed COCO: scored against themselves, AP is 1.
    detections = [{'image_id': a['image_id'], 'category_id': a['category_id'],
                   'bbox': a['bbox'], 'score': 1.0} for a in coco.anns.values()]
    with contextlib.redirect_stdout(io.StringIO()):
        evaluation = COCOeval(coco, coco.loadRes(detections), 'bbox')
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    assert evaluation.stats[1] == pytest.approx(1.0)  # AP@0.5


def test_export_refuses_a_non_empty_directory(filled: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / 'busy'
    out_dir.mkdir()
    (out_dir / 'precious.txt').write_text('keep me')
    code, _, err = uq('labels', 'export', '--store', str(filled), '--coco', str(out_dir))
    assert code == 2 and 'is not empty' in err
    code, _, _ = uq('labels', 'export', '--store', str(filled), '--coco', str(out_dir),
                    '--overwrite')
    assert code == 0 and (out_dir / 'precious.txt').read_text() == 'keep me'


def test_coco_round_trip_and_corrections(filled: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / 'coco'
    assert uq('labels', 'export', '--store', str(filled), '--coco', str(out_dir))[0] == 0
    annotations = out_dir / 'annotations' / 'instances_default.json'
    fresh = tmp_path / 'fresh.sqlite3'

    code, out, err = uq('labels', 'import', str(annotations), '--store', str(fresh))
    assert (code, out.strip()) == (0, '3 stored'), err
    with LabelStore(fresh) as store, LabelStore(filled) as original:
        for record in store.labels():
            source = original.get_label(record.request_id)
            whole_crop = (0.0, 0.0, 36.0, 50.0)  # r3 has no box: exported as the whole crop
            assert (record.label, record.labeler, record.box, record.crop_png) == (
                source.label, source.labeler, source.box or whole_crop, source.crop_png)
            assert record.time == source.time and record.source == 'import'

    code, out, _ = uq('labels', 'import', str(annotations), '--store', str(fresh))
    assert (code, out.strip()) == (0, '3 duplicate')

    # Someone re-labels r2 in CVAT: importing that is a conflict unless overruled.
    data = json.loads(annotations.read_text())
    data['categories'].append({'id': 9, 'name': 'kettle', 'supercategory': 'object'})
    for ann in data['annotations']:
        if ann['attributes']['request_id'] == 'r2':
            ann['category_id'] = 9
    edited = out_dir / 'annotations' / 'edited.json'
    edited.write_text(json.dumps(data))
    code, out, err = uq('labels', 'import', str(edited), '--store', str(fresh))
    assert code == 1 and out.strip() == 'nothing imported: 1 conflict'
    assert "request r2 was already answered 'teapot' by alice" in err
    with LabelStore(fresh) as store:
        assert store.get_label('r2').label == 'teapot'
    code, out, _ = uq('labels', 'import', str(edited), '--store', str(fresh), '--overrule',
                      '--labeler', 'reviewer')
    assert (code, out.strip()) == (0, '2 duplicate, 1 overruled')
    with LabelStore(fresh) as store:
        r2 = store.get_label('r2')
        assert (r2.label, r2.labeler, r2.revision) == ('kettle', 'reviewer', 2)


def test_import_of_foreign_coco_derives_stable_request_ids(tmp_path: Path) -> None:
    root = tmp_path / 'foreign'
    (root / 'images').mkdir(parents=True)
    (root / 'images' / 'a.png').write_bytes(encode_png(pixels(5, 10, 10)))
    data = {'images': [{'id': 1, 'file_name': 'a.png', 'width': 10, 'height': 10}],
            'categories': [{'id': 1, 'name': 'cone'}],
            'annotations': [{'id': 1, 'image_id': 1, 'category_id': 1, 'bbox': [1, 1, 5, 5]},
                            {'id': 2, 'image_id': 1, 'category_id': 7, 'bbox': [1, 1, 5, 5]},
                            {'id': 3, 'image_id': 2, 'category_id': 1, 'bbox': [1, 1, 5, 5]}]}
    (root / 'labels.json').write_text(json.dumps(data))
    store_path = tmp_path / 's.sqlite3'
    code, out, err = uq('labels', 'import', str(root / 'labels.json'), '--store',
                        str(store_path))
    assert code == 2 and out.strip() == 'nothing imported: 2 invalid'
    assert 'labels.json annotation 2: missing field or reference 7' in err
    with LabelStore(store_path) as store:
        assert store.labels() == []
    data['annotations'] = data['annotations'][:1]
    (root / 'labels.json').write_text(json.dumps(data))
    assert uq('labels', 'import', str(root / 'labels.json'), '--store',
              str(store_path))[:2] == (0, '1 stored\n')
    assert uq('labels', 'import', str(root / 'labels.json'), '--store',
              str(store_path))[1].strip() == '1 duplicate'
    with LabelStore(store_path) as store:
        (record,) = store.labels()
        assert record.request_id.startswith('import-') and record.labeler == 'import'
        assert record.box == (1.0, 1.0, 5.0, 5.0) and record.image_size == (10, 10)


def test_jsonl_answers_pending_requests(filled: Path, tmp_path: Path) -> None:
    with LabelStore(filled) as store:
        store.add_request(PendingRequest('r6', reason='x'))
    answers = tmp_path / 'answers.jsonl'
    answers.write_text('\n'.join([
        json.dumps({'request_id': 'r4', 'label': 'cone', 'labeler': 'carol'}),
        json.dumps({'request_id': 'r6', 'label': 'star'}),
        json.dumps({'request_id': 'r1', 'label': 'mug'}),
        json.dumps({'request_id': 'ghost', 'label': 'mug'}),
        json.dumps({'request_id': 'r4', 'label': 'bad\nlabel'}),
        '{not json',
        '',
    ]))
    code, out, err = uq('labels', 'import', str(answers), '--store', str(filled))
    assert (code, out.strip()) == (2, 'nothing imported: 2 invalid, 1 unknown_request')
    assert "answers.jsonl line 4: unknown request 'ghost'" in err
    assert 'answers.jsonl line 5: label contains the non-printable character' in err
    assert 'answers.jsonl line 6: not valid JSON' in err
    with LabelStore(filled) as store:
        assert store.get_label('r4') is None and len(store.pending_requests()) == 2
    answers.write_text('\n'.join(answers.read_text().splitlines()[:3]))
    code, out, err = uq('labels', 'import', str(answers), '--store', str(filled))
    assert (code, out.strip()) == (0, '1 duplicate, 2 stored')
    with LabelStore(filled) as store:
        assert (store.get_label('r4').label, store.get_label('r4').labeler) == ('cone', 'carol')
        assert store.get_label('r6').labeler == 'import'
        assert store.pending_requests() == []


def test_import_rejects_bad_files_and_labelers(tmp_path: Path) -> None:
    store = str(tmp_path / 's.sqlite3')
    code, _, err = uq('labels', 'import', str(tmp_path / 'missing.json'), '--store', store)
    assert code == 2 and 'is not a file' in err
    bad = tmp_path / 'bad.json'
    bad.write_text('{"images": []}')
    code, _, err = uq('labels', 'import', str(bad), '--store', store)
    assert code == 2 and 'is not a COCO annotations file' in err
    bad.write_text('[1, 2')
    code, _, err = uq('labels', 'import', str(bad), '--store', store)
    assert code == 2 and 'is not valid JSON' in err
    code, _, err = uq('labels', 'import', str(bad), '--store', store, '--labeler', '')
    assert code == 2 and '--labeler: labeler must not be empty' in err


def test_import_into_a_read_only_store_fails_cleanly(filled: Path, tmp_path: Path) -> None:
    answers = tmp_path / 'a.jsonl'
    answers.write_text(json.dumps({'request_id': 'r4', 'label': 'cone'}) + '\n')
    garbage = tmp_path / 'garbage.sqlite3'
    garbage.write_bytes(b'x' * 5000)
    code, _, err = uq('labels', 'import', str(answers), '--store', str(garbage))
    assert code == 1 and 'is damaged or not an SQLite database' in err


def test_put_label_records_round_trip_through_export(tmp_path: Path) -> None:
    """A label imported without box or model id still exports as valid COCO."""
    path = tmp_path / 'minimal.sqlite3'
    with LabelStore(path) as store:
        store.put_label(LabelRecord('m1', 'cone', 'x', 1.0, crop_png=encode_png(
            pixels(1, 8, 9))))
    code, _, _ = uq('labels', 'export', '--store', str(path), '--coco', str(tmp_path / 'o'))
    assert code == 0
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(tmp_path / 'o' / 'annotations' / 'instances_default.json'))
    (ann,) = coco.anns.values()
    assert ann['bbox'] == [0.0, 0.0, 9.0, 8.0]


def test_export_places_crops_in_their_frame_only_when_the_store_knows_it(
        tmp_path: Path) -> None:
    """Frame fields (for ``uq eval bag --ground-truth``) are added where the request knew its
    frame; an imported label has no stamp, so it cannot be placed in a recording (the store
    takes its crop as its frame)."""
    path = tmp_path / 'frames.sqlite3'
    with LabelStore(path) as store:
        store.add_request(PendingRequest(
            'in-frame', crop_png=encode_png(pixels(2, 40, 50)), box=(5.0, 6.0, 30.0, 20.0),
            crop_origin=(100.0, 60.0), image_size=(320, 240), stamp=1_700_000_001.25))
        store.answer('in-frame', 'mug', 'alice')
        store.put_label(LabelRecord('imported', 'cone', 'x', 1.0, crop_png=encode_png(
            pixels(3, 8, 9)), box=(1.0, 1.0, 5.0, 5.0)))
    code, _, _ = uq('labels', 'export', '--store', str(path), '--coco', str(tmp_path / 'o'))
    assert code == 0
    data = json.loads((tmp_path / 'o' / 'annotations' / 'instances_default.json').read_text())
    assert data['info']['exhaustive'] is False
    images = {img['request_id']: img for img in data['images']}
    anns = {a['attributes']['request_id']: a for a in data['annotations']}
    placed = images['in-frame']
    assert placed['stamp_ns'] == 1_700_000_001_250_000_000
    assert placed['crop_origin'] == [100.0, 60.0]
    assert (placed['frame_width'], placed['frame_height']) == (320, 240)
    assert anns['in-frame']['bbox'] == [5.0, 6.0, 30.0, 20.0]
    assert anns['in-frame']['bbox_image'] == [105.0, 66.0, 30.0, 20.0]
    assert 'stamp_ns' not in images['imported']
    assert anns['imported']['bbox_image'] == anns['imported']['bbox'] == [1.0, 1.0, 5.0, 5.0]


def _coco_file(tmp_path: Path, annotations: list[object], categories: object = None) -> Path:
    (tmp_path / 'images').mkdir(exist_ok=True)
    (tmp_path / 'images' / 'a.png').write_bytes(encode_png(pixels(5, 10, 10)))
    path = tmp_path / 'labels.json'
    path.write_text(json.dumps({
        'images': [{'id': 1, 'file_name': 'a.png'}],
        'categories': categories if categories is not None else [{'id': 1, 'name': 'cone'}],
        'annotations': annotations}))
    return path


GOOD = {'id': 1, 'image_id': 1, 'category_id': 1, 'bbox': [1, 1, 5, 5]}


@pytest.mark.parametrize('text, message', [
    ('[' * 100_000 + ']' * 100_000, 'nested too deeply'),
    ('{"images": [], "annotations": [], "categories": [{"id": ' + '9' * 5000 + '}]}',
     'is not valid JSON'),
    ('{"images": [], "annotations": [], "categories": [], "x": NaN}', 'NaN is not a number'),
    ('{"images": [], "annotations": [], "categories": [], "x": 1e400}', 'out of range'),
    ('{"images": [], "annotations": [], "categories": 5}', '"categories" must be a list'),
    ('{"images": [], "annotations": ["x"], "categories": []}',
     'annotations[0] must be an object'),
    ('{"images": [{"id": 1}, {"id": 1}], "annotations": [], "categories": []}',
     'image id 1 appears more than once'),
    ('{"images": [{"id": [1]}], "annotations": [], "categories": []}',
     'image 0 needs an integer or string "id"'),
    ('{"images": [], "annotations": [], "categories": [{"id": 1, "name": "a\\u0007"}]}',
     'category 1: label contains the non-printable character'),
])
def test_import_of_a_malformed_file_exits_2_with_one_line(tmp_path: Path, text: str,
                                                          message: str) -> None:
    bad = tmp_path / 'bad.json'
    bad.write_text(text)
    code, out, err = uq('labels', 'import', str(bad), '--store', str(tmp_path / 's.sqlite3'))
    assert code == 2 and out == ''
    assert err.count('\n') == 1 and str(bad) in err and message in err


def test_import_refuses_oversized_and_non_utf8_files(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / 'bad.json'
    bad.write_bytes(b'{"a": "\xff"}')
    code, _, err = uq('labels', 'import', str(bad), '--store', str(tmp_path / 's.sqlite3'))
    assert code == 2 and f'{bad} is not UTF-8 text' in err
    monkeypatch.setattr('uq_autonomy.labels.coco.MAX_IMPORT_BYTES', 8)
    code, _, err = uq('labels', 'import', str(bad), '--store', str(tmp_path / 's.sqlite3'))
    assert code == 2 and f'{bad} is 10 bytes; an import file may have at most 8' in err


@pytest.mark.parametrize('change, message', [
    ({'bbox': [1, 1, 5]}, 'bbox must be 4 numbers'),
    ({'bbox': [1, 1, -5, 5]}, 'width and height >= 0'),
    ({'bbox': [1, True, 5, 5]}, 'bbox must be 4 numbers'),
    ({'attributes': {'track_id': 10**30}}, 'track_id must be a 64-bit integer'),
    ({'attributes': {'track_id': 'x'}}, 'track_id must be a 64-bit integer'),
    ({'attributes': 'x'}, 'attributes must be an object'),
    ({'attributes': {'request_id': 'bad id!'}}, "request_id 'bad id!' is invalid"),
    ({'attributes': {'labeler': 'a\nb'}}, 'labeler contains the non-printable'),
    ({'image_id': [1]}, 'TypeError'),
])
def test_one_invalid_annotation_leaves_the_store_unchanged(tmp_path: Path, filled: Path,
                                                           change: dict, message: str) -> None:
    with LabelStore(filled) as store:
        before = store.labels()
    path = _coco_file(tmp_path, [GOOD, {**GOOD, 'id': 2, 'bbox': [2, 2, 5, 5], **change}])
    code, out, err = uq('labels', 'import', str(path), '--store', str(filled))
    assert (code, out.strip()) == (2, 'nothing imported: 1 invalid')
    assert 'labels.json annotation 2: ' in err and message in err and 'Traceback' not in err
    with LabelStore(filled) as store:
        assert store.labels() == before


def test_a_file_labelling_one_request_twice_differently_is_invalid(tmp_path: Path,
                                                                    filled: Path) -> None:
    path = _coco_file(tmp_path, [{**GOOD, 'attributes': {'request_id': 'q1'}},
                                 {**GOOD, 'id': 2, 'category_id': 2,
                                  'attributes': {'request_id': 'q1'}}],
                      [{'id': 1, 'name': 'cone'}, {'id': 2, 'name': 'mug'}])
    code, out, err = uq('labels', 'import', str(path), '--store', str(tmp_path / 's.sqlite3'))
    assert code == 2 and 'annotation 2: the file labels request q1 twice, differently' in err
    answers = tmp_path / 'a.jsonl'
    answers.write_text('{"request_id": "r4", "label": "cone"}\n'
                       '{"request_id": "r4", "label": "Cone"}\n'
                       '{"request_id": "r4", "label": "mug"}\n[1]\n')
    code, out, err = uq('labels', 'import', str(answers), '--store', str(filled))
    assert (code, out.strip()) == (2, 'nothing imported: 2 invalid')
    assert "line 3: the file answers request r4 twice, differently ('cone', then 'mug')" in err
    assert 'line 4: expected a JSON object, got list' in err


def test_a_write_failure_half_way_through_an_import_stores_none_of_it(
        tmp_path: Path, filled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from uq_autonomy.labels.store import LabelStoreError

    with LabelStore(filled) as store:
        before = store.labels()
    path = _coco_file(tmp_path, [{**GOOD, 'attributes': {'request_id': 'q1'}},
                                 {**GOOD, 'id': 2, 'attributes': {'request_id': 'q2'}}])
    original = LabelStore.put_label
    calls: list[str] = []

    def fail_on_the_second(self: LabelStore, record: LabelRecord, **kwargs: object) -> object:
        if self.path != filled:  # the import's checks, in a scratch store
            return original(self, record, **kwargs)
        calls.append(record.request_id)
        if len(calls) == 2:
            raise LabelStoreError('the disk is full while storing the label of q2', filled)
        return original(self, record, **kwargs)

    monkeypatch.setattr(LabelStore, 'put_label', fail_on_the_second)
    code, _, err = uq('labels', 'import', str(path), '--store', str(filled))
    assert code == 1 and 'the disk is full' in err and calls == ['q1', 'q2']
    monkeypatch.undo()
    with LabelStore(filled) as store:
        assert store.labels() == before  # q1, stored before the failure, was rolled back
    # The same file imports in full once the store can be written.
    code, out, _ = uq('labels', 'import', str(path), '--store', str(filled))
    assert code == 0 and out.strip() == '2 stored'


# -- a fleet's store -------------------------------------------------------------------------

def test_a_fleet_store_lists_and_exports_every_robots_labels(postgres_url: str,
                                                              tmp_path: Path) -> None:
    from uq_autonomy.labels.url import open_label_store

    with open_label_store(postgres_url) as store:
        for i, (rid, robot, label) in enumerate((('a1', 'robot-a', 'mug'),
                                                 ('b1', 'robot-b', 'cone'),
                                                 ('a2', 'robot-a', None))):
            store.add_request(PendingRequest(rid, crop_png=encode_png(pixels(i, 20, 30)),
                                             box=(1.0, 2.0, 10.0, 8.0), robot_id=robot))
            if label:
                store.answer(rid, label, 'alice')
    code, out, err = uq('labels', 'list', '--store-url', postgres_url, '--json')
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r['request_id'], r['robot_id']) for r in rows] == [('a1', 'robot-a'),
                                                                ('b1', 'robot-b')]
    code, out, err = uq('labels', 'list', '--store-url', postgres_url, '--pending')
    assert code == 0 and 'a2' in out and 'robot-a' in out
    code, out, _ = uq('labels', 'list', '--store-url', postgres_url, '--robot', 'robot-b')
    assert code == 0 and 'b1' in out and 'a1' not in out

    out_dir = tmp_path / 'fleet-coco'
    code, out, err = uq('labels', 'export', '--store-url', postgres_url, '--coco', str(out_dir))
    assert code == 0, err
    assert '2 images, 2 categories (cone, mug)' in err
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(out.strip())
    robots = {coco.imgs[a['image_id']]['robot_id']: a['attributes']['robot_id']
              for a in coco.anns.values()}
    assert robots == {'robot-a': 'robot-a', 'robot-b': 'robot-b'}
    # Re-imported into another store, the labels keep their robots.
    fresh = tmp_path / 'fresh.sqlite3'
    code, out, err = uq('labels', 'import', out.strip(), '--store-url', f'sqlite://{fresh}')
    assert code == 0, err
    with LabelStore(fresh) as copy:
        assert {r.request_id: r.robot_id for r in copy.labels()} == {'a1': 'robot-a',
                                                                    'b1': 'robot-b'}


@pytest.mark.parametrize('verb', ['list', 'export', 'serve'])
def test_a_malformed_store_url_is_one_line_and_exit_2(verb: str, tmp_path: Path) -> None:
    extra = ['--coco', str(tmp_path / 'out')] if verb == 'export' else []
    code, out, err = uq('labels', verb, '--store-url', 'mysql://host/db', *extra)
    assert code == 2 and out == ''
    assert err == "error: label store URL 'mysql://host/db': unknown scheme 'mysql'; use " \
                  "sqlite:///path.sqlite3 or postgresql://user@host:port/database\n"


def test_an_unreachable_fleet_store_is_one_line_and_exit_1(postgres_server: object) -> None:
    url = f'postgresql://uq:secret@127.0.0.1:{postgres_server.port}/missing'
    code, _, err = uq('labels', 'list', '--store-url', url)
    assert code == 1 and err.count('\n') == 1
    assert err.startswith('error: cannot connect to label store postgresql://uq:***@')
