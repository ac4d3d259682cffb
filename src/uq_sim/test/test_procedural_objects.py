"""Procedural unknown shapes: determinism, geometry, MuJoCo models and held-out names."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from scipy.spatial import Delaunay

from uq_sim.dataset import SPLITS, _config_for, image_rng
from uq_sim.objects import (
    ALL_CLASSES,
    PROCEDURAL_CATEGORY_BASE,
    PROCEDURAL_CLASSES,
    GeomType,
    Mesh,
    category_id,
    class_index,
    coco_categories,
    mesh_volume,
    supercategory,
)
from uq_sim.procedural_objects import (
    convex_hull_mesh,
    mesh_centroid,
    procedural_shape,
    random_rotation,
    stable_rest_rotation,
    superquadric_mesh,
)
from uq_sim.procedural_scenes import (
    procedural_family,
    procedural_scene,
    procedural_scene_rng,
    render_procedural_example,
)
from uq_sim.randomization import sample_scene
from uq_sim.scene import SceneRenderer, build_mjcf, compose_scene


@pytest.fixture(scope='module')
def renderer():
    with SceneRenderer(320, 240) as r:
        yield r


def _geometry(geoms) -> list:
    """Everything that defines the shape of a geom tuple, as comparable arrays."""
    out = []
    for g in geoms:
        out += [g.type.value, np.asarray(g.size), np.asarray(g.pos), np.asarray(g.rot)]
        if g.mesh is not None:
            out += [g.mesh.vertices, g.mesh.faces]
    return out


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x == y if isinstance(x, str) else (np.shape(x) == np.shape(y) and np.array_equal(x, y))
        for x, y in zip(a, b, strict=True))


def _assert_closed_and_outward(mesh: Mesh) -> None:
    edges = Counter()
    for a, b, c in mesh.faces:
        for e in ((a, b), (b, c), (c, a)):
            edges[e] += 1
    assert all(n == 1 and edges[(e[1], e[0])] == 1 for e, n in edges.items())
    assert mesh_volume(mesh) > 0.0


@pytest.mark.parametrize('family', PROCEDURAL_CLASSES)
def test_same_seed_same_shape_other_seed_other_shape(family):
    first, rest = procedural_shape(family, np.random.default_rng(7))
    again, rest_again = procedural_shape(family, np.random.default_rng(7))
    assert _same(_geometry(first), _geometry(again)) and np.array_equal(rest, rest_again)
    others = [procedural_shape(family, np.random.default_rng(s))[0] for s in (8, 9, 10)]
    assert not any(_same(_geometry(first), _geometry(o)) for o in others)


def test_scenes_are_deterministic_per_seed_and_index():
    a, b = procedural_scene(3, 5), procedural_scene(3, 5)
    assert [o.class_name for o in a.objects] == [o.class_name for o in b.objects]
    assert all(_same(_geometry(x.geoms), _geometry(y.geoms)) and x.xy == y.xy
               for x, y in zip(a.objects, b.objects, strict=True))
    assert build_mjcf(a) == build_mjcf(b)
    assert build_mjcf(procedural_scene(4, 5)) != build_mjcf(a)
    assert build_mjcf(procedural_scene(3, 6)) != build_mjcf(a)
    # The one unknown object is the index's family, placed first as in test_unknown.
    assert a.objects[0].class_name == procedural_family(5) == PROCEDURAL_CLASSES[2]
    assert all(o.known for o in a.objects[1:]) and 1 <= len(a.objects) - 1 <= 4


def test_scene_streams_are_not_the_dataset_streams():
    for seed, index, attempt in ((0, 1, 0), (0, 2, 1), (5, 3, 0)):
        assert not np.array_equal(procedural_scene_rng(seed, index, attempt).random(4),
                                  image_rng(seed, index, attempt).random(4))


def test_no_dataset_split_draws_a_procedural_shape():
    for split in SPLITS:
        for image_id in range(1, 41):
            scene = sample_scene(image_rng(0, image_id), _config_for(split))
            assert not {o.class_name for o in scene.objects} & set(PROCEDURAL_CLASSES)


def test_names_and_ids_never_collide_with_the_dataset_classes():
    assert not set(PROCEDURAL_CLASSES) & set(ALL_CLASSES)
    ids = [category_id(c) for c in PROCEDURAL_CLASSES]
    assert ids == list(range(PROCEDURAL_CATEGORY_BASE, PROCEDURAL_CATEGORY_BASE + 3))
    assert not set(ids) & {c['id'] for c in coco_categories()}
    # The dataset's category list (its contract) does not list them.
    assert {c['name'] for c in coco_categories()} == set(ALL_CLASSES)
    assert all(supercategory(c) == 'unknown' and class_index(c) == -1
               for c in PROCEDURAL_CLASSES)
    with pytest.raises(ValueError, match='procedural family'):
        procedural_shape('torus', np.random.default_rng(0))


@pytest.mark.parametrize('family', ['procedural_hull', 'procedural_superquadric'])
def test_meshes_are_closed_outward_and_centred(family):
    for seed in range(12):
        (geom,), _ = procedural_shape(family, np.random.default_rng(seed))
        assert geom.type is GeomType.MESH and geom.mesh is not None
        _assert_closed_and_outward(geom.mesh)
        np.testing.assert_allclose(mesh_centroid(geom.mesh), 0.0, atol=1e-12)


def test_convex_hull_of_a_cube_and_degenerate_points():
    corners = np.array([[x, y, z] for x in (0, 1) for y in (0, 1) for z in (0, 1)], float)
    inside = np.array([[0.5, 0.5, 0.5], [0.2, 0.7, 0.4]])
    mesh = convex_hull_mesh(np.vstack([corners, inside]) * 0.04)
    _assert_closed_and_outward(mesh)
    assert len(mesh.vertices) == 8 and mesh_volume(mesh) == pytest.approx(0.04 ** 3)
    np.testing.assert_allclose(mesh.vertices.mean(axis=0), 0.0, atol=1e-15)
    with pytest.raises(ValueError, match='span no solid'):
        convex_hull_mesh(np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0.0]]))


def test_superquadric_volumes_match_closed_forms():
    a, b, c = 0.05, 0.03, 0.02
    # Exponent 2 in both directions is the octahedron |x|/a + |y|/b + |z|/c <= 1; the
    # grid puts its six tips and edges on vertices, so the mesh is exact.
    assert mesh_volume(superquadric_mesh((a, b, c), 2.0, 2.0)) == pytest.approx(
        4 * a * b * c / 3, rel=1e-9)
    # Exponents 1 are the ellipsoid (a polygonal approximation from inside).
    assert mesh_volume(superquadric_mesh((a, b, c), 1.0, 1.0, n_lat=64, n_lon=128)) \
        == pytest.approx(4 * math.pi * a * b * c / 3, rel=3e-3)
    # A taper scales the cross-section area by (1 + t z/c)^2; over a solid symmetric in z
    # the odd term cancels and the t^2 term adds volume.
    assert mesh_volume(superquadric_mesh((a, b, c), 2.0, 2.0, taper=0.5)) > 4 * a * b * c / 3
    with pytest.raises(ValueError, match='positive'):
        superquadric_mesh((a, b, 0.0), 1.0, 1.0)
    with pytest.raises(ValueError, match='taper'):
        superquadric_mesh((a, b, c), 1.0, 1.0, taper=1.0)


def test_meshes_rest_on_a_stable_face():
    """The centre of mass lies above the contact face (inside its footprint)."""
    for seed in range(20):
        rng = np.random.default_rng(seed)
        mesh = convex_hull_mesh(rng.normal(size=(10, 3)) * [0.05, 0.03, 0.02])
        rot = stable_rest_rotation(mesh, rng)
        np.testing.assert_allclose(rot @ rot.T, np.eye(3), atol=1e-12)
        world = mesh.vertices @ rot.T
        contact = world[world[:, 2] < world[:, 2].min() + 1e-9]
        assert len(contact) >= 3
        centre = mesh_centroid(mesh) @ rot.T
        assert Delaunay(contact[:, :2]).find_simplex(centre[:2], tol=1e-9) >= 0


def test_random_rotation_is_a_rotation():
    rot = random_rotation(np.random.default_rng(0))
    np.testing.assert_allclose(rot @ rot.T, np.eye(3), atol=1e-12)
    assert np.linalg.det(rot) == pytest.approx(1.0)


@pytest.mark.parametrize('family', PROCEDURAL_CLASSES)
def test_each_family_renders_a_visible_object(renderer, family):
    renderer.load(compose_scene([(family, (0.0, 0.05))], seed=2))
    frame = renderer.render()
    (ann,) = frame.annotations
    assert ann.class_name == family and not ann.known
    assert ann.category_id == category_id(family)
    assert (frame.object_map == 0).sum() == ann.area > 300
    assert ann.bbox[2] >= 15 and ann.bbox[3] >= 15


def test_rendered_examples_show_the_unknown_object_whole(renderer):
    rgb, annotations = render_procedural_example(renderer, 0, 1)
    unknown = [a for a in annotations if not a.known]
    assert [a.class_name for a in unknown] == [procedural_family(1)]
    assert not unknown[0].occluded and not unknown[0].truncated
    again, annotations_again = render_procedural_example(renderer, 0, 1)
    assert np.array_equal(rgb, again) and annotations == annotations_again
