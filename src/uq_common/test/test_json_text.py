"""Strict JSON for texts from outside: what Python's json accepts beyond JSON is refused."""

from __future__ import annotations

import pytest

from uq_common.json_text import parse_json, parse_json_object


@pytest.mark.parametrize('text, message', [
    ('NaN', 'NaN is not a number JSON allows'),
    ('[Infinity]', 'Infinity is not a number JSON allows'),
    ('{"x": -Infinity}', '-Infinity is not a number JSON allows'),
    ('1e400', 'out of range'),
    ('[' * 100_000, 'nested too deeply'),
    ('{"x": ', 'Expecting value'),
])
def test_what_is_not_json_is_a_value_error(text, message):
    with pytest.raises(ValueError, match=message):
        parse_json(text)


def test_json_is_parsed_as_json():
    assert parse_json('{"a": [1, 2.5, -3e2, null, true, "x"]}') == {
        'a': [1, 2.5, -300.0, None, True, 'x']}
    # Integers are exact, however long: a caller bounds them where it needs to.
    assert parse_json('123456789012345678901234567890') == 123456789012345678901234567890


def test_an_object_is_required_and_its_size_bounded():
    assert parse_json_object('{"seed": 3}', 'request', 100) == {'seed': 3}
    with pytest.raises(ValueError, match='request must be a JSON object, got list'):
        parse_json_object('[1]', 'request', 100)
    with pytest.raises(ValueError, match='request is 12 characters long; at most 10'):
        parse_json_object('{"seed": 30}', 'request', 10)
    with pytest.raises(ValueError, match=r'request is not JSON \(NaN is not a number'):
        parse_json_object('{"seed": NaN}', 'request', 100)
