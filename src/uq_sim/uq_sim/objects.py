"""Object library of the simulated tabletop (ROS-free, MuJoCo-free).

Each object is a rigid set of geoms in its own body frame. Six **known** classes are used
for training; **unknown** shapes are never used for training and serve to test whether the
detector knows what it does not know. **Auxiliary** shapes are generic "other objects"
(irregular rocks, stacked blocks, irregular slabs, crossed sticks) that appear only in the
training split: the detector learns objectness on them and learns that they belong to none
of the known classes, so that "not one of these" is something it was taught rather than
left to chance. They are deliberately unlike the unknown test shapes, which stay unseen.
Procedural meshes are computed here from their dimensions.

Category ids follow the dataset contract: known classes 1..6 in :data:`KNOWN_CLASSES`
order, unknown classes 7..11 in :data:`UNKNOWN_CLASSES` order, auxiliary classes 12.. in
:data:`AUXILIARY_CLASSES` order.
"""

from __future__ import annotations

import colorsys
import math
from dataclasses import dataclass
from enum import Enum

import numpy as np

from uq_sim.geometry import mat_to_quat, rot_x, rot_y, rot_z
from uq_sim.geoms import Finish, GeomSpec, GeomType, Mesh, uv_sphere_faces
from uq_sim.procedural_objects import PROCEDURAL_CLASSES, procedural_shape

KNOWN_CLASSES: tuple[str, ...] = ('box', 'sphere', 'cylinder', 'capsule', 'ellipsoid', 'mug')
UNKNOWN_CLASSES: tuple[str, ...] = ('torus', 'cone', 'tetrahedron', 'dumbbell', 'star')
AUXILIARY_CLASSES: tuple[str, ...] = ('rock', 'block_stack', 'slab', 'sticks', 'pile', 'arch',
                                      'stool')
ALL_CLASSES: tuple[str, ...] = KNOWN_CLASSES + UNKNOWN_CLASSES + AUXILIARY_CLASSES
PROCEDURAL_CATEGORY_BASE = 101


def supercategory(class_name: str) -> str:
    """``'known'``, ``'unknown'`` or ``'auxiliary'`` (the COCO supercategory of a class)."""
    if class_name in KNOWN_CLASSES:
        return 'known'
    if class_name in UNKNOWN_CLASSES:
        return 'unknown'
    if class_name in AUXILIARY_CLASSES:
        return 'auxiliary'
    if class_name in PROCEDURAL_CLASSES:
        return 'unknown'
    raise ValueError(f'unknown object class {class_name!r}; expected one of {ALL_CLASSES}')


def category_id(class_name: str) -> int:
    """COCO category id of a class: known 1..6, unknown 7..11, auxiliary 12.., procedural
    101.. .

    Raises
    ------
    ValueError
        If the class is not in the library.
    """
    if class_name in PROCEDURAL_CLASSES:
        return PROCEDURAL_CATEGORY_BASE + PROCEDURAL_CLASSES.index(class_name)
    if class_name not in ALL_CLASSES:
        raise ValueError(f'unknown object class {class_name!r}; expected one of {ALL_CLASSES}')
    return ALL_CLASSES.index(class_name) + 1


def class_index(class_name: str) -> int:
    """Index of a class among :data:`KNOWN_CLASSES`, or -1 for an unknown class."""
    return KNOWN_CLASSES.index(class_name) if class_name in KNOWN_CLASSES else -1


def coco_categories() -> list[dict]:
    """The ``categories`` list of the dataset's COCO files."""
    return [{'id': category_id(name), 'name': name, 'supercategory': supercategory(name)}
            for name in ALL_CLASSES]


class TextureKind(str, Enum):
    """Surface appearance of an object (MuJoCo builtin textures)."""

    PLAIN = 'plain'
    CHECKER = 'checker'
    GRADIENT = 'gradient'


