"""Scripted tabletop scenarios: scene state as a deterministic function of time (ROS-free).

A :class:`Scenario` holds one compiled-once :class:`~uq_sim.scene.SceneSpec` with every
object that ever appears, a schedule of when each object is on the table, and a gripper
path. :meth:`Scenario.state_at` maps a time to poses and presence; the sim camera node
renders that state at its own rate, so the image content at time ``t`` never depends on
the frame rate or on dropped frames.

Scenarios
---------
``tabletop_demo`` (30 s)
    Four known objects (box, sphere, mug, cylinder). An unknown torus is put down at
    8 s, a cone at 13 s, a tetrahedron at 18 s; from 21 s the gripper moves over the torus
    and descends toward it (27-30 s).
``known_static`` (10 s)
    The four known objects, nothing moves.
``unknown_static`` (10 s)
    Two known objects and two unknown ones (torus, cone), nothing moves.
``novel_arrivals`` (25 s)
    Four known objects; an unknown torus is put down at 2 s, a cone at 9 s, a tetrahedron
    at 16 s, and they stay (for ``uq eval help``).
``novel_pair`` (20 s)
    A known box and mug; an unknown cone is put down at 1 s and a torus at 8 s, and they
    stay (for ``uq eval help``; its first seconds are the ``--quick`` run).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from uq_sim.geometry import rot_z
from uq_sim.objects import Appearance, ObjectSpec, TextureKind, make_object

# The MuJoCo-dependent scene module is imported lazily so that listing or stepping
# scenarios (e.g. in a node's --help) does not load the renderer.

_PUT_DOWN_S = 0.6        # an appearing object is lowered onto the table over this time
_PUT_DOWN_HEIGHT = 0.08  # from this height above its resting place, metres


@dataclass(frozen=True)
class ScenarioEvent:
    """Something that happens at ``time`` seconds, for timelines and plots."""

    time: float
    description: str


@dataclass(frozen=True)
class ObjectState:
    """Pose of one object at a time; ``present`` False means it is not on the table."""

    name: str
    class_name: str
    present: bool
    pos: tuple[float, ...]
    quat: tuple[float, ...]


@dataclass(frozen=True)
class SceneState:
    """Scene at one scenario time."""

    time: float
    objects: tuple[ObjectState, ...]
    gripper_pos: tuple[float, ...] | None = None
    gripper_yaw: float = 0.0

    def present_names(self) -> list[str]:
        """Names of the objects on the table."""
        return [o.name for o in self.objects if o.present]


def _smoothstep(x: float) -> float:
    x = min(1.0, max(0.0, x))
    return x * x * (3.0 - 2.0 * x)


@dataclass(frozen=True)
class Scenario:
    """A scripted scene sequence.

    Attributes
    ----------
    name, description : str
        Identifier and one-line summary.
    duration : float
        Length of one pass, seconds.
    spec_factory : callable
        Builds the scene (imports MuJoCo-dependent types lazily).
    schedule : dict of str to (float, float)
        Object name -> (time it is put down, time it is removed).
    gripper_path : tuple of (float, (x, y, z))
        Gripper tool-point waypoints; positions are interpolated smoothly between them.
    events : tuple of ScenarioEvent
        Timeline for plots.
    """

    name: str
    description: str
    duration: float
    spec_factory: Callable[[], object]
    schedule: dict[str, tuple[float, float]]
    gripper_path: tuple[tuple[float, tuple[float, ...]], ...] = ()
    events: tuple[ScenarioEvent, ...] = ()
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def spec(self):  # -> uq_sim.scene.SceneSpec
        """The scene with every object of the scenario (built once)."""
        if 'spec' not in self._cache:
            self._cache['spec'] = self.spec_factory()
        return self._cache['spec']

    def scenario_time(self, t: float, loop: bool = True) -> float:
        """Map elapsed seconds to scenario time: wrap when looping, else hold the end.

        Raises
        ------
        ValueError
            If ``t`` is negative or not finite.
        """
        if not math.isfinite(t) or t < 0.0:
            raise ValueError(f'time must be finite and >= 0, got {t}')
        return math.fmod(t, self.duration) if loop else min(t, self.duration)

    def state_at(self, t: float, loop: bool = True) -> SceneState:
        """Scene state at elapsed time ``t`` seconds (see :meth:`scenario_time`)."""
        ts = self.scenario_time(t, loop)
        states = []
        for obj in self.spec.objects:
            start, end = self.schedule.get(obj.name, (0.0, math.inf))
            present = start <= ts < end
            pos = obj.position()
            if present and start > 0.0:
                lift = 1.0 - _smoothstep((ts - start) / _PUT_DOWN_S)
                pos = pos + np.array([0.0, 0.0, _PUT_DOWN_HEIGHT * lift])
            states.append(ObjectState(obj.name, obj.class_name, present,
                                      tuple(float(v) for v in pos),
                                      tuple(float(v) for v in obj.quat)))
        return SceneState(ts, tuple(states), self._gripper_at(ts))

    def _gripper_at(self, ts: float) -> tuple[float, ...] | None:
        if not self.gripper_path:
            return None
        times = [w[0] for w in self.gripper_path]
        points = [np.asarray(w[1], float) for w in self.gripper_path]
        if ts <= times[0]:
            return tuple(points[0])
        for (t0, p0), (t1, p1) in zip(zip(times, points, strict=True),
                                      zip(times[1:], points[1:], strict=True), strict=False):
            if ts <= t1:
                s = _smoothstep((ts - t0) / (t1 - t0)) if t1 > t0 else 1.0
                return tuple(float(v) for v in p0 + s * (p1 - p0))
        return tuple(float(v) for v in points[-1])

    def apply(self, renderer, t: float, loop: bool = True) -> SceneState:
        """Pose a :class:`~uq_sim.scene.SceneRenderer` (with :attr:`spec` loaded) at ``t``."""
        state = self.state_at(t, loop)
        for obj in state.objects:
            renderer.set_object_present(obj.name, obj.present)
            renderer.set_object_pose(obj.name, obj.pos, obj.quat)
        if state.gripper_pos is not None:
            renderer.set_gripper_pose(state.gripper_pos, state.gripper_yaw)
        return state


# ------------------------------------------------------------------------ library

_COLOURS = {
    'box': Appearance((0.8, 0.25, 0.2), TextureKind.CHECKER, (0.55, 0.15, 0.12)),
    'sphere': Appearance((0.2, 0.4, 0.85)),
    'mug': Appearance((0.95, 0.8, 0.25), specular=0.5, shininess=0.6),
    'cylinder': Appearance((0.25, 0.7, 0.35), TextureKind.GRADIENT, (0.1, 0.35, 0.15)),
    'torus': Appearance((0.95, 0.5, 0.15), specular=0.4),
    'cone': Appearance((0.6, 0.3, 0.75)),
    'tetrahedron': Appearance((0.2, 0.75, 0.8), TextureKind.CHECKER, (0.1, 0.4, 0.45)),
}
_PLACES = {
    'box': ((-0.2, -0.06), 0.4), 'sphere': ((-0.04, 0.12), 0.0),
    'mug': ((0.2, 0.04), -0.6), 'cylinder': ((0.16, -0.19), 0.0),
    'torus': ((0.0, -0.05), 0.0), 'cone': ((-0.2, 0.12), 0.0),
    'tetrahedron': ((0.1, 0.14), 0.7),
}
_UPRIGHT = {'cylinder', 'capsule'}  # fixed resting pose in scripted scenes
_DEMO_KNOWN = ('box', 'sphere', 'mug', 'cylinder')
_HOME = (0.34, -0.26, 0.34)


def _objects(classes: Sequence[str], seed: int = 7) -> tuple[ObjectSpec, ...]:
    # One generator per object, so an object's size does not depend on the others.
    out = []
    for cls in classes:
        rng = np.random.default_rng([seed, hash_name(cls)])
        xy, yaw = _PLACES[cls]
        obj = make_object(cls, cls, xy, rng, yaw=yaw, appearance=_COLOURS[cls])
        if cls in _UPRIGHT:
            obj = replace(obj, rot=rot_z(yaw))
        out.append(obj)
    return tuple(out)


def hash_name(name: str) -> int:
    """A stable (not per-process salted) integer from a name, for seeding."""
    return int.from_bytes(name.encode()[:8].ljust(8, b'\0'), 'little')


def _spec(classes: Sequence[str], gripper: bool):
    from uq_sim.scene import GripperSpec, LightSpec, SceneSpec
    return SceneSpec(
        objects=_objects(classes),
        lights=(LightSpec(pos=(0.5, -0.4, 1.3), diffuse=(0.62, 0.6, 0.58)),
                LightSpec(pos=(-0.6, 0.3, 1.0), diffuse=(0.18, 0.18, 0.2),
                          directional=False, castshadow=False)),
        gripper=GripperSpec(pos=_HOME) if gripper else None,
        ambient=0.25, headlight=0.2)


def _tabletop_demo() -> Scenario:
    above = (_PLACES['torus'][0][0], _PLACES['torus'][0][1])
    return Scenario(
        name='tabletop_demo',
        description='known objects, then unknown ones appear; the gripper approaches the torus',
        duration=30.0,
        spec_factory=lambda: _spec(_DEMO_KNOWN + ('torus', 'cone', 'tetrahedron'), True),
        schedule={'torus': (8.0, math.inf), 'cone': (13.0, math.inf),
                  'tetrahedron': (18.0, math.inf)},
        gripper_path=((0.0, _HOME), (21.0, _HOME), (26.0, (above[0], above[1], 0.16)),
                      (29.0, (above[0], above[1], 0.05)), (30.0, (above[0], above[1], 0.05))),
        events=(ScenarioEvent(0.0, 'known objects: box, sphere, mug, cylinder'),
                ScenarioEvent(8.0, 'unknown torus appears'),
                ScenarioEvent(13.0, 'unknown cone appears'),
                ScenarioEvent(18.0, 'unknown tetrahedron appears'),
                ScenarioEvent(21.0, 'gripper moves toward the torus'),
                ScenarioEvent(26.0, 'gripper descends onto the torus')),
    )


def _known_static() -> Scenario:
    return Scenario(
        name='known_static', description='four known objects, static', duration=10.0,
        spec_factory=lambda: _spec(_DEMO_KNOWN, False), schedule={},
        events=(ScenarioEvent(0.0, 'known objects: box, sphere, mug, cylinder'),))


def _unknown_static() -> Scenario:
    return Scenario(
        name='unknown_static', description='two known and two unknown objects, static',
        duration=10.0, spec_factory=lambda: _spec(('box', 'mug', 'torus', 'cone'), False),
        schedule={},
        events=(ScenarioEvent(0.0, 'known box and mug, unknown torus and cone'),))


def _novel_arrivals() -> Scenario:
    return Scenario(
        name='novel_arrivals',
        description='four known objects; unknown torus, cone, tetrahedron arrive and stay',
        duration=25.0, spec_factory=lambda: _spec(_DEMO_KNOWN + ('torus', 'cone',
                                                                 'tetrahedron'), False),
        schedule={'torus': (2.0, math.inf), 'cone': (9.0, math.inf),
                  'tetrahedron': (16.0, math.inf)},
        events=(ScenarioEvent(0.0, 'known objects: box, sphere, mug, cylinder'),
                ScenarioEvent(2.0, 'unknown torus appears'),
                ScenarioEvent(9.0, 'unknown cone appears'),
                ScenarioEvent(16.0, 'unknown tetrahedron appears')))


def _novel_pair() -> Scenario:
    return Scenario(
        name='novel_pair', description='known box and mug; unknown cone and torus arrive',
        duration=20.0, spec_factory=lambda: _spec(('box', 'mug', 'cone', 'torus'), False),
        schedule={'cone': (1.0, math.inf), 'torus': (8.0, math.inf)},
        events=(ScenarioEvent(0.0, 'known box and mug'),
                ScenarioEvent(1.0, 'unknown cone appears'),
                ScenarioEvent(8.0, 'unknown torus appears')))


_FACTORIES: dict[str, Callable[[], Scenario]] = {
    'tabletop_demo': _tabletop_demo,
    'known_static': _known_static,
    'unknown_static': _unknown_static,
    'novel_arrivals': _novel_arrivals,
    'novel_pair': _novel_pair,
}
SCENARIO_NAMES: tuple[str, ...] = tuple(_FACTORIES)


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name`` (a new instance each call).

    Raises
    ------
    ValueError
        If there is no such scenario.
    """
    if name not in _FACTORIES:
        raise ValueError(f'unknown scenario {name!r}; expected one of {SCENARIO_NAMES}')
    return _FACTORIES[name]()
