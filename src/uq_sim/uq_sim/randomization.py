"""Domain randomisation: random tabletop scenes for the synthetic dataset (ROS-free).

Everything is drawn from one ``numpy.random.Generator``, so a scene is a deterministic
function of its seed. Colours and textures come from one distribution for every class,
known and unknown alike, so that a detector has to use shape.
"""

from __future__ import annotations

import colorsys
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from uq_sim.geometry import intrinsics_from_fovy, ray_to_plane
from uq_sim.objects import (
    AUXILIARY_CLASSES,
    KNOWN_CLASSES,
    UNKNOWN_CLASSES,
    ObjectSpec,
    TextureKind,
    make_distractor,
    make_object,
)
from uq_sim.scene import TABLE_HALF, CameraSpec, GripperSpec, LightSpec, SceneSpec, TableSpec

_DEFAULT_CAMERA = CameraSpec()


@dataclass(frozen=True)
class RandomizationConfig:
    """Ranges of the domain randomisation.

    Attributes
    ----------
    n_known : tuple[int, int]
        Inclusive range of the number of known objects per scene.
    n_unknown : tuple[int, int]
        Inclusive range of the number of unknown objects per scene.
    n_auxiliary : tuple[int, int]
        Inclusive range of the number of auxiliary ("other object") shapes per scene;
        only the training split has them.
    n_distractors : tuple[int, int]
        Inclusive range of flat clutter items.
    gripper_probability : float
        Probability that the gripper hovers in view.
    behind_probability : float
        Probability that an object is placed just behind another one as seen from the
        camera, which produces partial occlusion.
    camera_jitter : float
        Maximum camera position and target offset per axis, metres.
    camera_roll : float
        Maximum camera roll, radians.
    """

    n_known: tuple[int, int] = (2, 5)
    n_unknown: tuple[int, int] = (0, 0)
    n_auxiliary: tuple[int, int] = (0, 0)
    n_distractors: tuple[int, int] = (0, 4)
    gripper_probability: float = 0.3
    behind_probability: float = 0.3
    camera_jitter: float = 0.04
    camera_roll: float = 0.06

    def __post_init__(self) -> None:
        for name in ('n_known', 'n_unknown', 'n_auxiliary', 'n_distractors'):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise ValueError(f'{name} must satisfy 0 <= low <= high, got {(lo, hi)}')
        if self.n_known[1] + self.n_unknown[1] < 1:
            raise ValueError('a scene needs at least one object')
        for name in ('gripper_probability', 'behind_probability'):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f'{name} must be in [0, 1], got {getattr(self, name)}')