@dataclass(frozen=True)
class Appearance:
    """Colours and texture of an object. Colours are RGB in [0, 1]."""

    rgb: tuple[float, ...]
    texture: TextureKind = TextureKind.PLAIN
    rgb2: tuple[float, ...] = (1.0, 1.0, 1.0)
    accent: tuple[float, ...] = (0.5, 0.5, 0.5)
    specular: float = 0.3
    shininess: float = 0.3


@dataclass(frozen=True)
class ObjectSpec:
    """One object instance on the table.

    Attributes
    ----------
    name : str
        Unique instance name in the scene (MJCF body name).
    class_name : str
        One of :data:`ALL_CLASSES`.
    geoms : tuple[GeomSpec, ...]
        Shape in the body frame.
    rot : numpy.ndarray
        Body orientation (3x3, world from body) when resting on the table.
    xy : tuple[float, float]
        Position on the table, metres; the height follows from :meth:`rest_height`.
    appearance : Appearance
        Colours and texture.
    """

    name: str
    class_name: str
    geoms: tuple[GeomSpec, ...]
    rot: np.ndarray
    xy: tuple[float, float]
    appearance: Appearance

    @property
    def known(self) -> bool:
        """True for the known (training) classes."""
        return self.class_name in KNOWN_CLASSES

    @property
    def quat(self) -> np.ndarray:
        """Body orientation as a quaternion (w, x, y, z)."""
        return mat_to_quat(self.rot)

    def rest_height(self, table_z: float = 0.0) -> float:
        """Body-origin height at which the lowest point of the object touches the table."""
        up = np.array([0.0, 0.0, 1.0])
        lowest = math.inf
        for g in self.geoms:
            centre_z = float((self.rot @ np.asarray(g.pos))[2])
            u_geom = (self.rot @ g.rot).T @ up
            lowest = min(lowest, centre_z - g.extent_below(u_geom))
        return table_z - lowest

    def position(self, table_z: float = 0.0) -> np.ndarray:
        """Body position resting on the table at :attr:`xy`."""
        return np.array([self.xy[0], self.xy[1], self.rest_height(table_z)])

    def footprint_radius(self) -> float:
        """Radius about the body origin (horizontal) that contains the object."""
        return max(math.hypot(*(self.rot @ np.asarray(g.pos))[:2]) + g.bounding_radius()
                   for g in self.geoms)

    def top_height(self, table_z: float = 0.0) -> float:
        """Height of the highest point of the object resting on the table."""
        down = np.array([0.0, 0.0, -1.0])
        z0 = self.rest_height(table_z)
        return max(z0 + float((self.rot @ np.asarray(g.pos))[2])
                   + g.extent_below((self.rot @ g.rot).T @ down) for g in self.geoms)


# --------------------------------------------------------------------------- meshes


def torus_mesh(major: float, minor: float, n_major: int = 32, n_minor: int = 16) -> Mesh:
    """Torus about the z axis with tube radius ``minor`` around a circle of radius ``major``."""
    if not 0.0 < minor < major:
        raise ValueError(f'torus needs 0 < minor < major, got minor={minor}, major={major}')
    a = np.linspace(0.0, 2 * math.pi, n_major, endpoint=False)
    b = np.linspace(0.0, 2 * math.pi, n_minor, endpoint=False)
    aa, bb = np.meshgrid(a, b, indexing='ij')
    ring = major + minor * np.cos(bb)
    verts = np.stack([ring * np.cos(aa), ring * np.sin(aa), minor * np.sin(bb)], axis=-1)
    faces = []
    for i in range(n_major):
        for j in range(n_minor):
            v00 = i * n_minor + j
            v10 = ((i + 1) % n_major) * n_minor + j
            v01 = i * n_minor + (j + 1) % n_minor
            v11 = ((i + 1) % n_major) * n_minor + (j + 1) % n_minor
            faces += [(v00, v10, v11), (v00, v11, v01)]
    return Mesh(verts.reshape(-1, 3), np.asarray(faces, dtype=int))


