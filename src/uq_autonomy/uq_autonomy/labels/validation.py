"""Validation of what goes into the label store: labels, labellers, request ids, crops,
embeddings, candidates and boxes (ROS-free, no SQLite).

Every field is checked by rule before it is stored; an invalid one raises
:class:`LabelValidationError` (a ``ValueError``) whose message names the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from uq_autonomy.help.crops import PNG_SIGNATURE
from uq_common.class_labels import (
    InvalidLabelError,
    is_request_id,
    normalise_label,
)

MAX_LABELER_LENGTH = 64
MAX_ROBOT_ID_LENGTH = 64
_ROBOT_ID = re.compile(r'[A-Za-z0-9][A-Za-z0-9._-]*')
MAX_REASON_LENGTH = 2000
MAX_MODEL_ID_LENGTH = 256
MAX_CANDIDATES = 100
MAX_CROP_BYTES = 8 * 1024 * 1024
MAX_EMBEDDING_DIM = 65536


class LabelValidationError(ValueError):
    """An answer, request or record field is invalid (empty, too long, control characters)."""


def _normalise_text(value: object, what: str, max_length: int) -> str:
    if not isinstance(value, str):
        raise LabelValidationError(f'{what} must be a string, got {type(value).__name__}')
    if not value.isprintable():  # tabs, newlines and other control characters included
        bad = next(c for c in value if not c.isprintable())
        raise LabelValidationError(
            f'{what} contains the non-printable character {bad!r}; use printable text only')
    text = re.sub(' {2,}', ' ', value.strip(' '))
    if not text:
        raise LabelValidationError(f'{what} must not be empty')
    if len(text) > max_length:
        raise LabelValidationError(
            f'{what} is {len(text)} characters long; at most {max_length} are allowed')
    return text


def validate_label(label: object) -> str:
    """Normalised class label, by the rule the detector teaches by
    (:func:`uq_common.class_labels.normalise_label`): a label stored here is never refused
    by ``teach_object``.

    Raises
    ------
    LabelValidationError
        Unless the label passes that rule.
    """
    try:
        return normalise_label(label)
    except InvalidLabelError as exc:
        raise LabelValidationError(str(exc)) from None


def same_label(stored: str, label: str) -> bool:
    # Rows written before labels were case-folded hold e.g. 'Mug': answering 'Mug' (folded
    # to 'mug') again is the same answer, not a conflict.
    try:
        return normalise_label(stored) == label
    except InvalidLabelError:
        return stored == label


def validate_labeler(labeler: object) -> str:
    """Normalised labeler name: printable, surrounding spaces stripped, runs of spaces
    collapsed, case kept, at most :data:`MAX_LABELER_LENGTH` characters."""
    return _normalise_text(labeler, 'labeler', MAX_LABELER_LENGTH)


def validate_robot_id(robot_id: object, allow_empty: bool = True) -> str:
    """The robot id, when it is 1-64 characters of ``A-Z a-z 0-9 . _ -`` starting with a
    letter or digit (a host name fits); empty means "not known" (requests stored before
    robots had ids) where ``allow_empty``.

    Raises
    ------
    LabelValidationError
        Otherwise.
    """
    if not isinstance(robot_id, str):
        raise LabelValidationError(f'robot_id must be a string, got {type(robot_id).__name__}')
    if robot_id == '' and allow_empty:
        return ''
    if len(robot_id) > MAX_ROBOT_ID_LENGTH or not _ROBOT_ID.fullmatch(robot_id):
        shown = robot_id if len(robot_id) <= 40 else robot_id[:40] + '...'
        raise LabelValidationError(
            f'robot_id {shown!r} is invalid: use 1-{MAX_ROBOT_ID_LENGTH} characters of '
            f"letters, digits, '.', '_' or '-', starting with a letter or digit")
    return robot_id


def validate_request_id(request_id: object) -> str:
    """The request id, when it is 1-128 characters of ``A-Z a-z 0-9 . _ : -`` (no leading
    punctuation).

    Raises
    ------
    LabelValidationError
        Otherwise.
    """
    if not isinstance(request_id, str):
        raise LabelValidationError(
            f'request_id must be a string, got {type(request_id).__name__}')
    if not is_request_id(request_id):
        shown = request_id if len(request_id) <= 40 else request_id[:40] + '...'
        raise LabelValidationError(
            f'request_id {shown!r} is invalid: use 1-128 characters of letters, digits, '
            f"'.', '_', ':' or '-', starting with a letter or digit")
    return request_id


def validate_optional_text(value: object, what: str, max_length: int) -> str:
    if value is None or value == '':
        return ''
    if not isinstance(value, str):
        raise LabelValidationError(f'{what} must be a string, got {type(value).__name__}')
    if len(value) > max_length:
        raise LabelValidationError(
            f'{what} is {len(value)} characters long; at most {max_length} are allowed')
    if not value.isprintable():
        raise LabelValidationError(f'{what} contains non-printable characters')
    return value


def validate_crop(crop: bytes | None) -> bytes | None:
    if crop is None:
        return None
    crop = bytes(crop)
    if len(crop) > MAX_CROP_BYTES:
        raise LabelValidationError(
            f'crop is {len(crop)} bytes; at most {MAX_CROP_BYTES} are allowed')
    if not crop.startswith(PNG_SIGNATURE):
        raise LabelValidationError('crop must be PNG bytes (see uq_autonomy.help.crops.encode_png)')
    return crop


def validate_embedding(embedding: ArrayLike | None) -> NDArray[np.float32] | None:
    if embedding is None:
        return None
    v = np.asarray(embedding, dtype=np.float64).reshape(-1)
    if v.size == 0 or v.size > MAX_EMBEDDING_DIM:
        raise LabelValidationError(
            f'embedding must have 1..{MAX_EMBEDDING_DIM} values, got {v.size}')
    if not np.all(np.isfinite(v)):
        raise LabelValidationError('embedding contains non-finite values')
    return v.astype(np.float32)


def validate_candidates(candidates: Sequence[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    if len(candidates) > MAX_CANDIDATES:
        raise LabelValidationError(
            f'{len(candidates)} candidates; at most {MAX_CANDIDATES} are allowed')
    out = []
    for item in candidates:
        try:
            label, probability = item
            p = float(probability)
        except (TypeError, ValueError):
            raise LabelValidationError(
                f'a candidate must be a (label, probability) pair, got {item!r}') from None
        if not (math.isfinite(p) and 0.0 <= p <= 1.0):
            raise LabelValidationError(
                f'candidate probability must be in [0, 1], got {probability!r} for {label!r}')
        out.append((validate_label(label), p))
    return tuple(out)


def validate_box(box: Sequence[float] | None, what: str) -> tuple[float, ...] | None:
    if box is None:
        return None
    values = tuple(float(v) for v in box)
    if len(values) != 4 or not all(math.isfinite(v) for v in values):
        raise LabelValidationError(f'{what} must be 4 finite numbers, got {list(box)}')
    if values[2] < 0.0 or values[3] < 0.0:
        raise LabelValidationError(f'{what} width and height must be >= 0, got {list(box)}')
    return values
