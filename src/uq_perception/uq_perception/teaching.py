"""Teaching the detector online (ROS-free): a person's label for one object updates the
NTK-GP at once, and the learnt state survives restarts.

The embedding travels with the request (``Detection.embedding`` -> ``HelpRequest`` ->
``TeachObject``), so the detector keeps no history of past frames and a label can be
applied whenever it arrives, minutes after the object was seen or after a restart. Every
applied label is saved atomically with the GP state (:meth:`LastLayerNTKGP.save`, checked
against the model id on load), together with the label's identifier, so a label delivered
twice is applied once.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from uq_perception.ntk import LastLayerNTKGP

logger = logging.getLogger(__name__)

MAX_LABEL_LENGTH = 64
# A class name is shown in overlays, COCO files and RViz: printable, no control characters.
_LABEL_PATTERN = re.compile(r'^[\w][\w .\-/()]*$')
MAX_REQUEST_ID_LENGTH = 128


@dataclass(frozen=True)
class TeachResult:
    """Outcome of one label: applied (or applied before) with its class index, or refused."""

    accepted: bool
    message: str
    class_index: int = -1


def check_label(label: str) -> str | None:
    """Why ``label`` cannot be a class name, or ``None`` when it can."""
    if not isinstance(label, str) or not label.strip():
        return 'the label is empty'
    if len(label) > MAX_LABEL_LENGTH:
        return f'the label has {len(label)} characters, at most {MAX_LABEL_LENGTH} are allowed'
    if label != label.strip() or not _LABEL_PATTERN.match(label):
        return (f'the label {label!r} has characters other than letters, digits, spaces and '
                '. - / ( ) _, or leading/trailing spaces')
    return None


def label_weight(gp: LastLayerNTKGP, feature: np.ndarray, trust: float) -> float:
    """How many training observations one person's label is worth at ``feature``.

    A training point moves the posterior at its feature by the fraction ``k / (k +
    sigma^2)`` of the way to its target (``k``: the GP's prior variance there). A detector's
    GP is confident almost everywhere (``k`` far below ``sigma^2``, which the evidence fits
    to the residuals of regressing one-hot labels), so one plain observation would barely
    move a newly taught class. A person's label is trusted to decide the fraction ``trust``
    of the posterior at its feature: weight ``trust / (1 - trust) * sigma^2 / k``, at least
    1. ``trust = 0`` counts a label as one training point.
    """
    if not 0.0 <= trust < 1.0:
        raise ValueError(f'trust must lie in [0, 1), got {trust}')
    if trust == 0.0:
        return 1.0
    out = gp.predict(feature[None])
    prior = max(float(out.gp_variance[0]), 1e-300)
    sigma2 = float(gp.sigma2[int(out.expert_id[0])])
    return max(1.0, trust / (1.0 - trust) * sigma2 / prior)


def teach(gp: LastLayerNTKGP, request_id: str, label: str, embedding: object,
          model_id: str, save_to: Path | None = None, trust: float = 0.9) -> TeachResult:
    """Apply one label to ``gp`` and save the state to ``save_to`` (when given).

    A label that names one of the GP's classes updates it; another name adds a class. The
    label is weighted by :func:`label_weight` with ``trust``.
    Refused with a message, changing nothing: an empty or malformed request id or label,
    an embedding of the wrong size or with non-finite values, a model id other than the
    GP's. A save failure keeps the update in memory and says so (it is applied, not yet
    durable).
    """
    if not isinstance(request_id, str) or not request_id or \
            len(request_id) > MAX_REQUEST_ID_LENGTH or not request_id.isprintable():
        return TeachResult(False, f'invalid request id {request_id!r:.80}')
    problem = check_label(label)
    if problem:
        return TeachResult(False, f'request {request_id}: {problem}')
    if model_id != gp.model_id:
        return TeachResult(False, f'request {request_id}: the embedding comes from model '
                                  f'{model_id!r}, the detector runs {gp.model_id!r}')
    feature = np.asarray(embedding, dtype=np.float64).ravel()
    if feature.shape != (gp.feature_dim,):
        return TeachResult(False, f'request {request_id}: embedding has {feature.size} values, '
                                  f'the detector\'s have {gp.feature_dim}')
    if not np.isfinite(feature).all() or float(np.abs(feature).max(initial=0.0)) > 1e6:
        return TeachResult(False, f'request {request_id}: embedding has non-finite or '
                                  'out-of-range values')
    names = list(gp.class_names)
    index = names.index(label) if label in names else len(names)
    weight = label_weight(gp, feature, trust)
    applied = gp.update(feature, index, label, update_id=request_id, weight=weight)
    if not applied:
        return TeachResult(True, f'request {request_id}: {label!r} was applied before',
                           gp.class_names.index(label))
    kind = 'new class' if index == len(names) else 'class'
    message = (f'request {request_id}: learnt {kind} {label!r} (index {index}, weight '
               f'{weight:.3g} training points)')
    if save_to is not None:
        try:
            gp.save(save_to)
        except OSError as exc:
            logger.error('cannot save the learnt GP state to %s: %s', save_to, exc)
            return TeachResult(True, f'{message}; NOT saved to {save_to}: {exc}', index)
    return TeachResult(True, message, index)


def load_learnt_state(shipped: LastLayerNTKGP, path: Path | None
                      ) -> tuple[LastLayerNTKGP, str]:
    """The GP to run: the learnt state at ``path`` when it exists and belongs to the same
    model (same id, feature size and base classes), else ``shipped``; with a sentence
    saying which and why."""
    from uq_perception.ntk import LastLayerNTKGP

    if path is None:
        return shipped, 'no learnt state configured (learned_gp_path empty)'
    if not path.exists():
        return shipped, f'no learnt state at {path} yet; starting from the shipped GP'
    try:
        learnt = LastLayerNTKGP.load(path, feature_dim=shipped.feature_dim,
                                     model_id=shipped.model_id)
    except (OSError, ValueError) as exc:
        return shipped, f'ignoring the learnt state {path}: {exc}; starting from the shipped GP'
    base = shipped.class_names[:shipped.num_base_classes]
    if learnt.class_names[:learnt.num_base_classes] != base:
        return shipped, (f'ignoring the learnt state {path}: its base classes '
                         f'{learnt.class_names[:learnt.num_base_classes]} are not {base}')
    taught = len(learnt.applied_updates)
    return learnt, (f'loaded the learnt state {path}: {taught} labels, classes '
                    f'{learnt.class_names}')