def _u(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(rng.uniform(lo, hi))


def sample_camera(rng: np.random.Generator, jitter: float = 0.04, roll: float = 0.06
                  ) -> CameraSpec:
    """The default robot camera with a small random offset of position, aim and roll."""
    base = _DEFAULT_CAMERA
    pos = tuple(p + _u(rng, -jitter, jitter) for p in base.pos)
    target = tuple(p + _u(rng, -jitter, jitter) for p in base.target[:2]) + (base.target[2],)
    return CameraSpec(pos=pos, target=target, roll=_u(rng, -roll, roll), fovy=base.fovy)


def sample_lights(rng: np.random.Generator) -> tuple[tuple[LightSpec, ...], float, float]:
    """One main light (usually shadow-casting) plus 0-2 fill lights; returns ambient too."""
    lights = []
    for i in range(int(rng.integers(1, 4))):
        az, el = _u(rng, 0.0, 2 * math.pi), _u(rng, math.radians(35), math.radians(85))
        dist = _u(rng, 1.0, 1.6)
        pos = (dist * math.cos(el) * math.cos(az), dist * math.cos(el) * math.sin(az),
               dist * math.sin(el))
        level = _u(rng, 0.35, 0.75) if i == 0 else _u(rng, 0.1, 0.35)
        tint = rng.uniform(-0.08, 0.08, size=3)
        diffuse = tuple(float(np.clip(level + t, 0.0, 1.0)) for t in tint)
        target = (_u(rng, -0.15, 0.15), _u(rng, -0.15, 0.15), 0.0)
        lights.append(LightSpec(pos=pos, target=target, diffuse=diffuse,
                                specular=_u(rng, 0.05, 0.4), directional=i == 0,
                                castshadow=i == 0 and rng.random() < 0.85))
    return tuple(lights), _u(rng, 0.12, 0.35), _u(rng, 0.1, 0.35)


def _muted_rgb(rng: np.random.Generator) -> tuple[float, ...]:
    r, g, b = colorsys.hsv_to_rgb(_u(rng, 0.0, 1.0), _u(rng, 0.0, 0.5), _u(rng, 0.3, 0.9))
    return (r, g, b)


def sample_table(rng: np.random.Generator) -> TableSpec:
    """Table, floor and background colours and texture."""
    rgb = _muted_rgb(rng)
    draw = rng.random()
    texture = (TextureKind.PLAIN if draw < 0.3 else
               TextureKind.CHECKER if draw < 0.7 else TextureKind.GRADIENT)
    contrast = _u(rng, 0.7, 0.95)
    return TableSpec(texture=texture, rgb=rgb, rgb2=tuple(c * contrast for c in rgb),
                     repeat=_u(rng, 2.0, 12.0), floor_rgb=_muted_rgb(rng),
                     sky_rgb1=_muted_rgb(rng), sky_rgb2=_muted_rgb(rng))


def _table_point(rng: np.random.Generator, camera: CameraSpec, size: tuple[int, int],
                 margin: float = 0.06, u_range: tuple[float, float] = (-0.04, 1.04),
                 v_range: tuple[float, float] = (0.12, 1.04)) -> tuple[float, float] | None:
    """A table point under a random pixel (fractions of the image), None if off the table.

    Sampling in the image rather than on the table spreads objects evenly over the picture
    and puts a few across the border (truncated).
    """
    intr = intrinsics_from_fovy(camera.fovy, *size)
    u = _u(rng, *u_range) * intr.width
    v = _u(rng, *v_range) * intr.height
    hit = ray_to_plane(u, v, np.asarray(camera.pos), camera.axes(), intr)
    if hit is None or abs(hit[0]) > TABLE_HALF[0] - margin or abs(hit[1]) > TABLE_HALF[1] - margin:
        return None
    return float(hit[0]), float(hit[1])


def place_objects(rng: np.random.Generator, classes: Sequence[str], camera: CameraSpec,
                  size: tuple[int, int] = (320, 240), behind_probability: float = 0.3,
                  max_tries: int = 60) -> list[ObjectSpec]:
    """Place one object per class name without interpenetration.

    ``size`` is the image (width, height), which sets the camera's horizontal view.

    Objects that find no free place within ``max_tries`` are dropped, so the result may be
    shorter than ``classes``.
    """
    placed: list[ObjectSpec] = []
    cam_xy = np.asarray(camera.pos[:2])
    for i, cls in enumerate(classes):
        template = make_object(f'obj{i}', cls, (0.0, 0.0), rng)
        radius = template.footprint_radius()
        for _ in range(max_tries):
            if placed and rng.random() < behind_probability:
                # Just behind an existing object along the viewing direction.
                other = placed[int(rng.integers(len(placed)))]
                away = np.asarray(other.xy) - cam_xy
                away /= np.linalg.norm(away)
                side = np.array([-away[1], away[0]])
                gap = 0.9 * (radius + other.footprint_radius()) + _u(rng, 0.0, 0.03)
                xy = np.asarray(other.xy) + gap * away + _u(rng, -0.6, 0.6) * gap * side
                if abs(xy[0]) > TABLE_HALF[0] - 0.06 or abs(xy[1]) > TABLE_HALF[1] - 0.06:
                    continue
                cand: tuple[float, float] | None = (float(xy[0]), float(xy[1]))
            elif rng.random() < 0.12:
                # Anywhere, also across the border: some objects are truncated.
                cand = _table_point(rng, camera, size)
            else:
                cand = _table_point(rng, camera, size, u_range=(0.1, 0.9), v_range=(0.25, 0.9))
            if cand is None:
                continue
            if all(math.dist(cand, o.xy) >= 0.9 * (radius + o.footprint_radius())
                   for o in placed):
                placed.append(ObjectSpec(template.name, cls, template.geoms, template.rot,
                                         cand, template.appearance))
                break
    return placed


def sample_scene(rng: np.random.Generator, config: RandomizationConfig | None = None,
                 known_classes: Sequence[str] = KNOWN_CLASSES,
                 unknown_classes: Sequence[str] = UNKNOWN_CLASSES,
                 auxiliary_classes: Sequence[str] = AUXILIARY_CLASSES,
                 size: tuple[int, int] = (320, 240)) -> SceneSpec:
    """Draw a random tabletop scene.

    Parameters
    ----------
    rng : numpy.random.Generator
        The only source of randomness.
    config : RandomizationConfig, optional
        Ranges; defaults to known objects only.
    known_classes, unknown_classes, auxiliary_classes : sequence of str
        Classes to draw from (uniformly, with replacement).
    size : tuple of int
        Image (width, height) the scene is meant for; sets where objects are placed.

    Returns
    -------
    SceneSpec
        Unknown, then auxiliary objects come first in ``objects`` so that they get a place
        even on a crowded table.
    """
    config = config or RandomizationConfig()
    camera = sample_camera(rng, config.camera_jitter, config.camera_roll)
    n_known = int(rng.integers(config.n_known[0], config.n_known[1] + 1))
    n_unknown = int(rng.integers(config.n_unknown[0], config.n_unknown[1] + 1))
    if n_known + n_unknown == 0:
        n_known = 1
    classes = [str(rng.choice(unknown_classes)) for _ in range(n_unknown)]
    if config.n_auxiliary[1] > 0:
        # Drawn only when asked for, so scenes without them keep their random stream.
        n_auxiliary = int(rng.integers(config.n_auxiliary[0], config.n_auxiliary[1] + 1))
        classes += [str(rng.choice(auxiliary_classes)) for _ in range(n_auxiliary)]
    classes += [str(rng.choice(known_classes)) for _ in range(n_known)]
    objects = place_objects(rng, classes, camera, size, config.behind_probability)
    distractors = []
    for j in range(int(rng.integers(config.n_distractors[0], config.n_distractors[1] + 1))):
        xy = _table_point(rng, camera, size, margin=0.1)
        if xy is not None:
            distractors.append(make_distractor(f'clutter{j}', xy, rng))
    gripper = None
    if rng.random() < config.gripper_probability:
        xy = _table_point(rng, camera, size, margin=0.0) or (0.0, 0.0)
        gripper = GripperSpec(pos=(xy[0], xy[1], _u(rng, 0.08, 0.3)),
                              yaw=_u(rng, 0.0, math.pi), opening=_u(rng, 0.02, 0.07),
                              rgb=tuple([_u(rng, 0.3, 0.8)] * 3))
    lights, ambient, headlight = sample_lights(rng)
    return SceneSpec(objects=tuple(objects), distractors=tuple(distractors), camera=camera,
                     lights=lights, table=sample_table(rng), gripper=gripper,
                     ambient=ambient, headlight=headlight)
