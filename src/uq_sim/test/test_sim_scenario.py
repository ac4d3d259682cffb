"""Scripted scenarios: deterministic state over time, schedule, gripper path, rendering."""

from __future__ import annotations

import math

import pytest

from uq_sim.scenario import SCENARIO_NAMES, get_scenario
from uq_sim.scene import SceneRenderer


def test_demo_schedule_known_first_then_unknown_objects_appear():
    demo = get_scenario('tabletop_demo')
    assert demo.duration == 30.0
    assert set(demo.state_at(0.0).present_names()) == {'box', 'sphere', 'mug', 'cylinder'}
    assert 'torus' in demo.state_at(8.5).present_names()
    assert 'cone' not in demo.state_at(12.9).present_names()
    assert len(demo.state_at(18.5).present_names()) == 7
    assert [e.time for e in demo.events] == sorted(e.time for e in demo.events)


def test_state_is_a_deterministic_function_of_time():
    a, b = get_scenario('tabletop_demo'), get_scenario('tabletop_demo')
    for t in (0.0, 8.2, 17.3, 25.0, 29.99):
        assert a.state_at(t) == b.state_at(t)


def test_appearing_object_is_put_down_onto_its_resting_place():
    demo = get_scenario('tabletop_demo')
    z = [{o.name: o.pos[2] for o in demo.state_at(t).objects}['torus'] for t in (8.0, 8.3, 9.0)]
    assert z[0] > z[1] > z[2]
    rest = {o.name: o for o in demo.spec.objects}['torus'].position()[2]
    assert z[2] == pytest.approx(rest)


def test_gripper_moves_toward_the_torus_and_loop_wraps():
    demo = get_scenario('tabletop_demo')
    torus_xy = {o.name: o for o in demo.spec.objects}['torus'].xy
    start, end = demo.state_at(5.0).gripper_pos, demo.state_at(29.9).gripper_pos
    assert math.dist(end[:2], torus_xy) < 0.01 < math.dist(start[:2], torus_xy)
    assert end[2] < start[2]
    assert demo.state_at(31.0) == demo.state_at(1.0)
    assert demo.state_at(45.0, loop=False).time == 30.0
    with pytest.raises(ValueError, match='time'):
        demo.state_at(-1.0)
    with pytest.raises(ValueError, match='unknown scenario'):
        get_scenario('nope')


def test_rendered_ground_truth_follows_the_schedule():
    demo = get_scenario('tabletop_demo')
    with SceneRenderer(320, 240) as renderer:
        renderer.load(demo.spec)
        demo.apply(renderer, 5.0)
        before = {a.class_name for a in renderer.render().annotations}
        demo.apply(renderer, 19.0)
        after = {a.class_name for a in renderer.render().annotations}
    assert before == {'box', 'sphere', 'mug', 'cylinder'}
    assert after == before | {'torus', 'cone', 'tetrahedron'}


@pytest.mark.parametrize('name', SCENARIO_NAMES)
def test_every_scenario_has_objects_in_view(name):
    scenario = get_scenario(name)
    with SceneRenderer(160, 120) as renderer:
        renderer.load(scenario.spec)
        scenario.apply(renderer, scenario.duration - 0.01)
        frame = renderer.render(visibility=False)
    assert len(frame.annotations) == len(scenario.state_at(scenario.duration - 0.01)
                                         .present_names())
