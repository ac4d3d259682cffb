"""The GP's feature transform: per block, centre, then L2-normalise to radius sqrt(d)
(ROS-free).

The last-layer kernel ``(phi^T phi' + 1) / delta`` gives a query's variance a term that grows
with ``||phi||``. A network trained with cross-entropy maps unfamiliar inputs to *smaller*
features, which that term scores as familiar: on a YOLOv8n the raw GP variance ranked
unknown objects below known ones. The shipped CenterNet projects its embedding onto a sphere
inside the network; a detector the user brings gets the same treatment here, outside it.

A detector's ``phi`` may be made of blocks: a multi-scale YOLO head is one block per scale,
``[phi_s; 1]`` in block ``s`` and zeros elsewhere (the ONNX adapter's layout), so a row
belongs to the block whose bias slot holds 1. Each block has its own feature statistics, so
each is centred on its own training mean before normalisation; the bias slot is left as it
is. A detector with one feature vector (DETR, the CenterNet) is one block without a bias
slot.

The transform is fitted on the training features, stored in the GP artefact and applied by
:class:`~uq_perception.ntk.model.LastLayerNTKGP` to every feature it is given (fit, query,
calibration, online update), so ``uq gp fit``, the node and the evaluators apply the same
map. The logits stay those of the raw features: the transform changes the kernel, not the
GP's mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from uq_perception.ntk.linalg import check_matrix

# A centred feature shorter than this is left at the origin instead of being blown up.
_MIN_NORM = 1e-12


@dataclass(frozen=True)
class FeatureBlock:
    """One block of ``phi``: the features ``[start, stop)`` and the column of its bias slot
    (``None``: the block is the whole vector and every row belongs to it)."""

    start: int
    stop: int
    bias_index: int | None = None

    @property
    def width(self) -> int:
        return self.stop - self.start

    def to_meta(self) -> list[int | None]:
        return [self.start, self.stop, self.bias_index]


def single_block(feature_dim: int) -> tuple[FeatureBlock, ...]:
    """The layout of a detector whose ``phi`` is one vector."""
    return (FeatureBlock(0, int(feature_dim)),)


def check_blocks(blocks: Sequence[FeatureBlock], feature_dim: int) -> tuple[FeatureBlock, ...]:
    """``blocks`` as a tuple, after checking they lie in ``[0, feature_dim)``, do not overlap,
    and either all have a bias slot outside every block's features or form one block
    without one."""
    blocks = tuple(blocks)
    if not blocks:
        raise ValueError('a feature transform needs at least one block')
    taken = np.zeros(feature_dim, dtype=bool)
    for block in blocks:
        if not (0 <= block.start < block.stop <= feature_dim):
            raise ValueError(f'block [{block.start}, {block.stop}) is not inside the '
                             f'{feature_dim} features')
        if taken[block.start:block.stop].any():
            raise ValueError(f'block [{block.start}, {block.stop}) overlaps another')
        taken[block.start:block.stop] = True
    slots = [b.bias_index for b in blocks]
    if None in slots and len(blocks) > 1:
        raise ValueError('with several blocks, every block needs its bias slot')
    for slot in slots:
        if slot is not None and not (0 <= slot < feature_dim and not taken[slot]):
            raise ValueError(f'bias slot {slot} must be a column outside every block')
    return blocks


@dataclass(frozen=True)
class FeatureTransform:
    """Per block: ``phi_b -> sqrt(d_b) (phi_b - mean_b) / ||phi_b - mean_b||``.

    Attributes
    ----------
    blocks : tuple[FeatureBlock, ...]
        The layout of ``phi``.
    means : tuple[np.ndarray, ...]
        Each block's training mean (zeros: normalisation without centring).
    centred : bool
        Whether the means were fitted (False: the transform only normalises).
    counts : tuple[int, ...]
        Training rows of each block (0: none, its mean is zero).
    """

    blocks: tuple[FeatureBlock, ...]
    means: tuple[np.ndarray, ...]
    centred: bool
    counts: tuple[int, ...]

    @classmethod
    def fitted(cls, features: np.ndarray, blocks: Sequence[FeatureBlock],
               centre: bool = True) -> FeatureTransform:
        """Fit the block means on ``features`` (the GP's training rows).

        A block without training rows (a scale at which no training object was detected)
        keeps a zero mean: the GP has seen nothing there, so its variance stays the
        prior's whatever the centre.

        Raises
        ------
        ValueError
            If the features are not a finite ``(N, D)`` matrix or the blocks do not fit ``D``.
        """
        x = check_matrix(features, 'features').astype(np.float64)
        layout = check_blocks(blocks, x.shape[1])
        means, counts = [], []
        for block in layout:
            rows = rows_of(x, block)
            count = int(rows.sum())
            counts.append(count)
            means.append(x[rows, block.start:block.stop].mean(axis=0) if centre and count
                         else np.zeros(block.width))
        return cls(layout, tuple(means), bool(centre), tuple(counts))

    @property
    def feature_dim(self) -> int:
        return max(max(b.stop, -1 if b.bias_index is None else b.bias_index + 1)
                   for b in self.blocks)

    def __call__(self, features: np.ndarray) -> np.ndarray:
        """The transformed ``(N, D)`` float64 features (the input is not modified)."""
        x = np.array(features, dtype=np.float64, ndmin=2)
        for block, mean in zip(self.blocks, self.means, strict=True):
            rows = rows_of(x, block)
            part = x[rows, block.start:block.stop] - mean
            norms = np.linalg.norm(part, axis=1, keepdims=True)
            scale = math.sqrt(block.width) / np.maximum(norms, _MIN_NORM)
            x[rows, block.start:block.stop] = np.where(norms > _MIN_NORM, part * scale, 0.0)
        return x

    def to_meta(self) -> dict[str, Any]:
        """JSON-ready description; the means travel as an array (:meth:`means_array`)."""
        return {'kind': 'centre_l2' if self.centred else 'l2',
                'blocks': [b.to_meta() for b in self.blocks], 'counts': list(self.counts)}

    def means_array(self) -> np.ndarray:
        return np.concatenate(self.means) if self.means else np.zeros(0)

    @classmethod
    def from_meta(cls, meta: Any, means: np.ndarray, feature_dim: int) -> FeatureTransform:
        """The transform :meth:`to_meta` and :meth:`means_array` describe, every field
        checked (a corrupt artefact is an error, never a silently different kernel)."""
        if not isinstance(meta, dict) or meta.get('kind') not in ('centre_l2', 'l2'):
            raise ValueError(f'feature_transform must name kind centre_l2 or l2, '
                             f'got {meta!r:.120}')
        raw_blocks, counts = meta.get('blocks'), meta.get('counts')
        if not (isinstance(raw_blocks, list) and isinstance(counts, list)
                and len(raw_blocks) == len(counts) and raw_blocks):
            raise ValueError('feature_transform needs blocks and counts of the same length')
        blocks = []
        for item in raw_blocks:
            if not (isinstance(item, list) and len(item) == 3
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in item[:2])
                    and (item[2] is None or (isinstance(item[2], int)
                                             and not isinstance(item[2], bool)))):
                raise ValueError(f'a feature block is [start, stop, bias slot or null], '
                                 f'got {item!r:.80}')
            blocks.append(FeatureBlock(*item))
        layout = check_blocks(blocks, feature_dim)
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
            raise ValueError(f'feature_transform counts must be integers >= 0, got {counts!r:.80}')
        means = np.asarray(means, dtype=np.float64)
        widths = [b.width for b in layout]
        if means.shape != (sum(widths),) or not np.isfinite(means).all():
            raise ValueError(f'feature_transform means must be {sum(widths)} finite values, '
                             f'got shape {means.shape}')
        centred = meta['kind'] == 'centre_l2'
        if not centred and means.any():
            raise ValueError('an l2 feature transform has zero means')
        split = np.split(means, np.cumsum(widths)[:-1])
        return cls(layout, tuple(split), centred, tuple(counts))


def rows_of(x: np.ndarray, block: FeatureBlock) -> np.ndarray:
    """Which rows belong to ``block``: all, or those whose bias slot is set."""
    if block.bias_index is None:
        return np.ones(x.shape[0], dtype=bool)
    return x[:, block.bias_index] != 0.0
