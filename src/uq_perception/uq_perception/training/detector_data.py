"""COCO detection splits for the detector: loading, training targets, augmentation (ROS-free).

A split of ``uq sim dataset`` is a directory with ``annotations.json`` (COCO with the extra
per-object fields ``occluded``, ``truncated`` and ``visible_fraction``) and the images it
names; any other COCO instances file (CVAT, Label Studio, FiftyOne, ``uq labels export``)
is split into training and validation images at random (:class:`CocoTrainingData`). Files
are read and checked by :mod:`uq_perception.training.coco_data`. The detector's classes are the
categories that are neither ``unknown`` nor ``auxiliary`` by supercategory (the simulator's
have supercategory ``known``), in the order of their ids; objects of ``unknown`` categories
must still be found (objectness) but have no class. ``auxiliary`` ones are training-time
"other objects": the class head is taught that they are none of the known classes (outlier
exposure, label :data:`OUTLIER_LABEL`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from uq_perception.detectors.centernet import STRIDE
from uq_perception.training.coco_data import (
    MIN_CLASS_SIDE,
    CategoryRole,
    CocoDataset,
    category_roles,
    read_coco,
    read_image,
    split_indices,
)

# Class target of an auxiliary object: "none of the known classes". -1 means no class
# target at all (unknown, occluded or tiny objects).
OUTLIER_LABEL = -2
# Objects smaller than this (pixels, shorter side) are too small to be judged reliably;
# evaluation ignores them like occluded and truncated ones.
MIN_EVAL_SIDE = 8.0
# Gaussian splat of a centre: sigma = GAUSSIAN_ALPHA / 6 of the box side (TTFNet-style
# elliptical kernel), at least MIN_SIGMA cells so small objects still get a blob.
GAUSSIAN_ALPHA = 0.54
MIN_SIGMA = 0.8
# A training crop keeps an object when at least this fraction of its box lies inside.
MIN_CROP_FRACTION = 0.5


@dataclass(frozen=True)
class DetectionSplit:
    """Images and ground truth of one split, at the detector's input size.

    Attributes
    ----------
    name : str
        Split name (directory name).
    images : np.ndarray
        ``(N, H, W, 3)`` uint8 RGB images.
    image_ids : np.ndarray
        ``(N,)`` COCO image ids.
    boxes : list[np.ndarray]
        Per image ``(K, 4)`` float32 ``center_x, center_y, width, height`` in input pixels.
    labels : list[np.ndarray]
        Per image ``(K,)`` int64 index into ``class_names``, or -1 for unknown objects.
    category_ids : list[np.ndarray]
        Per image ``(K,)`` int64 COCO category ids.
    occluded, truncated : list[np.ndarray]
        Per image ``(K,)`` bool flags from the annotations.
    auxiliary : list[np.ndarray]
        Per image ``(K,)`` bool: auxiliary "other objects" (training only).
    class_names : list[str]
        Known classes (the detector's head), ordered by category id.
    category_names : dict[int, str]
        Name of every category id, known or not.
    """

    name: str
    images: np.ndarray
    image_ids: np.ndarray
    boxes: list[np.ndarray]
    labels: list[np.ndarray]
    category_ids: list[np.ndarray]
    occluded: list[np.ndarray]
    truncated: list[np.ndarray]
    auxiliary: list[np.ndarray]
    class_names: list[str]
    category_names: dict[int, str]

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def hard(self, index: int) -> np.ndarray:
        """``(K,)`` bool: objects that evaluation ignores (occluded, truncated or tiny)."""
        small = self.boxes[index][:, 2:].min(axis=1) < MIN_EVAL_SIDE if len(
            self.boxes[index]) else np.zeros(0, dtype=bool)
        return self.occluded[index] | self.truncated[index] | small

    def _visible(self, index: int) -> np.ndarray:
        """``(K,)`` bool: objects neither occluded nor too small to show their shape."""
        boxes = self.boxes[index]
        big = boxes[:, 2:].min(axis=1) >= MIN_CLASS_SIDE if len(boxes) else np.zeros(
            0, dtype=bool)
        return ~self.occluded[index] & big

    def classifiable(self, index: int) -> np.ndarray:
        """``(K,)`` bool: known objects visible enough to train or fit a classifier on."""
        return (self.labels[index] >= 0) & self._visible(index)

    def class_targets(self, index: int) -> np.ndarray:
        """Labels of one image's objects for the class loss.

        The class index for classifiable known objects, :data:`OUTLIER_LABEL` for
        auxiliary objects that are as visible, -1 (nothing taught) otherwise.
        """
        visible = self._visible(index)
        return np.where((self.labels[index] >= 0) & visible, self.labels[index],
                        np.where(self.auxiliary[index] & visible, OUTLIER_LABEL, -1))

    @property
    def num_objects(self) -> int:
        """Total number of annotated objects."""
        return int(sum(len(b) for b in self.boxes))


def split_from_coco(dataset: CocoDataset, name: str, input_size: tuple[int, int] = (240, 320),
                    class_names: Sequence[str] | None = None,
                    indices: Sequence[int] | None = None) -> DetectionSplit:
    """Read the images of a checked COCO file and resize them (and their boxes).

    Parameters
    ----------
    dataset : CocoDataset
        From :func:`uq_perception.training.coco_data.read_coco`.
    name : str
        Name of the split.
    input_size : tuple[int, int]
        ``(height, width)`` to resize images to.
    class_names : Sequence[str] | None
        Expected classes (a trained model's); the file's classes must be exactly these.
    indices : Sequence[int] | None
        Positions of the images to read (default: all, in id order).

    Raises
    ------
    ValueError
        If an image cannot be read or is not the size the file states
        (:class:`~uq_perception.training.coco_data.CocoFormatError`), or the file's classes differ
        from ``class_names``.
    """
    import cv2  # deferred: keeps `uq --help` fast

    roles, names = category_roles(dataset)
    if class_names is not None and list(class_names) != names:
        raise ValueError(f'{dataset.annotations_path}: known classes {names} differ from the '
                         f'model\'s {list(class_names)}')
    chosen = [dataset.images[i] for i in (range(len(dataset)) if indices is None
                                          else indices)]
    height, width = input_size
    pixels = np.empty((len(chosen), height, width, 3), dtype=np.uint8)
    boxes, labels, categories, occluded, truncated, auxiliary = [], [], [], [], [], []
    for n, image in enumerate(chosen):
        rgb = read_image(image)
        if rgb.shape[:2] != (height, width):
            rgb = cv2.resize(rgb, (width, height), interpolation=cv2.INTER_AREA)
        pixels[n] = rgb
        sx, sy = width / image.width, height / image.height
        # Crowd regions (iscrowd) are groups, not objects: no centre to teach or find.
        single = ~image.crowd
        boxes.append((image.boxes[single] * np.array([sx, sy, sx, sy], np.float32)
                      ).astype(np.float32))
        role = [roles[int(c)] for c in image.category_ids[single]]
        labels.append(np.array([index for _, index in role], dtype=np.int64))
        auxiliary.append(np.array([r is CategoryRole.AUXILIARY for r, _ in role], dtype=bool))
        categories.append(image.category_ids[single])
        occluded.append(image.occluded[single])
        truncated.append(image.truncated[single])
    return DetectionSplit(
        name=name, images=pixels,
        image_ids=np.array([image.id for image in chosen], dtype=np.int64),
        boxes=boxes, labels=labels, category_ids=categories, occluded=occluded,
        truncated=truncated, auxiliary=auxiliary, class_names=names,
        category_names={c.id: c.name for c in dataset.categories.values()})


def load_split(split_dir: str | Path, input_size: tuple[int, int] = (240, 320),
               class_names: Sequence[str] | None = None,
               max_images: int | None = None) -> DetectionSplit:
    """Read a split directory of ``uq sim dataset`` and resize its images (and boxes).

    Parameters
    ----------
    split_dir : str | Path
        Directory with ``annotations.json``; ``file_name`` entries are relative to it.
    input_size : tuple[int, int]
        ``(height, width)`` to resize images to.
    class_names : Sequence[str] | None
        Expected known classes (a trained model's); a mismatch is an error.
    max_images : int | None
        Read only the first images (in id order), for quick runs.

    Raises
    ------
    ValueError
        If the annotation file or an image is missing or malformed, or the known classes
        differ from ``class_names``.
    """
    split_dir = Path(split_dir)
    ann_path = split_dir / 'annotations.json'
    if not ann_path.is_file():
        raise ValueError(f'no annotations.json in {split_dir}; generate data with '
                         f'`uq sim dataset --out DIR`')
    return split_from_coco(read_coco(ann_path, max_images=max_images), split_dir.name,
                           input_size, class_names)


@dataclass(frozen=True)
class CocoTrainingData:
    """One COCO instances file (CVAT, Label Studio, FiftyOne, ``uq labels export``) split
    into training and validation images at random.

    Attributes
    ----------
    annotations : Path
        The instances JSON.
    images : Path | None
        Folder of its images (None: looked for beside the JSON, see
        :mod:`uq_perception.training.coco_data`).
    val_fraction : float
        Fraction of the images held out for validation, in ``(0, 1)``.
    seed : int
        Seed of the split.
    """

    annotations: Path
    images: Path | None = None
    val_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f'val_fraction must be in (0, 1), got {self.val_fraction}')
        if self.seed < 0:
            raise ValueError(f'seed must be >= 0, got {self.seed}')


def load_coco_splits(data: CocoTrainingData, input_size: tuple[int, int] = (240, 320),
                     class_names: Sequence[str] | None = None, max_images: int | None = None
                     ) -> tuple[DetectionSplit, DetectionSplit, CocoDataset]:
    """The training and validation splits of ``data`` at ``input_size``, and the checked file.

    Every category is a class unless marked unknown or auxiliary by its supercategory
    (:func:`uq_perception.training.coco_data.category_roles`); with ``class_names`` (a trained
    model's) the file's classes must be exactly these.

    Raises
    ------
    ValueError
        On a malformed file or image (:class:`~uq_perception.training.coco_data.CocoFormatError`),
        fewer than 2 images, or classes that differ from ``class_names``.
    """
    dataset = read_coco(data.annotations, data.images, max_images)
    train_index, val_index = split_indices(len(dataset), data.val_fraction, data.seed)
    train = split_from_coco(dataset, 'train', input_size, class_names, train_index.tolist())
    val = split_from_coco(dataset, 'val', input_size, train.class_names, val_index.tolist())
    return train, val, dataset


@dataclass(frozen=True)
class Targets:
    """Training targets of a batch at the stride-4 output resolution.

    ``M`` is the largest number of objects of an image in the batch; ``mask`` marks the
    real ones.
    """

    heatmap: torch.Tensor  # (B, 1, h, w) Gaussian-splatted centres, exactly 1 at each centre
    index: torch.Tensor  # (B, M) int64 flat cell index y * w + x of each centre
    boxes: torch.Tensor  # (B, M, 4) centre-size boxes in input pixels
    mask: torch.Tensor  # (B, M) float 1 for a real object
    size: torch.Tensor  # (B, M, 2) log(width / stride), log(height / stride)
    offset: torch.Tensor  # (B, M, 2) centre minus its cell corner, in cells
    label: torch.Tensor  # (B, M) int64 class index, -1 no class taught, -2 outlier


def _splat(heatmap: np.ndarray, cx: int, cy: int, sigma_x: float, sigma_y: float) -> None:
    h, w = heatmap.shape
    rx, ry = int(math.ceil(3 * sigma_x)), int(math.ceil(3 * sigma_y))
    x0, x1 = max(cx - rx, 0), min(cx + rx + 1, w)
    y0, y1 = max(cy - ry, 0), min(cy + ry + 1, h)
    xs = np.arange(x0, x1) - cx
    ys = np.arange(y0, y1) - cy
    blob = np.exp(-(xs[None, :] ** 2) / (2 * sigma_x ** 2) - (ys[:, None] ** 2) / (
        2 * sigma_y ** 2))
    np.maximum(heatmap[y0:y1, x0:x1], blob, out=heatmap[y0:y1, x0:x1])


def build_targets(boxes: Sequence[np.ndarray], labels: Sequence[np.ndarray],
                  output_size: tuple[int, int]) -> Targets:
    """Targets of a batch from per-image boxes and class labels.

    Parameters
    ----------
    boxes : Sequence[np.ndarray]
        Per image ``(K, 4)`` centre-size boxes in input pixels.
    labels : Sequence[np.ndarray]
        Per image ``(K,)`` class index, -1 for objects without a class target (unknown,
        occluded or tiny objects: they still get objectness and box targets),
        :data:`OUTLIER_LABEL` for auxiliary objects.
    output_size : tuple[int, int]
        ``(h, w)`` of the stride-4 maps.
    """
    if len(boxes) != len(labels):
        raise ValueError(f'{len(boxes)} box arrays but {len(labels)} label arrays')
    h, w = output_size
    batch = len(boxes)
    most = max([len(b) for b in boxes] + [1])
    heatmap = np.zeros((batch, 1, h, w), dtype=np.float32)
    index = np.zeros((batch, most), dtype=np.int64)
    box_array = np.zeros((batch, most, 4), dtype=np.float32)
    box_array[..., 2:] = 1.0
    mask = np.zeros((batch, most), dtype=np.float32)
    size = np.zeros((batch, most, 2), dtype=np.float32)
    offset = np.zeros((batch, most, 2), dtype=np.float32)
    label = np.full((batch, most), -1, dtype=np.int64)
    for i, (bx, lb) in enumerate(zip(boxes, labels, strict=True)):
        if len(bx) != len(lb):
            raise ValueError(f'image {i}: {len(bx)} boxes but {len(lb)} labels')
        for k, ((cx, cy, bw, bh), cls) in enumerate(zip(bx, lb, strict=True)):
            fx, fy = cx / STRIDE, cy / STRIDE
            ix = min(max(int(math.floor(fx)), 0), w - 1)
            iy = min(max(int(math.floor(fy)), 0), h - 1)
            wc, hc = max(bw, 1.0) / STRIDE, max(bh, 1.0) / STRIDE
            _splat(heatmap[i, 0], ix, iy, max(GAUSSIAN_ALPHA * wc / 6, MIN_SIGMA),
                   max(GAUSSIAN_ALPHA * hc / 6, MIN_SIGMA))
            index[i, k] = iy * w + ix
            box_array[i, k] = (cx, cy, bw, bh)
            mask[i, k] = 1.0
            size[i, k] = (math.log(wc), math.log(hc))
            offset[i, k] = (fx - ix, fy - iy)
            label[i, k] = int(cls)
    return Targets(heatmap=torch.from_numpy(heatmap), index=torch.from_numpy(index),
                   boxes=torch.from_numpy(box_array),
                   mask=torch.from_numpy(mask), size=torch.from_numpy(size),
                   offset=torch.from_numpy(offset), label=torch.from_numpy(label))


def jitter_boxes(boxes: torch.Tensor, rng: np.random.Generator, scale: float = 0.15,
                 shift: float = 0.1) -> torch.Tensor:
    """Randomly rescale and shift ``(..., 4)`` centre-size boxes.

    The embedding is read inside the box the detector predicts, which is never exactly
    the ground truth; training it on perturbed boxes keeps the class evidence stable
    under those errors. Sizes are multiplied by ``U(1 - scale, 1 + scale)`` per side and
    centres moved by ``U(-shift, shift)`` of the size.
    """
    noise = torch.from_numpy(rng.uniform(-1.0, 1.0, tuple(boxes.shape))).to(boxes.dtype)
    size = boxes[..., 2:]
    return torch.cat([boxes[..., :2] + noise[..., :2] * shift * size,
                      size * (1.0 + noise[..., 2:] * scale)], dim=-1)


def images_to_tensor(images: np.ndarray) -> torch.Tensor:
    """``(B, H, W, 3)`` uint8 -> ``(B, 3, H, W)`` float32 in ``[0, 1]``."""
    return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float().div_(
        255.0)


def augment(images: np.ndarray, boxes: Sequence[np.ndarray], labels: Sequence[np.ndarray],
            rng: np.random.Generator, crop: tuple[int, int] | None = None
            ) -> tuple[torch.Tensor, list[np.ndarray], list[np.ndarray]]:
    """Random crops, horizontal flips and photometric jitter of a batch.

    Brightness, contrast and per-channel gains vary; geometry changes only by the flip and
    the crop, because the simulator already randomises camera pose and object placement.
    Crops (the same size for the whole batch, anywhere in each image) cut the cost of a
    training step; the network is fully convolutional, so it still runs on whole images.
    Objects with less than :data:`MIN_CROP_FRACTION` of their box inside a crop are
    dropped, the others clipped to it.

    Parameters
    ----------
    images : np.ndarray
        ``(B, H, W, 3)`` uint8.
    boxes, labels : Sequence[np.ndarray]
        Per image ``(K, 4)`` centre-size boxes and ``(K,)`` labels.
    rng : np.random.Generator
        Source of all random choices.
    crop : tuple[int, int] | None
        ``(height, width)`` of the crops (multiples of 16), or None for whole images.

    Returns
    -------
    tuple[torch.Tensor, list[np.ndarray], list[np.ndarray]]
        ``(B, 3, h, w)`` float images in ``[0, 1]``, and the boxes and labels that remain.
    """
    batch, height, width = images.shape[0], images.shape[1], images.shape[2]
    ch, cw = (height, width) if crop is None else crop
    if not (0 < ch <= height and 0 < cw <= width):
        raise ValueError(f'crop {crop} does not fit images of {height}x{width}')
    flip = np.asarray(rng.random(batch) < 0.5)
    top = rng.integers(0, height - ch + 1, batch)
    left = rng.integers(0, width - cw + 1, batch)
    pixels = np.empty((batch, ch, cw, 3), dtype=np.uint8)
    out_boxes, out_labels = [], []
    for i in range(batch):
        pixels[i] = images[i, top[i]:top[i] + ch, left[i]:left[i] + cw]
        bx = np.asarray(boxes[i], dtype=np.float32).reshape(-1, 4)
        x1 = bx[:, 0] - bx[:, 2] / 2 - left[i]
        y1 = bx[:, 1] - bx[:, 3] / 2 - top[i]
        x2, y2 = x1 + bx[:, 2], y1 + bx[:, 3]
        cx1, cy1 = np.clip(x1, 0, cw), np.clip(y1, 0, ch)
        cx2, cy2 = np.clip(x2, 0, cw), np.clip(y2, 0, ch)
        inside = (cx2 - cx1) * (cy2 - cy1)
        keep = inside >= MIN_CROP_FRACTION * np.maximum(bx[:, 2] * bx[:, 3], 1e-6)
        kept = np.stack([(cx1 + cx2) / 2, (cy1 + cy2) / 2, cx2 - cx1, cy2 - cy1],
                        axis=1)[keep].astype(np.float32)
        if flip[i]:
            pixels[i] = pixels[i][:, ::-1]
            kept[:, 0] = cw - kept[:, 0]
        out_boxes.append(kept)
        out_labels.append(np.asarray(labels[i])[keep])
    tensor = images_to_tensor(pixels)
    brightness = torch.from_numpy(rng.uniform(0.75, 1.25, (batch, 1, 1, 1))).float()
    contrast = torch.from_numpy(rng.uniform(0.75, 1.25, (batch, 1, 1, 1))).float()
    gains = torch.from_numpy(rng.uniform(0.9, 1.1, (batch, 3, 1, 1))).float()
    mean = tensor.mean(dim=(1, 2, 3), keepdim=True)
    tensor = ((tensor - mean) * contrast + mean) * brightness * gains
    return tensor.clamp_(0.0, 1.0), out_boxes, out_labels
