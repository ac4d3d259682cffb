"""Procedurally generated unknown shapes: a held-out OOD test beyond the five fixed ones.

The fixed unknown classes (torus, cone, tetrahedron, dumbbell, star) are five shapes that
were known while the detector and its recipe were chosen. The families here draw a new
shape from a seed every time, so the detector's uncertainty can be tested on shapes nobody
has looked at (``uq eval detector --procedural-unknowns N``):

- ``procedural_hull``: convex hull of 7-16 random points near the surface of a random
  ellipsoid (semi-axes 35-70, 30-60, 25-55 mm), a faceted irregular polyhedron;
- ``procedural_superquadric``: superquadric (semi-axes 28-60 mm) with exponents chosen
  away from the known classes (both near 1 is an ellipsoid, both small a box or
  cylinder): at least one exponent is >= 1.7, which gives diamonds, bicones and pinched,
  star-like solids, tapered along their height;
- ``procedural_union``: two to four random primitives (box, sphere, cylinder, capsule,
  ellipsoid) of random sizes (16-32 mm scale), each tilted at random and overlapping
  the one it is attached to, in one or two colours.

None of these generators is used by the dataset (``uq_sim.dataset``) or by training, and
the scenes draw their random numbers from streams separate from every dataset image (see
:func:`procedural_scene_rng`). Meshes rest on a stable face of their convex hull.

The geometry is MuJoCo-free; the scene functions import the renderer when called.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.spatial import ConvexHull

from uq_sim.geoms import Finish, GeomSpec, GeomType, Mesh, uv_sphere_faces

# Held-out unknown shape families, generated from a seed for
# `uq eval detector --procedural-unknowns`. No dataset split holds them, so they are not in
# uq_sim.objects.ALL_CLASSES (the categories of the dataset contract); their category ids
# start at uq_sim.objects.PROCEDURAL_CATEGORY_BASE, clear of the dataset's ids.
PROCEDURAL_CLASSES: tuple[str, ...] = ('procedural_hull', 'procedural_superquadric',
                                       'procedural_union')

_PRIMITIVES = (GeomType.BOX, GeomType.SPHERE, GeomType.CYLINDER, GeomType.CAPSULE,
               GeomType.ELLIPSOID)


def _u(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(rng.uniform(lo, hi))


def random_rotation(rng: np.random.Generator) -> np.ndarray:
    """A uniformly distributed 3x3 rotation (from a normalised Gaussian quaternion)."""
    q = rng.normal(size=4)
    w, x, y, z = q / np.linalg.norm(q)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def _rotation_taking(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The shortest rotation taking unit vector ``a`` to unit vector ``b``."""
    axis = np.cross(a, b)
    sin, cos = float(np.linalg.norm(axis)), float(a @ b)
    if sin < 1e-12:
        if cos > 0:
            return np.eye(3)
        # Opposite vectors: half a turn about any axis perpendicular to a.
        helper = np.array([1.0, 0.0, 0.0]) if abs(a[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
        perp = np.cross(a, helper)
        perp /= np.linalg.norm(perp)
        return 2.0 * np.outer(perp, perp) - np.eye(3)
    k = axis / sin
    skew = np.array([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    return np.eye(3) + sin * skew + (1.0 - cos) * skew @ skew


def mesh_centroid(mesh: Mesh) -> np.ndarray:
    """Centre of mass of the solid a closed, outward-facing mesh encloses (uniform density)."""
    v = mesh.vertices[mesh.faces]
    volume = np.einsum('ij,ij->i', v[:, 0], np.cross(v[:, 1], v[:, 2])) / 6.0
    return (volume[:, None] * v.sum(axis=1) / 4.0).sum(axis=0) / volume.sum()


def convex_hull_mesh(points: np.ndarray) -> Mesh:
    """Closed, outward-facing triangle mesh of the convex hull of ``(N, 3)`` points,
    moved so that its centre of mass is at the origin.

    Raises
    ------
    ValueError
        If the points do not span a solid (fewer than 4, or all in one plane).
    """
    from scipy.spatial import QhullError

    points = np.asarray(points, float)
    try:
        hull = ConvexHull(points)
    except (QhullError, ValueError) as exc:
        raise ValueError(f'the points span no solid: {exc}') from exc
    remap = np.full(len(points), -1, dtype=int)
    remap[hull.vertices] = np.arange(len(hull.vertices))
    vertices, faces = points[hull.vertices], remap[hull.simplices]
    # Qhull does not orient its triangles; turn each to face away from the interior.
    tri = vertices[faces]
    normal = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    inward = np.einsum('ij,ij->i', normal, tri.mean(axis=1) - vertices.mean(axis=0)) < 0
    faces[inward] = faces[inward][:, ::-1]
    mesh = Mesh(vertices, faces)
    return Mesh(vertices - mesh_centroid(mesh), faces)


def stable_rest_rotation(mesh: Mesh, rng: np.random.Generator) -> np.ndarray:
    """Orientation (world from body) in which ``mesh`` lies on a stable face of its hull.

    A face is stable when the centre of mass projects into it; one is drawn with
    probability proportional to its area (large faces catch a tossed object more often).
    The hull face nearest the centre of mass is always stable; it is the fallback when
    Qhull's triangulation splits every stable facet so that the projection misses each
    triangle.
    """
    hull = ConvexHull(mesh.vertices)
    centre = mesh_centroid(mesh)
    normals, offsets = hull.equations[:, :3], hull.equations[:, 3]  # outward, n.x + d <= 0
    depth = -(normals @ centre + offsets)
    foot = centre + depth[:, None] * normals
    tri = mesh.vertices[hull.simplices]
    edge1, edge2 = tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]
    area2 = np.cross(edge1, edge2)
    # Barycentric coordinates of each foot point in its own triangle.
    rel = foot - tri[:, 0]
    b1 = np.einsum('ij,ij->i', np.cross(rel, edge2), area2)
    b2 = np.einsum('ij,ij->i', np.cross(edge1, rel), area2)
    norm2 = np.einsum('ij,ij->i', area2, area2)
    inside = (b1 >= 0) & (b2 >= 0) & (b1 + b2 <= norm2)
    if inside.any():
        area = np.sqrt(norm2) * inside
        face = int(rng.choice(len(area), p=area / area.sum()))
    else:
        face = int(np.argmin(depth))
    return _rotation_taking(normals[face], np.array([0.0, 0.0, -1.0]))


def random_hull_mesh(rng: np.random.Generator) -> Mesh:
    """Convex hull of 7-16 random points at 0.7-1 of the way to a random ellipsoid's surface."""
    count = int(rng.integers(7, 17))
    semi_axes = np.array([_u(rng, 0.035, 0.07), _u(rng, 0.03, 0.06), _u(rng, 0.025, 0.055)])
    directions = rng.normal(size=(count, 3))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    # Radii near 1 put most points on the hull, so it has many facets.
    radii = rng.uniform(0.7, 1.0, count)
    return convex_hull_mesh(directions * radii[:, None] * semi_axes)


def _signed_power(x: np.ndarray, exponent: float) -> np.ndarray:
    return np.sign(x) * np.abs(x) ** exponent


def superquadric_mesh(semi_axes: tuple[float, float, float], e1: float, e2: float,
                      taper: float = 0.0, n_lat: int = 16, n_lon: int = 32) -> Mesh:
    """Superquadric with height exponent ``e1`` and cross-section exponent ``e2``.

    Points ``(a C(h)^e1 C(w)^e2, b C(h)^e1 S(w)^e2, c S(h)^e1)`` over latitude ``h`` and
    longitude ``w``, where ``X^e`` keeps the sign of ``X``; ``e = 1`` is round, ``e -> 0``
    square, ``e = 2`` straight-edged (a diamond), ``e > 2`` pinched. The cross-section
    scales by ``1 + taper * z / c`` (a frustum-like taper). ``n_lon`` a multiple of 4 and
    ``n_lat`` even keep the tips and the equator on vertices. Centre of mass at the origin.

    Raises
    ------
    ValueError
        If a semi-axis or exponent is not positive, ``|taper| >= 1``, or the grid is too
        coarse.
    """
    if min(semi_axes) <= 0.0 or e1 <= 0.0 or e2 <= 0.0:
        raise ValueError(f'a superquadric needs positive semi-axes and exponents, got '
                         f'{semi_axes}, e1={e1}, e2={e2}')
    if not abs(taper) < 1.0 or n_lat < 4 or n_lon < 8:
        raise ValueError(f'a superquadric needs |taper| < 1, n_lat >= 4 and n_lon >= 8, got '
                         f'{taper}, {n_lat}, {n_lon}')
    a, b, c = semi_axes
    polar = np.linspace(0.0, math.pi, n_lat + 1)[1:-1]  # from the top pole down
    lon = np.linspace(0.0, 2 * math.pi, n_lon, endpoint=False)
    pp, ll = np.meshgrid(polar, lon, indexing='ij')
    ring = _signed_power(np.sin(pp), e1)
    z = c * _signed_power(np.cos(pp), e1)
    scale = 1.0 + taper * z / c
    x = a * scale * ring * _signed_power(np.cos(ll), e2)
    y = b * scale * ring * _signed_power(np.sin(ll), e2)
    rings = np.stack([x, y, z], axis=-1).reshape(-1, 3)
    vertices = np.vstack([[[0.0, 0.0, c]], rings, [[0.0, 0.0, -c]]])
    mesh = Mesh(vertices, uv_sphere_faces(n_lat, n_lon))
    return Mesh(vertices - mesh_centroid(mesh), mesh.faces)


def random_superquadric_mesh(rng: np.random.Generator) -> Mesh:
    """A superquadric unlike the known classes: one exponent in [1.7, 2.6] (straight-edged
    or pinched), the other in [0.3, 2.6], random semi-axes and taper."""
    high, other = _u(rng, 1.7, 2.6), _u(rng, 0.3, 2.6)
    e1, e2 = (high, other) if rng.random() < 0.5 else (other, high)
    semi_axes = (_u(rng, 0.028, 0.06), _u(rng, 0.028, 0.06), _u(rng, 0.022, 0.06))
    return superquadric_mesh(semi_axes, e1, e2, _u(rng, -0.5, 0.5))


def random_primitive_union(rng: np.random.Generator) -> tuple[GeomSpec, ...]:
    """Two to four random primitives, randomly tilted, each overlapping an earlier one.

    Every primitive contains a ball of radius ``inner`` about its centre; a new one is put
    at less than the sum of its and its anchor's ``inner`` radii, so the union is one
    connected solid. The first primitive takes the object's main colour, later ones the
    main or the accent colour at random. Centred on the mean of the primitive centres.
    """
    geoms: list[GeomSpec] = []
    inner: list[float] = []
    for n in range(int(rng.integers(2, 5))):
        kind = _PRIMITIVES[int(rng.integers(len(_PRIMITIVES)))]
        scale = _u(rng, 0.016, 0.032)
        size: tuple[float, ...]
        if kind in (GeomType.BOX, GeomType.ELLIPSOID):
            size = tuple(float(s) for s in scale * rng.uniform(0.5, 1.4, 3))
            radius = min(size)
        elif kind is GeomType.SPHERE:
            size, radius = (scale,), scale
        else:  # cylinder or capsule: radius, half-length
            size = (_u(rng, 0.4, 0.9) * scale, _u(rng, 0.8, 2.0) * scale)
            radius = size[0] if kind is GeomType.CAPSULE else min(size)
        pos = np.zeros(3)
        if n:
            anchor = int(rng.integers(n))
            direction = rng.normal(size=3)
            direction /= np.linalg.norm(direction)
            pos = np.asarray(geoms[anchor].pos) + direction * _u(rng, 0.4, 0.85) * (
                inner[anchor] + radius)
        finish = Finish.MAIN if n == 0 or rng.random() < 0.5 else Finish.ACCENT
        geoms.append(GeomSpec(kind, size, tuple(float(p) for p in pos), random_rotation(rng),
                              finish=finish))
        inner.append(radius)
    centre = np.mean([g.pos for g in geoms], axis=0)
    return tuple(GeomSpec(g.type, g.size, tuple(float(p) for p in np.asarray(g.pos) - centre),
                          g.rot, finish=g.finish) for g in geoms)


def procedural_shape(class_name: str, rng: np.random.Generator
                     ) -> tuple[tuple[GeomSpec, ...], np.ndarray]:
    """Geoms and resting orientation (before yaw) of a new instance of a procedural family.

    Raises
    ------
    ValueError
        If ``class_name`` is not one of :data:`PROCEDURAL_CLASSES`.
    """
    if class_name == 'procedural_hull':
        mesh = random_hull_mesh(rng)
    elif class_name == 'procedural_superquadric':
        mesh = random_superquadric_mesh(rng)
    elif class_name == 'procedural_union':
        return random_primitive_union(rng), np.eye(3)
    else:
        raise ValueError(f'unknown procedural family {class_name!r}; expected one of '
                         f'{PROCEDURAL_CLASSES}')
    return (GeomSpec(GeomType.MESH, mesh=mesh),), stable_rest_rotation(mesh, rng)


# ------------------------------------------------------------------------ scenes
