"""COCO export and import of the label store (for retraining in CVAT, Label Studio, FiftyOne).

Export layout (CVAT's "COCO 1.0" layout)::

    DIR/images/<request_id>.png            one crop per label
    DIR/annotations/instances_default.json

Each label is one image (its crop) with one annotation: ``bbox`` is the object's box in the
crop as COCO ``[x, y, width, height]`` (the whole crop when the box is unknown),
``category_id`` refers to ``categories`` (one per distinct label, sorted by name, ids from 1).
The annotation's ``attributes`` keep the provenance (``request_id``, ``robot_id``, ``labeler``,
``time``, ``model_id``, ``track_id``, ``revision``, ``source``); CVAT shows them as attributes and
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

Import is all or nothing (one transaction, rolled back unless every entry is accepted) and
reads either such a COCO file (re-imported after corrections in another tool: the
request id comes back from ``attributes.request_id``, else it is derived from the image bytes
and box so a second import of the same file is idempotent) or a JSON-lines file of answers
to pending requests, one ``{"request_id": ..., "label": ..., "labeler": ...}`` per line
(``labeler`` optional), which is a command-line way to answer help requests.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from uq_autonomy.help.crops import png_size
from uq_autonomy.labels.store import AnswerStatus, LabelRecord, LabelStoreBase, format_time
from uq_autonomy.labels.validation import (
    MAX_CROP_BYTES,
    LabelValidationError,
    validate_label,
    validate_labeler,
    validate_request_id,
    validate_robot_id,
)
from uq_common.json_text import parse_json

IMAGES_DIR = 'images'
ANNOTATIONS_FILE = 'annotations/instances_default.json'
#: Largest import file read (bytes). An export's JSON is about 1 KB per label, crops are
#: separate files, so this is far above any real file and keeps a hostile one out of memory.
MAX_IMPORT_BYTES = 64 * 1024 * 1024


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
    #: True when an entry was invalid or refused, so the store was left unchanged.
    stored_nothing: bool = False

    def add(self, status: str, message: str | None = None) -> None:
        self.counts[status] = self.counts.get(status, 0) + 1
        if message:
            self.messages.append(message)

    @property
    def invalid(self) -> int:
        """Entries that break the file format or the store's rules."""
        return self.counts.get('invalid', 0)

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
            'request_id': r.request_id, 'robot_id': r.robot_id}
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
            'attributes': {'request_id': r.request_id, 'robot_id': r.robot_id,
                           'labeler': r.labeler,
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


def export_coco(store: LabelStoreBase, directory: str | os.PathLike[str], *,
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


class _ImportRefused(Exception):
    """An entry was invalid or refused: roll the import's transaction back."""


@dataclass(frozen=True)
class _Entry:
    """One checked entry of an import file: a COCO label (``record``) or an answer."""

    where: str
    request_id: str
    label: str
    labeler: str
    record: LabelRecord | None = None


def _read_import_text(path: Path) -> str:
    size = path.stat().st_size
    if size > MAX_IMPORT_BYTES:
        raise ValueError(f'{path} is {size} bytes; an import file may have at most '
                         f'{MAX_IMPORT_BYTES} (the crops are separate files)')
    try:
        return path.read_bytes().decode('utf-8')
    except UnicodeDecodeError as err:
        raise ValueError(f'{path} is not UTF-8 text ({err.reason} at byte {err.start})') from None


def _objects(path: Path, data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = data[key]
    if not isinstance(items, list):
        raise ValueError(f'{path}: "{key}" must be a list, got {type(items).__name__}')
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f'{path}: {key}[{index}] must be an object, got '
                             f'{type(item).__name__}')
    return items


def _by_id(path: Path, items: list[dict[str, Any]], what: str) -> dict[int | str, Any]:
    """``items`` keyed by their ``id``; a missing, non-scalar or repeated id is an error
    (with a repeated id, which entry an annotation means is a guess)."""
    out: dict[int | str, Any] = {}
    for index, item in enumerate(items):
        key = item.get('id')
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise ValueError(f'{path}: {what} {index} needs an integer or string "id", got '
                             f'{_shown(key)}')
        if key in out:
            raise ValueError(f'{path}: {what} id {_shown(key)} appears more than once')
        out[key] = item
    return out


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + '...'


def _bbox(value: object) -> tuple[float, float, float, float]:
    if not isinstance(value, list) or len(value) != 4 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise ValueError(f'bbox must be 4 numbers [x, y, width, height], got {_shown(value)}')
    x, y, w, h = (float(v) for v in value)
    if not all(math.isfinite(v) for v in (x, y, w, h)) or w < 0.0 or h < 0.0:
        raise ValueError(f'bbox must be finite with width and height >= 0, got '
                         f'{_shown(value)}')
    return x, y, w, h


def _track_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -2**63 <= value < 2**63:
        raise ValueError(f'track_id must be a 64-bit integer, got {_shown(value)}')
    return value


def _read_crop(annotations_path: Path, file_name: object) -> bytes:
    if not isinstance(file_name, str):
        raise ValueError(f'image file_name must be a string, got {_shown(file_name)}')
    image_path = _find_image(annotations_path, file_name)
    size = image_path.stat().st_size
    if size > MAX_CROP_BYTES:
        raise ValueError(f'{image_path} is {size} bytes; a crop may have at most '
                         f'{MAX_CROP_BYTES}')
    return image_path.read_bytes()


def _coco_entries(path: Path, data: dict[str, Any], labeler: str | None,
                  summary: ImportSummary) -> list[_Entry]:
    """Every annotation as a checked label; an invalid one is counted in ``summary``."""
    categories = {}
    for key, category in _by_id(path, _objects(path, data, 'categories'), 'category').items():
        try:
            categories[key] = validate_label(category.get('name'))
        except LabelValidationError as err:
            raise ValueError(f'{path}: category {_shown(key)}: {err}') from None
    images = _by_id(path, _objects(path, data, 'images'), 'image')
    annotations = _objects(path, data, 'annotations')
    _by_id(path, annotations, 'annotation')
    now = datetime.now().timestamp()
    entries = []
    labelled: dict[str, str] = {}
    for ann in annotations:
        where = f'{path.name} annotation {_shown(ann["id"])}'
        try:
            image = images[ann['image_id']]
            label = categories[ann['category_id']]
            crop = _read_crop(path, image.get('file_name'))
            attributes = ann.get('attributes') or {}
            if not isinstance(attributes, dict):
                raise ValueError(f'attributes must be an object, got {_shown(attributes)}')
            bbox = _bbox(ann.get('bbox'))
            request_id = validate_request_id(
                attributes.get('request_id') or image.get('request_id') or (
                    'import-' + hashlib.sha256(
                        crop + json.dumps([label, bbox]).encode()).hexdigest()[:24]))
            record = LabelRecord(
                request_id=request_id, label=label,
                labeler=labeler or attributes.get('labeler') or 'import',
                time=_parse_time(attributes.get('time')) or now,
                model_id=attributes.get('model_id') or '', crop_png=crop, box=bbox,
                track_id=_track_id(attributes.get('track_id', -1)), source='import',
                robot_id=validate_robot_id(attributes.get('robot_id') or ''))
        except (KeyError, TypeError, ValueError, OSError) as err:
            summary.add('invalid', f'{where}: {_describe(err)}')
            continue
        if labelled.setdefault(request_id, label) != label:
            summary.add('invalid', f'{where}: the file labels request {request_id} '
                                   f'twice, differently')
            continue
        entries.append(_Entry(where, request_id, label, record.labeler, record))
    return entries


def _answer_entries(path: Path, text: str, labeler: str | None,
                    summary: ImportSummary) -> list[_Entry]:
    """Every line as a checked answer; an invalid one is counted in ``summary``."""
    entries = []
    answered: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f'{path.name} line {number}'
        try:
            entry = parse_json(line)
            if not isinstance(entry, dict):
                raise ValueError(f'expected a JSON object, got {type(entry).__name__}')
            rid = validate_request_id(entry['request_id'])
            label = validate_label(entry['label'])
            who = validate_labeler(labeler or entry.get('labeler') or 'import')
        except (KeyError, TypeError, ValueError) as err:
            summary.add('invalid', f'{where}: {_describe(err)}')
            continue
        if answered.setdefault(rid, label) != label:
            summary.add('invalid', f'{where}: the file answers request {rid} twice, '
                                   f"differently ('{answered[rid]}', then '{label}')")
            continue
        entries.append(_Entry(where, rid, label, who))
    return entries


def _describe(err: Exception) -> str:
    if isinstance(err, KeyError):
        return f'missing field or reference {err}'
    if isinstance(err, json.JSONDecodeError):
        return f'not valid JSON ({err})'
    if isinstance(err, ValueError):
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


def import_labels(store: LabelStoreBase, path: str | os.PathLike[str], *,
                  labeler: str | None = None, overrule: bool = False) -> ImportSummary:
    """Import a COCO annotations file (``.json``) or a JSON-lines answers file (``.jsonl``).

    All or nothing: every entry goes to the store, whose rules accept or refuse it, inside
    one transaction; when one is invalid or refused, the summary lists them all and the
    transaction is rolled back (``summary.stored_nothing``).

    Raises
    ------
    ValueError
        When the file is larger than :data:`MAX_IMPORT_BYTES`, not UTF-8, not valid JSON
        (NaN, Infinity and overflowing numbers included) or not COCO-shaped; the message
        names the file.
    OSError
        When it cannot be read.
    LabelStoreError
        When the store cannot be read or written; nothing is stored then (the entries are
        written in one transaction).
    """
    p = Path(path)
    summary = ImportSummary()
    text = _read_import_text(p)
    answers = p.suffix.lower() == '.jsonl'
    if answers:
        entries = _answer_entries(p, text, labeler, summary)
    else:
        try:
            data = parse_json(text)
        except ValueError as err:
            raise ValueError(f'{p} is not valid JSON ({err}); expected a COCO annotations '
                             f'file or a .jsonl file of answers') from None
        if not isinstance(data, dict) or not {'images', 'annotations', 'categories'} <= set(data):
            raise ValueError(f'{p} is not a COCO annotations file (it needs images, '
                             f'annotations and categories)')
        entries = _coco_entries(p, data, labeler, summary)
    # Every entry goes to the store, whose own rules accept or refuse it, inside one
    # transaction that is rolled back unless the whole file is accepted.
    accepted: list[str] = []
    with contextlib.suppress(_ImportRefused), store.batch(f'importing {p}'):
        for entry in entries:
            try:
                if entry.record is not None:
                    result = store.put_label(entry.record, overrule=overrule)
                else:
                    result = store.answer(entry.request_id, entry.label, entry.labeler,
                                          overrule=overrule, source='import')
            except LabelValidationError as err:
                summary.add('invalid', f'{entry.where}: {err}')
                continue
            if result.accepted:
                accepted.append(result.status.value)
            else:
                summary.add(result.status.value, f'{entry.where}: {result.message}')
        if summary.counts:
            raise _ImportRefused
    if summary.counts:
        summary.stored_nothing = True
    else:
        for status in accepted:
            summary.add(status)
    return summary
