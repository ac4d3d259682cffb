"""Online teaching (ROS-free): a label updates the GP once, a new name adds a class, bad
requests change nothing, and the learnt state is saved and reloaded only for its model."""

from __future__ import annotations

import numpy as np
import pytest

from uq_perception.ntk import LastLayerNTKGP
from uq_perception.teaching import check_label, load_learnt_state, teach

D, C = 6, 3


def _gp() -> LastLayerNTKGP:
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((C, D)) * 3.0
    y = rng.integers(C, size=300)
    x = centres[y] + rng.standard_normal((300, D)) * 0.3
    weight, bias = centres, -0.5 * (centres * centres).sum(1)
    return LastLayerNTKGP(weight, bias, class_names=['cube', 'ball', 'cone'],
                          model_id='net-1').fit(x, y)


def test_a_new_class_is_learnt_once_and_lowers_the_variance_there(tmp_path):
    gp = _gp()
    # Far from the training data, where the GP's prior variance dwarfs the label noise, so
    # one label moves the new class's logit nearly all the way to its target.
    novel = np.full(D, 60.0)
    before = float(gp.gp_variance(novel[None])[0])
    result = teach(gp, 'req-1', 'mug', novel.astype(np.float32), 'net-1', tmp_path / 'gp.npz')
    assert result.accepted and result.class_index == 3 and 'new class' in result.message
    assert gp.class_names == ['cube', 'ball', 'cone', 'mug']
    assert float(gp.gp_variance(novel[None])[0]) < before
    assert int(np.argmax(gp.predict(novel[None]).probabilities[0])) == 3
    # Delivered again (a retry after a lost answer): accepted, not applied twice.
    state = gp.gp_tensors()['precision_inverse'].clone()
    again = teach(gp, 'req-1', 'mug', novel, 'net-1', tmp_path / 'gp.npz')
    assert again.accepted and 'applied before' in again.message and again.class_index == 3
    assert np.array_equal(gp.gp_tensors()['precision_inverse'].numpy(), state.numpy())


def test_a_known_class_label_updates_that_class():
    gp = _gp()
    result = teach(gp, 'req-2', 'ball', np.zeros(D), 'net-1')
    assert result.accepted and result.class_index == 1 and gp.applied_updates == ['req-2']
    assert gp.class_names == ['cube', 'ball', 'cone']


@pytest.mark.parametrize(('request_id', 'label', 'embedding', 'model_id', 'needle'), [
    ('', 'mug', np.zeros(D), 'net-1', 'invalid request id'),
    ('r', '', np.zeros(D), 'net-1', 'label is empty'),
    ('r', 'x' * 65, np.zeros(D), 'net-1', 'at most 64'),
    ('r', 'mug\n', np.zeros(D), 'net-1', 'characters other than'),
    ('r', ' mug', np.zeros(D), 'net-1', 'leading/trailing'),
    ('r', 'mug', np.zeros(D + 1), 'net-1', f'embedding has {D + 1} values'),
    ('r', 'mug', np.full(D, np.nan), 'net-1', 'non-finite'),
    ('r', 'mug', np.full(D, 1e30), 'net-1', 'out-of-range'),
    ('r', 'mug', np.zeros(D), 'other-net', "model 'other-net'"),
], ids=['empty-id', 'empty-label', 'long-label', 'control-char', 'spaces', 'wrong-size',
        'nan', 'huge', 'model-mismatch'])
def test_bad_requests_are_refused_and_change_nothing(request_id, label, embedding,
                                                     model_id, needle):
    gp = _gp()
    result = teach(gp, request_id, label, embedding, model_id)
    assert not result.accepted and result.class_index == -1
    assert needle in result.message
    assert gp.class_names == ['cube', 'ball', 'cone'] and gp.applied_updates == []


def test_check_label_accepts_ordinary_names():
    for name in ('mug', 'coffee mug', 'box_2', 'T-joint (steel)'):
        assert check_label(name) is None, name


def test_learnt_state_reloads_for_the_same_model_only(tmp_path):
    gp = _gp()
    path = tmp_path / 'learnt.npz'
    assert teach(gp, 'req-1', 'mug', np.full(D, 6.0), 'net-1', path).accepted
    restored, why = load_learnt_state(_gp(), path)
    assert restored.class_names[-1] == 'mug' and restored.applied_updates == ['req-1']
    assert 'loaded the learnt state' in why and '1 labels' in why

    other = LastLayerNTKGP(np.eye(C, D), np.zeros(C), class_names=['cube', 'ball', 'cone'],
                           model_id='net-2').fit(np.eye(C, D), np.arange(C))
    kept, why = load_learnt_state(other, path)
    assert kept is other and 'model id mismatch' in why

    missing, why = load_learnt_state(gp, tmp_path / 'none.npz')
    assert missing is gp and 'no learnt state' in why

    (tmp_path / 'corrupt.npz').write_bytes(b'not a state file')
    kept, why = load_learnt_state(gp, tmp_path / 'corrupt.npz')
    assert kept is gp and 'ignoring the learnt state' in why


def test_an_unwritable_save_path_keeps_the_label_in_memory_and_says_so(tmp_path):
    gp = _gp()
    result = teach(gp, 'req-1', 'mug', np.full(D, 6.0), 'net-1',
                   tmp_path / 'missing-dir' / 'gp.npz')
    assert result.accepted and 'NOT saved' in result.message
    assert gp.class_names[-1] == 'mug'


def test_with_trust_one_label_decides_the_new_class_even_where_the_gp_is_confident():
    # Near the training data the GP's prior variance is far below its noise: one plain
    # observation barely moves a new class; a trusted label makes it the prediction.
    plain, trusted = _gp(), _gp()
    near = plain.predict(np.zeros((1, D))).gp_variance[0]
    assert near < 0.5 * plain.sigma2[0]
    assert teach(plain, 'r', 'mug', np.zeros(D), 'net-1', trust=0.0).accepted
    assert int(np.argmax(plain.predict(np.zeros((1, D))).probabilities[0])) != 3
    result = teach(trusted, 'r', 'mug', np.zeros(D), 'net-1', trust=0.99)
    assert result.accepted and 'weight' in result.message
    assert int(np.argmax(trusted.predict(np.zeros((1, D))).probabilities[0])) == 3
    assert trusted.predict(np.zeros((1, D))).gp_variance[0] < 0.2 * near


def test_a_weighted_update_equals_repeating_the_observation():
    once, repeated = _gp(), _gp()
    x = np.linspace(-1.0, 1.0, D)
    once.update(x, 1, weight=3.0)
    for _ in range(3):
        repeated.update(x, 1)
    query = np.random.default_rng(1).standard_normal((5, D))
    np.testing.assert_allclose(once.gp_variance(query), repeated.gp_variance(query),
                               rtol=1e-9)
    with pytest.raises(ValueError, match='weight must be finite and > 0'):
        once.update(x, 1, weight=0.0)
