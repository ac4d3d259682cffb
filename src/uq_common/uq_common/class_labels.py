"""The one rule for class labels people give: the label store, the labelling page and the
detector's ``teach_object`` all accept exactly the labels this module accepts.

A label becomes a class name, shown in overlays, RViz markers and COCO exports, so it is
plain text: letters (any script), digits, ``_``, spaces and ``. - / ( )``, starting with a
letter, digit or ``_``, at most :data:`MAX_LABEL_LENGTH` characters.

Normalisation (the stored and taught form): Unicode NFC, surrounding spaces stripped, runs
of spaces made one, then case-folded (``str.casefold``), so ``'Mug'``, ``' mug '`` and
``'MUG'`` are one class, ``'mug'``. Folding, not refusing, because the case a person types
carries no meaning for a class and refusing ``'Mug'`` would only make them retype it.
"""

from __future__ import annotations

import re
import unicodedata

MAX_LABEL_LENGTH = 64
# Identifiers of help requests, which every answer quotes: 1-128 characters of
# ``A-Z a-z 0-9 . _ : -``, starting with a letter or digit.
REQUEST_ID_PATTERN = re.compile(r'[A-Za-z0-9][A-Za-z0-9._:-]{0,127}')
_LABEL_PATTERN = re.compile(r'[\w][\w .\-/()]*')


class InvalidLabelError(ValueError):
    """A label breaks the class label rule; the message says which part and why."""


def is_request_id(value: object) -> bool:
    """Whether ``value`` is a help request's identifier by :data:`REQUEST_ID_PATTERN`."""
    return isinstance(value, str) and REQUEST_ID_PATTERN.fullmatch(value) is not None


def normalise_label(label: object) -> str:
    """The normalised class label (module docstring), or :class:`InvalidLabelError`.

    Raises
    ------
    InvalidLabelError
        If ``label`` is not a string, has non-printable characters (control characters,
        tabs, newlines), is empty or longer than :data:`MAX_LABEL_LENGTH` once normalised,
        or has characters outside the rule.
    """
    if not isinstance(label, str):
        raise InvalidLabelError(f'label must be a string, got {type(label).__name__}')
    if not label.isprintable():
        bad = next(c for c in label if not c.isprintable())
        raise InvalidLabelError(
            f'label contains the non-printable character {bad!r}; use printable text only')
    # NFC first: a decomposed accent is a combining mark, which the pattern refuses.
    text = re.sub(' {2,}', ' ', unicodedata.normalize('NFC', label).strip(' '))
    if not text:
        raise InvalidLabelError('label must not be empty')
    # Folding may lengthen a label ('ß' -> 'ss') and decompose it; measure the final form.
    text = unicodedata.normalize('NFC', text.casefold())
    if len(text) > MAX_LABEL_LENGTH:
        raise InvalidLabelError(
            f'label is {len(text)} characters long; at most {MAX_LABEL_LENGTH} are allowed')
    if not _LABEL_PATTERN.fullmatch(text):
        shown = label if len(label) <= 40 else label[:40] + '...'
        raise InvalidLabelError(
            f'label {shown!r} may hold only letters, digits, spaces and _ . - / ( ), '
            'starting with a letter, digit or _')
    return text
