"""Tabletop scenes: specification, MJCF generation and offscreen rendering with exact boxes.

A :class:`SceneSpec` describes everything in one scene (objects, clutter, camera, lights,
table, gripper). :func:`build_mjcf` turns it into MJCF text; :class:`SceneRenderer`
compiles it with MuJoCo and renders RGB images together with ground truth computed from
the segmentation buffer:

- the box of an object is the bounding box of its *visible* pixels (a compound object is
  the union of its geoms);
- its visible fraction is visible pixels over the pixels it covers when rendered without
  any other object, clutter item or gripper in front of it;
- it is *truncated* when its visible pixels touch the image border.

Every object, clutter item and the gripper is a mocap body, so a scenario moves them
without recompiling the model. Rendering follows ``ENVIRONMENT.md``: 1024 shadow map,
no multisampling (``offsamples=0``), offscreen buffer of the image size.

This module is ROS-free. It sets ``MUJOCO_GL=egl`` when unset, because MuJoCo picks
its GL backend at import time and these machines have no display.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault('MUJOCO_GL', 'egl')

import mujoco  # noqa: E402
import numpy as np  # noqa: E402
from mujoco.rendering.classic import gl_context  # noqa: E402

from uq_sim.geometry import (  # noqa: E402
    Intrinsics,
    intrinsics_from_fovy,
    look_at_axes,
    mat_to_quat,
    project_points,
    rot_z,
)
from uq_sim.objects import (  # noqa: E402
    Appearance,
    DistractorSpec,
    GeomSpec,
    GeomType,
    ObjectSpec,
    TextureKind,
    category_id,
    make_object,
)

CAMERA_NAME = 'robot_camera'
TABLE_HALF = (0.6, 0.45)  # table top half extents (x, y), metres; the top is at z = 0
TABLE_Z = 0.0
# Where hidden bodies wait: behind the camera and below the floor, so they neither appear
# in the image nor cast shadows onto the table.
HIDDEN_POS = np.array([0.0, -25.0, -10.0])
_GEOM = int(mujoco.mjtObj.mjOBJ_GEOM)
_RND = mujoco.mjtRndFlag


@dataclass(frozen=True)
class CameraSpec:
    """The robot's camera: position, the point it looks at, roll and vertical fov."""

    pos: tuple[float, ...] = (0.0, -0.52, 0.46)
    target: tuple[float, ...] = (0.0, 0.06, 0.0)
    roll: float = 0.0
    fovy: float = 45.0

    def axes(self) -> np.ndarray:
        """Camera-to-world rotation (MuJoCo convention: x right, y up, z backward)."""
        return look_at_axes(np.asarray(self.pos), np.asarray(self.target), self.roll)


@dataclass(frozen=True)
class LightSpec:
    """A light aimed at ``target``; directional lights ignore the distance."""

    pos: tuple[float, ...]
    target: tuple[float, ...] = (0.0, 0.0, 0.0)
    diffuse: tuple[float, ...] = (0.6, 0.6, 0.6)
    specular: float = 0.2
    directional: bool = True
    castshadow: bool = True


@dataclass(frozen=True)
class TableSpec:
    """Appearance of the table top, the floor and the background."""

    texture: TextureKind = TextureKind.CHECKER
    rgb: tuple[float, ...] = (0.62, 0.55, 0.45)
    rgb2: tuple[float, ...] = (0.55, 0.48, 0.4)
    repeat: float = 6.0
    floor_rgb: tuple[float, ...] = (0.3, 0.3, 0.32)
    sky_rgb1: tuple[float, ...] = (0.75, 0.78, 0.8)
    sky_rgb2: tuple[float, ...] = (0.35, 0.38, 0.42)


@dataclass(frozen=True)
class GripperSpec:
    """A two-finger gripper on a mocap body; ``pos`` is the point between the fingertips."""

    pos: tuple[float, ...] = (0.32, -0.18, 0.3)
    yaw: float = 0.0
    opening: float = 0.035
    rgb: tuple[float, ...] = (0.55, 0.57, 0.6)


