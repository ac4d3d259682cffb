"""Synthetic dataset: format contract, splits, unknown objects, determinism for a seed."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from uq_sim.dataset import SPLITS, generate_dataset, split_counts
from uq_sim.objects import AUXILIARY_CLASSES, KNOWN_CLASSES, UNKNOWN_CLASSES


@pytest.fixture(scope='module')
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp('ds_a')
    return out, generate_dataset(out, 8, seed=3, progress=False)


def test_split_counts_sum_and_cover_small_sets():
    assert split_counts(8) == {'train': 5, 'val': 1, 'test': 1, 'test_unknown': 1}
    assert sum(split_counts(1003).values()) == 1003
    assert split_counts(10, {'train': 0.5, 'test_unknown': 0.5}) == {'train': 5,
                                                                    'test_unknown': 5}
    with pytest.raises(ValueError, match='sum to 1'):
        split_counts(10, {'train': 0.5})
    with pytest.raises(ValueError, match='unknown split'):
        split_counts(10, {'train': 0.5, 'holdout': 0.5})


def test_coco_format_contract(dataset):
    out, paths = dataset
    assert set(paths) == set(SPLITS)
    ids = []
    for split in SPLITS:
        coco = json.loads((out / split / 'annotations.json').read_text())
        cats = coco['categories']
        assert [c['name'] for c in cats] == list(KNOWN_CLASSES + UNKNOWN_CLASSES
                                                 + AUXILIARY_CLASSES)
        assert [c['id'] for c in cats] == list(range(1, len(cats) + 1))
        assert {c['name']: c['supercategory'] for c in cats}['mug'] == 'known'
        assert {c['name']: c['supercategory'] for c in cats}['torus'] == 'unknown'
        assert {c['name']: c['supercategory'] for c in cats}['rock'] == 'auxiliary'
        image_ids = set()
        for im in coco['images']:
            assert set(im) == {'id', 'file_name', 'width', 'height'}
            assert im['file_name'] == f"images/{im['id']:06d}.png"
            path = out / split / im['file_name']
            assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
            assert (im['width'], im['height']) == (320, 240)
            image_ids.add(im['id'])
        ids += sorted(image_ids)
        assert coco['annotations'], f'split {split} has no annotations'
        for k, ann in enumerate(coco['annotations'], start=1):
            assert set(ann) == {'id', 'image_id', 'category_id', 'bbox', 'area', 'iscrowd',
                                'occluded', 'truncated', 'visible_fraction'}
            assert ann['id'] == k and ann['image_id'] in image_ids and ann['iscrowd'] == 0
            x, y, w, h = ann['bbox']
            assert w >= 1 and h >= 1 and x >= 0 and y >= 0 and x + w <= 320 and y + h <= 240
            assert 0 < ann['area'] <= w * h
            assert 0.0 < ann['visible_fraction'] <= 1.0
            assert isinstance(ann['occluded'], bool) and isinstance(ann['truncated'], bool)
            # Truncated means the visible pixels reach the image border.
            touches = x == 0 or y == 0 or x + w == 320 or y + h == 240
            assert ann['truncated'] == touches
    assert ids == list(range(1, 9)), 'image ids are global and consecutive'


def test_unknown_shapes_appear_only_in_the_unknown_split(dataset):
    out, _ = dataset
    n_known, n_unknown = len(KNOWN_CLASSES), len(UNKNOWN_CLASSES)
    for split in ('val', 'test'):
        coco = json.loads((out / split / 'annotations.json').read_text())
        assert all(a['category_id'] <= n_known for a in coco['annotations'])
    # Training may hold auxiliary "other objects", never the unknown test shapes.
    coco = json.loads((out / 'train' / 'annotations.json').read_text())
    assert all(a['category_id'] <= n_known or a['category_id'] > n_known + n_unknown
               for a in coco['annotations'])
    coco = json.loads((out / 'test_unknown' / 'annotations.json').read_text())
    assert all(a['category_id'] <= n_known + n_unknown for a in coco['annotations'])
    for im in coco['images']:
        unknown = [a for a in coco['annotations']
                   if a['image_id'] == im['id'] and a['category_id'] > n_known]
        assert any(not a['occluded'] and not a['truncated'] for a in unknown)


def test_same_seed_gives_identical_files_and_other_seed_differs(dataset, tmp_path):
    out, _ = dataset
    again = tmp_path / 'again'
    generate_dataset(again, 8, seed=3, progress=False)
    for split in SPLITS:
        assert ((again / split / 'annotations.json').read_bytes()
                == (out / split / 'annotations.json').read_bytes())
    png = 'train/images/000001.png'
    assert (again / png).read_bytes() == (out / png).read_bytes()
    other = tmp_path / 'other'
    generate_dataset(other, 8, seed=4, splits=['train'], progress=False)
    assert ((other / 'train' / 'annotations.json').read_bytes()
            != (out / 'train' / 'annotations.json').read_bytes())


def test_images_are_rgb_pngs(dataset):
    import cv2

    out, _ = dataset
    coco = json.loads((out / 'train' / 'annotations.json').read_text())
    img = cv2.imread(str(out / 'train' / coco['images'][0]['file_name']), cv2.IMREAD_UNCHANGED)
    assert img.shape == (240, 320, 3) and img.dtype == np.uint8
    assert img.std() > 5.0, 'image is blank'


def test_cli_writes_the_same_dataset(dataset, tmp_path):
    out, _ = dataset
    cli = tmp_path / 'cli'
    proc = subprocess.run(
        [sys.executable, '-m', 'uq_common.cli', 'sim', 'dataset', '--out', str(cli),
         '--n', '8', '--seed', '3', '--splits', 'test_unknown', '--no-progress'],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert 'test_unknown:' in proc.stdout
    assert ((cli / 'test_unknown' / 'annotations.json').read_bytes()
            == (out / 'test_unknown' / 'annotations.json').read_bytes())
