"""COCO instances files as annotation tools export them, read and checked by rule (ROS-free).

CVAT ("COCO 1.0"), Label Studio ("COCO"), FiftyOne (``COCODetectionDataset``),
``uq labels export`` and ``uq sim dataset`` all write an instances JSON (``images``,
``annotations``, ``categories``) beside a folder of images. :func:`read_coco` reads one,
checks every field it uses, finds every image file and keeps the boxes in the image's own
pixels; :func:`read_image` reads an image only when it is needed and checks that its size
is the one the file states. Any violation is a :class:`CocoFormatError` (a ``ValueError``)
whose one-line message names the file and the entry.

Where an image is looked for: an absolute ``file_name`` as it is; otherwise, with an images
folder given, ``IMAGES/file_name`` then ``IMAGES/<base name>`` (Label Studio prefixes
``images/``); without one, relative to the JSON's folder, its ``images/`` and ``data/``
subfolders (``uq sim dataset``, FiftyOne) and the ``images/`` folder beside it (CVAT's
``annotations/instances_default.json``).

Roles of categories (:func:`category_roles`): a category is one of the detector's classes
unless its supercategory is ``unknown`` (objects no class fits: the GP should flag them) or
``auxiliary`` (other objects: found, never classified), or the caller names it unknown or
ignored. This is the convention of ``uq sim dataset``, whose classes have supercategory
``known``; a tool's own export (supercategory ``object``, ``none`` or empty) makes every
category a class.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from uq_common.json_text import parse_json
from uq_common.str_enum import StrEnum

UNKNOWN_SUPERCATEGORY = 'unknown'
AUXILIARY_SUPERCATEGORY = 'auxiliary'
#: Largest instances file read (bytes): COCO 2017's train file is under 0.5 GB.
MAX_ANNOTATIONS_BYTES = 1 << 30
#: Largest image side accepted (pixels), as stated in the file and as decoded.
MAX_IMAGE_SIDE = 16384
#: How far (pixels) a box may reach past the image border before it is an error: tools
#: round box corners, and the sliver outside is clipped off.
BORDER_TOLERANCE = 1.0
#: Objects smaller than this (pixels, shorter side) carry too little appearance to teach a
#: class.
MIN_CLASS_SIDE = 4.0
_SHOWN = 60


class CocoFormatError(ValueError):
    """A COCO file or one of its images cannot be used; the message says which and why."""


class CategoryRole(StrEnum):
    """What a category's objects are to a detector."""

    CLASS = 'class'  # one of the detector's classes
    UNKNOWN = 'unknown'  # no class fits: scored as out-of-distribution objects
    AUXILIARY = 'auxiliary'  # found but never classified (training: outlier exposure)


@dataclass(frozen=True)
class CocoCategory:
    """One entry of ``categories``."""

    id: int
    name: str
    supercategory: str


@dataclass(frozen=True)
class CocoImage:
    """One image and its annotations, boxes in the image's pixels.

    Attributes
    ----------
    id : int
        The image's COCO id.
    path : Path
        The image file (exists when the file was read).
    width, height : int
        Size stated in the file; :func:`read_image` checks the pixels against it.
    boxes : np.ndarray
        ``(K, 4)`` float32 ``center_x, center_y, width, height``, clipped to the image.
    category_ids : np.ndarray
        ``(K,)`` int64 category ids.
    occluded, truncated, crowd : np.ndarray
        ``(K,)`` bool: the ``occluded``/``truncated`` flags (top level, as ``uq sim
        dataset`` writes them, or in ``attributes``, as CVAT does) and ``iscrowd``.
    """

    id: int
    path: Path
    width: int
    height: int
    boxes: np.ndarray
    category_ids: np.ndarray
    occluded: np.ndarray
    truncated: np.ndarray
    crowd: np.ndarray


@dataclass(frozen=True)
class CocoDataset:
    """A checked instances file: its categories and its images, in id order.

    Attributes
    ----------
    annotations_path : Path
        The JSON file.
    sha256 : str
        Digest of its bytes (provenance of what is fitted or trained on it).
    categories : dict[int, CocoCategory]
        Every category by id.
    images : list[CocoImage]
        Every image, sorted by id.
    """

    annotations_path: Path
    sha256: str
    categories: dict[int, CocoCategory]
    images: list[CocoImage]

    def __len__(self) -> int:
        return len(self.images)

    def annotation_counts(self) -> dict[int, int]:
        """Number of annotations of each category id (0 for unused categories)."""
        counts = dict.fromkeys(self.categories, 0)
        for image in self.images:
            for cid in image.category_ids.tolist():
                counts[cid] += 1
        return counts


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + '...'