@dataclass(frozen=True)
class SceneSpec:
    """Everything in one tabletop scene."""

    objects: tuple[ObjectSpec, ...]
    distractors: tuple[DistractorSpec, ...] = ()
    camera: CameraSpec = field(default_factory=CameraSpec)
    lights: tuple[LightSpec, ...] = (LightSpec(pos=(0.4, -0.3, 1.2)),)
    table: TableSpec = field(default_factory=TableSpec)
    gripper: GripperSpec | None = None
    ambient: float = 0.25
    headlight: float = 0.25

    def __post_init__(self) -> None:
        names = [o.name for o in self.objects] + [d.name for d in self.distractors]
        if len(set(names)) != len(names):
            raise ValueError(f'object and clutter names must be unique, got {names}')
        if 'gripper' in names:
            raise ValueError("the name 'gripper' is reserved for the gripper")


@dataclass(frozen=True)
class ObjectAnnotation:
    """Ground truth of one object in one rendered image.

    ``bbox`` is ``(x, y, w, h)`` in pixels, top-left corner, covering whole pixels (a box
    of one pixel at column 5 is ``x=5, w=1``); ``area`` is the number of visible pixels.
    """

    name: str
    class_name: str
    category_id: int
    known: bool
    track_id: int
    bbox: tuple[int, int, int, int]
    area: int
    visible_fraction: float
    occluded: bool
    truncated: bool


@dataclass
class Frame:
    """A rendered image with its ground truth.

    Attributes
    ----------
    rgb : numpy.ndarray
        (H, W, 3) uint8 image, rows top to bottom.
    object_map : numpy.ndarray
        (H, W) int16 index into the scene's objects of the visible object per pixel, -1
        for anything else (table, clutter, gripper, background).
    annotations : list[ObjectAnnotation]
        One entry per object with at least ``min_area`` visible pixels.
    intrinsics : Intrinsics
        Pinhole model of the camera (ROS ``CameraInfo`` convention).
    """

    rgb: np.ndarray
    object_map: np.ndarray
    annotations: list[ObjectAnnotation]
    intrinsics: Intrinsics


# ---------------------------------------------------------------------------- MJCF


def _f(values: Iterable[float] | float) -> str:
    if isinstance(values, (int, float, np.floating)):
        return f'{float(values):.6g}'
    return ' '.join(f'{float(v):.6g}' for v in values)


def _rgba(rgb: Sequence[float], alpha: float = 1.0) -> str:
    return _f([*rgb, alpha])


def _material_xml(name: str, app: Appearance, lines: list[str]) -> None:
    """Append the texture and materials of one object (main, dark inside, accent)."""
    if app.texture is TextureKind.PLAIN:
        lines.append(f'<material name="{name}_main" rgba="{_rgba(app.rgb)}" '
                     f'specular="{_f(app.specular)}" shininess="{_f(app.shininess)}"/>')
    else:
        builtin = 'checker' if app.texture is TextureKind.CHECKER else 'gradient'
        lines.append(f'<texture name="{name}_tex" type="cube" builtin="{builtin}" '
                     f'rgb1="{_f(app.rgb)}" rgb2="{_f(app.rgb2)}" width="32" height="32"/>')
        lines.append(f'<material name="{name}_main" texture="{name}_tex" '
                     f'specular="{_f(app.specular)}" shininess="{_f(app.shininess)}"/>')
    lines.append(f'<material name="{name}_dark" rgba="{_rgba([c * 0.18 for c in app.rgb])}" '
                 'specular="0.05"/>')
    lines.append(f'<material name="{name}_accent" rgba="{_rgba(app.accent)}" '
                 f'specular="{_f(app.specular)}"/>')


def _geom_xml(body: str, idx: int, g: GeomSpec) -> str:
    attrs = [f'name="{body}_g{idx}"', f'type="{g.type.value}"',
             f'material="{body}_{g.finish.value}"', f'pos="{_f(g.pos)}"',
             f'quat="{_f(mat_to_quat(g.rot))}"']
    if g.type is GeomType.MESH:
        attrs.append(f'mesh="{body}_mesh{idx}"')
    else:
        attrs.append(f'size="{_f(g.size)}"')
    return '<geom ' + ' '.join(attrs) + '/>'


def _mesh_xml(body: str, idx: int, g: GeomSpec) -> str:
    assert g.mesh is not None
    return (f'<mesh name="{body}_mesh{idx}" vertex="{_f(g.mesh.vertices.ravel())}" '
            f'face="{" ".join(str(int(i)) for i in g.mesh.faces.ravel())}"/>')


