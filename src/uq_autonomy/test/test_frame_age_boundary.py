"""The age rule of perception frames at its boundary: ``max_frame_age_s`` is the limit.

A frame stamped more than ``max_frame_age_s`` before the clock must not drive the level
(the arbitration node refuses it with :func:`stamp_problem` and the arbiter falls back to
teleoperation). The examples elsewhere use fresh frames and an hour-old one, which a rule
loosened ten-fold still tells apart; here frames a little over the limit (1.01x to 9.5x)
must be refused and frames a little under it accepted, for several limits. The limits and
the clock are binary fractions, so a stamp exactly at the limit is exactly representable.
"""

from __future__ import annotations

import math

import pytest

from uq_autonomy.arbitration.config import ArbiterConfig
from uq_autonomy.arbitration.frame_validity import stamp_problem

CLOCK_S = 1024.0
LIMITS_S = [0.125, 0.25, 1.0, 4.0]
OVER = [1.01, 1.1, 1.5, 2.0, 3.0, 5.0, 9.5]
UNDER = [0.0, 0.5, 0.9, 0.99]


@pytest.mark.parametrize('limit', LIMITS_S)
@pytest.mark.parametrize('factor', OVER)
def test_a_frame_a_little_older_than_max_frame_age_s_is_refused(limit, factor):
    config = ArbiterConfig(max_frame_age_s=limit)
    problem = stamp_problem(CLOCK_S - factor * limit, CLOCK_S, config)
    assert problem is not None, f'a frame {factor}x max_frame_age_s {limit:g} old was accepted'
    assert f'old, more than max_frame_age_s {limit:g}' in problem


@pytest.mark.parametrize('limit', LIMITS_S)
@pytest.mark.parametrize('factor', UNDER)
def test_a_frame_younger_than_max_frame_age_s_is_accepted(limit, factor):
    config = ArbiterConfig(max_frame_age_s=limit)
    assert stamp_problem(CLOCK_S - factor * limit, CLOCK_S, config) is None


@pytest.mark.parametrize('limit', LIMITS_S)
def test_the_limit_itself_is_accepted_and_the_next_older_stamp_refused(limit):
    config = ArbiterConfig(max_frame_age_s=limit)
    at_limit = CLOCK_S - limit
    assert stamp_problem(at_limit, CLOCK_S, config) is None
    older = math.nextafter(at_limit, -math.inf)
    assert CLOCK_S - older > limit  # exact: the subtraction of close numbers is exact
    assert stamp_problem(older, CLOCK_S, config) is not None
