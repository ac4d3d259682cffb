"""Argument types of the ``uq`` commands: what each accepts and how it refuses the rest."""

from __future__ import annotations

import argparse
import re

import pytest

from uq_common.arguments import (
    MAX_DOMAIN_ID,
    domain_id,
    non_negative_float,
    non_negative_int,
    open_fraction,
    positive_float,
    positive_int,
)


@pytest.mark.parametrize('parse, text, value', [
    (positive_int, '1', 1), (positive_int, '300', 300),
    (non_negative_int, '0', 0), (non_negative_int, '12', 12),
    (domain_id, '0', 0), (domain_id, str(MAX_DOMAIN_ID), MAX_DOMAIN_ID),
    (positive_float, '0.25', 0.25), (positive_float, '1e3', 1000.0),
    (non_negative_float, '0', 0.0), (non_negative_float, '2.5', 2.5),
    (open_fraction, '0.2', 0.2), (open_fraction, '0.999', 0.999),
])
def test_values_in_range_are_parsed(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize('parse, text, message', [
    (positive_int, '0', 'must be >= 1, got 0'),
    (positive_int, '-3', 'must be >= 1, got -3'),
    (positive_int, '2.5', "expected a whole number, got '2.5'"),
    (positive_int, 'many', "expected a whole number, got 'many'"),
    (non_negative_int, '-1', 'must be >= 0, got -1'),
    (domain_id, '-1', 'a ROS domain id must be 0..232, got -1'),
    (domain_id, '233', 'a ROS domain id must be 0..232, got 233'),
    (positive_float, '0', 'must be > 0, got 0.0'),
    (open_fraction, '0', 'must be in (0, 1), got 0.0'),
    (open_fraction, '1', 'must be in (0, 1), got 1.0'),
    (positive_float, 'nan', "expected a finite number, got 'nan'"),
    (positive_float, 'inf', "expected a finite number, got 'inf'"),
    (positive_float, 'fast', "expected a number, got 'fast'"),
    (non_negative_float, '-0.5', 'must be >= 0, got -0.5'),
    (non_negative_float, '-inf', "expected a finite number, got '-inf'"),
])
def test_values_out_of_range_are_refused_saying_why(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
        parse(text)


def test_a_command_refuses_them_with_exit_2_and_one_line(capsys):
    from uq_common.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(['eval', 'detector', '--data', 'x', '--threads', '0'])
    assert exit_info.value.code == 2
    assert 'argument --threads: must be >= 1, got 0' in capsys.readouterr().err
