"""Where the learnt GP state lives by default (under the ROS home, one file per model), and
what a restarted detector takes from it and from the shipped GP."""

from __future__ import annotations

import numpy as np

from uq_perception.ntk import LastLayerNTKGP
from uq_perception.teaching import default_learnt_state_path, load_learnt_state, teach

D, C = 6, 3


def _gp() -> tuple[LastLayerNTKGP, np.ndarray]:
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((C, D)) * 3.0
    y = rng.integers(C, size=300)
    x = centres[y] + rng.standard_normal((300, D)) * 0.3
    gp = LastLayerNTKGP(centres, -0.5 * (centres * centres).sum(1), class_names=['a', 'b', 'c'],
                        model_id='net-1').fit(x[:200], y[:200])
    return gp, x[200:]


def test_the_default_is_under_ros_home_else_dot_ros_in_home():
    assert default_learnt_state_path('net-1', {'ROS_HOME': '/data/ros', 'HOME': '/home/u'}) \
        .as_posix() == '/data/ros/uq/learned/net-1.npz'
    for unset in ({'HOME': '/home/u'}, {'ROS_HOME': '', 'HOME': '/home/u'}):
        assert default_learnt_state_path('net-1', unset).as_posix() == \
            '/home/u/.ros/uq/learned/net-1.npz'
    assert default_learnt_state_path('net-1', {'ROS_HOME': '~/robot', 'HOME': '/home/u'}) \
        .as_posix() == '/home/u/robot/uq/learned/net-1.npz'


def test_model_ids_map_to_distinct_plain_file_names():
    env = {'ROS_HOME': '/r'}
    ids = ['centernet-efd0b6f5e9bebe63', 'yolo/v8:n', 'yolo_v8_n', 'yolo_v8:n', '..', '.',
           '', 'a' * 300, '../../etc/passwd', 'modèle']
    paths = [default_learnt_state_path(model_id, env) for model_id in ids]
    assert len(set(paths)) == len(ids)
    for path in paths:
        assert path.parent.as_posix() == '/r/uq/learned'
        assert path.suffix == '.npz' and not path.name.startswith('.')
        assert len(path.name) < 100 and '/' not in path.name
    assert paths[0].name == 'centernet-efd0b6f5e9bebe63.npz'


def test_the_folder_is_made_at_start_and_a_restart_loads_the_labels(tmp_path):
    gp, held_out = _gp()
    path = default_learnt_state_path(gp.model_id, {'ROS_HOME': str(tmp_path / 'home')})
    state = load_learnt_state(gp, path)
    assert state.source == 'the shipped GP' and state.save_to == path and not state.problem
    assert path.parent.is_dir() and not path.exists()
    assert teach(gp, 'req-1', 'mug', np.full(D, 2.0), 'net-1', state.save_to).accepted
    assert path.is_file()
    restarted = load_learnt_state(_gp()[0], path)
    assert restarted.source == f'the learnt state {path} (1 labels)'
    assert restarted.gp.class_names == ['a', 'b', 'c', 'mug']


def test_a_learnt_state_takes_the_shipped_score_reference(tmp_path):
    # Saved before the shipped GP had a reference: the restarted detector still scores.
    gp, held_out = _gp()
    assert teach(gp, 'req-1', 'mug', np.full(D, 2.0), 'net-1', tmp_path / 'learnt.npz').accepted
    shipped, held_out = _gp()
    reference = shipped.calibrate_score(held_out, 'val')
    state = load_learnt_state(shipped, tmp_path / 'learnt.npz')
    assert state.gp.class_names[-1] == 'mug' and state.gp.score_reference == reference
    assert state.gp.predict(held_out[:2]).calibrated_score is not None


def test_a_folder_that_cannot_be_made_is_a_reported_problem(tmp_path):
    (tmp_path / 'file').write_text('not a folder')
    gp, _ = _gp()
    state = load_learnt_state(gp, tmp_path / 'file' / 'uq' / 'net-1.npz')
    assert state.save_to is None and 'cannot create the folder' in state.problem
    assert 'NOT saved' in state.problem


def test_persistence_off_keeps_labels_in_memory():
    gp, _ = _gp()
    state = load_learnt_state(gp, None)
    assert state.save_to is None and state.gp is gp and 'memory only' in state.message