def cone_mesh(radius: float, height: float, n: int = 32) -> Mesh:
    """Cone with its base disc (centre at the origin) in the z=0 plane and apex at +z."""
    if radius <= 0.0 or height <= 0.0:
        raise ValueError(f'cone needs positive radius and height, got {radius}, {height}')
    a = np.linspace(0.0, 2 * math.pi, n, endpoint=False)
    rim = np.stack([radius * np.cos(a), radius * np.sin(a), np.zeros(n)], axis=1)
    verts = np.vstack([rim, [[0.0, 0.0, height], [0.0, 0.0, 0.0]]])
    apex, centre = n, n + 1
    faces = []
    for i in range(n):
        j = (i + 1) % n
        faces += [(i, j, apex), (j, i, centre)]
    return Mesh(verts, np.asarray(faces, dtype=int))


def tetrahedron_mesh(edge: float, height_scale: float = 1.0) -> Mesh:
    """Tetrahedron standing on an equilateral face in the z=0 plane, apex above its centre."""
    if edge <= 0.0 or height_scale <= 0.0:
        raise ValueError(f'tetrahedron needs positive edge and height scale, got {edge}, '
                         f'{height_scale}')
    r = edge / math.sqrt(3.0)
    h = edge * math.sqrt(2.0 / 3.0) * height_scale
    a = np.array([0.0, 2 * math.pi / 3, 4 * math.pi / 3])
    base = np.stack([r * np.cos(a), r * np.sin(a), np.zeros(3)], axis=1)
    verts = np.vstack([base, [[0.0, 0.0, h]]])
    faces = np.array([(0, 2, 1), (0, 1, 3), (1, 2, 3), (2, 0, 3)])
    return Mesh(verts, faces)


def prism_mesh(outline: np.ndarray, thickness: float) -> Mesh:
    """Prism over a polygon in the z=0 plane, extruded to ``thickness``.

    ``outline`` is ``(K, 2)``, counter-clockwise and star-shaped about the origin (every
    vertex seen from the origin in angular order), so a fan from the centre triangulates it.
    """
    outline = np.asarray(outline, float)
    k = len(outline)
    if k < 3 or thickness <= 0.0:
        raise ValueError('a prism needs at least 3 outline vertices and thickness > 0')
    bottom = np.hstack([outline, np.zeros((k, 1))])
    top = np.hstack([outline, np.full((k, 1), thickness)])
    verts = np.vstack([bottom, top, [[0.0, 0.0, 0.0], [0.0, 0.0, thickness]]])
    cb, ct = 2 * k, 2 * k + 1
    faces = []
    for i in range(k):
        j = (i + 1) % k
        faces += [(cb, j, i), (ct, k + i, k + j), (i, j, k + j), (i, k + j, k + i)]
    return Mesh(verts, np.asarray(faces, dtype=int))


def star_prism_mesh(outer: float, inner: float, thickness: float, points: int = 5) -> Mesh:
    """Star-shaped prism (flat star) lying in the z=0 plane, extruded to ``thickness``."""
    if not 0.0 < inner < outer or thickness <= 0.0 or points < 3:
        raise ValueError('star prism needs 0 < inner < outer, thickness > 0, points >= 3')
    k = 2 * points
    ang = math.pi / 2 + np.arange(k) * math.pi / points
    rad = np.where(np.arange(k) % 2 == 0, outer, inner)
    return prism_mesh(np.stack([rad * np.cos(ang), rad * np.sin(ang)], axis=1), thickness)


