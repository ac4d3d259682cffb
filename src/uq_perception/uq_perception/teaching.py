"""Teaching the detector online (ROS-free): a person's label for one object updates the
NTK-GP at once, and the learnt state survives restarts.

The embedding travels with the request (``Detection.embedding`` -> ``HelpRequest`` ->
``TeachObject``), so the detector keeps no history of past frames and a label can be
applied whenever it arrives, minutes after the object was seen or after a restart. Every
applied label is saved atomically with the GP state (:meth:`LastLayerNTKGP.save`, checked
against the model id on load), together with the label's identifier, so a label delivered
twice is applied once.

Labels follow the workspace's one class label rule (:mod:`uq_common.class_labels`, which the
label store applies too): normalised and case-folded, and a label matches a class whose
name folds to it. At most :data:`MAX_TAUGHT_CLASSES` classes are added to the network's own:
every class costs each detection's prediction time.

A learnt state that exists but cannot be used (unreadable, corrupt, another model's) is
never overwritten: :func:`load_learnt_state` moves it aside first, so the labels in it can
still be recovered.

By default the learnt state lives under the ROS home, one file per model
(:func:`default_learnt_state_path`): ``$ROS_HOME/uq/learned/<model id>.npz``, or
``~/.ros/uq/learned/<model id>.npz`` when ``ROS_HOME`` is unset, the folder ROS 2 keeps its
own per-user state in. Another model (retrained weights: another id) starts afresh, and
its labels never mix with these.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from uq_common.class_labels import InvalidLabelError, normalise_label

if TYPE_CHECKING:
    from uq_perception.ntk import LastLayerNTKGP

logger = logging.getLogger(__name__)

MAX_REQUEST_ID_LENGTH = 128
# Classes that labels may add to the network's own. Each class adds a logit to every
# detection's prediction, whose cost grows linearly with the number of classes, and a
# scene with more distinct unknown objects than this is better served by retraining.
MAX_TAUGHT_CLASSES = 64
# Characters kept as they are in the file name of a model's learnt state.
_FILE_NAME_SAFE = re.compile(r'[A-Za-z0-9._-]+')
_MAX_PLAIN_NAME = 64


@dataclass(frozen=True)
class TeachResult:
    """Outcome of one label: applied (or applied before) with its class index, or refused."""

    accepted: bool
    message: str
    class_index: int = -1


@dataclass(frozen=True)
class LearntState:
    """The GP a detector runs after :func:`load_learnt_state`, and what happened.

    Attributes
    ----------
    gp
        The learnt state, or the shipped GP when there is none that can be used.
    message
        One sentence saying which and why.
    problem
        Empty when all is well; else why the learnt state at the path could not be used
        (and where it was moved), for the node to report as a degraded state.
    save_to
        Where labels are to be saved: the configured path, or ``None`` when an unusable
        state could not be moved aside (saving would destroy it).
    source
        Where ``gp`` came from, in a few words: the learnt state's path and its number of
        labels, or the shipped GP.
    """

    gp: LastLayerNTKGP
    message: str
    problem: str = ''
    save_to: Path | None = None
    source: str = 'the shipped GP'


def default_learnt_state_path(model_id: str,
                               environ: Mapping[str, str] | None = None) -> Path:
    """Where the GP state learnt for the model ``model_id`` is kept by default.

    ``$ROS_HOME/uq/learned/<model id>.npz``, ``~/.ros/uq/learned/<model id>.npz`` when
    ``ROS_HOME`` is unset or empty (``~`` expanded in both, as ROS 2 does). A model id with
    characters other than letters, digits, ``.``, ``_`` and ``-``, or none, or longer than
    64 characters, is written with those replaced, cut to 64, and a hash of the id
    appended, so two ids never share a file.
    """
    env = os.environ if environ is None else environ
    ros_home = env.get('ROS_HOME') or os.path.join('~', '.ros')
    if ros_home.startswith('~'):
        home = env.get('HOME') or os.path.expanduser('~')
        ros_home = home + ros_home[1:]
    name = model_id
    if not _FILE_NAME_SAFE.fullmatch(model_id) or model_id in ('.', '..') \
            or len(model_id) > _MAX_PLAIN_NAME:
        digest = hashlib.sha256(model_id.encode('utf-8', 'surrogatepass')).hexdigest()[:16]
        plain = re.sub(r'[^A-Za-z0-9._-]', '_', model_id)[:_MAX_PLAIN_NAME]
        name = f'{plain}-{digest}'.lstrip('.')
    return Path(ros_home) / 'uq' / 'learned' / f'{name}.npz'


def _class_index(names: Sequence[str], label: str) -> int | None:
    """Index of the class ``label`` (normalised) names: the first whose name normalises to
    it (base classes and states taught before labels were case-folded keep their own
    spelling), else ``None``."""
    for index, name in enumerate(names):
        try:
            if normalise_label(name) == label:
                return index
        except InvalidLabelError:
            continue  # a base class outside the rule: no label can name it
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

    The label is normalised by the class label rule (:mod:`uq_common.class_labels`); one
    that names one of the GP's classes (:func:`_class_index`) updates it; another name adds
    a class. The label is weighted by :func:`label_weight` with ``trust``.
    Refused with a message, changing nothing: an empty or malformed request id, a label
    that breaks the rule, a new class beyond :data:`MAX_TAUGHT_CLASSES`, an embedding of the
    wrong size or with non-finite values, a model id other than the GP's. A save failure
    keeps the update in memory and says so (it is applied, not yet durable).
    """
    if not isinstance(request_id, str) or not request_id or \
            len(request_id) > MAX_REQUEST_ID_LENGTH or not request_id.isprintable():
        return TeachResult(False, f'invalid request id {request_id!r:.80}')
    try:
        label = normalise_label(label)
    except InvalidLabelError as exc:
        return TeachResult(False, f'request {request_id}: {exc}')
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
    known = _class_index(names, label)
    if request_id in gp.applied_updates:
        return TeachResult(True, f'request {request_id}: {label!r} was applied before',
                           -1 if known is None else known)
    taught = len(names) - gp.num_base_classes
    if known is None and taught >= MAX_TAUGHT_CLASSES:
        return TeachResult(False, f'request {request_id}: {label!r} would be a new class, '
                                  f'and the detector already has {taught} taught classes, the '
                                  f'most it takes (MAX_TAUGHT_CLASSES); label the object as '
                                  'one of its classes, or retrain the detector')
    index = len(names) if known is None else known
    name = label if known is None else names[known]
    weight = label_weight(gp, feature, trust)
    if not gp.update(feature, index, name, update_id=request_id, weight=weight):
        return TeachResult(True, f'request {request_id}: {name!r} was applied before', index)
    kind = 'new class' if known is None else 'class'
    message = (f'request {request_id}: learnt {kind} {name!r} (index {index}, weight '
               f'{weight:.3g} training points)')
    if save_to is not None:
        try:
            gp.save(save_to)
        except OSError as exc:
            logger.error('cannot save the learnt GP state to %s: %s', save_to, exc)
            return TeachResult(True, f'{message}; NOT saved to {save_to}: {exc}', index)
    return TeachResult(True, message, index)


