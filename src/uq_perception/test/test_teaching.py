"""Online teaching (ROS-free): a label updates the GP once, a new name adds a class (up to
a cap), bad requests change nothing, labels follow the shared class label rule, and the
learnt state is saved and reloaded only for its model, never overwritten when unusable."""

from __future__ import annotations

import numpy as np
import pytest

from uq_perception.ntk import LastLayerNTKGP
from uq_perception.teaching import MAX_TAUGHT_CLASSES, load_learnt_state, teach

D, C = 6, 3


def _gp(names: tuple[str, ...] = ('cube', 'ball', 'cone')) -> LastLayerNTKGP:
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((C, D)) * 3.0
    y = rng.integers(C, size=300)
    x = centres[y] + rng.standard_normal((300, D)) * 0.3
    weight, bias = centres, -0.5 * (centres * centres).sum(1)
    return LastLayerNTKGP(weight, bias, class_names=list(names), model_id='net-1').fit(x, y)


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
    ('r', '', np.zeros(D), 'net-1', 'label must not be empty'),
    ('r', 'x' * 65, np.zeros(D), 'net-1', 'at most 64'),
    ('r', 'mug\n', np.zeros(D), 'net-1', 'non-printable character'),
    ('r', "Tom's mug", np.zeros(D), 'net-1', 'may hold only letters'),
    ('r', 'mug', np.zeros(D + 1), 'net-1', f'embedding has {D + 1} values'),
    ('r', 'mug', np.full(D, np.nan), 'net-1', 'non-finite'),
    ('r', 'mug', np.full(D, 1e30), 'net-1', 'out-of-range'),
    ('r', 'mug', np.zeros(D), 'other-net', "model 'other-net'"),
], ids=['empty-id', 'empty-label', 'long-label', 'control-char', 'apostrophe', 'wrong-size',
        'nan', 'huge', 'model-mismatch'])
def test_bad_requests_are_refused_and_change_nothing(request_id, label, embedding,
                                                     model_id, needle):
    gp = _gp()
    result = teach(gp, request_id, label, embedding, model_id)
    assert not result.accepted and result.class_index == -1
    assert needle in result.message
    assert gp.class_names == ['cube', 'ball', 'cone'] and gp.applied_updates == []


def test_labels_are_normalised_by_the_shared_rule_and_match_classes_by_folded_name():
    gp = _gp(('cube', 'Traffic Light', 'cone'))
    # A base class spelt with capitals is named by its folded form, keeping its spelling.
    known = teach(gp, 'r1', ' traffic   LIGHT ', np.zeros(D), 'net-1')
    assert known.accepted and known.class_index == 1, known.message
    new = teach(gp, 'r2', 'Coffee Mug', np.full(D, 9.0), 'net-1')
    assert new.accepted and new.class_index == 3 and "'coffee mug'" in new.message
    again = teach(gp, 'r3', 'COFFEE mug', np.full(D, 9.5), 'net-1')
    assert again.accepted and again.class_index == 3 and 'new class' not in again.message
    assert gp.class_names == ['cube', 'Traffic Light', 'cone', 'coffee mug']


def test_new_classes_are_capped_and_the_refusal_says_why(tmp_path):
    gp = _gp()
    rng = np.random.default_rng(3)
    for i in range(MAX_TAUGHT_CLASSES):
        assert teach(gp, f'r{i}', f'thing {i}', rng.normal(size=D), 'net-1').accepted
    assert gp.num_classes == C + MAX_TAUGHT_CLASSES
    path = tmp_path / 'learnt.npz'
    refused = teach(gp, 'one-more', 'thing x', rng.normal(size=D), 'net-1', path)
    assert not refused.accepted and refused.class_index == -1
    assert f'already has {MAX_TAUGHT_CLASSES} taught classes' in refused.message
    assert 'MAX_TAUGHT_CLASSES' in refused.message
    assert gp.num_classes == C + MAX_TAUGHT_CLASSES and 'one-more' not in gp.applied_updates
    assert not path.exists()
    # Labels of known classes, taught ones included, and retries still go through.
    assert teach(gp, 'known', 'ball', rng.normal(size=D), 'net-1').accepted
    assert teach(gp, 'taught', 'Thing 5', rng.normal(size=D), 'net-1').class_index == C + 5
    assert teach(gp, 'r0', 'thing 0', rng.normal(size=D), 'net-1').accepted