def rock_mesh(semi_axes: tuple[float, float, float], rng: np.random.Generator,
              bumpiness: float = 0.3, n_lat: int = 7, n_lon: int = 12) -> Mesh:
    """Irregular lump: a coarse UV sphere with random low-frequency radial bumps.

    The radius along unit direction ``n`` is ``1 + bumpiness * sum_k a_k cos(w_k d_k.n +
    p_k)`` (three random waves, weights summing to 1) times the semi-axes; the coarse
    tessellation leaves flat facets, as on a stone.
    """
    if min(semi_axes) <= 0.0 or not 0.0 <= bumpiness < 1.0:
        raise ValueError('a rock needs positive semi-axes and 0 <= bumpiness < 1')
    lat = np.linspace(0.0, math.pi, n_lat + 1)[1:-1]
    lon = np.linspace(0.0, 2 * math.pi, n_lon, endpoint=False)
    la, lo = np.meshgrid(lat, lon, indexing='ij')
    ring = np.stack([np.sin(la) * np.cos(lo), np.sin(la) * np.sin(lo), np.cos(la)], axis=-1)
    dirs = np.vstack([[[0.0, 0.0, 1.0]], ring.reshape(-1, 3), [[0.0, 0.0, -1.0]]])
    waves = rng.normal(size=(3, 3))
    waves /= np.linalg.norm(waves, axis=1, keepdims=True)
    weights = rng.dirichlet(np.ones(3))
    freq = rng.uniform(1.5, 3.0, 3)
    phase = rng.uniform(0.0, 2 * math.pi, 3)
    radius = 1.0 + bumpiness * (weights * np.cos(dirs @ waves.T * freq + phase)).sum(axis=1)
    verts = dirs * radius[:, None] * np.asarray(semi_axes)
    return Mesh(verts, uv_sphere_faces(n_lat, n_lon))


def mesh_volume(mesh: Mesh) -> float:
    """Signed volume of a closed mesh; positive when its faces point outwards."""
    v = mesh.vertices[mesh.faces]
    return float(np.einsum('ij,ij->i', v[:, 0], np.cross(v[:, 1], v[:, 2])).sum() / 6.0)


# ------------------------------------------------------------------ shape builders