def _is_id(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _objects(path: Path, data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = data[key]
    if not isinstance(items, list):
        raise CocoFormatError(f'{path}: "{key}" must be a list, got {type(items).__name__}')
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise CocoFormatError(f'{path}: {key}[{index}] must be an object, got '
                                  f'{type(item).__name__}')
    return items


def _unique_ids(path: Path, items: list[dict[str, Any]], what: str) -> list[int]:
    ids: list[int] = []
    seen: set[int] = set()
    for index, item in enumerate(items):
        key: object = item.get('id')
        if not _is_id(key):
            raise CocoFormatError(f'{path}: {what} {index} needs a whole number "id" in '
                                  f'[0, 2**63), got {_shown(key)}')
        if key in seen:
            raise CocoFormatError(f'{path}: {what} id {_shown(key)} appears more than once')
        seen.add(key)
        ids.append(key)
    return ids


def _text(path: Path, where: str, value: object, field: str, required: bool = True) -> str:
    if value is None and not required:
        return ''
    if not isinstance(value, str) or (required and not value.strip()) or len(value) > 4096 \
            or not value.isprintable():
        raise CocoFormatError(f'{path}: {where} needs a printable "{field}" string, got '
                              f'{_shown(value)}')
    return value.strip()


def _side(path: Path, where: str, image: dict[str, Any], field: str) -> int:
    value = image.get(field)
    if isinstance(value, bool) or not isinstance(value, int) \
            or not 1 <= value <= MAX_IMAGE_SIDE:
        raise CocoFormatError(f'{path}: {where} needs "{field}" as a whole number of pixels in '
                              f'[1, {MAX_IMAGE_SIDE}], got {_shown(value)}')
    return value


def _flag(ann: dict[str, Any], name: str) -> bool:
    attributes = ann.get('attributes')
    value = ann.get(name, attributes.get(name) if isinstance(attributes, dict) else None)
    return value is True or value == 1


def _box(path: Path, where: str, value: object, width: int, height: int
         ) -> tuple[float, float, float, float]:
    """COCO ``[x, y, w, h]`` checked and clipped; returns centre-size."""
    if not isinstance(value, list) or len(value) != 4 or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        raise CocoFormatError(f'{path}: {where} needs "bbox" as 4 numbers [x, y, width, '
                              f'height], got {_shown(value)}')
    x, y, w, h = (float(v) for v in value)
    if not all(math.isfinite(v) for v in (x, y, w, h)) or w <= 0.0 or h <= 0.0:
        raise CocoFormatError(f'{path}: {where} has bbox {_shown(value)}; it must be finite '
                              'with width and height > 0')
    tol = BORDER_TOLERANCE
    if x < -tol or y < -tol or x + w > width + tol or y + h > height + tol:
        raise CocoFormatError(f'{path}: {where} has bbox {_shown(value)} outside its '
                              f'{width}x{height} image')
    x1, y1 = max(x, 0.0), max(y, 0.0)
    x2, y2 = min(x + w, float(width)), min(y + h, float(height))
    if x2 <= x1 or y2 <= y1:
        raise CocoFormatError(f'{path}: {where} has bbox {_shown(value)} with no area inside '
                              f'its {width}x{height} image')
    return (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1


def image_candidates(annotations_path: Path, file_name: str,
                     images_dir: Path | None = None) -> list[Path]:
    """Where an image of ``file_name`` is looked for, in order (module docstring)."""
    name = Path(file_name.replace('\\', '/'))
    if name.is_absolute():
        return [name] + ([images_dir / name.name] if images_dir is not None else [])
    if images_dir is not None:
        return [images_dir / name, images_dir / name.name]
    here = annotations_path.parent
    return [here / name, here / 'images' / name, here / 'data' / name,
            here.parent / 'images' / name]


def _read_json(path: Path) -> tuple[dict[str, Any], str]:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise CocoFormatError(f'cannot read the annotations file {path}: '
                              f'{exc.strerror or exc}') from None
    if size > MAX_ANNOTATIONS_BYTES:
        raise CocoFormatError(f'{path} is {size} bytes; an annotations file may have at most '
                              f'{MAX_ANNOTATIONS_BYTES}')
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CocoFormatError(f'cannot read the annotations file {path}: '
                              f'{exc.strerror or exc}') from None
    try:
        data = parse_json(raw.decode('utf-8'))
    except UnicodeDecodeError as exc:
        raise CocoFormatError(f'{path} is not UTF-8 text ({exc.reason} at byte '
                              f'{exc.start})') from None
    except ValueError as exc:
        raise CocoFormatError(f'{path} is not valid JSON ({exc})') from None
    if not isinstance(data, dict) or not {'images', 'annotations', 'categories'} <= set(data):
        raise CocoFormatError(f'{path} is not a COCO instances file (it needs "images", '
                              f'"annotations" and "categories")')
    return data, hashlib.sha256(raw).hexdigest()


def read_coco(annotations: str | Path, images_dir: str | Path | None = None,
              max_images: int | None = None) -> CocoDataset:
    """Read and check a COCO instances file and find its images.

    Parameters
    ----------
    annotations : str | Path
        The instances JSON.
    images_dir : str | Path | None
        Folder of the images (see the module docstring for where they are looked for).
    max_images : int | None
        Keep only the first images in id order (quick runs).

    Raises
    ------
    CocoFormatError
        If the file is missing, too large, not UTF-8 JSON, or any entry it uses breaks the
        format: ids missing or repeated, an annotation naming an undeclared image or
        category, a box that is not 4 finite numbers with positive size inside its image,
        an image without its size, two categories whose names differ only in case, or an
        image file that cannot be found.
    """
    path = Path(annotations)
    folder = Path(images_dir) if images_dir is not None else None
    if folder is not None and not folder.is_dir():
        raise CocoFormatError(f'images folder not found: {folder}')
    data, digest = _read_json(path)
    raw_categories = _objects(path, data, 'categories')
    categories: dict[int, CocoCategory] = {}
    folded: dict[str, int] = {}
    for key, item in zip(_unique_ids(path, raw_categories, 'category'), raw_categories,
                         strict=True):
        where = f'category {_shown(key)}'
        name = _text(path, where, item.get('name'), 'name')
        supercategory = _text(path, where, item.get('supercategory'), 'supercategory',
                              required=False)
        other = folded.setdefault(name.casefold(), key)
        if other != key:
            raise CocoFormatError(f'{path}: categories {_shown(other)} and {_shown(key)} are '
                                  f'both named {name!r} (names are compared ignoring case)')
        categories[key] = CocoCategory(key, name, supercategory)
    raw_images = _objects(path, data, 'images')
    image_ids = _unique_ids(path, raw_images, 'image')
    by_id = dict(zip(image_ids, raw_images, strict=True))
    kept = sorted(image_ids)[:max_images]
    sizes = {}
    for key in kept:
        where = f'image {_shown(key)}'
        sizes[key] = (_side(path, where, by_id[key], 'width'),
                      _side(path, where, by_id[key], 'height'))
    per_image: dict[int, list[tuple[tuple[float, ...], int, bool, bool, bool]]] = {
        key: [] for key in kept}
    for index, ann in enumerate(_objects(path, data, 'annotations')):
        where = f'annotation {_shown(ann.get("id", index))}'
        image_id, category_id = ann.get('image_id'), ann.get('category_id')
        if not _is_id(image_id) or image_id not in by_id:
            raise CocoFormatError(f'{path}: {where} names image {_shown(image_id)}, which is '
                                  'not in "images"')
        if not _is_id(category_id) or category_id not in categories:
            raise CocoFormatError(f'{path}: {where} names category {_shown(category_id)}, '
                                  'which is not in "categories"')
        if image_id not in per_image:
            continue
        width, height = sizes[image_id]
        crowd = ann.get('iscrowd', 0)
        if crowd not in (0, 1) or isinstance(crowd, bool):
            raise CocoFormatError(f'{path}: {where} has iscrowd {_shown(crowd)}; it must be '
                                  '0 or 1')
        box = _box(path, where, ann.get('bbox'), width, height)
        per_image[image_id].append((box, category_id, _flag(ann, 'occluded'),
                                    _flag(ann, 'truncated'), crowd == 1))
    images, missing = [], []
    for key in kept:
        where = f'image {_shown(key)}'
        file_name = _text(path, where, by_id[key].get('file_name'), 'file_name')
        candidates = image_candidates(path, file_name, folder)
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            missing.append(candidates[0])
            continue
        anns = per_image[key]
        width, height = sizes[key]
        images.append(CocoImage(
            id=key, path=found, width=width, height=height,
            boxes=np.array([a[0] for a in anns], np.float32).reshape(-1, 4),
            category_ids=np.array([a[1] for a in anns], np.int64),
            occluded=np.array([a[2] for a in anns], bool),
            truncated=np.array([a[3] for a in anns], bool),
            crowd=np.array([a[4] for a in anns], bool)))
    if missing:
        raise CocoFormatError(f'{path}: {len(missing)} of {len(kept)} image files not found, '
                              f'the first at {missing[0]}'
                              + ('' if folder is not None else '; name the folder of the '
                                 'images'))
    return CocoDataset(path, digest, categories, images)


def read_image(image: CocoImage) -> np.ndarray:
    """The ``(height, width, 3)`` uint8 RGB pixels of ``image``.

    Raises
    ------
    CocoFormatError
        If the file cannot be decoded, or its size is not the one the annotations state
        (their boxes would be in other pixels).
    """
    import cv2  # deferred: keeps importing this module cheap

    bgr = cv2.imread(str(image.path), cv2.IMREAD_COLOR)
    if bgr is None:
        raise CocoFormatError(f'cannot read image {image.path} (not an image file OpenCV '
                              'can decode)')
    height, width = bgr.shape[:2]
    if (width, height) != (image.width, image.height):
        raise CocoFormatError(f'image {image.path} is {width}x{height} pixels but the '
                              f'annotations say {image.width}x{image.height}')
    return np.ascontiguousarray(bgr[:, :, ::-1])


def _names(names: Iterable[str]) -> dict[str, str]:
    return {str(n).strip().casefold(): str(n) for n in names}


def category_roles(dataset: CocoDataset, class_names: Sequence[str] | None = None,
                   unknown: Iterable[str] = (), ignored: Iterable[str] = ()
                   ) -> tuple[dict[int, tuple[CategoryRole, int]], list[str]]:
    """The role of every category, and the detector's class names.

    Names are compared ignoring case and surrounding spaces.

    Parameters
    ----------
    dataset : CocoDataset
        The checked file.
    class_names : Sequence[str] | None
        A trained detector's classes: every category that is a class must be one of them.
        None: the classes are the file's class categories, in id order.
    unknown, ignored : Iterable[str]
        Names of categories to treat as unknown objects, or as auxiliary objects, whatever
        their supercategory.

    Returns
    -------
    tuple[dict, list[str]]
        ``{category id: (role, class index or -1)}`` and the class names.

    Raises
    ------
    CocoFormatError
        If a name in ``unknown`` or ``ignored`` is no category of the file or is in both,
        the file has no class category (and ``class_names`` is None), or an annotated
        category that is a class is not one of ``class_names``.
    """
    by_name = {c.name.casefold(): c for c in dataset.categories.values()}
    marked: dict[str, dict[str, str]] = {'unknown': _names(unknown), 'ignored': _names(ignored)}
    for what, given in marked.items():
        strays = [shown for key, shown in given.items() if key not in by_name]
        if strays:
            raise CocoFormatError(f'{dataset.annotations_path}: {what} categories {strays} '
                                  f'are not in the file (its categories: '
                                  f'{sorted(c.name for c in dataset.categories.values())})')
    both = set(marked['unknown']) & set(marked['ignored'])
    if both:
        raise CocoFormatError(f'categories {sorted(both)} are marked both unknown and ignored')

    def role_of(category: CocoCategory) -> CategoryRole:
        key, sup = category.name.casefold(), category.supercategory.casefold()
        if key in marked['unknown'] or (key not in marked['ignored']
                                        and sup == UNKNOWN_SUPERCATEGORY):
            return CategoryRole.UNKNOWN
        if key in marked['ignored'] or sup == AUXILIARY_SUPERCATEGORY:
            return CategoryRole.AUXILIARY
        return CategoryRole.CLASS

    ordered = sorted(dataset.categories.values(), key=lambda c: c.id)
    roles = {c.id: role_of(c) for c in ordered}
    if class_names is None:
        names = [c.name for c in ordered if roles[c.id] is CategoryRole.CLASS]
        if not names:
            raise CocoFormatError(f'{dataset.annotations_path}: no category is a class (all '
                                  'are unknown or auxiliary)')
    else:
        names = [str(n) for n in class_names]
    index = {name.strip().casefold(): i for i, name in enumerate(names)}
    counts = dataset.annotation_counts()
    out: dict[int, tuple[CategoryRole, int]] = {}
    strangers = []
    for category in ordered:
        role = roles[category.id]
        if role is not CategoryRole.CLASS:
            out[category.id] = (role, -1)
            continue
        found = index.get(category.name.casefold())
        if found is None:
            if counts[category.id]:
                strangers.append(f'{category.name!r} ({counts[category.id]} annotations)')
            # Declared but never used (CVAT lists every label of a project): harmless.
            out[category.id] = (CategoryRole.AUXILIARY, -1)
            continue
        out[category.id] = (role, found)
    if strangers:
        raise CocoFormatError(
            f'{dataset.annotations_path}: categories {", ".join(strangers[:5])}'
            f'{" and more" if len(strangers) > 5 else ""} are not classes of the model '
            f'({", ".join(names[:20])}{", ..." if len(names) > 20 else ""}); declare them '
            'unknown or ignored')
    return out, names


def split_indices(count: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random train/validation split of ``count`` images: ``(train, val)`` sorted indices.

    The validation part has ``round(count * val_fraction)`` images, at least one, and the
    training part at least one.

    Raises
    ------
    ValueError
        If ``count < 2`` or ``val_fraction`` is not in ``(0, 1)``.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f'the validation fraction must be in (0, 1), got {val_fraction}')
    if count < 2:
        raise ValueError(f'a train/validation split needs at least 2 images, got {count}')
    val = min(max(round(count * val_fraction), 1), count - 1)
    order = np.random.default_rng(seed).permutation(count)
    return np.sort(order[val:]), np.sort(order[:val])
