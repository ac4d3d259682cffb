"""COCO export and import of the label store (for retraining in CVAT, Label Studio, FiftyOne).

Export layout (CVAT's "COCO 1.0" layout)::

    DIR/images/<request_id>.png            one crop per label
    DIR/annotations/instances_default.json

Each label is one image (its crop) with one annotation: ``bbox`` is the object's box in the
crop as COCO ``[x, y, width, height]`` (the whole crop when the box is unknown),
``category_id`` refers to ``categories`` (one per distinct label, sorted by name, ids from 1).
The annotation's ``attributes`` keep the provenance (``request_id``, ``labeler``, ``time``,
``model_id``, ``track_id``, ``revision``, ``source``); CVAT shows them as attributes and
other tools ignore them. Labels without a crop have no image and are left out (counted).

So that the export serves as ground truth for ``uq eval bag`` (docs/bag_evaluation.md), it
also places each crop in its camera frame, where the store knows it:

- image ``stamp_ns``: the camera frame's header stamp, integer nanoseconds (the store keeps
  float seconds, so this is exact to a few hundred nanoseconds); absent when the store has
  no stamp (labels imported from elsewhere), so such labels match no recording;
- image ``crop_origin`` ``[x, y]``: the crop's top-left corner in the frame, and
  ``frame_width``, ``frame_height``: the frame's size (for an imported label the store takes
  the crop as its frame);
- annotation ``bbox_image``: the box in frame pixels, COCO ``[x, y, width, height]``, i.e.
  ``bbox`` shifted by ``crop_origin`` (the stored box is the detection's box clipped to the
  crop, which lies inside the frame, so this is the detection's box clipped to the frame).

``info.exhaustive`` is false: a help label names one object the robot asked about, not
every object in the frame, so the labels are partial (no AP can be computed from them).

Import reads either such a COCO file (re-imported after corrections in another tool: the
request id comes back from ``attributes.request_id``, else it is derived from the image bytes
and box so a second import of the same file is idempotent) or a JSON-lines file of answers
to pending requests, one ``{"request_id": ..., "label": ..., "labeler": ...}`` per line
(``labeler`` optional), which is a command-line way to answer help requests.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from uq_autonomy.crops import png_size
from uq_autonomy.label_store import (
    AnswerResult,
    AnswerStatus,
    LabelRecord,
    LabelStore,
    LabelValidationError,
    format_time,
)

IMAGES_DIR = 'images'
ANNOTATIONS_FILE = 'annotations/instances_default.json'


@dataclass(frozen=True)
class CocoExportSummary:
    """What :func:`export_coco` wrote."""

    directory: Path
    annotations_file: Path
    images: int
    categories: list[str]
    skipped_without_crop: list[str]


@dataclass
class ImportSummary:
    """Outcome of :func:`import_labels`, per status, with one message per refused entry."""

    counts: dict[str, int] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)

    def add(self, status: str, message: str | None = None) -> None:
        self.counts[status] = self.counts.get(status, 0) + 1
        if message:
            self.messages.append(message)

    @property
    def refused(self) -> int:
        """Entries not stored (conflicts, unknown or withdrawn requests, invalid entries)."""
        ok = {AnswerStatus.STORED.value, AnswerStatus.DUPLICATE.value,
              AnswerStatus.OVERRULED.value}
        return sum(n for status, n in self.counts.items() if status not in ok)


def coco_dataset(records: list[LabelRecord]) -> tuple[dict[str, Any], list[LabelRecord],
                                                      list[str]]:
    """The COCO dictionary for ``records``; also returns the records exported and the
    request ids skipped for lack of a crop."""
    exported = [r for r in records if r.crop_png]
    skipped = [r.request_id for r in records if not r.crop_png]
    names = sorted({r.label for r in exported})
    category_id = {name: i + 1 for i, name in enumerate(names)}
    images, annotations = [], []
    for r in exported:
        try:
            width, height = png_size(r.crop_png or b'')
        except ValueError:
            skipped.append(r.request_id)
            continue
        image: dict[str, Any] = {
            'id': r.id, 'file_name': f'{r.request_id}.png', 'width': width,
            'height': height, 'date_captured': format_time(r.time),
            'request_id': r.request_id}
        # The store's defaults (no image size, stamp 0) mean the frame is unknown; a stamp
        # without the crop's place in its frame would put crop pixels into frame pixels.
        if r.image_size is not None:
            image['crop_origin'] = [float(r.crop_origin[0]), float(r.crop_origin[1])]
            image['frame_width'], image['frame_height'] = (int(v) for v in r.image_size)
            if r.stamp > 0.0:
                image['stamp_ns'] = _stamp_ns(r.stamp)
        images.append(image)
        x, y, w, h = r.box if r.box is not None else (0.0, 0.0, float(width), float(height))
        annotation: dict[str, Any] = {
            'id': r.id, 'image_id': r.id, 'category_id': category_id[r.label],
            'bbox': [round(x, 2), round(y, 2), round(w, 2), round(h, 2)],
            'area': round(w * h, 2), 'iscrowd': 0, 'segmentation': [],
            'attributes': {'request_id': r.request_id, 'labeler': r.labeler,
                           'time': format_time(r.time), 'model_id': r.model_id,
                           'track_id': r.track_id, 'revision': r.revision,
                           'source': r.source},
        }
        if r.box is not None and r.image_size is not None:
            ox, oy = r.crop_origin
            annotation['bbox_image'] = [round(x + ox, 2), round(y + oy, 2),
                                        round(w, 2), round(h, 2)]
        annotations.append(annotation)
    dataset = {
        'info': {'description': 'uq_autonomy help-request labels',
                 'date_created': format_time(datetime.now().timestamp()), 'version': '1.0',
                 'exhaustive': False},
        'licenses': [],
        'categories': [{'id': category_id[n], 'name': n, 'supercategory': 'object'}
                       for n in names],
        'images': images,
        'annotations': annotations,
    }
    kept = {img['request_id'] for img in images}
    return dataset, [r for r in exported if r.request_id in kept], skipped


def _stamp_ns(stamp: float) -> int:
    """Float seconds as integer nanoseconds. Seconds and fraction apart: the product
    ``stamp * 1e9`` would be a float past 2**53, rounded to 256 ns."""
    seconds = math.floor(stamp)
    return seconds * 10**9 + int(round((stamp - seconds) * 1e9))


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f'.{path.name}.', dir=path.parent)
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export_coco(store: LabelStore, directory: str | os.PathLike[str], *,
                overwrite: bool = False) -> CocoExportSummary:
    """Write the store's labels as a COCO dataset under ``directory`` (layout above).

    Raises
    ------
    FileExistsError
        When ``directory`` holds files and ``overwrite`` is False.
    LabelStoreError
        When the store cannot be read.
    """
    out = Path(directory)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f'{out} is not empty; choose an empty directory or overwrite')
    dataset, exported, skipped = coco_dataset(store.labels())
    for r in exported:
        _atomic_write(out / IMAGES_DIR / f'{r.request_id}.png', r.crop_png or b'')
    annotations = out / ANNOTATIONS_FILE
    _atomic_write(annotations, json.dumps(dataset, indent=1).encode())
    return CocoExportSummary(out, annotations, len(exported),
                             [c['name'] for c in dataset['categories']], skipped)


def _record_result(summary: ImportSummary, where: str, result: AnswerResult) -> None:
    message = None if result.accepted else f'{where}: {result.message}'
    summary.add(result.status.value, message)


def _import_coco(store: LabelStore, path: Path, data: dict[str, Any], labeler: str | None,
                 overrule: bool, summary: ImportSummary) -> None:
    categories = {c['id']: c['name'] for c in data.get('categories', [])}
    images = {img['id']: img for img in data.get('images', [])}
    now = datetime.now().timestamp()
    for index, ann in enumerate(data.get('annotations', [])):
        where = f'{path.name} annotation {ann.get("id", index)}'
        try:
            image = images[ann['image_id']]
            label = categories[ann['category_id']]
            crop = _find_image(path, image['file_name']).read_bytes()
            attributes = ann.get('attributes') or {}
            bbox = [float(v) for v in ann['bbox']]
            request_id = attributes.get('request_id') or image.get('request_id') or (
                'import-' + hashlib.sha256(
                    crop + json.dumps([label, bbox]).encode()).hexdigest()[:24])
            record = LabelRecord(
                request_id=request_id, label=label,
                labeler=labeler or attributes.get('labeler') or 'import',
                time=_parse_time(attributes.get('time')) or now,
                model_id=attributes.get('model_id') or '', crop_png=crop,
                box=tuple(bbox),  # type: ignore[arg-type]
                track_id=int(attributes.get('track_id', -1)), source='import')
            result = store.put_label(record, overrule=overrule)
        except (KeyError, TypeError, ValueError, OSError) as err:
            summary.add('invalid', f'{where}: {_describe(err)}')
            continue
        _record_result(summary, where, result)


def _import_answers(store: LabelStore, path: Path, labeler: str | None, overrule: bool,
                    summary: ImportSummary) -> None:
    with path.open(encoding='utf-8') as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f'{path.name} line {number}'
            try:
                entry = json.loads(line)
                result = store.answer(entry['request_id'], entry['label'],
                                      labeler or entry.get('labeler') or 'import',
                                      overrule=overrule, source='import')
            except (KeyError, TypeError, ValueError) as err:
                summary.add('invalid', f'{where}: {_describe(err)}')
                continue
            _record_result(summary, where, result)


def _describe(err: Exception) -> str:
    if isinstance(err, KeyError):
        return f'missing field or reference {err}'
    if isinstance(err, LabelValidationError):
        return str(err)
    if isinstance(err, OSError):
        return f'cannot read {err.filename}: {err.strerror}'
    return f'{type(err).__name__}: {err}'


def _find_image(annotations_path: Path, file_name: str) -> Path:
    """COCO ``file_name`` next to the JSON, in ``images/`` beside it or one level up (the
    export layout), whichever exists."""
    name = Path(file_name)
    if name.is_absolute() or '..' in name.parts:
        raise ValueError(f'image file name {file_name!r} must be a relative path inside the '
                         f'dataset')
    here = annotations_path.parent
    for candidate in (here / name, here / IMAGES_DIR / name, here.parent / IMAGES_DIR / name):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(2, 'image not found', str(here.parent / IMAGES_DIR / name))


def _parse_time(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace('Z', '+00:00')).timestamp()
    except ValueError:
        return None


def import_labels(store: LabelStore, path: str | os.PathLike[str], *,
                  labeler: str | None = None, overrule: bool = False) -> ImportSummary:
    """Import a COCO annotations file (``.json``) or a JSON-lines answers file (``.jsonl``).

    Every entry is its own transaction: a refused or invalid entry is reported in the
    summary and the rest still go in.

    Raises
    ------
    ValueError
        When the file is neither valid COCO JSON nor JSON lines.
    OSError
        When it cannot be read.
    LabelStoreError
        When the store cannot be written (the entries before the failure are stored).
    """
    p = Path(path)
    summary = ImportSummary()
    if p.suffix.lower() == '.jsonl':
        _import_answers(store, p, labeler, overrule, summary)
        return summary
    try:
        data = json.loads(p.read_text(encoding='utf-8'))
    except json.JSONDecodeError as err:
        raise ValueError(f'{p} is not valid JSON ({err}); expected a COCO annotations file '
                         f'or a .jsonl file of answers') from err
    if not isinstance(data, dict) or not {'images', 'annotations', 'categories'} <= set(data):
        raise ValueError(f'{p} is not a COCO annotations file (it needs images, annotations '
                         f'and categories)')
    _import_coco(store, p, data, labeler, overrule, summary)
    return summary

