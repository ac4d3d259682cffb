"""Scale gating: one GP expert per scale of a multi-scale head, calibrated per scale
(ROS-free).

A multi-scale YOLO head is one linear head per scale. The ONNX adapter lays its ``phi`` out
as one block per scale, ``[phi_s; 1]`` in block ``s`` and zeros elsewhere, so a row belongs
to the scale whose bias slot is set (:mod:`uq_perception.ntk.feature_transform`). Each scale
has its own feature statistics and its own number of training objects, so one GP over all
of them shares one noise, one prior precision, one OOD threshold and one score reference
between quantities that are not alike: a variance that is typical at one scale may be
extreme at another.

With scale gating (``Gating.SCALE``) expert ``s`` is scale ``s``: its rows, its noise
``sigma_s^2`` and prior precision ``delta_s`` (from its own evidence), its OOD threshold
(the ``ood_quantile`` of its known validation objects' variances) and its score reference
(those objects' values of the score's signal). A calibrated score of 0.95 then means "above
95 % of the known objects seen at this scale", at every scale.

Fallback rules, for a scale with too few objects to estimate its own values:

- hyperparameters: a scale with fewer training objects than its block width + 1 (the
  weights of one class of its head: ``d_s`` features and a bias) keeps the values fitted on
  the pooled data of all scales (:func:`~uq_perception.ntk.evidence.fit_expert_hyperparameters`);
- OOD threshold and score reference: a scale with fewer than
  :data:`MIN_SCALE_VALIDATION` known validation objects uses the pooled ones, computed on
  the validation objects of every scale (the model's ``ood_threshold`` and
  ``score_reference``, which a GP without scale gating uses everywhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from uq_perception.ntk.calibrated_score import ScoreReference
from uq_perception.ntk.config import check_integer, check_real
from uq_perception.ntk.feature_transform import FeatureBlock, check_blocks

#: Fewest known validation objects of a scale for its own OOD threshold and score reference
#: (fewer: the pooled ones). Twenty place the 0.95 quantile between the two largest values.
MIN_SCALE_VALIDATION = 20


@dataclass(frozen=True)
class ScaleGating:
    """The scales of ``phi`` and each scale's calibration.

    Attributes
    ----------
    blocks : tuple[FeatureBlock, ...]
        One block per scale, each with its bias slot (expert ``s`` is ``blocks[s]``).
    ood_thresholds : tuple[float | None, ...]
        Each scale's OOD threshold on the GP variance (None: the pooled one).
    references : tuple[ScoreReference | None, ...]
        Each scale's score reference (None: the pooled one).
    validation_counts : tuple[int, ...]
        Known validation objects of each scale behind the calibration (0 before it).
    """

    blocks: tuple[FeatureBlock, ...]
    ood_thresholds: tuple[float | None, ...] = ()
    references: tuple[ScoreReference | None, ...] = ()
    validation_counts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        blocks = tuple(self.blocks)
        if len(blocks) < 2 or any(b.bias_index is None for b in blocks):
            raise ValueError('scale gating needs at least 2 scales, each a feature block with '
                             f'its bias slot, got {len(blocks)} block(s)')
        width = max(max(b.stop, b.bias_index + 1) for b in blocks)  # type: ignore[operator]
        object.__setattr__(self, 'blocks', check_blocks(blocks, width))
        count = len(blocks)
        for name, default in (('ood_thresholds', None), ('references', None),
                              ('validation_counts', 0)):
            values = tuple(getattr(self, name)) or (default,) * count
            if len(values) != count:
                raise ValueError(f'{name} must have one entry per scale ({count}), got '
                                 f'{len(values)}')
            object.__setattr__(self, name, values)
        for value in self.ood_thresholds:
            if value is not None:
                check_real('scale ood_threshold', value, 0.0)
        for reference in self.references:
            if reference is not None and not isinstance(reference, ScoreReference):
                raise ValueError(f'a scale reference must be a ScoreReference, got '
                                 f'{type(reference).__name__}')
        for value in self.validation_counts:
            check_integer('scale validation_count', value, 0)

    @property
    def num_scales(self) -> int:
        return len(self.blocks)

    @property
    def feature_dim(self) -> int:
        return max(max(b.stop, b.bias_index + 1) for b in self.blocks)  # type: ignore[operator]

    def min_training_points(self) -> list[int]:
        """Fewest training objects of each scale for its own hyperparameters."""
        return [b.width + 1 for b in self.blocks]

    def scale_of(self, features: np.ndarray) -> np.ndarray:
        """``(N,)`` int64 scale of each row: the block whose bias slot is set.

        Raises
        ------
        ValueError
            If a row sets no bias slot or several (it is not a row of this head's layout).
        """
        x = np.asarray(features)
        slots = np.stack([x[:, b.bias_index] != 0.0 for b in self.blocks], axis=1) \
            if x.shape[0] else np.zeros((0, self.num_scales), bool)
        set_count = slots.sum(axis=1)
        bad = np.flatnonzero(set_count != 1)
        if bad.size:
            row = int(bad[0])
            raise ValueError(
                f'feature row {row} sets {int(set_count[row])} of the scale bias slots '
                f'{[b.bias_index for b in self.blocks]} (exactly one expected): it is not a '
                'feature of this multi-scale head')
        return np.argmax(slots, axis=1).astype(np.int64)

    def with_thresholds(self, thresholds: Sequence[float | None],
                        counts: Sequence[int]) -> ScaleGating:
        return ScaleGating(self.blocks, tuple(thresholds), self.references, tuple(counts))

    def with_references(self, references: Sequence[ScoreReference | None],
                        counts: Sequence[int]) -> ScaleGating:
        return ScaleGating(self.blocks, self.ood_thresholds, tuple(references), tuple(counts))

    def without_references(self) -> ScaleGating:
        return ScaleGating(self.blocks, self.ood_thresholds, (), self.validation_counts)

    def to_meta(self) -> dict[str, Any]:
        """JSON-ready form for the GP state's metadata."""
        return {'blocks': [b.to_meta() for b in self.blocks],
                'ood_thresholds': list(self.ood_thresholds),
                'score_references': [None if r is None else r.to_meta()
                                     for r in self.references],
                'validation_counts': list(self.validation_counts),
                'min_validation': MIN_SCALE_VALIDATION}

    @classmethod
    def from_meta(cls, meta: Any, feature_dim: int) -> ScaleGating:
        """Inverse of :meth:`to_meta`, every field checked against ``feature_dim``."""
        fields = {'blocks', 'ood_thresholds', 'score_references', 'validation_counts',
                  'min_validation'}
        if not isinstance(meta, dict) or set(meta) != fields:
            raise ValueError(f'scale_gating must have exactly the fields {sorted(fields)}, '
                             f'got {meta!r:.120}')
        raw = meta['blocks']
        if not isinstance(raw, list) or not all(
                isinstance(item, list) and len(item) == 3 and all(
                    isinstance(v, int) and not isinstance(v, bool) for v in item)
                for item in raw):
            raise ValueError(f'scale_gating.blocks must be [start, stop, bias slot] integer '
                             f'triples, got {raw!r:.80}')
        check_integer('scale_gating.min_validation', meta['min_validation'], 1)
        for name in ('ood_thresholds', 'score_references', 'validation_counts'):
            if not isinstance(meta[name], list):
                raise ValueError(f'scale_gating.{name} must be a list, got {meta[name]!r:.80}')
        try:
            gating = cls(tuple(FeatureBlock(*item) for item in raw),
                         tuple(meta['ood_thresholds']),
                         tuple(None if r is None else ScoreReference.from_meta(r)
                               for r in meta['score_references']),
                         tuple(meta['validation_counts']))
        except (TypeError, ValueError) as exc:
            raise ValueError(f'scale_gating: {exc}') from None
        if gating.feature_dim > feature_dim:
            raise ValueError(f'scale_gating blocks reach column {gating.feature_dim - 1}, the '
                             f'features have {feature_dim}')
        return gating