def _gripper_xml(g: GripperSpec) -> list[str]:
    # Body origin = tool point between the fingertips; fingers rise from there to the palm.
    half_open = max(0.012, g.opening / 2 + 0.008)
    return [
        f'<body name="gripper" mocap="true" pos="{_f(g.pos)}" '
        f'quat="{_f(mat_to_quat(rot_z(g.yaw)))}">',
        f'<geom name="gripper_finger_l" type="box" size="0.008 0.014 0.04" '
        f'pos="{_f([-half_open, 0, 0.04])}" material="gripper_mat"/>',
        f'<geom name="gripper_finger_r" type="box" size="0.008 0.014 0.04" '
        f'pos="{_f([half_open, 0, 0.04])}" material="gripper_mat"/>',
        f'<geom name="gripper_palm" type="box" size="{_f([half_open + 0.012, 0.022, 0.014])}" '
        'pos="0 0 0.094" material="gripper_mat"/>',
        '<geom name="gripper_wrist" type="cylinder" size="0.026 0.05" pos="0 0 0.158" '
        'material="gripper_dark"/>',
        '<geom name="gripper_arm" type="capsule" size="0.032 0.12" pos="0 0 0.33" '
        'material="gripper_mat"/>',
        '</body>',
    ]


def build_mjcf(spec: SceneSpec, width: int = 320, height: int = 240) -> str:
    """MJCF text of a scene (all bodies at their specified, visible poses).

    Parameters
    ----------
    spec : SceneSpec
        The scene.
    width, height : int
        Image size; the offscreen buffer is made at least this large.

    Returns
    -------
    str
        A complete ``<mujoco>`` document.
    """
    t = spec.table
    cam_axes = spec.camera.axes()
    asset: list[str] = [
        f'<texture name="sky" type="skybox" builtin="gradient" rgb1="{_f(t.sky_rgb1)}" '
        f'rgb2="{_f(t.sky_rgb2)}" width="64" height="64"/>',
    ]
    if t.texture is TextureKind.PLAIN:
        asset.append(f'<material name="table_mat" rgba="{_rgba(t.rgb)}" specular="0.1"/>')
    else:
        builtin = 'checker' if t.texture is TextureKind.CHECKER else 'gradient'
        asset.append(f'<texture name="table_tex" type="2d" builtin="{builtin}" '
                     f'rgb1="{_f(t.rgb)}" rgb2="{_f(t.rgb2)}" width="128" height="128"/>')
        asset.append(f'<material name="table_mat" texture="table_tex" '
                     f'texrepeat="{_f([t.repeat, t.repeat])}" specular="0.1"/>')
    asset.append(f'<material name="table_edge" rgba="{_rgba([c * 0.7 for c in t.rgb])}"/>')
    asset.append(f'<material name="floor_mat" rgba="{_rgba(t.floor_rgb)}"/>')

    world: list[str] = []
    for i, light in enumerate(spec.lights):
        direction = np.asarray(light.target, float) - np.asarray(light.pos, float)
        world.append(
            f'<light name="light{i}" pos="{_f(light.pos)}" dir="{_f(direction)}" '
            f'directional="{str(light.directional).lower()}" '
            f'castshadow="{str(light.castshadow).lower()}" diffuse="{_f(light.diffuse)}" '
            f'specular="{_f([light.specular] * 3)}" cutoff="70" exponent="2"/>')
    tx, ty = TABLE_HALF
    world += [
        '<geom name="floor" type="plane" size="4 4 0.1" pos="0 0 -0.75" material="floor_mat"/>',
        f'<geom name="table_top" type="plane" size="{_f([tx, ty, 0.01])}" material="table_mat"/>',
        f'<geom name="table_body" type="box" size="{_f([tx, ty, 0.02])}" pos="0 0 -0.0202" '
        'material="table_edge"/>',
    ]
    for sx in (-1, 1):
        for sy in (-1, 1):
            world.append(f'<geom type="box" size="0.025 0.025 0.36" '
                         f'pos="{_f([sx * (tx - 0.05), sy * (ty - 0.05), -0.4])}" '
                         'material="table_edge"/>')
    world.append(f'<camera name="{CAMERA_NAME}" pos="{_f(spec.camera.pos)}" '
                 f'xyaxes="{_f(cam_axes[:, 0])} {_f(cam_axes[:, 1])}" '
                 f'fovy="{_f(spec.camera.fovy)}"/>')

    for obj in spec.objects:
        _material_xml(obj.name, obj.appearance, asset)
        for k, g in enumerate(obj.geoms):
            if g.type is GeomType.MESH:
                asset.append(_mesh_xml(obj.name, k, g))
        world.append(f'<body name="{obj.name}" mocap="true" pos="{_f(obj.position(TABLE_Z))}" '
                     f'quat="{_f(obj.quat)}">')
        world += [_geom_xml(obj.name, k, g) for k, g in enumerate(obj.geoms)]
        world.append('</body>')
    for d in spec.distractors:
        _material_xml(d.name, d.appearance, asset)
        pos = [d.xy[0], d.xy[1], TABLE_Z + d.size[-1]]
        world.append(f'<body name="{d.name}" mocap="true" pos="{_f(pos)}" '
                     f'quat="{_f(mat_to_quat(rot_z(d.yaw)))}">'
                     f'<geom name="{d.name}_g0" type="{d.shape.value}" size="{_f(d.size)}" '
                     f'material="{d.name}_main"/></body>')
    if spec.gripper is not None:
        asset.append(f'<material name="gripper_mat" rgba="{_rgba(spec.gripper.rgb)}" '
                     'specular="0.5" shininess="0.6"/>')
        asset.append('<material name="gripper_dark" rgba="0.12 0.12 0.13 1" specular="0.3"/>')
        world += _gripper_xml(spec.gripper)

    amb, head = spec.ambient, spec.headlight
    return '\n'.join([
        '<mujoco model="uq_tabletop">',
        '<compiler angle="radian"/>',
        '<option gravity="0 0 0"/>',
        '<visual>',
        f'<global offwidth="{max(width, 64)}" offheight="{max(height, 64)}"/>',
        '<quality shadowsize="1024" offsamples="0"/>',
        f'<headlight ambient="{_f([amb] * 3)}" diffuse="{_f([head] * 3)}" '
        'specular="0.05 0.05 0.05"/>',
        '<map znear="0.01" zfar="30"/>',
        '</visual>',
        # No contacts: scenes are posed kinematically, nothing is simulated.
        '<default><geom contype="0" conaffinity="0"/></default>',
        '<asset>', *asset, '</asset>',
        '<worldbody>', *world, '</worldbody>',
        '</mujoco>',
    ])


