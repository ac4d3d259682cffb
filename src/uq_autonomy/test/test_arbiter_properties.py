"""Property-based tests of the arbiter (hypothesis).

1. Never more than one level up per dwell period, except a restore after an outage: to no
   more than the level held when perception was lost, within the restore window, on a
   frame below that level's up threshold.
2. Never above teleoperation while perception is stale, broken or missing (override or not).
3. A noisy signal inside one hysteresis band causes a bounded, monotone set of transitions.
4. The command equals its level's formula, re-derived here from the inputs.

Each property is checked on random configurations and random timed event sequences; the
expected values are computed in this file from the event history, not read back from the
arbiter's internals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from uq_autonomy.arbitration.arbiter import Arbiter
from uq_autonomy.arbitration.config import NUM_LEVELS, ArbiterConfig, Level, Thresholds
from uq_autonomy.arbitration.frame_validity import DetectionSummary

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def thresholds(draw: st.DrawFn) -> Thresholds:
    ups = sorted(draw(st.lists(st.floats(0.0, 5.0), min_size=3, max_size=3, unique=True)),
                 reverse=True)
    widths = draw(st.lists(st.floats(0.05, 2.0), min_size=3, max_size=3))
    gaps = draw(st.lists(st.floats(0.01, 1.0), min_size=2, max_size=2))
    down = [0.0, 0.0, ups[2] + widths[2]]
    down[1] = max(ups[1] + widths[1], down[2] + gaps[1])
    down[0] = max(ups[0] + widths[0], down[1] + gaps[0])
    return Thresholds(up=tuple(ups), down=tuple(down))


@st.composite
def configs(draw: st.DrawFn) -> ArbiterConfig:
    # Raw GP variance: its thresholds may be any ordered non-negative numbers.
    return ArbiterConfig(
        uncertainty_signal='gp_variance',
        gp_variance_thresholds=draw(thresholds()),
        min_dwell_s=draw(st.sampled_from([0.0, 0.05, 0.3, 1.0])),
        perception_deadline_s=draw(st.floats(0.05, 1.0)),
        resume_window_s=draw(st.sampled_from([0.0, 0.5, 5.0])),
        resume_confirm_s=draw(st.sampled_from([0.0, 0.1, 0.3])),
        operator_timeout_s=draw(st.floats(0.05, 1.0)),
        autonomy_timeout_s=draw(st.floats(0.05, 1.0)),
        operator_deadband=draw(st.floats(0.0, 0.5)),
        blend_alpha_min=(amin := draw(st.floats(0.0, 1.0))),
        blend_alpha_max=draw(st.floats(amin, 1.0)),
    )


def frame(u: float) -> list[DetectionSummary]:
    return [DetectionSummary('obj', 0, -1, 100.0, 100.0, 10.0, 10.0, u, 0.0, (1.0,))]


# An event is (dt, kind, payload). Kinds: frame (uncertainty, possibly NaN), empty frame,
# plain decision tick, override (level, duration), operator/autonomy command.
uncertainties = st.one_of(st.floats(0.0, 8.0), st.just(math.nan), st.just(0.0))
# Magnitudes from far below to far above any dead-band, so the override test bites.
twists = st.builds(lambda v, scale: [x * scale for x in v],
                   st.lists(st.floats(-1.0, 1.0), min_size=6, max_size=6),
                   st.sampled_from([0.0, 0.02, 0.1, 0.3, 0.6, 2.0]))
events = st.lists(st.one_of(
    st.tuples(st.floats(0.0, 0.4), st.just('frame'), uncertainties),
    st.tuples(st.floats(0.0, 0.4), st.just('frame'), uncertainties),
    st.tuples(st.floats(0.0, 1.5), st.just('tick'), st.none()),
    st.tuples(st.floats(0.0, 0.4), st.just('empty'), st.none()),
    st.tuples(st.floats(0.0, 0.4), st.just('override'),
              st.tuples(st.integers(-1, 3), st.sampled_from([0.0, 0.2, 1.0]))),
    st.tuples(st.floats(0.0, 0.4), st.just('operator'), twists),
    st.tuples(st.floats(0.0, 0.4), st.just('autonomy'), twists),
), min_size=1, max_size=80)
# Mostly commands, for the command formula.
command_events = st.lists(st.one_of(
    st.tuples(st.floats(0.0, 0.3), st.just('operator'), twists),
    st.tuples(st.floats(0.0, 0.3), st.just('autonomy'), twists),
    st.tuples(st.floats(0.0, 0.3), st.just('frame'), uncertainties),
    st.tuples(st.floats(0.0, 1.0), st.just('tick'), st.none()),
), min_size=8, max_size=80)


@dataclass
class Record:
    """What the test knows from the inputs alone, after each event."""

    now: float
    level: Level
    transition_from: Level | None
    stale_expected: bool
    override_used: bool
    last_valid: float | None
    frame_u: float | None


def run(config: ArbiterConfig, evs: list, t0: float = 10.0) -> tuple[Arbiter, list[Record]]:
    arbiter = Arbiter(config, t0)
    now = t0
    last_valid: float | None = None
    last_frame_ok = False
    override_used = False
    out = []
    for dt, kind, payload in evs:
        now += dt
        frame_u = None
        if kind == 'frame':
            frame_u = payload
            step = arbiter.observe(now, frame(payload), 1)
            last_frame_ok = math.isfinite(payload)
            last_valid = now if last_frame_ok else last_valid
        elif kind == 'empty':
            step = arbiter.observe(now, [], 1)
            last_frame_ok = False
        elif kind == 'override':
            override_used = True
            _, _, step = arbiter.set_override(now, payload[0], payload[1])
        elif kind == 'operator':
            arbiter.operator_command(now, payload)
            step = arbiter.step(now)
        elif kind == 'autonomy':
            arbiter.autonomy_command(now, payload)
            step = arbiter.step(now)
        else:
            step = arbiter.step(now)
        stale = (not last_frame_ok or last_valid is None
                 or now - last_valid > config.perception_deadline_s)
        out.append(Record(now, step.state.level,
                          step.transition.from_level if step.transition else None,
                          stale, override_used, last_valid, frame_u))
    return arbiter, out


@st.composite
def outages(draw: st.DrawFn) -> tuple[ArbiterConfig, list]:
    """A climb on certain frames, an outage, then frames whose uncertainty lies around the
    thresholds: the sequences where a restore can happen (the random events above hardly
    ever make one)."""
    config = draw(configs())
    th = config.thresholds
    climb = draw(st.lists(st.tuples(st.floats(0.02, 0.2), st.just('frame'),
                                    st.floats(0.0, 0.9 * th.up[-1])), min_size=5, max_size=60))
    near = st.builds(lambda v, f: v * f, st.sampled_from([*th.up, *th.down]),
                     st.floats(0.8, 1.2))
    after = draw(st.lists(st.tuples(st.floats(0.0, 0.3), st.just('frame'),
                                    st.one_of(near, uncertainties)), min_size=1, max_size=30))
    return config, [*climb, (draw(st.floats(0.0, 8.0)), 'tick', None), *after]


@SETTINGS
@given(configs(), events)
def test_never_more_than_one_level_up_per_dwell_period(config, evs):
    # Manual overrides jump by design; the property is about the signal-driven climb.
    evs = [e for e in evs if e[1] != 'override']
    if evs:
        check_climb(config, evs)


@SETTINGS
@given(outages())
def test_a_restore_after_an_outage_never_exceeds_what_perception_had_earned(case):
    check_climb(*case)


def check_climb(config: ArbiterConfig, evs: list) -> None:
    t0 = 10.0
    _, records = run(config, evs, t0)
    last_change = t0
    # The level held when perception was last lost, and the last valid frame before.
    held, lost_after = Level.TELEOPERATION, None
    before = Record(t0, Level.TELEOPERATION, None, True, False, None, None)
    for r in records:
        if r.stale_expected and not before.stale_expected:
            held, lost_after = before.level, before.last_valid
        before = r
        if r.transition_from is None:
            continue
        climb = r.level == r.transition_from + 1 and \
            r.now - last_change >= config.min_dwell_s - 1e-9
        if r.level > r.transition_from and not climb:
            assert config.resume_window_s > 0.0 and lost_after is not None
            assert r.level <= held
            assert r.now - lost_after <= config.resume_window_s + 1e-9
            last_u = next(x.frame_u for x in reversed(records[:records.index(r) + 1])
                          if x.frame_u is not None)
            assert last_u < config.thresholds.up[r.level - 1]
        last_change = r.now


@SETTINGS
@given(configs(), events)
def test_never_above_teleoperation_while_perception_is_unusable(config, evs):
    _, records = run(config, evs)
    for r in records:
        if r.stale_expected:
            assert r.level == Level.TELEOPERATION


@SETTINGS
@given(configs(), st.integers(0, NUM_LEVELS - 2), st.integers(0, NUM_LEVELS - 1),
       st.lists(st.tuples(st.floats(0.01, 0.3), st.floats(0.02, 0.98)), min_size=20,
                max_size=200))
def test_noise_inside_a_hysteresis_band_does_not_chatter(config, band, start, samples):
    th = config.gp_variance_thresholds
    lo, hi = th.up[band], th.down[band]
    # Start from any level: a released override leaves the level where it was (the release
    # is itself a decision on the in-band signal, so it counts too).
    arbiter = Arbiter(config, 0.0)
    now = 0.01
    arbiter.observe(now, frame(0.5 * (lo + hi)), 1)
    arbiter.set_override(now, start, 0.0)
    assert arbiter.level == start
    _, _, step = arbiter.set_override(now, -1, 0.0)
    levels = [start, int(step.state.level)]
    transitions = int(step.transition is not None)
    for dt, fraction in samples:
        now += min(dt, 0.9 * config.perception_deadline_s)  # keep perception fresh
        u = lo + fraction * (hi - lo)  # strictly inside (up, down) of the band
        step = arbiter.observe(now, frame(u), 1)
        transitions += step.transition is not None
        levels.append(int(step.state.level))
    assert transitions <= NUM_LEVELS - 1
    diffs = np.diff(levels)
    assert np.all(diffs >= 0) or np.all(diffs <= 0), levels  # monotone: no back and forth
    # It never crosses the band: from below it stops at band's lower level at most...
    if start <= band:
        assert max(levels) <= band
    else:  # ...from above it goes no lower than the band's upper level.
        assert min(levels) >= band + 1


def expected_command(level: Level, config: ArbiterConfig, u: float, op, op_fresh: bool,
                     auto, auto_fresh: bool) -> np.ndarray:
    zero = np.zeros(6)
    op = np.asarray(op, float) if op is not None and op_fresh else None
    auto = np.asarray(auto, float) if auto is not None and auto_fresh else None
    if level in (Level.TELEOPERATION, Level.GUIDED):
        return op if op is not None else zero
    if level == Level.SHARED:
        if op is None:
            return zero
        confidence = np.clip(1.0 - u / config.gp_variance_thresholds.down[1], 0.0, 1.0)
        alpha = config.blend_alpha_min + (config.blend_alpha_max - config.blend_alpha_min) \
            * confidence
        return (1.0 - alpha) * op + alpha * (auto if auto is not None else zero)
    if op is not None and np.max(np.abs(op)) > config.operator_deadband:
        return op
    return auto if auto is not None else zero


@SETTINGS
@given(configs(), command_events, st.permutations(list(Level)),
       st.one_of(st.none(), st.floats(0.0, 4.0)))
def test_command_equals_the_level_formula(config, evs, forced_levels, steady_u):
    arbiter = Arbiter(config, 0.0)
    now = 0.0
    op = auto = None
    op_t = auto_t = -math.inf
    u = math.nan
    # Interleave forced levels so every level's formula is exercised, not only level 0.
    chunk = max(1, len(evs) // len(forced_levels))
    for i, (dt, kind, payload) in enumerate(evs):
        now += dt
        if i % chunk == 0:
            level = forced_levels[min(i // chunk, len(forced_levels) - 1)]
            arbiter.set_override(now, level, 0.0)
        if steady_u is not None:
            # Keep perception fresh so forced levels hold and levels 2-3 get exercised.
            arbiter.observe(now, frame(steady_u), 1)
            u = steady_u
        if kind == 'frame':
            step = arbiter.observe(now, frame(payload), 1)
            u = payload
        elif kind == 'operator':
            arbiter.operator_command(now, payload)
            op, op_t = payload, now
            step = arbiter.step(now)
        elif kind == 'autonomy':
            arbiter.autonomy_command(now, payload)
            auto, auto_t = payload, now
            step = arbiter.step(now)
        else:
            step = arbiter.step(now)
        expected = expected_command(
            step.state.level, config, u, op, now - op_t <= config.operator_timeout_s,
            auto, now - auto_t <= config.autonomy_timeout_s)
        np.testing.assert_allclose(step.command, expected, rtol=1e-12, atol=1e-12)
        if step.state.level == Level.SHARED:
            assert config.blend_alpha_min - 1e-12 <= step.state.blend_alpha \
                <= config.blend_alpha_max + 1e-12
