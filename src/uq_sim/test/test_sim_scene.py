"""Scenes: object library geometry, MJCF, rendering and exact ground-truth boxes."""

from __future__ import annotations

import math
from collections import Counter

import mujoco
import numpy as np
import pytest

from uq_sim.geometry import intrinsics_from_fovy, mat_to_quat, quat_to_mat, rot_x, rot_z
from uq_sim.objects import (
    ALL_CLASSES,
    AUXILIARY_CLASSES,
    KNOWN_CLASSES,
    PROCEDURAL_CLASSES,
    UNKNOWN_CLASSES,
    Appearance,
    GeomType,
    category_id,
    class_index,
    cone_mesh,
    make_object,
    mesh_volume,
    prism_mesh,
    rock_mesh,
    star_prism_mesh,
    tetrahedron_mesh,
    torus_mesh,
)
from uq_sim.scene import (
    CameraSpec,
    LightSpec,
    SceneRenderer,
    SceneSpec,
    build_mjcf,
    compose_scene,
)


@pytest.fixture(scope='module')
def renderer():
    with SceneRenderer(320, 240) as r:
        yield r


def test_class_lists_and_category_ids_follow_the_contract():
    assert KNOWN_CLASSES == ('box', 'sphere', 'cylinder', 'capsule', 'ellipsoid', 'mug')
    assert len(UNKNOWN_CLASSES) >= 4 and not set(UNKNOWN_CLASSES) & set(KNOWN_CLASSES)
    assert not set(AUXILIARY_CLASSES) & (set(KNOWN_CLASSES) | set(UNKNOWN_CLASSES))
    assert ALL_CLASSES == KNOWN_CLASSES + UNKNOWN_CLASSES + AUXILIARY_CLASSES
    assert [category_id(c) for c in ALL_CLASSES] == list(range(1, len(ALL_CLASSES) + 1))
    assert class_index('mug') == 5 and class_index('torus') == -1
    with pytest.raises(ValueError, match='unknown object class'):
        category_id('teapot')


@pytest.mark.parametrize('mesh', [
    torus_mesh(0.05, 0.015), cone_mesh(0.04, 0.1), tetrahedron_mesh(0.1),
    star_prism_mesh(0.05, 0.02, 0.02),
    rock_mesh((0.05, 0.04, 0.03), np.random.default_rng(0), bumpiness=0.4),
    prism_mesh(np.array([[0.04, 0.0], [0.01, 0.03], [-0.03, 0.02], [-0.02, -0.03],
                         [0.02, -0.02]]), 0.02)],
    ids=['torus', 'cone', 'tetrahedron', 'star', 'rock', 'slab'])
def test_procedural_meshes_are_closed_and_face_outwards(mesh):
    edges = Counter()
    for a, b, c in mesh.faces:
        for e in ((a, b), (b, c), (c, a)):
            edges[e] += 1
    # Closed and consistently oriented: each directed edge once, its reverse once.
    assert all(n == 1 and edges[(e[1], e[0])] == 1 for e, n in edges.items())
    assert mesh_volume(mesh) > 0.0


def test_mesh_volumes_match_closed_forms():
    assert mesh_volume(torus_mesh(0.05, 0.01, 128, 64)) == pytest.approx(
        2 * math.pi ** 2 * 0.05 * 0.01 ** 2, rel=4e-3)  # polygonal tube: -0.2 %
    assert mesh_volume(cone_mesh(0.04, 0.1, 256)) == pytest.approx(
        math.pi * 0.04 ** 2 * 0.1 / 3, rel=1e-3)
    assert mesh_volume(tetrahedron_mesh(0.1)) == pytest.approx(0.1 ** 3 / (6 * math.sqrt(2)))


def test_quaternion_round_trip():
    rot = rot_z(0.7) @ rot_x(-2.1)
    np.testing.assert_allclose(quat_to_mat(mat_to_quat(rot)), rot, atol=1e-12)


@pytest.mark.parametrize('classes', [ALL_CLASSES, PROCEDURAL_CLASSES],
                         ids=['catalogue', 'procedural'])
