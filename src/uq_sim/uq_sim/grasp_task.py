"""The "reach and grasp the <target class> object" task (ROS-free).

A trial is a tabletop scene drawn from a seed: the target (one object of the target
class), known distractors of other classes, and, in look-alike trials, an unknown object
that the shipped detector takes for the target class (found with the shipped model: a
torus is read as an ellipsoid in most views, see docs/shared_autonomy.md). The look-alike
is put nearer the gripper's start than the target, so a policy that trusts the detector
and reaches for the nearest target-class detection grasps the wrong object.

A trial may instead hold a *procedural* look-alike: shape ``k`` of the held-out families
of :mod:`uq_sim.procedural_objects`, drawn from its own stream
(:func:`lookalike_shape_rng`), so shape ``k`` is the same object, resting the same way, in
every trial; only its place changes. In a *target-absent* trial the target is left out: the right
outcome is to grasp nothing.

The gripper grasps on command: when its tool point stays within ``grasp_radius`` of an
object's centre (in the table plane), at a speed below ``still_speed``, while the command
asks to close (``linear.z`` downward, see :mod:`uq_sim.robot`) for ``grasp_hold_s``, it
closes on that object and the trial ends: **success** if it is the target, **failure**
if it is another object, **timeout** if nothing was grasped within ``timeout_s``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from uq_common.json_text import parse_json_object
from uq_sim.objects import make_object
from uq_sim.procedural_scenes import procedural_family

TARGET_CLASS = 'ellipsoid'
LOOKALIKE_CLASSES = ('torus',)
DISTRACTOR_CLASSES = ('box', 'sphere', 'cylinder', 'mug')
# The gripper starts behind the objects (seen from the camera), so on its way it never
# hides the target from the camera: the arm rises above the tool point.
GRIPPER_HOME = (0.0, 0.21)
MAX_SEED = 2**31 - 1  # the sim's ``seed`` parameter has the same range
# A reset request is a few dozen characters; anything much longer is malformed or hostile.
MAX_RESET_REQUEST_CHARS = 1024
_INT64 = (-2**63, 2**63 - 1)
# Procedural look-alike shapes are numbered 0 .. MAX_LOOKALIKE_SHAPE.
MAX_LOOKALIKE_SHAPE = 2**31 - 1
# Spawn key of the look-alike shape streams, apart from the procedural scenes' and the
# dataset's streams.
LOOKALIKE_SHAPE_STREAM = 0x6C6F6F6B
# A per-trial time limit in a reset request, seconds (the node's parameter has this range).
TRIAL_TIMEOUT_RANGE = (1.0, 3600.0)


def lookalike_shape_rng(index: int) -> np.random.Generator:
    """Random stream of procedural look-alike shape ``index`` (its geometry and colours)."""
    return np.random.default_rng(np.random.SeedSequence(
        [int(index)], spawn_key=(LOOKALIKE_SHAPE_STREAM,)))


@dataclass(frozen=True)
class ResetRequest:
    """A ``reset_task`` request: the trial seed, whether it has a look-alike (``None``:
    drawn), the harness's tag echoed in ``task_state``, the procedural look-alike shape
    (``None``: the fixed look-alike class), whether the target is left out, and the
    trial's time limit (``None``: the node's)."""

    seed: int
    lookalike: bool | None
    request_id: int = -1
    lookalike_shape: int | None = None
    target_absent: bool = False
    timeout_s: float | None = None


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_reset_request(text: str) -> ResetRequest:
    """The request in ``text``: a JSON object ``{"seed": N, "lookalike": true | false |
    null, "request_id": K, "lookalike_shape": S | null, "target_absent": true | false,
    "timeout_s": T | null}``.

    ``seed`` is a JSON integer in ``[0, MAX_SEED]``; ``lookalike`` (default null) is true,
    false or null; ``request_id`` (default -1) is a JSON integer that fits 64 bits. Floats,
    booleans and strings are no integers here: ``1.7`` or ``true`` is refused, not rounded.
    ``lookalike_shape`` (default null) is an integer in ``[0, MAX_LOOKALIKE_SHAPE]`` and
    implies a look-alike; ``target_absent`` (default false) a boolean, true only with a
    look-alike; ``timeout_s`` (default null) a number in ``TRIAL_TIMEOUT_RANGE``.

    Raises
    ------
    ValueError
        Naming the first rule ``text`` breaks (too long, not JSON, not an object, a field
        of the wrong type or out of range).
    """
    request = parse_json_object(text, 'request', MAX_RESET_REQUEST_CHARS)
    seed = request.get('seed')
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f'seed must be an integer in [0, {MAX_SEED}], got {seed!r:.40}')
    lookalike = request.get('lookalike')
    if lookalike is not None and not isinstance(lookalike, bool):
        raise ValueError(f'lookalike must be true, false or null, got {lookalike!r:.40}')
    request_id = request.get('request_id', -1)
    if isinstance(request_id, bool) or not isinstance(request_id, int) \
            or not _INT64[0] <= request_id <= _INT64[1]:
        raise ValueError(f'request_id must be a 64-bit integer, got {request_id!r:.40}')
    shape = request.get('lookalike_shape')
    if shape is not None and (not _integer(shape) or not 0 <= shape <= MAX_LOOKALIKE_SHAPE):
        raise ValueError(f'lookalike_shape must be null or an integer in '
                         f'[0, {MAX_LOOKALIKE_SHAPE}], got {shape!r:.40}')
    if shape is not None and lookalike is False:
        raise ValueError('lookalike_shape asks for a look-alike; lookalike is false')
    absent = request.get('target_absent', False)
    if not isinstance(absent, bool):
        raise ValueError(f'target_absent must be true or false, got {absent!r:.40}')
    if absent and not (lookalike or shape is not None):
        raise ValueError('target_absent needs a look-alike (lookalike true or a '
                         'lookalike_shape)')
    timeout = request.get('timeout_s')
    low, high = TRIAL_TIMEOUT_RANGE
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(
            timeout, int | float) or not low <= timeout <= high):
        raise ValueError(f'timeout_s must be null or a number in [{low:g}, {high:g}], '
                         f'got {timeout!r:.40}')
    return ResetRequest(seed, lookalike, request_id, shape, absent,
                        None if timeout is None else float(timeout))


@dataclass(frozen=True)
class TaskObject:
    """One object of a trial: name, class, table position, whether it is a look-alike,
    and for a procedural look-alike its shape number (see :func:`lookalike_shape_rng`)."""

    name: str
    class_name: str
    xy: tuple[float, float]
    known: bool
    lookalike: bool = False
    shape_index: int | None = None


@dataclass(frozen=True)
class TrialSpec:
    """A trial: its seed, target class, objects (the first is the target unless
    ``target_present`` is false)."""

    seed: int
    target_class: str
    objects: tuple[TaskObject, ...]
    lookalike: bool
    target_present: bool = True

    @property
    def target(self) -> TaskObject | None:
        """The object to grasp; None in a target-absent trial."""
        return self.objects[0] if self.target_present else None

    @property
    def lookalike_object(self) -> TaskObject | None:
        """The look-alike; None when the trial has none."""
        return next((o for o in self.objects if o.lookalike), None)

    def scene_spec(self):  # -> uq_sim.scene.SceneSpec
        """The MuJoCo scene of this trial, with the gripper at its home position."""
        from uq_sim.scene import GripperSpec, LightSpec, SceneSpec
        rng = np.random.default_rng([self.seed, 17])

        # A procedural look-alike is one object, resting the same way in every trial: its
        # geometry, colours and yaw come from its own stream; only its place changes.
        objects = tuple(make_object(o.name, o.class_name, o.xy, rng if o.shape_index is None
                                    else lookalike_shape_rng(o.shape_index))
                        for o in self.objects)
        return SceneSpec(
            objects=objects,
            lights=(LightSpec(pos=(0.5, -0.4, 1.3), diffuse=(0.62, 0.6, 0.58)),
                    LightSpec(pos=(-0.6, 0.3, 1.0), diffuse=(0.18, 0.18, 0.2),
                              directional=False, castshadow=False)),
            gripper=GripperSpec(pos=(GRIPPER_HOME[0], GRIPPER_HOME[1], 0.12), yaw=math.pi / 2),
            ambient=0.25, headlight=0.2)


def make_trial(seed: int, lookalike: bool | None = None,
               target_class: str = TARGET_CLASS, lookalike_shape: int | None = None,
               target_absent: bool = False) -> TrialSpec:
    """Draw trial ``seed``; ``lookalike`` None draws it (probability 0.4).

    Objects are at least 0.12 m apart, in the part of the table the camera sees well
    (x in [-0.22, 0.22], y in [-0.14, 0.1]); the target is at least 0.25 m from the
    gripper's start; a look-alike lies nearer the start than the target.
    ``lookalike_shape`` puts procedural shape ``lookalike_shape`` in the look-alike's place
    (the layout is that of the same seed with the fixed look-alike); ``target_absent``
    then leaves the target out, every other object where it was.

    Raises
    ------
    ValueError
        If ``target_absent`` is asked without a look-alike, or a shape with
        ``lookalike=False``.
    """
    if lookalike_shape is not None:
        if lookalike is False:
            raise ValueError('a look-alike shape needs a look-alike trial')
        lookalike = True
    if target_absent and not lookalike:
        raise ValueError('a target-absent trial holds a look-alike')
    rng = np.random.default_rng([seed, 1717])
    if lookalike is None:
        lookalike = bool(rng.random() < 0.4)
    home = np.array(GRIPPER_HOME)
    placed: list[np.ndarray] = []

    def draw(condition) -> tuple[float, float]:
        for _ in range(2000):
            xy = np.array([rng.uniform(-0.22, 0.22), rng.uniform(-0.14, 0.1)])
            if all(np.linalg.norm(xy - p) >= 0.12 for p in placed) and condition(xy):
                placed.append(xy)
                return float(xy[0]), float(xy[1])
        raise RuntimeError(f'trial {seed}: no free place for an object')

    target_xy = draw(lambda xy: np.linalg.norm(xy - home) >= 0.25)
    objects = [TaskObject('target', target_class, target_xy, True)]
    if lookalike:
        d_target = float(np.linalg.norm(np.array(target_xy) - home))
        cls = LOOKALIKE_CLASSES[int(rng.integers(len(LOOKALIKE_CLASSES)))]
        if lookalike_shape is not None:
            cls = procedural_family(lookalike_shape)
        xy = draw(lambda p: np.linalg.norm(p - home) < d_target - 0.05)
        objects.append(TaskObject('lookalike', cls, xy, False, True, lookalike_shape))
    others = [c for c in DISTRACTOR_CLASSES if c != target_class]
    for k, cls in enumerate(rng.choice(others, size=2, replace=False)):
        objects.append(TaskObject(f'distractor{k}', str(cls), draw(lambda p: True), True))
    if target_absent:
        return TrialSpec(seed, target_class, tuple(objects[1:]), lookalike, False)
    return TrialSpec(seed, target_class, tuple(objects), lookalike)


@dataclass
class TaskMonitor:
    """Decides grasps and the trial outcome from the gripper's motion.

    Attributes
    ----------
    grasp_radius, still_speed, grasp_hold_s, timeout_s
        See the module docstring (metres, m/s, seconds, seconds).
    """

    trial: TrialSpec
    start_time: float
    grasp_radius: float = 0.035
    still_speed: float = 0.015
    grasp_hold_s: float = 0.4
    timeout_s: float = 60.0
    request_id: int = -1
    status: str = 'running'
    grasped: str | None = None
    end_time: float | None = None
    _dwell_object: str | None = field(default=None, repr=False)
    _dwell_since: float = field(default=0.0, repr=False)

    def update(self, gripper_xy: np.ndarray, speed: float, grasping: bool, now: float) -> str:
        """Advance with the gripper's state at ``now``; returns the status."""
        if self.status != 'running':
            return self.status
        if now - self.start_time > self.timeout_s:
            self._finish('timeout', None, now)
            return self.status
        nearest, distance = None, math.inf
        for obj in self.trial.objects:
            d = float(np.hypot(gripper_xy[0] - obj.xy[0], gripper_xy[1] - obj.xy[1]))
            if d < distance:
                nearest, distance = obj.name, d
        if not grasping or distance > self.grasp_radius or speed > self.still_speed:
            self._dwell_object = None
            return self.status
        if self._dwell_object != nearest:
            self._dwell_object, self._dwell_since = nearest, now
        elif now - self._dwell_since >= self.grasp_hold_s:
            self._finish('success' if nearest == 'target' else 'failure', nearest, now)
        return self.status

    def _finish(self, status: str, grasped: str | None, now: float) -> None:
        self.status, self.grasped, self.end_time = status, grasped, now

    def to_json(self, now: float, gripper: np.ndarray) -> str:
        """The task state as JSON (the ``task_state`` topic's payload)."""
        t = self.trial
        return json.dumps({
            'trial': t.seed, 'request_id': self.request_id, 'status': self.status,
            'grasped': self.grasped,
            'target_class': t.target_class,
            'target': None if t.target is None else t.target.name, 'lookalike': t.lookalike,
            'target_present': t.target_present,
            'elapsed_s': round((self.end_time or now) - self.start_time, 3),
            'gripper': [round(float(v), 4) for v in gripper],
            'objects': [{'name': o.name, 'class': o.class_name, 'x': o.xy[0], 'y': o.xy[1],
                         'known': o.known, 'lookalike': o.lookalike} for o in t.objects],
        })
