"""uq_common.StrEnum behaves as Python 3.11's enum.StrEnum where the code relies on it."""

import json

from uq_common.str_enum import StrEnum


class Colour(StrEnum):
    RED = 'red'


def test_members_are_their_value_in_str_format_json_and_comparisons():
    assert str(Colour.RED) == 'red' and f'{Colour.RED}' == 'red' and f'{Colour.RED:>5}' == '  red'
    assert json.dumps({'c': Colour.RED}) == '{"c": "red"}'
    assert Colour.RED == 'red' and Colour('red') is Colour.RED and isinstance(Colour.RED, str)