@pytest.mark.parametrize('seed', [0, 1, 2])
def test_every_object_rests_on_the_table_in_mujoco(seed, classes):
    """The lowest point of each object, from MuJoCo's own poses, lies on the table (z=0);
    MuJoCo compiles every class, the procedural families included."""
    rng = np.random.default_rng(seed)
    objects = tuple(make_object(f'o{i}', cls, (0.3 * (i % 4) - 0.45, 0.2 * (i // 4) - 0.2), rng)
                    for i, cls in enumerate(classes))
    spec = SceneSpec(objects=objects)
    model = mujoco.MjModel.from_xml_string(build_mjcf(spec))
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    for obj in objects:
        body = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, obj.name)
        lowest = math.inf
        for gid in np.nonzero(model.geom_bodyid == body)[0]:
            xmat = data.geom_xmat[gid].reshape(3, 3)
            if model.geom_type[gid] == mujoco.mjtGeom.mjGEOM_MESH:
                m = model.geom_dataid[gid]
                verts = model.mesh_vert[model.mesh_vertadr[m]:
                                        model.mesh_vertadr[m] + model.mesh_vertnum[m]]
                lowest = min(lowest, float((data.geom_xpos[gid] + verts @ xmat.T)[:, 2].min()))
            else:
                spec_geom = obj.geoms[[f'{obj.name}_g{k}' for k in range(len(obj.geoms))]
                                      .index(model.geom(gid).name)]
                below = spec_geom.extent_below(xmat.T @ np.array([0.0, 0.0, 1.0]))
                lowest = min(lowest, data.geom_xpos[gid][2] - below)
        assert lowest == pytest.approx(0.0, abs=2e-4), obj.class_name


def test_sphere_box_matches_its_analytic_projection(renderer):
    rng = np.random.default_rng(0)
    sphere = make_object('ball', 'sphere', (0.05, 0.02), rng)
    renderer.load(SceneSpec(objects=(sphere,)))
    frame = renderer.render()
    (ann,) = frame.annotations
    radius = sphere.geoms[0].size[0]
    centre = sphere.position()
    cam = renderer.data.cam_xpos[0]
    axes = renderer.data.cam_xmat[0].reshape(3, 3)
    # Silhouette of the sphere: points on the sphere tangent to the viewing rays.
    dirs = rng.normal(size=(20000, 3))
    pts = centre + radius * dirs / np.linalg.norm(dirs, axis=1, keepdims=True)
    local = (pts - cam) @ axes
    intr = intrinsics_from_fovy(45.0, 320, 240)
    u = intr.cx + intr.fx * local[:, 0] / -local[:, 2]
    v = intr.cy - intr.fy * local[:, 1] / -local[:, 2]
    # Pixel centres sit at integers; the box covers whole pixels [x, x + w).
    expected = (u.min() + 0.5, v.min() + 0.5, u.max() + 0.5, v.max() + 0.5)
    x, y, w, h = ann.bbox
    assert abs(x - expected[0]) <= 1.0 and abs(y - expected[1]) <= 1.0
    assert abs(x + w - expected[2]) <= 1.0 and abs(y + h - expected[3]) <= 1.0
    assert not ann.occluded and not ann.truncated and ann.visible_fraction == 1.0


def test_compound_box_is_the_union_of_its_parts(renderer):
    """The mug's box (body + handle) equals where the image changes when the mug is added."""
    rng = np.random.default_rng(5)
    mug = make_object('mug', 'mug', (0.0, 0.0), rng, yaw=0.0,
                      appearance=Appearance((0.95, 0.05, 0.05), specular=0.0))
    lights = (LightSpec(pos=(0.3, -0.3, 1.2), castshadow=False),)
    renderer.load(SceneSpec(objects=(), lights=lights))
    empty = renderer.render().rgb.astype(int)
    renderer.load(SceneSpec(objects=(mug,), lights=lights))
    frame = renderer.render()
    changed = np.abs(frame.rgb.astype(int) - empty).max(axis=2) > 12
    ys, xs = np.nonzero(changed)
    (ann,) = frame.annotations
    assert ann.bbox == (xs.min(), ys.min(), xs.max() - xs.min() + 1, ys.max() - ys.min() + 1)


def test_occlusion_fraction_matches_rendering_the_object_alone(renderer):
    camera = CameraSpec()
    back = make_object('back', 'cylinder', (0.0, 0.12), np.random.default_rng(1))
    front = make_object('front', 'box', (0.0, -0.02), np.random.default_rng(2))
    renderer.load(SceneSpec(objects=(front, back), camera=camera))
    both = renderer.render()
    by_name = {a.name: a for a in both.annotations}
    renderer.load(SceneSpec(objects=(back,), camera=camera))
    alone = renderer.render()
    (back_alone,) = alone.annotations
    fraction = by_name['back'].area / back_alone.area
    assert fraction < 0.95, 'the test scene should occlude the back object'
    assert by_name['back'].visible_fraction == pytest.approx(fraction, abs=1e-4)
    assert by_name['back'].occluded == (fraction < renderer.occluded_below)
    assert by_name['front'].visible_fraction == 1.0
    # Boxes match the segmentation: each covers exactly its object's visible pixels.
    for ann in both.annotations:
        ys, xs = np.nonzero(both.object_map == ann.track_id)
        assert ann.bbox == (xs.min(), ys.min(), xs.max() - xs.min() + 1, ys.max() - ys.min() + 1)
        assert ann.area == len(xs)


def test_object_across_the_border_is_truncated(renderer):
    spec = compose_scene([('box', (-0.29, -0.1)), ('sphere', (0.0, 0.0))], seed=3)
    renderer.load(spec)
    by_class = {a.class_name: a for a in renderer.render().annotations}
    assert by_class['box'].truncated and by_class['box'].bbox[0] == 0
    assert not by_class['sphere'].truncated


def test_known_and_unknown_objects_at_chosen_positions(renderer):
    placements = [('box', (-0.18, -0.05)), ('mug', (0.18, 0.0)), ('capsule', (-0.05, 0.12)),
                  ('torus', (0.03, -0.1))]
    renderer.load(compose_scene(placements, seed=11))
    frame = renderer.render()
    assert frame.rgb.shape == (240, 320, 3) and frame.rgb.dtype == np.uint8
    got = {a.class_name: a for a in frame.annotations}
    assert set(got) == {'box', 'mug', 'capsule', 'torus'}
    assert not got['torus'].known and got['torus'].category_id == category_id('torus')
    assert all(got[c].known for c in ('box', 'mug', 'capsule'))
    # Objects are large enough for a small CNN: 20-90 px.
    for a in frame.annotations:
        assert 15 <= max(a.bbox[2:]) <= 100


def test_hidden_objects_leave_the_image_and_the_ground_truth(renderer):
    renderer.load(compose_scene([('sphere', (-0.1, 0.0)), ('cone', (0.1, 0.0))], seed=4))
    renderer.set_object_present('obj1', False)
    frame = renderer.render()
    assert [a.class_name for a in frame.annotations] == ['sphere']
    renderer.set_object_present('obj1', True)
    assert len(renderer.render().annotations) == 2
    with pytest.raises(ValueError, match='no object named'):
        renderer.set_object_present('nope', True)


def test_renderer_rejects_bad_sizes_and_use_after_close():
    with pytest.raises(ValueError, match='image size'):
        SceneRenderer(8, 8)
    r = SceneRenderer(64, 48)
    r.close()
    r.close()
    with pytest.raises(RuntimeError, match='closed'):
        r.load(compose_scene([('box', (0.0, 0.0))]))


def test_mesh_geoms_are_meshes_in_the_model():
    spec = compose_scene([('torus', (0.0, 0.0)), ('dumbbell', (0.2, 0.0))])
    model = mujoco.MjModel.from_xml_string(build_mjcf(spec))
    assert model.nmesh == 1 and GeomType.MESH.value == 'mesh'
    assert model.nmocap == 2