# ------------------------------------------------------------------------ renderer


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two (x0, y0, x1, y1) boxes overlap; NaN boxes (behind the camera) always do."""
    if np.isnan(a).any() or np.isnan(b).any():
        return True
    return bool(a[0] <= b[2] and b[0] <= a[2] and a[1] <= b[3] and b[1] <= a[3])


def _touching(owner: np.ndarray, n_objects: int) -> np.ndarray:
    """Objects whose visible pixels are 4-adjacent to another object or occluder.

    Where an object is partly hidden, the pixels across its visible outline belong to what
    hides it, so an object that touches nothing else is not occluded.
    """
    ids = []
    for a, b in ((owner[:, :-1], owner[:, 1:]), (owner[:-1], owner[1:])):
        edge = (a != b) & (a >= 0) & (b >= 0)
        ids += [a[edge], b[edge]]
    found = np.unique(np.concatenate(ids))
    return found[found < n_objects]


class SceneRenderer:
    """Offscreen renderer of :class:`SceneSpec` scenes with exact ground-truth boxes.

    One GL context lives as long as the renderer; :meth:`load` compiles a new scene and
    replaces the MuJoCo render context (about 10-20 ms), so one renderer serves many
    scenes. Use it as a context manager or call :meth:`close`.

    Parameters
    ----------
    width, height : int
        Image size in pixels.
    occluded_below : float
        Objects whose visible fraction is below this are flagged ``occluded``.
    min_area : int
        Objects with fewer visible pixels get no annotation.

    Raises
    ------
    ValueError
        If the size or thresholds are out of range.
    """

    def __init__(self, width: int = 320, height: int = 240, occluded_below: float = 0.5,
                 min_area: int = 12) -> None:
        if not (16 <= width <= 4096 and 16 <= height <= 4096):
            raise ValueError(f'image size must be within 16..4096 pixels, got {width}x{height}')
        if not 0.0 <= occluded_below <= 1.0:
            raise ValueError(f'occluded_below must be in [0, 1], got {occluded_below}')
        if min_area < 1:
            raise ValueError(f'min_area must be >= 1, got {min_area}')
        self.width, self.height = int(width), int(height)
        self.occluded_below = float(occluded_below)
        self.min_area = int(min_area)
        self._gl = gl_context.GLContext(self.width, self.height)
        self._ctx: mujoco.MjrContext | None = None
        self._rect = mujoco.MjrRect(0, 0, self.width, self.height)
        self._option = mujoco.MjvOption()
        self._camera = mujoco.MjvCamera()
        self._spec: SceneSpec | None = None
        # Any: MuJoCo ships no type stubs; both are set by load().
        self.model: Any = None
        self.data: Any = None

    # -- lifecycle ------------------------------------------------------------------

    @contextmanager
    def _current(self) -> Iterator[None]:
        if self._gl is None:
            raise RuntimeError('the renderer is closed')
        # as_current releases the context afterwards, so executor threads may alternate.
        if hasattr(self._gl, 'as_current'):
            with self._gl.as_current():
                yield
        else:
            self._gl.make_current()
            yield

    def close(self) -> None:
        """Free the GL resources; the renderer cannot be used afterwards. Idempotent."""
        if self._gl is None:
            return
        if self._ctx is not None:
            with self._current():
                self._ctx.free()
            self._ctx = None
        self._gl.free()
        self._gl = None

    def __enter__(self) -> SceneRenderer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have torn down EGL
            pass

    # -- scene ----------------------------------------------------------------------

    @property
    def spec(self) -> SceneSpec:
        """The loaded scene."""
        if self._spec is None:
            raise RuntimeError('no scene loaded; call load() first')
        return self._spec

    @property
    def intrinsics(self) -> Intrinsics:
        """Pinhole intrinsics of the loaded scene's camera at this image size."""
        return intrinsics_from_fovy(self.spec.camera.fovy, self.width, self.height)

    def load(self, spec: SceneSpec) -> None:
        """Compile ``spec`` and make it the scene to render (all objects shown)."""
        model = mujoco.MjModel.from_xml_string(build_mjcf(spec, self.width, self.height))
        data = mujoco.MjData(model)
        with self._current():
            if self._ctx is not None:
                self._ctx.free()
                self._ctx = None
            self._ctx = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_50.value)
            mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, self._ctx)
        self._scene = mujoco.MjvScene(model, maxgeom=64 + 8 * model.ngeom)
        self.model, self.data, self._spec = model, data, spec
        self._camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._camera.fixedcamid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA,
                                                    CAMERA_NAME)

        def mocap_of(body: str) -> int:
            return int(model.body_mocapid[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY,
                                                            body)])

        self._obj_mocap = np.array([mocap_of(o.name) for o in spec.objects], dtype=int)
        self._clutter_mocap = [mocap_of(d.name) for d in spec.distractors]
        if spec.gripper is not None:
            self._clutter_mocap.append(mocap_of('gripper'))
        # geom id -> index of the object owning it; clutter and gripper geoms get the code
        # n_objects (they hide objects but are not annotated); -1 for everything else.
        n = len(spec.objects)
        body_owner = np.full(model.nbody, -1, dtype=np.int32)
        for k, o in enumerate(spec.objects):
            body_owner[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, o.name)] = k
        for mid in self._clutter_mocap:
            body_owner[np.nonzero(model.body_mocapid == mid)[0]] = n
        self._geom_owner = body_owner[model.geom_bodyid]
        self._obj_geoms = [np.nonzero(self._geom_owner == k)[0] for k in range(n)]
        self._present = np.ones(len(spec.objects), dtype=bool)
        mujoco.mj_forward(model, data)

    def set_object_pose(self, name: str, pos: Sequence[float], quat: Sequence[float]) -> None:
        """Move object ``name`` to ``pos`` with orientation ``quat`` (w, x, y, z)."""
        k = self._object_index(name)
        self.data.mocap_pos[self._obj_mocap[k]] = pos
        self.data.mocap_quat[self._obj_mocap[k]] = quat

    def set_object_present(self, name: str, present: bool) -> None:
        """Show or hide object ``name`` (a hidden object keeps its last pose for later)."""
        self._present[self._object_index(name)] = bool(present)

    def set_gripper_pose(self, pos: Sequence[float], yaw: float = 0.0) -> None:
        """Move the gripper's tool point to ``pos`` with heading ``yaw`` (radians).

        Raises
        ------
        ValueError
            If the scene has no gripper.
        """
        if self.spec.gripper is None:
            raise ValueError('this scene has no gripper')
        mid = self._clutter_mocap[-1]
        self.data.mocap_pos[mid] = pos
        self.data.mocap_quat[mid] = mat_to_quat(rot_z(yaw))

    def _object_index(self, name: str) -> int:
        for k, o in enumerate(self.spec.objects):
            if o.name == name:
                return k
        raise ValueError(f'no object named {name!r} in the scene')

    # -- rendering ------------------------------------------------------------------

    def _update(self) -> None:
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_camlight(self.model, self.data)
        mujoco.mjv_updateScene(self.model, self.data, self._option, None, self._camera,
                               int(mujoco.mjtCatBit.mjCAT_ALL), self._scene)

    def _render_rgb(self) -> np.ndarray:
        buf = np.empty((self.height, self.width, 3), dtype=np.uint8)
        mujoco.mjr_render(self._rect, self._scene, self._ctx)
        mujoco.mjr_readPixels(buf, None, self._rect, self._ctx)
        return np.ascontiguousarray(buf[::-1])  # OpenGL rows run bottom-up

    def _render_owner(self) -> np.ndarray:
        """(H, W) int16 owner per pixel: object index, n_objects for clutter/gripper, or -1."""
        flags = self._scene.flags
        saved = flags.copy()
        flags[_RND.mjRND_SEGMENT] = 1
        flags[_RND.mjRND_IDCOLOR] = 1
        # Shadows and the skybox do not change ids but cost most of the frame time.
        flags[_RND.mjRND_SHADOW] = 0
        flags[_RND.mjRND_SKYBOX] = 0
        flags[_RND.mjRND_REFLECTION] = 0
        try:
            buf = self._render_rgb().astype(np.int32)
        finally:
            flags[:] = saved
        segid = buf[..., 0] | (buf[..., 1] << 8) | (buf[..., 2] << 16)
        # Colour = segid + 1 of the scene geom; 0 is the background.
        lut = np.full(self._scene.ngeom + 2, -1, dtype=np.int16)
        for i in range(self._scene.ngeom):
            g = self._scene.geoms[i]
            if g.segid >= 0 and g.objtype == _GEOM:
                lut[g.segid + 1] = self._geom_owner[g.objid]
        segid[segid >= lut.size] = 0
        return lut[segid]

    def render(self, visibility: bool = True) -> Frame:
        """Render the current state: RGB image and ground truth.

        Parameters
        ----------
        visibility : bool
            Compute visible fractions (extra segmentation passes only for objects that
            touch another object, a clutter item or the gripper in the image); when False
            every visible fraction is reported as 1.0 and nothing is flagged occluded.

        Returns
        -------
        Frame
        """
        spec = self.spec
        n = len(spec.objects)
        mocap_pos = self.data.mocap_pos
        saved = mocap_pos.copy()
        mocap_pos[self._obj_mocap[~self._present]] = HIDDEN_POS
        try:
            with self._current():
                self._update()
                rgb = self._render_rgb()
                owner = self._render_owner()
                counts = np.bincount(owner[(owner >= 0) & (owner < n)].ravel(), minlength=n)
                alone = counts.astype(float)
                if visibility:
                    alone = self._unoccluded_counts(owner, counts)
        finally:
            mocap_pos[:] = saved
        owner[owner >= n] = -1
        border = np.concatenate([owner[0], owner[-1], owner[:, 0], owner[:, -1]])
        touching_border = set(np.unique(border[border >= 0]).tolist())
        annotations = []
        for k, obj in enumerate(spec.objects):
            if counts[k] < self.min_area:
                continue
            ys, xs = np.nonzero(owner == k)
            x0, y0 = int(xs.min()), int(ys.min())
            fraction = float(min(1.0, counts[k] / alone[k])) if alone[k] > 0 else 1.0
            annotations.append(ObjectAnnotation(
                name=obj.name, class_name=obj.class_name,
                category_id=category_id(obj.class_name), known=obj.known, track_id=k,
                bbox=(x0, y0, int(xs.max()) - x0 + 1, int(ys.max()) - y0 + 1),
                area=int(counts[k]), visible_fraction=round(fraction, 4),
                occluded=fraction < self.occluded_below, truncated=k in touching_border))
        return Frame(rgb=rgb, object_map=owner, annotations=annotations,
                     intrinsics=self.intrinsics)

    def _projected_boxes(self, objects: Sequence[int]) -> np.ndarray:
        """(len(objects), 4) image boxes (x0, y0, x1, y1) containing each object's geoms.

        Projects the corners of every geom's bounding box, so the boxes are conservative;
        NaN when a corner lies behind the camera.
        """
        model, data = self.model, self.data
        cam_id = self._camera.fixedcamid
        cam_pos = data.cam_xpos[cam_id]
        cam_axes = data.cam_xmat[cam_id].reshape(3, 3)
        signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)])
        boxes = np.empty((len(objects), 4))
        for row, k in enumerate(objects):
            corners = []
            for gid in self._obj_geoms[k]:
                centre, half = model.geom_aabb[gid, :3], model.geom_aabb[gid, 3:]
                local = centre + signs * half
                corners.append(data.geom_xpos[gid] + local @ data.geom_xmat[gid].reshape(3, 3).T)
            uv = project_points(np.vstack(corners), cam_pos, cam_axes, self.intrinsics)
            boxes[row] = (uv[:, 0].min(), uv[:, 1].min(), uv[:, 0].max(), uv[:, 1].max())
        return boxes

    def _unoccluded_counts(self, owner: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Pixels each visible object covers with nothing else in front of it.

        Only objects touching something else can be occluded. They are grouped so that no
        two objects of a group can overlap in the image; each group is rendered once with
        every other object, the clutter and the gripper moved out of sight.
        """
        n = len(counts)
        need = [int(k) for k in _touching(owner, n)]
        alone = counts.astype(float)
        if not need:
            return alone
        boxes = dict(zip(need, self._projected_boxes(need), strict=True))
        groups: list[list[int]] = []
        for k in need:
            for group in groups:
                if not any(_overlap(boxes[k], boxes[j]) for j in group):
                    group.append(k)
                    break
            else:
                groups.append([k])
        pos = self.data.mocap_pos
        shown = pos.copy()
        try:
            for group in groups:
                pos[:] = HIDDEN_POS
                pos[self._obj_mocap[group]] = shown[self._obj_mocap[group]]
                self._update()
                solo = self._render_owner()
                solo_counts = np.bincount(solo[(solo >= 0) & (solo < n)].ravel(), minlength=n)
                alone[group] = solo_counts[group]
        finally:
            pos[:] = shown
            self._update()
        return alone


# ------------------------------------------------------------------- conveniences


def compose_scene(placements: Sequence[tuple[str, tuple[float, float]]], seed: int = 0,
                  gripper: GripperSpec | None = None) -> SceneSpec:
    """A scene with chosen classes at chosen table positions, default camera and lights.

    Sizes, resting poses, yaw and colours are drawn from ``seed``.

    Parameters
    ----------
    placements : sequence of (class_name, (x, y))
        Objects to place; names become ``obj0``, ``obj1``, ... in this order.
    seed : int
        Seed for the object's random size and appearance.
    gripper : GripperSpec, optional
        Add a gripper.

    Examples
    --------
    >>> spec = compose_scene([('box', (-0.1, 0.0)), ('torus', (0.1, 0.05))])
    >>> frame = render_scene(spec)          # doctest: +SKIP
    """
    rng = np.random.default_rng(seed)
    objects = tuple(make_object(f'obj{i}', cls, xy, rng) for i, (cls, xy) in enumerate(placements))
    return SceneSpec(objects=objects, gripper=gripper)


def render_scene(spec: SceneSpec, width: int = 320, height: int = 240,
                 visibility: bool = True) -> Frame:
    """Render one scene with a temporary renderer (convenient, not for loops)."""
    with SceneRenderer(width, height) as renderer:
        renderer.load(spec)
        return renderer.render(visibility=visibility)
