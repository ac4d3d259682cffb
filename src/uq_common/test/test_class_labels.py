"""The class label rule shared by the label store and the detector: what it accepts, how it
normalises (case folded), and that every refusal says why."""

from __future__ import annotations

import re

import pytest

from uq_common.class_labels import MAX_LABEL_LENGTH, InvalidLabelError, normalise_label


@pytest.mark.parametrize(('label', 'normalised'), [
    ('mug', 'mug'),
    ('Mug', 'mug'),
    ('  coffee   MUG ', 'coffee mug'),
    ('T-joint (steel) 2/3', 't-joint (steel) 2/3'),
    ('box_2.v1', 'box_2.v1'),
    ('_scratch', '_scratch'),
    ('Tasse à café', 'tasse à café'),
    ('tasse a\u0300 cafe\u0301', 'tasse à café'),  # decomposed accents: NFC first
    ('Straße', 'strasse'),
    ('x' * MAX_LABEL_LENGTH, 'x' * MAX_LABEL_LENGTH),
])
def test_valid_labels_are_normalised_and_case_folded(label, normalised):
    assert normalise_label(label) == normalised
    assert normalise_label(normalised) == normalised  # idempotent: stored form is taught form


@pytest.mark.parametrize(('label', 'message'), [
    (None, 'label must be a string, got NoneType'),
    (3, 'label must be a string, got int'),
    ('', 'label must not be empty'),
    ('   ', 'label must not be empty'),
    ('mug\n', re.escape("non-printable character '\\n'")),
    ('mug\tcup', 'non-printable character'),
    ('x' * (MAX_LABEL_LENGTH + 1), f'label is {MAX_LABEL_LENGTH + 1} characters long'),
    ('ß' * 40, 'label is 80 characters long'),  # measured after folding
    ("Tom's mug", re.escape('may hold only letters, digits, spaces and _ . - / ( )')),
    ('mug, red', 'may hold only'),
    ('mug #2', 'may hold only'),
    ('mug+lid', 'may hold only'),
    ('"x"', 'may hold only'),
    ('(mug)', 'starting with a letter, digit or _'),
    ('.hidden', 'starting with a letter, digit or _'),
])
def test_invalid_labels_are_refused_with_the_reason(label, message):
    with pytest.raises(InvalidLabelError, match=message):
        normalise_label(label)


def test_the_error_is_a_value_error():
    assert issubclass(InvalidLabelError, ValueError)