def move_aside(path: Path, why: str) -> Path:
    """Rename ``path`` to the free sibling ``<name>.<why>-<UTC time>[-n]`` and return it.

    The new name is reserved with an exclusive create before the rename, so no existing
    file is ever replaced. Raises ``OSError`` when the folder cannot be written.
    """
    stamp = datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')
    for attempt in range(1000):
        target = path.with_name(f'{path.name}.{why}-{stamp}' + (f'-{attempt}' if attempt else ''))
        try:
            os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            continue
        try:
            os.replace(path, target)
        except OSError:
            target.unlink(missing_ok=True)
            raise
        return target
    raise FileExistsError(f'no free name for moving {path} aside: 1000 {path.name}.{why}-{stamp}'
                          '* files exist')


def load_learnt_state(shipped: LastLayerNTKGP, path: Path | None) -> LearntState:
    """The GP to run: the learnt state at ``path`` when it exists and belongs to the same
    model (same id, feature size and base classes), else ``shipped``.

    Without a state at ``path`` its folder is created (labels are saved there); when that
    fails, ``problem`` says so and ``save_to`` is ``None``. A state at ``path`` that cannot
    be used is moved aside (:func:`move_aside`, to
    ``<name>.unusable-<UTC time>``) before anything is saved there, and the result's
    ``problem`` names both paths and the reason. When it cannot be moved, ``save_to`` is
    ``None``: labels are then kept in memory only, and the file stays as it is.

    The calibrated score's reference (and, for a GP gated by scale, each scale's threshold
    and reference) is the shipped GP's when it has one: it describes the
    model's validation data, which labels do not change, and a learnt state saved before
    the shipped GP gained (or renewed) its reference would otherwise score nothing.
    """
    from uq_perception.ntk import LastLayerNTKGP

    if path is None:
        return LearntState(shipped, 'the learnt state is not kept (persist_learnt_state is '
                                    'false): labels live in memory only; starting from the '
                                    'shipped GP')
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            problem = (f'cannot create the folder of the learnt state {path} ({exc}): new '
                       'labels are NOT saved')
            return LearntState(shipped, f'{problem}; starting from the shipped GP', problem)
        return LearntState(shipped, f'no learnt state at {path} yet; starting from the '
                                    'shipped GP', save_to=path)
    try:
        learnt = LastLayerNTKGP.load(path, feature_dim=shipped.feature_dim,
                                     model_id=shipped.model_id)
        base = shipped.class_names[:shipped.num_base_classes]
        if learnt.class_names[:learnt.num_base_classes] != base:
            raise ValueError(f'its base classes {learnt.class_names[:learnt.num_base_classes]} '
                             f'are not {base}')
    except (OSError, ValueError) as exc:
        reason = str(exc)
    else:
        if shipped.score_reference is not None:
            learnt.score_reference = shipped.score_reference
        if shipped.scale_gating is not None and learnt.scale_gating is not None:
            learnt.scale_gating = shipped.scale_gating
        labels = len(learnt.applied_updates)
        return LearntState(learnt, f'loaded the learnt state {path}: {labels} labels, '
                                   f'classes {learnt.class_names}', save_to=path,
                           source=f'the learnt state {path} ({labels} labels)')
    try:
        moved = move_aside(path, 'unusable')
    except OSError as exc:
        problem = (f'cannot use the learnt state {path} ({reason}) nor move it aside ({exc}): '
                   'it is left untouched and new labels are NOT saved')
        return LearntState(shipped, f'{problem}; starting from the shipped GP', problem)
    problem = (f'cannot use the learnt state {path} ({reason}): moved it to {moved}, new '
               f'labels are saved to {path} afresh')
    return LearntState(shipped, f'{problem}; starting from the shipped GP', problem, path)