def test_learnt_state_reloads_for_the_same_model_only(tmp_path):
    gp = _gp()
    path = tmp_path / 'learnt.npz'
    assert teach(gp, 'req-1', 'mug', np.full(D, 6.0), 'net-1', path).accepted
    restored = load_learnt_state(_gp(), path)
    assert restored.gp.class_names[-1] == 'mug' and restored.gp.applied_updates == ['req-1']
    assert 'loaded the learnt state' in restored.message and '1 labels' in restored.message
    assert restored.problem == '' and restored.save_to == path

    missing = load_learnt_state(gp, tmp_path / 'none.npz')
    assert missing.gp is gp and 'no learnt state' in missing.message and not missing.problem
    assert missing.save_to == tmp_path / 'none.npz'

    other = LastLayerNTKGP(np.eye(C, D), np.zeros(C), class_names=['cube', 'ball', 'cone'],
                           model_id='net-2').fit(np.eye(C, D), np.arange(C))
    kept = load_learnt_state(other, path)
    assert kept.gp is other and 'model id mismatch' in kept.problem
    # Another model's state is moved aside, not lost.
    moved = list(tmp_path.glob('learnt.npz.unusable-*'))
    assert len(moved) == 1 and not path.exists()
    assert LastLayerNTKGP.load(moved[0]).applied_updates == ['req-1']


def _corrupt(path, at: float = 0.5) -> bytes:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    path.write_bytes(bytes(data))
    return bytes(data)


def test_an_unreadable_learnt_state_is_moved_aside_and_never_overwritten(tmp_path):
    path = tmp_path / 'learnt.npz'
    gp = _gp()
    for i in range(3):
        assert teach(gp, f'req-{i}', 'mug', np.full(D, 6.0 + i), 'net-1', path).accepted
    corrupt = _corrupt(path)

    state = load_learnt_state(_gp(), path)
    assert state.gp.class_names == ['cube', 'ball', 'cone'] and state.save_to == path
    [moved] = tmp_path.glob('learnt.npz.unusable-*')
    assert moved.read_bytes() == corrupt and not path.exists()
    assert str(path) in state.problem and str(moved) in state.problem
    assert 'not a readable NTK-GP state file' in state.problem
    # The next label starts a new file; the moved one keeps the earlier labels' bytes.
    assert teach(state.gp, 'req-new', 'cup', np.full(D, 9.0), 'net-1', state.save_to).accepted
    assert LastLayerNTKGP.load(path).applied_updates == ['req-new']
    assert moved.read_bytes() == corrupt

    # A second unusable state (in the same second, as likely as not) gets a name of its own.
    second = _corrupt(path, 0.3)
    assert load_learnt_state(_gp(), path).problem
    siblings = sorted(tmp_path.glob('learnt.npz.unusable-*'))
    assert len(siblings) == 2 and {p.read_bytes() for p in siblings} == {corrupt, second}


def test_an_unusable_learnt_state_that_cannot_be_moved_is_left_and_labels_not_saved(tmp_path):
    path = tmp_path / 'learnt.npz'
    path.mkdir()  # learned_gp_path names a folder: unreadable, and cannot be renamed to a file
    (path / 'keep.txt').write_text('mine')
    gp = _gp()
    state = load_learnt_state(gp, path)
    assert state.gp is gp and state.save_to is None
    assert 'nor move it aside' in state.problem and 'NOT saved' in state.problem
    assert (path / 'keep.txt').read_text() == 'mine'
    assert list(tmp_path.iterdir()) == [path]  # no reservation left behind


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
