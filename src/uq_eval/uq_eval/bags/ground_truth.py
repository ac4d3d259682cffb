"""Ground truth for ``uq eval bag`` from a COCO annotations file (ROS-free).

Two producers write such files (docs/bag_evaluation.md):

- ``uq sim record`` writes ``<bag>/ground_truth.json``: one image per frame, every visible
  object annotated, ``info.exhaustive`` true;
- ``uq labels export`` (the ask-for-help loop) writes one crop per label, placed in its
  frame by ``stamp_ns``, ``crop_origin`` and ``bbox_image``; ``info.exhaustive`` is false
  because only the objects the robot asked about are labelled.

Each image carries ``stamp_ns``, the header stamp of its camera frame in integer
nanoseconds. Annotations give the box in frame pixels: ``bbox_image`` when present, else
``bbox`` (the image is then the frame itself); an annotation on a crop (its image has a
``crop_origin``) without ``bbox_image`` cannot be placed and is left out, counted. A label
belongs to the bag frame whose stamp is within :data:`STAMP_TOLERANCE_NS` of its own (the
help store keeps float seconds, which round the nanoseconds; frames are milliseconds apart,
so no label can fall to the wrong frame). The whole file is loaded: it holds a few numbers
per object, not images.
"""

from __future__ import annotations

import json
import reprlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

STAMP_TOLERANCE_NS = 1_000
# Box coordinates and sizes, pixels: far beyond any camera frame (the evaluator caps frames
# at 4096 x 4096 pixels), and small enough that every check and the IoU arithmetic stay in
# float range (a JSON integer can be arbitrarily large).
MAX_BOX_PIXELS = 1_000_000
# Stamps are compared as int64 nanoseconds.
MAX_STAMP_NS = 2**63 - 1


class GroundTruthError(Exception):
    """A ground-truth file cannot be used; the message names the file and the problem."""


def is_ground_truth_file(argument: str) -> bool:
    """Whether ``--ground-truth ARGUMENT`` names a COCO file (an existing file, or a name
    ending in ``.json``) rather than a topic of the bag."""
    return argument.lower().endswith('.json') or Path(argument).is_file()


@dataclass(frozen=True)
class FrameTruth:
    """The labelled objects of one frame: boxes as ``(center_x, center_y, width, height)``
    in frame pixels (as ``uq_msgs/Detection``), and their class names."""

    boxes: np.ndarray
    classes: list[str]


@dataclass
class CocoGroundTruth:
    """Labels of a COCO file grouped by frame stamp; :meth:`take` finds a frame's labels."""

    path: Path
    exhaustive: bool
    frames: dict[int, FrameTruth]
    notes: list[str] = field(default_factory=list)
    _stamps: np.ndarray = field(init=False, repr=False)
    _matched: set[int] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self._stamps = np.array(sorted(self.frames), dtype=np.int64)

    def take(self, stamp_ns: int) -> FrameTruth | None:
        """The labels of the frame stamped ``stamp_ns``, or ``None`` when it has none."""
        i = int(np.searchsorted(self._stamps, stamp_ns))
        near = [int(self._stamps[j]) for j in (i - 1, i) if 0 <= j < len(self._stamps)]
        near = [s for s in near if abs(s - stamp_ns) <= STAMP_TOLERANCE_NS]
        if not near:
            return None
        best = min(near, key=lambda s: abs(s - stamp_ns))
        self._matched.add(best)
        return self.frames[best]

    def unmatched(self) -> int:
        """Labelled stamps that no frame taken so far matched."""
        return len(self.frames) - len(self._matched)


def _problem(path: Path, text: str) -> GroundTruthError:
    return GroundTruthError(f'ground truth {path}: {text}')


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_id(value: Any) -> bool:
    """Whether ``value`` can name an image or category: COCO uses integers; strings do no
    harm. Anything else (a list, an object) cannot be looked up."""
    return _is_int(value) or isinstance(value, str)


def _box(path: Path, annotation: dict, key: str) -> tuple[float, float, float, float]:
    value = annotation.get(key)
    numbers = value if isinstance(value, list) else []
    # Compared before any conversion: Python compares a huge int or NaN with a float
    # exactly (NaN fails), where float() would overflow.
    ok = (len(numbers) == 4
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers)
          and all(0.0 <= v <= MAX_BOX_PIXELS for v in numbers))
    if not ok:
        raise _problem(path, f'annotation {reprlib.repr(annotation.get("id"))}: {key} must '
                             f'be 4 finite numbers >= 0 and <= {MAX_BOX_PIXELS} ([x, y, '
                             f'width, height] in pixels), got {reprlib.repr(value)}')
    x, y, w, h = (float(v) for v in numbers)
    return x + w / 2.0, y + h / 2.0, w, h