def _capsule_between(p0: np.ndarray, p1: np.ndarray, radius: float,
                     finish: Finish = Finish.MAIN) -> GeomSpec:
    """Capsule geom from ``p0`` to ``p1`` (body frame)."""
    p0, p1 = np.asarray(p0, float), np.asarray(p1, float)
    axis = p1 - p0
    length = float(np.linalg.norm(axis))
    z = axis / length
    helper = np.array([1.0, 0.0, 0.0]) if abs(z[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
    x = np.cross(helper, z)
    x /= np.linalg.norm(x)
    rot = np.stack([x, np.cross(z, x), z], axis=1)
    return GeomSpec(GeomType.CAPSULE, (radius, length / 2), tuple((p0 + p1) / 2), rot,
                    finish=finish)


def _u(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(rng.uniform(lo, hi))


def _shape(class_name: str, rng: np.random.Generator) -> tuple[tuple[GeomSpec, ...], np.ndarray]:
    """Sample the geoms and resting orientation (before yaw) of one instance of a class.

    Size ranges are chosen so objects span roughly 20-90 pixels at 320x240 from the
    default camera: a small CNN on a CPU can learn them, and sizes overlap across classes
    so that size alone does not reveal the class.
    """
    lying = rot_y(math.pi / 2)  # turns the local z axis horizontal
    if class_name == 'box':
        size = tuple(_u(rng, 0.022, 0.06) for _ in range(3))
        return (GeomSpec(GeomType.BOX, size),), np.eye(3)
    if class_name == 'sphere':
        return (GeomSpec(GeomType.SPHERE, (_u(rng, 0.028, 0.055),)),), np.eye(3)
    if class_name == 'cylinder':
        geom = GeomSpec(GeomType.CYLINDER, (_u(rng, 0.024, 0.048), _u(rng, 0.03, 0.07)))
        return (geom,), (np.eye(3) if rng.random() < 0.6 else lying)
    if class_name == 'capsule':
        geom = GeomSpec(GeomType.CAPSULE, (_u(rng, 0.018, 0.034), _u(rng, 0.03, 0.065)))
        return (geom,), (np.eye(3) if rng.random() < 0.35 else lying)
    if class_name == 'ellipsoid':
        a, b, c = _u(rng, 0.05, 0.08), _u(rng, 0.026, 0.042), _u(rng, 0.02, 0.032)
        # Sometimes stood on its side so it is not always a flat lens.
        rot = np.eye(3) if rng.random() < 0.7 else rot_x(math.pi / 2)
        return (GeomSpec(GeomType.ELLIPSOID, (a, b, c)),), rot
    if class_name == 'mug':
        r, h = _u(rng, 0.03, 0.045), _u(rng, 0.035, 0.055)
        t = _u(rng, 0.005, 0.008)
        reach = r + _u(rng, 0.018, 0.03)
        top, bottom = 0.55 * h, -0.45 * h
        geoms = (
            GeomSpec(GeomType.CYLINDER, (r, h)),
            # A dark disc just above the rim reads as the mug's opening from above.
            GeomSpec(GeomType.CYLINDER, (0.86 * r, 0.0012), (0.0, 0.0, h), finish=Finish.DARK),
            _capsule_between(np.array([0.8 * r, 0, top]), np.array([reach, 0, top]), t),
            _capsule_between(np.array([reach, 0, top]), np.array([reach, 0, bottom]), t),
            _capsule_between(np.array([reach, 0, bottom]), np.array([0.8 * r, 0, bottom]), t),
        )
        return geoms, np.eye(3)
    if class_name == 'torus':
        major = _u(rng, 0.034, 0.055)
        mesh = torus_mesh(major, _u(rng, 0.28, 0.42) * major)
        return (GeomSpec(GeomType.MESH, mesh=mesh),), rot_x(_u(rng, 0.0, math.radians(30)))
    if class_name == 'cone':
        radius, height = _u(rng, 0.03, 0.05), _u(rng, 0.07, 0.12)
        mesh = cone_mesh(radius, height)
        if rng.random() < 0.7:
            return (GeomSpec(GeomType.MESH, mesh=mesh),), np.eye(3)
        # Lying on its side: tilt until one generator line is horizontal.
        tilt = math.pi / 2 - math.atan(radius / height)
        return (GeomSpec(GeomType.MESH, mesh=mesh),), rot_x(tilt)
    if class_name == 'tetrahedron':
        mesh = tetrahedron_mesh(_u(rng, 0.075, 0.12), _u(rng, 0.8, 1.2))
        return (GeomSpec(GeomType.MESH, mesh=mesh),), np.eye(3)
    if class_name == 'dumbbell':
        r, d = _u(rng, 0.02, 0.03), _u(rng, 0.04, 0.065)
        bar = GeomSpec(GeomType.CYLINDER, (_u(rng, 0.006, 0.01), d), rot=rot_y(math.pi / 2),
                       finish=Finish.ACCENT)
        return (GeomSpec(GeomType.SPHERE, (r,), (-d, 0.0, 0.0)),
                GeomSpec(GeomType.SPHERE, (r,), (d, 0.0, 0.0)), bar), np.eye(3)
    if class_name == 'star':
        outer = _u(rng, 0.045, 0.065)
        mesh = star_prism_mesh(outer, _u(rng, 0.4, 0.5) * outer, _u(rng, 0.015, 0.03))
        return (GeomSpec(GeomType.MESH, mesh=mesh),), np.eye(3)
    if class_name in AUXILIARY_CLASSES:
        return _auxiliary_shape(class_name, rng), np.eye(3)
    if class_name in PROCEDURAL_CLASSES:
        return procedural_shape(class_name, rng)
    raise ValueError(f'unknown object class {class_name!r}; expected one of {ALL_CLASSES}')


def _auxiliary_shape(class_name: str, rng: np.random.Generator) -> tuple[GeomSpec, ...]:
    """Geoms of an auxiliary (training-only "other object") instance, resting upright."""
    if class_name == 'rock':
        axes = (_u(rng, 0.03, 0.06), _u(rng, 0.025, 0.05), _u(rng, 0.018, 0.04))
        return (GeomSpec(GeomType.MESH, mesh=rock_mesh(axes, rng, _u(rng, 0.2, 0.4))),)
    if class_name == 'block_stack':
        # A base block with one or two smaller blocks on top, off-centre (steps, T, L).
        base = (_u(rng, 0.03, 0.06), _u(rng, 0.02, 0.045), _u(rng, 0.01, 0.025))
        geoms = [GeomSpec(GeomType.BOX, base)]
        z, below = base[2], base
        for _ in range(int(rng.integers(1, 3))):
            size = (_u(rng, 0.35, 0.8) * below[0], _u(rng, 0.4, 1.3) * below[1],
                    _u(rng, 0.01, 0.025))
            pos = (_u(rng, -1.0, 1.0) * (below[0] - size[0]), 0.0, z + size[2])
            geoms.append(GeomSpec(GeomType.BOX, size, pos, rot_z(_u(rng, -0.6, 0.6))))
            z, below = z + 2 * size[2], size
        return tuple(geoms)
    if class_name == 'slab':
        k = int(rng.integers(5, 9))
        # Even spacing jittered by less than half a step keeps the vertices in angular
        # order, so the outline stays star-shaped about its centre.
        angles = (np.arange(k) + rng.uniform(-0.35, 0.35, k)) * (2 * math.pi / k)
        reach = _u(rng, 0.035, 0.065)
        radii = reach * rng.uniform(0.55, 1.0, k)
        outline = np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)
        return (GeomSpec(GeomType.MESH, mesh=prism_mesh(outline, _u(rng, 0.012, 0.04))),)
    if class_name == 'sticks':
        # Two or three thin rods crossing, each resting on the one below.
        geoms, z = [], 0.0
        for n in range(int(rng.integers(2, 4))):
            r, half = _u(rng, 0.006, 0.012), _u(rng, 0.035, 0.06)
            z += r if n == 0 else r + geoms[-1].size[0]
            a = _u(rng, 0.0, math.pi)
            shift = rng.uniform(-0.015, 0.015, 2)
            end = np.array([half * math.cos(a), half * math.sin(a), 0.0])
            centre = np.array([shift[0], shift[1], z])
            geoms.append(_capsule_between(centre - end, centre + end, r))
        return tuple(geoms)
    if class_name == 'pile':
        # A heap of three to five small mixed primitives, touching or overlapping.
        geoms = []
        for _ in range(int(rng.integers(3, 6))):
            kind = rng.integers(3)
            scale = _u(rng, 0.012, 0.024)
            xy = rng.uniform(-0.03, 0.03, 2)
            if kind == 0:
                size = tuple(scale * rng.uniform(0.6, 1.4, 3))
                geoms.append(GeomSpec(GeomType.BOX, size, (xy[0], xy[1], size[2]),
                                      rot_z(_u(rng, 0.0, math.pi))))
            elif kind == 1:
                geoms.append(GeomSpec(GeomType.SPHERE, (scale,), (xy[0], xy[1], scale)))
            else:
                end = np.array([1.5 * scale, 0.0, 0.0]) @ rot_z(_u(rng, 0.0, math.pi)).T
                centre = np.array([xy[0], xy[1], 0.6 * scale])
                geoms.append(_capsule_between(centre - end, centre + end, 0.6 * scale))
        return tuple(geoms)
    if class_name == 'arch':
        # Two posts bridged by a lintel.
        post = (_u(rng, 0.006, 0.014), _u(rng, 0.01, 0.03), _u(rng, 0.015, 0.035))
        span = _u(rng, 0.02, 0.045)
        lintel = (span + post[0] + _u(rng, 0.0, 0.012), post[1], _u(rng, 0.006, 0.014))
        return (GeomSpec(GeomType.BOX, post, (-span, 0.0, post[2])),
                GeomSpec(GeomType.BOX, post, (span, 0.0, post[2])),
                GeomSpec(GeomType.BOX, lintel, (0.0, 0.0, 2 * post[2] + lintel[2])))
    if class_name == 'stool':
        # A flat top on three or four thin legs.
        top = (_u(rng, 0.025, 0.05), _u(rng, 0.025, 0.05), _u(rng, 0.004, 0.01))
        leg_r, leg_h = _u(rng, 0.003, 0.007), _u(rng, 0.012, 0.035)
        legs = ((-1, -1), (-1, 1), (1, -1), (1, 1)) if rng.random() < 0.5 else \
            ((-1, -1), (1, -1), (0, 1))
        geoms = [GeomSpec(GeomType.BOX, top, (0.0, 0.0, 2 * leg_h + top[2]))]
        for sx, sy in legs:
            geoms.append(GeomSpec(GeomType.CYLINDER, (leg_r, leg_h),
                                  (0.8 * sx * top[0], 0.8 * sy * top[1], leg_h)))
        return tuple(geoms)
    raise ValueError(f'unknown auxiliary class {class_name!r}; expected one of '
                     f'{AUXILIARY_CLASSES}')


def random_rgb(rng: np.random.Generator) -> tuple[float, ...]:
    """A random colour from the whole hue circle, including near-greys and dark shades.

    The same distribution serves every class, so colour never reveals the class.
    """
    sat = 0.0 if rng.random() < 0.1 else _u(rng, 0.25, 1.0)
    r, g, b = colorsys.hsv_to_rgb(_u(rng, 0.0, 1.0), sat, _u(rng, 0.25, 1.0))
    return (r, g, b)


def random_appearance(rng: np.random.Generator) -> Appearance:
    """Sample colours, texture and surface finish (identical distribution for all classes)."""
    rgb = random_rgb(rng)
    draw = rng.random()
    texture = (TextureKind.PLAIN if draw < 0.5 else
               TextureKind.CHECKER if draw < 0.75 else TextureKind.GRADIENT)
    rgb2 = random_rgb(rng) if rng.random() < 0.5 else tuple(
        float(np.clip(c * _u(rng, 0.3, 0.7), 0.0, 1.0)) for c in rgb)
    return Appearance(rgb=rgb, texture=texture, rgb2=rgb2, accent=random_rgb(rng),
                      specular=_u(rng, 0.0, 0.6), shininess=_u(rng, 0.05, 0.8))


def make_object(name: str, class_name: str, xy: tuple[float, float], rng: np.random.Generator,
                yaw: float | None = None, appearance: Appearance | None = None) -> ObjectSpec:
    """Sample one object instance of ``class_name`` placed at ``xy`` on the table.

    Parameters
    ----------
    name : str
        Unique instance name.
    class_name : str
        One of :data:`ALL_CLASSES`, or a held-out family of :data:`PROCEDURAL_CLASSES`
        (a new random shape from ``rng``, :mod:`uq_sim.procedural_objects`).
    xy : tuple of float
        Table position, metres.
    rng : numpy.random.Generator
        Source of the random size, resting pose, yaw and appearance.
    yaw : float, optional
        Rotation about the vertical, radians (random when omitted).
    appearance : Appearance, optional
        Colours and texture (random when omitted).

    Raises
    ------
    ValueError
        If ``class_name`` is not in the library.
    """
    geoms, rest = _shape(class_name, rng)
    yaw = _u(rng, 0.0, 2 * math.pi) if yaw is None else yaw
    appearance = random_appearance(rng) if appearance is None else appearance
    return ObjectSpec(name=name, class_name=class_name, geoms=geoms, rot=rot_z(yaw) @ rest,
                      xy=(float(xy[0]), float(xy[1])), appearance=appearance)


@dataclass(frozen=True)
class DistractorSpec:
    """A flat clutter item on the table (paper, coaster, plate); never annotated."""

    name: str
    shape: GeomType  # BOX or CYLINDER
    size: tuple[float, ...]
    xy: tuple[float, float]
    yaw: float
    appearance: Appearance


def make_distractor(name: str, xy: tuple[float, float], rng: np.random.Generator
                    ) -> DistractorSpec:
    """Sample a flat clutter item (2-6 mm thick) at ``xy``."""
    thick = _u(rng, 0.001, 0.003)
    size: tuple[float, ...]
    if rng.random() < 0.6:
        shape, size = GeomType.BOX, (_u(rng, 0.03, 0.09), _u(rng, 0.02, 0.06), thick)
    else:
        shape, size = GeomType.CYLINDER, (_u(rng, 0.03, 0.07), thick)
    return DistractorSpec(name, shape, size, (float(xy[0]), float(xy[1])),
                          _u(rng, 0.0, 2 * math.pi), random_appearance(rng))
