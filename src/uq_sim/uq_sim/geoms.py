"""Geoms and meshes of simulated objects, in an object's body frame (ROS-free, MuJoCo-free).

The building blocks shared by the object library (:mod:`uq_sim.objects`) and the procedural
unknown shapes (:mod:`uq_sim.procedural_objects`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

import numpy as np


class GeomType(str, Enum):
    """MuJoCo geom types used by the library."""

    BOX = 'box'
    SPHERE = 'sphere'
    CYLINDER = 'cylinder'
    CAPSULE = 'capsule'
    ELLIPSOID = 'ellipsoid'
    MESH = 'mesh'


class Finish(str, Enum):
    """Which colour of the object a geom takes."""

    MAIN = 'main'      # the object's (possibly textured) surface
    DARK = 'dark'      # the dark inside of a mug
    ACCENT = 'accent'  # a second plain colour (e.g. the bar of a dumbbell)


@dataclass(frozen=True)
class Mesh:
    """A closed triangle mesh with outward (counter-clockwise) faces, body frame, metres."""

    vertices: np.ndarray  # (V, 3) float
    faces: np.ndarray     # (F, 3) int


@dataclass(frozen=True)
class GeomSpec:
    """One geom of an object, in the object's body frame.

    ``size`` follows MJCF: box half-sizes; sphere radius; cylinder/capsule radius and
    half-length (along local z); ellipsoid semi-axes; unused for meshes.
    """

    type: GeomType
    size: tuple[float, ...] = ()
    pos: tuple[float, ...] = (0.0, 0.0, 0.0)
    rot: np.ndarray = field(default_factory=lambda: np.eye(3))
    mesh: Mesh | None = None
    finish: Finish = Finish.MAIN

    def extent_below(self, u: np.ndarray) -> float:
        """Support of the geom (about its centre) in direction ``-u`` given in the geom frame.

        ``u`` is the world's up axis expressed in this geom's frame; the value is how far
        the geom reaches below its centre.
        """
        u = np.asarray(u, float)
        if self.type is GeomType.SPHERE:
            return self.size[0]
        if self.type is GeomType.BOX:
            return float(np.abs(u) @ np.asarray(self.size))
        if self.type is GeomType.ELLIPSOID:
            return float(np.linalg.norm(np.asarray(self.size) * u))
        if self.type is GeomType.CAPSULE:
            return self.size[1] * abs(u[2]) + self.size[0]
        if self.type is GeomType.CYLINDER:
            return self.size[1] * abs(u[2]) + self.size[0] * math.sqrt(max(0.0, 1.0 - u[2] ** 2))
        assert self.mesh is not None
        return float(np.max(-(self.mesh.vertices @ u)))

    def bounding_radius(self) -> float:
        """Radius of a sphere about the geom centre that contains the geom."""
        if self.type is GeomType.SPHERE:
            return self.size[0]
        if self.type is GeomType.BOX:
            return float(np.linalg.norm(self.size))
        if self.type is GeomType.ELLIPSOID:
            return max(self.size)
        if self.type in (GeomType.CAPSULE, GeomType.CYLINDER):
            return self.size[1] + self.size[0]
        assert self.mesh is not None
        return float(np.max(np.linalg.norm(self.mesh.vertices, axis=1)))


def uv_sphere_faces(n_lat: int, n_lon: int) -> np.ndarray:
    """Outward triangles of a UV sphere whose vertices are: the top pole, ``n_lat - 1``
    rings of ``n_lon`` vertices from the top down, then the bottom pole."""
    bottom = 1 + (n_lat - 1) * n_lon

    def v(i: int, j: int) -> int:  # ring i (0 = nearest the top), longitude j
        return 1 + i * n_lon + j % n_lon

    faces = []
    for j in range(n_lon):
        faces.append((0, v(0, j), v(0, j + 1)))
        faces.append((bottom, v(n_lat - 2, j + 1), v(n_lat - 2, j)))
        for i in range(n_lat - 2):
            faces += [(v(i, j), v(i + 1, j), v(i + 1, j + 1)),
                      (v(i, j), v(i + 1, j + 1), v(i, j + 1))]
    return np.asarray(faces, dtype=int)