def _read(path: Path) -> dict:
    if not path.exists():
        raise _problem(path, 'does not exist')
    if path.is_dir():
        raise _problem(path, 'is a directory, not a COCO annotations file')
    try:
        data = json.loads(path.read_text(encoding='utf-8'))
    except OSError as err:
        raise _problem(path, f'cannot be read ({err.strerror})') from None
    except UnicodeDecodeError:
        raise _problem(path, 'is not a text file (expected COCO JSON)') from None
    except json.JSONDecodeError as err:
        raise _problem(path, f'is not valid JSON ({err.msg} at line {err.lineno}, column '
                             f'{err.colno})') from None
    except RecursionError:
        raise _problem(path, 'is nested too deeply to be a COCO annotations file') from None
    except ValueError as err:  # an integer of more digits than Python converts
        raise _problem(path, f'is not usable JSON ({err})') from None
    if not isinstance(data, dict) or not all(
            isinstance(data.get(k), list) for k in ('images', 'annotations', 'categories')):
        raise _problem(path, 'is not a COCO annotations file (it needs "images", '
                             '"annotations" and "categories" lists)')
    return data


def load_coco_ground_truth(path: str | Path) -> CocoGroundTruth:
    """Read and check a COCO ground-truth file (see the module docstring).

    Raises
    ------
    GroundTruthError
        When the file is missing, not JSON, not COCO, has an invalid box, stamp or
        reference, or has no stamped image at all.
    """
    path = Path(path)
    data = _read(path)
    info = data.get('info') or {}
    exhaustive = info.get('exhaustive', False) if isinstance(info, dict) else False
    if not isinstance(exhaustive, bool):
        raise _problem(path, f'info.exhaustive must be true or false, got {exhaustive!r}')
    categories: dict[Any, str] = {}
    for index, category in enumerate(data['categories']):
        if not (isinstance(category, dict) and _is_id(category.get('id'))
                and isinstance(category.get('name'), str)):
            raise _problem(path, f'category {index} needs an "id" (an integer or string) '
                                 'and a string "name"')
        categories[category['id']] = category['name']
    images: dict[Any, dict] = {}
    for index, image in enumerate(data['images']):
        if not (isinstance(image, dict) and _is_id(image.get('id'))):
            raise _problem(path, f'image {index} needs an "id" (an integer or string)')
        stamp = image.get('stamp_ns')
        if stamp is not None and not (_is_int(stamp) and 0 <= stamp <= MAX_STAMP_NS):
            raise _problem(path, f'image {reprlib.repr(image["id"])}: stamp_ns must be a '
                                 f'non-negative integer below 2**63 (int64 nanoseconds), got '
                                 f'{reprlib.repr(stamp)}')
        images[image['id']] = image
    unstamped = sum(1 for image in images.values() if image.get('stamp_ns') is None)
    if images and unstamped == len(images):
        raise _problem(path, 'no image has a "stamp_ns" (the camera frame\'s stamp in '
                             'integer nanoseconds), so no label can be matched to a bag '
                             'frame; export the labels again with `uq labels export`')
    boxes: dict[int, list[tuple[float, float, float, float]]] = {}
    classes: dict[int, list[str]] = {}
    unplaced = 0
    for index, annotation in enumerate(data['annotations']):
        if not isinstance(annotation, dict):
            raise _problem(path, f'annotation {index} is not an object')
        where = f'annotation {reprlib.repr(annotation.get("id", index))}'
        image_id, category_id = annotation.get('image_id'), annotation.get('category_id')
        image = images.get(image_id) if _is_id(image_id) else None
        if image is None:
            raise _problem(path, f'{where}: image_id {reprlib.repr(image_id)} is not an image '
                                 'of the file')
        name = categories.get(category_id) if _is_id(category_id) else None
        if name is None:
            raise _problem(path, f'{where}: category_id {reprlib.repr(category_id)} is not a '
                                 'category of the file')
        if 'bbox_image' in annotation:
            box = _box(path, annotation, 'bbox_image')
        elif 'crop_origin' in image:
            unplaced += 1
            continue
        else:
            box = _box(path, annotation, 'bbox')
        stamp = image.get('stamp_ns')
        if stamp is None:
            continue
        boxes.setdefault(stamp, []).append(box)
        classes.setdefault(stamp, []).append(name)
    frames = {stamp: FrameTruth(np.array(boxes[stamp], dtype=np.float64).reshape(-1, 4),
                                classes[stamp]) for stamp in boxes}
    # Exhaustively labelled frames without objects are ground truth too ("nothing here").
    if exhaustive:
        for image in images.values():
            stamp = image.get('stamp_ns')
            if stamp is not None and stamp not in frames:
                frames[stamp] = FrameTruth(np.zeros((0, 4)), [])
    notes = []
    if unstamped:
        notes.append(f'ground truth {path}: {unstamped} image(s) without stamp_ns left out')
    if unplaced:
        notes.append(f'ground truth {path}: {unplaced} annotation(s) on crops without '
                     'bbox_image (no box in frame pixels) left out')
    return CocoGroundTruth(path, exhaustive, frames, notes)
