"""The COCO reader: the layouts annotation tools export, boxes in image pixels, category
roles, and one clear error for every way a file or image breaks the format."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from uq_perception.training.coco_data import (
    CategoryRole,
    CocoFormatError,
    category_roles,
    read_coco,
    read_image,
    split_indices,
)

CATEGORIES = [{'id': 1, 'name': 'Mug', 'supercategory': 'object'},
              {'id': 2, 'name': 'box', 'supercategory': ''},
              {'id': 3, 'name': 'torus', 'supercategory': 'unknown'},
              {'id': 4, 'name': 'rock', 'supercategory': 'auxiliary'}]


def _coco(file_names: list[str], width: int = 40, height: int = 30) -> dict:
    images = [{'id': i + 1, 'file_name': name, 'width': width, 'height': height}
              for i, name in enumerate(file_names)]
    annotations = [{'id': 10 + i, 'image_id': i + 1, 'category_id': 1 + i % 4,
                    'bbox': [2, 3, 10, 8], 'iscrowd': 0} for i in range(len(file_names))]
    return {'images': images, 'annotations': annotations,
            'categories': [dict(c) for c in CATEGORIES]}


def _image(path: Path, width: int = 40, height: int = 30) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[:, :, 2] = 200  # red in BGR
    cv2.imwrite(str(path), pixels)


@pytest.mark.parametrize('layout', ['sim', 'cvat', 'label_studio', 'fiftyone', 'folder'])
def test_images_are_found_in_each_tools_layout(tmp_path, layout):
    if layout == 'sim':  # split/annotations.json, file_name images/x.png
        json_path, names = tmp_path / 'annotations.json', ['images/a.png']
        _image(tmp_path / 'images' / 'a.png')
    elif layout == 'cvat':  # annotations/instances_default.json beside images/
        json_path, names = tmp_path / 'annotations' / 'instances_default.json', ['a.png']
        _image(tmp_path / 'images' / 'a.png')
    elif layout == 'label_studio':  # result.json, file_name images/<hash>-a.png
        json_path, names = tmp_path / 'result.json', ['images/a.png']
        _image(tmp_path / 'images' / 'a.png')
    elif layout == 'fiftyone':  # labels.json beside data/
        json_path, names = tmp_path / 'labels.json', ['a.png']
        _image(tmp_path / 'data' / 'a.png')
    else:  # a folder named explicitly, file_name with a prefix it lacks
        json_path, names = tmp_path / 'export.json', ['some/where/a.png']
        _image(tmp_path / 'pictures' / 'a.png')
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(_coco(names)))
    dataset = read_coco(json_path, tmp_path / 'pictures' if layout == 'folder' else None)
    assert len(dataset) == 1 and dataset.images[0].path.is_file()
    np.testing.assert_allclose(dataset.images[0].boxes, [[7.0, 7.0, 10.0, 8.0]])
    rgb = read_image(dataset.images[0])
    assert rgb.shape == (30, 40, 3) and rgb[0, 0].tolist() == [200, 0, 0]


def test_roles_classes_and_split(tmp_path):
    names = [f'{i}.png' for i in range(8)]
    for name in names:
        _image(tmp_path / name)
    (tmp_path / 'a.json').write_text(json.dumps(_coco(names)))
    dataset = read_coco(tmp_path / 'a.json')
    roles, classes = category_roles(dataset)
    assert classes == ['Mug', 'box']
    assert roles == {1: (CategoryRole.CLASS, 0), 2: (CategoryRole.CLASS, 1),
                     3: (CategoryRole.UNKNOWN, -1), 4: (CategoryRole.AUXILIARY, -1)}
    # A model's names, matched ignoring case; --unknown and --ignore override supercategories.
    roles, classes = category_roles(dataset, ['BOX', 'mug', 'cup'], unknown=['rock'],
                                    ignored=['torus'])
    assert classes == ['BOX', 'mug', 'cup']
    assert roles[1] == (CategoryRole.CLASS, 1) and roles[2] == (CategoryRole.CLASS, 0)
    assert roles[3][0] is CategoryRole.AUXILIARY and roles[4][0] is CategoryRole.UNKNOWN
    with pytest.raises(CocoFormatError, match=r"'Mug' \(2 annotations\) are not classes"):
        category_roles(dataset, ['box', 'cup'])
    with pytest.raises(CocoFormatError, match='not in the file'):
        category_roles(dataset, unknown=['teapot'])
    with pytest.raises(CocoFormatError, match='both unknown and ignored'):
        category_roles(dataset, unknown=['rock'], ignored=['Rock'])
    train, val = split_indices(len(dataset), 0.25, seed=3)
    assert len(val) == 2 and sorted(np.r_[train, val].tolist()) == list(range(8))
    assert np.array_equal(split_indices(8, 0.25, seed=3)[1], val)
    assert len(read_coco(tmp_path / 'a.json', max_images=3)) == 3


def test_boxes_clipped_within_the_tolerance(tmp_path):
    _image(tmp_path / 'a.png')
    coco = _coco(['a.png'])
    coco['annotations'][0]['bbox'] = [-0.5, 25.0, 40.8, 5.5]
    (tmp_path / 'a.json').write_text(json.dumps(coco))
    np.testing.assert_allclose(read_coco(tmp_path / 'a.json').images[0].boxes,
                               [[20.0, 27.5, 40.0, 5.0]])


def _broken(tmp_path: Path, change) -> Path:
    _image(tmp_path / 'a.png')
    _image(tmp_path / 'b.png')
    coco = _coco(['a.png', 'b.png'])
    change(coco)
    path = tmp_path / 'a.json'
    path.write_text(json.dumps(coco) if isinstance(coco, dict) else coco)
    return path


def _set(path: tuple, value):
    def change(coco):
        target = coco
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


@pytest.mark.parametrize('change, message', [
    (_set(('images', 0, 'id'), 2), 'image id 2 appears more than once'),
    (_set(('images', 0, 'id'), 'x'), 'needs a whole number "id"'),
    (_set(('images', 0, 'width'), 0), 'needs "width" as a whole number'),
    (_set(('images', 1, 'height'), 1.5), 'needs "height" as a whole number'),
    (_set(('images', 0, 'file_name'), 'missing.png'), '1 of 2 image files not found'),
    (_set(('annotations', 0, 'image_id'), 9), 'names image 9, which is not in "images"'),
    (_set(('annotations', 0, 'category_id'), 9), 'names category 9'),
    (_set(('annotations', 0, 'bbox'), [1, 2, 3]), 'needs "bbox" as 4 numbers'),
    (_set(('annotations', 0, 'bbox'), [1, 2, 0, 3]), 'width and height > 0'),
    (_set(('annotations', 0, 'bbox'), [30, 2, 20, 3]), 'outside its 40x30 image'),
    (_set(('annotations', 0, 'bbox'), [1, 2, True, 3]), 'needs "bbox" as 4 numbers'),
    (_set(('annotations', 0, 'iscrowd'), 2), 'iscrowd 2'),
    (_set(('categories', 1, 'name'), 'MUG'), 'both named'),
    (_set(('categories', 1, 'name'), ''), 'needs a printable "name"'),
    (_set(('categories',), {}), '"categories" must be a list'),
])
def test_format_errors_name_the_entry(tmp_path, change, message):
    with pytest.raises(CocoFormatError, match=message.replace('(', r'\(').replace(')', r'\)')):
        read_coco(_broken(tmp_path, change))


@pytest.mark.parametrize('text, message', [
    ('{"images": [], "annotations": [', 'not valid JSON'),
    ('{"images": [], "annotations": [], "categories": [{"id": NaN}]}', 'not valid JSON'),
    ('{"images": [], "annotations": [], "categories": [], "x": 1e999}', 'not valid JSON'),
    ('[1, 2]', 'not a COCO instances file'),
    ('{"images": []}', 'not a COCO instances file'),
])
def test_corrupt_json(tmp_path, text, message):
    path = tmp_path / 'a.json'
    path.write_text(text)
    with pytest.raises(CocoFormatError, match=message):
        read_coco(path)
    path.write_bytes(b'\xff\xfe{}')
    with pytest.raises(CocoFormatError, match='not UTF-8'):
        read_coco(path)
    with pytest.raises(CocoFormatError, match='cannot read the annotations file'):
        read_coco(tmp_path / 'absent.json')


def test_image_content_is_checked_when_read(tmp_path):
    dataset = read_coco(_broken(tmp_path, lambda coco: None))
    _image(tmp_path / 'a.png', width=30, height=40)
    with pytest.raises(CocoFormatError, match='is 30x40 pixels but the annotations say 40x30'):
        read_image(dataset.images[0])
    (tmp_path / 'b.png').write_bytes(b'not a png')
    with pytest.raises(CocoFormatError, match='cannot read image'):
        read_image(dataset.images[1])
    with pytest.raises(CocoFormatError, match='images folder not found'):
        read_coco(tmp_path / 'a.json', tmp_path / 'nowhere')
