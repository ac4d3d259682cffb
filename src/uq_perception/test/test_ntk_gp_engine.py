"""Weight-space NTK-GP engine: outputs, gating, online update, persistence, input checks."""

import copy
import logging
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from uq_perception.ntk import (
    Gating,
    LastLayerNTKGP,
    NTKGPConfig,
    antithetic_normal_draws,
    gp_variance_torch,
    kmeans,
    spd_inverse,
    summarise_gaussian_logits,
)
from uq_perception.ntk.model import expert_quadratic_forms

D, C = 8, 4


def _data(n: int = 600, seed: int = 0):
    """Two Gaussian blobs per class in D dims (one direction nearly unused), class-mean head."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((2 * C, D)) * 3.0
    centres[:, -1] = 0.0
    blob = rng.integers(2 * C, size=n)
    scale = np.append(np.ones(D - 1), 0.05)
    x = centres[blob] + rng.standard_normal((n, D)) * scale
    y = blob % C
    means = np.stack([x[y == k].mean(0) for k in range(C)])
    weight, bias = means, -0.5 * (means * means).sum(1)
    return x, y, weight, bias


CONFIGS = [NTKGPConfig(), NTKGPConfig(num_experts=3), NTKGPConfig(gating=Gating.CLASS)]
IDS = ['m1', 'kmeans3', 'class']


@pytest.fixture(scope='module')
def data():
    return _data()


@pytest.fixture(scope='module', params=CONFIGS, ids=IDS)
def fitted(request, data):
    x, y, w, b = data
    return LastLayerNTKGP(w, b, request.param, model_id='net-1').fit(x, y)


def test_outputs_are_consistent_and_deterministic(fitted, data):
    x = data[0]
    queries = np.concatenate([x[:10], 10.0 * x[:5]])
    out = fitted.predict(queries)
    again = copy.deepcopy(fitted).predict(queries)
    for field in out.__dataclass_fields__:
        np.testing.assert_array_equal(getattr(out, field), getattr(again, field))
    b = len(queries)
    assert out.logits.shape == out.probabilities.shape == out.class_variance.shape == (b, C)
    assert np.isfinite(out.gp_variance).all() and (out.gp_variance >= 0).all()
    np.testing.assert_allclose(out.probabilities.sum(1), 1.0)
    assert (out.mutual_information >= 0).all()
    np.testing.assert_allclose(out.predictive_entropy - out.expected_entropy,
                               out.mutual_information, atol=1e-12)
    assert (out.predictive_entropy <= math.log(C) + 1e-12).all()
    assert not out.out_of_distribution.any()
    # Far from the data the GP is less certain, and the probit flattens probabilities.
    assert out.gp_variance[10:].min() > out.gp_variance[:10].max()
    plain = np.exp(out.logits - out.logits.max(1, keepdims=True))
    plain /= plain.sum(1, keepdims=True)
    assert (out.probabilities.max(1) <= plain.max(1) + 1e-12).all()
    assert out.expert_id.min() >= 0 and out.expert_id.max() < fitted.num_experts


def test_zero_variance_has_zero_mutual_information(data):
    x, y, w, b = data
    gp = LastLayerNTKGP(w, b).fit(x, y)
    gp._covariance[:] = 0.0
    out = gp.predict(x[:5])
    np.testing.assert_allclose(out.mutual_information, 0.0, atol=1e-12)
    np.testing.assert_allclose(out.probabilities.max(1),
                               np.exp(out.logits.max(1)) / np.exp(out.logits).sum(1))


def test_gating_partitions(data):
    x, y, w, b = data
    by_class = LastLayerNTKGP(w, b, NTKGPConfig(gating='class')).fit(x, y)
    np.testing.assert_array_equal(by_class.predict(x).expert_id, np.argmax(x @ w.T + b, 1))
    assert by_class.num_experts == C
    clustered = LastLayerNTKGP(w, b, NTKGPConfig(num_experts=3)).fit(x, y)
    centroids = clustered.centroids
    nearest = np.argmin(((x[:, None, :] - centroids[None]) ** 2).sum(2), 1)
    np.testing.assert_array_equal(clustered.predict(x).expert_id, nearest)
    assert len(np.unique(nearest)) == 3
    with pytest.raises(ValueError, match='one expert per class'):
        LastLayerNTKGP(w, b, NTKGPConfig(gating='class', num_experts=3))
    with pytest.raises(ValueError, match='gating must be one of'):
        NTKGPConfig(gating='nearest')


@pytest.mark.parametrize('rows', [0, 1, 7, 256])
def test_expert_variances_equal_the_per_expert_loop(rows):
    # Unevenly filled experts, some empty, as k-means gating gives; each row's quadratic
    # form computed here one expert at a time, row by row, in the order of the rows.
    rng = np.random.default_rng(rows)
    experts, width = 64, 129
    factors = rng.standard_normal((experts, width, width)) / width
    covariance = factors @ factors.transpose(0, 2, 1) + 1e-3 * np.eye(width)
    expert = rng.choice(experts, size=rows, p=rng.dirichlet(np.full(experts, 0.3)))
    phi = rng.standard_normal((rows, width))
    expected = np.empty(rows)
    for e in range(experts):
        for b in np.flatnonzero(expert == e):
            expected[b] = phi[b] @ covariance[e] @ phi[b]
    found = expert_quadratic_forms(phi, expert, covariance)
    assert found.shape == (rows,) and found.dtype == np.float64
    np.testing.assert_allclose(found, expected, rtol=1e-6, atol=0.0)
    # One expert: the same forms.
    np.testing.assert_allclose(expert_quadratic_forms(phi, np.zeros(rows, int), covariance[:1]),
                               np.einsum('bp,pq,bq->b', phi, covariance[0], phi), rtol=1e-6)


def test_gp_variance_is_each_rows_own_expert_form(data):
    x, y, w, b = data
    gp = LastLayerNTKGP(w, b, NTKGPConfig(num_experts=5)).fit(x, y)
    out = gp.predict(x)
    phi = np.hstack([x, np.ones((len(x), 1))])
    # Each expert's covariance from its own rows alone: (G_m / sigma_m^2 + delta_m I)^-1.
    expected = np.empty(len(x))
    for e in range(gp.num_experts):
        rows = out.expert_id == e
        train = phi[gp.predict(x).expert_id == e]
        cov = np.linalg.inv(train.T @ train / gp.sigma2[e] + gp.delta[e] * np.eye(D + 1))
        expected[rows] = np.einsum('bp,pq,bq->b', phi[rows], cov, phi[rows])
    np.testing.assert_allclose(out.gp_variance, expected, rtol=1e-6)


def test_kmeans_recovers_separated_clusters():
    rng = np.random.default_rng(3)
    centres = np.array([[0.0, 0.0], [20.0, 0.0], [0.0, 20.0]])
    points = np.concatenate([c + rng.standard_normal((50, 2)) for c in centres])
    found = kmeans(points, 3, seed=0)
    order = np.argsort(found[:, 0] + 2 * found[:, 1])
    np.testing.assert_allclose(found[order], centres, atol=0.5)
    np.testing.assert_array_equal(kmeans(points, 3, seed=0), found)
    with pytest.raises(ValueError, match='at least 3 points'):
        kmeans(points[:2], 3)


def test_streaming_fit_equals_array_fit(data):
    x, y, w, b = data
    config = NTKGPConfig(num_experts=3, kmeans_samples=10_000)
    whole = LastLayerNTKGP(w, b, config).fit(x, y)
    chunks = ((x[i:i + 97], y[i:i + 97]) for i in range(0, len(x), 97))
    streamed = LastLayerNTKGP(w, b, config).fit(chunks)
    np.testing.assert_allclose(streamed.centroids, whole.centroids, rtol=1e-12)
    np.testing.assert_allclose(streamed.predict(x[:20]).gp_variance,
                               whole.predict(x[:20]).gp_variance, rtol=1e-10)
    np.testing.assert_allclose(streamed.sigma2, whole.sigma2, rtol=1e-10)
    float32 = LastLayerNTKGP(w, b, config).fit(x.astype(np.float32), y)
    np.testing.assert_allclose(float32.sigma2, whole.sigma2, rtol=1e-5)


def test_unlabelled_fit_uses_predicted_classes(data):
    x, _, w, b = data
    unlabelled = LastLayerNTKGP(w, b).fit(x)
    predicted = LastLayerNTKGP(w, b).fit(x, np.argmax(x @ w.T + b, 1))
    np.testing.assert_allclose(unlabelled.sigma2, predicted.sigma2)


@pytest.mark.parametrize('config', CONFIGS, ids=IDS)
def test_online_update_equals_refit_on_enlarged_data(data, config):
    x, y, w, b = data
    gp = LastLayerNTKGP(w, b, config).fit(x, y)
    new = np.array([x[3] * 1.5, x[7] + 2.0])
    new_labels = [1, 2]
    before = gp.gp_variance(new)
    for feature, label in zip(new, new_labels, strict=True):
        gp.update(feature, label)
    after = gp.gp_variance(new)
    assert (after < before).all()
    refit = copy.deepcopy(gp).fit(np.concatenate([x, new]), np.concatenate([y, new_labels]),
                                  keep_gating=True, keep_hyperparameters=True)
    queries = np.concatenate([new, x[:10], 4.0 * x[:3]])
    np.testing.assert_allclose(gp.gp_variance(queries), refit.gp_variance(queries),
                               rtol=1e-9)


@pytest.mark.parametrize('config', [CONFIGS[0], CONFIGS[1]], ids=IDS[:2])
def test_long_online_update_sequence_crossing_exact_recomputation_equals_refit(data, config):
    """650 updates: the expert's inverse is recomputed exactly after its 256th and 512th.

    The recomputation must use the Gram matrix that already includes the sample being added;
    a recomputation from the previous Gram drops that sample and drifts away from a refit.
    """
    x, y, w, b = data
    gp = LastLayerNTKGP(w, b, config).fit(x, y)
    rng = np.random.default_rng(7)
    picks = rng.integers(len(x), size=650)
    new = x[picks] + 0.3 * rng.standard_normal((650, D))
    new_labels = y[picks]
    for feature, label in zip(new, new_labels, strict=True):
        gp.update(feature, int(label))
    refit = copy.deepcopy(gp).fit(np.concatenate([x, new]), np.concatenate([y, new_labels]),
                                  keep_gating=True, keep_hyperparameters=True)
    queries = np.concatenate([new[-20:], x[:10], 4.0 * x[:3]])
    np.testing.assert_allclose(gp.gp_variance(queries), refit.gp_variance(queries),
                               rtol=1e-6)
    np.testing.assert_allclose(gp.predict(queries).logits, refit.predict(queries).logits,
                               rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize('config', CONFIGS, ids=IDS)
def test_new_class_is_learned_online_and_matches_refit(data, config):
    x, y, w, b = data
    gp = LastLayerNTKGP(w, b, config, class_names=['a', 'b', 'c', 'd']).fit(x, y)
    # The novel object activates feature directions the known objects leave nearly unused
    # (large leverage), as a new object does in a detector's embedding.
    rng = np.random.default_rng(5)
    unused = np.linalg.svd(x - x.mean(0))[2][-1]
    novel = x[0] + 8.0 * unused + 0.3 * rng.standard_normal((28, D))
    assert gp.predict(novel).probabilities.shape == (28, C)
    gp.update(novel[0], C, class_name='mug')
    assert gp.class_names == ['a', 'b', 'c', 'd', 'mug'] and gp.num_classes == C + 1
    first = gp.predict(novel[:1]).probabilities[0, C]
    for feature in novel[1:8]:
        gp.update(feature, C)
    out = gp.predict(novel)
    assert out.probabilities.shape == (28, C + 1)
    assert out.probabilities[0, C] > first
    # Bayesian shrinkage: a handful of labelled views (not one) make the object known.
    assert (out.probabilities[8:].argmax(1) == C).mean() >= 0.9
    # Known objects stay known.
    known = gp.predict(x[:50])
    assert (known.probabilities.argmax(1) == np.argmax(x[:50] @ w.T + b, 1)).mean() > 0.95
    refit = copy.deepcopy(gp).fit(np.concatenate([x, novel[:8]]),
                                  np.concatenate([y, [C] * 8]),
                                  keep_gating=True, keep_hyperparameters=True)
    np.testing.assert_allclose(refit.predict(novel).logits, gp.predict(novel).logits,
                               rtol=1e-9)
    with pytest.raises(ValueError, match='already exists'):
        gp.update(novel[0], C + 1, class_name='mug')
    with pytest.raises(ValueError, match="is 'a', not 'b'"):
        gp.update(novel[0], 0, class_name='b')


def test_calibrate_ood_flags_the_chosen_quantile(data):
    x, y, w, b = data
    gp = LastLayerNTKGP(w, b, NTKGPConfig(ood_quantile=0.9)).fit(x, y)
    held_out = _data(n=2000, seed=0)[0]
    threshold = gp.calibrate_ood(held_out)
    assert threshold == gp.ood_threshold
    assert gp.predict(held_out).out_of_distribution.mean() == pytest.approx(0.1, abs=0.002)
    assert gp.predict(30.0 * held_out[:20]).out_of_distribution.all()


def test_probability_calibration_does_not_increase_nll(data):
    x, y, w, b = data
    gp = LastLayerNTKGP(w, b).fit(x, y)
    val_x, val_y = _data(n=400, seed=0)[:2]
    overconfident = 5.0 * (val_x @ w.T + b)

    def nll():
        p = gp.predict(val_x, overconfident).probabilities
        return -np.log(p[np.arange(len(val_y)), val_y]).mean()

    before = nll()
    lam, temperature = gp.calibrate_probabilities(val_x, val_y, overconfident)
    assert nll() <= before
    assert temperature > 1.0 and lam >= 0.0


def test_save_load_round_trip_and_validation(tmp_path, data):
    x, y, w, b = data
    gp = LastLayerNTKGP(w, b, NTKGPConfig(num_experts=3), class_names=list('abcd'),
                        model_id='net-1').fit(x, y)
    gp.calibrate_ood(x)
    gp.update(9.0 * np.ones(D), C, class_name='mug')
    path = tmp_path / 'gp.npz'
    gp.save(path)
    loaded = LastLayerNTKGP.load(path, feature_dim=D, class_names=list('abcd'),
                                 model_id='net-1')
    assert loaded.class_names == list('abcd') + ['mug']
    assert loaded.ood_threshold == gp.ood_threshold
    queries = np.concatenate([x[:10], 9.0 * np.ones((1, D))])
    for field in ('logits', 'gp_variance', 'probabilities', 'mutual_information'):
        np.testing.assert_allclose(getattr(loaded.predict(queries), field),
                                   getattr(gp.predict(queries), field), rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match='feature dimension mismatch'):
        LastLayerNTKGP.load(path, feature_dim=D + 1)
    with pytest.raises(ValueError, match='class names mismatch'):
        LastLayerNTKGP.load(path, class_names=list('abce'))
    with pytest.raises(ValueError, match='model id mismatch'):
        LastLayerNTKGP.load(path, model_id='net-2')
    garbage = tmp_path / 'garbage.npz'
    garbage.write_bytes(b'not a state file at all')
    with pytest.raises(ValueError, match='not a readable NTK-GP state file'):
        LastLayerNTKGP.load(garbage)
    truncated = tmp_path / 'truncated.npz'
    truncated.write_bytes(path.read_bytes()[:2000])
    with pytest.raises(ValueError, match='not a readable NTK-GP state file'):
        LastLayerNTKGP.load(truncated)
    with pytest.raises(FileNotFoundError):
        LastLayerNTKGP.load(tmp_path / 'missing.npz')


def _rewrite(path, out, **changes):
    """Copy a saved state with changed fields, re-signed so that the checks behind the
    checksum are what is exercised."""
    from uq_perception.ntk import arrays_digest
    with np.load(path) as archive:
        arrays = {k: archive[k] for k in archive.files}
    import json
    meta = json.loads(str(arrays['meta']))
    for key, value in changes.items():
        if key in meta:
            meta[key] = value
        else:
            arrays[key] = value
    meta['digest'] = arrays_digest({k: v for k, v in arrays.items() if k != 'meta'})
    arrays['meta'] = np.array(json.dumps(meta))
    with open(out, 'wb') as handle:
        np.savez(handle, **arrays)


def test_load_rejects_wrong_version_and_inconsistent_state(tmp_path, data):
    x, y, w, b = data
    path = tmp_path / 'gp.npz'
    LastLayerNTKGP(w, b).fit(x, y).save(path)
    _rewrite(path, tmp_path / 'v99.npz', version=99)
    with pytest.raises(ValueError, match='unsupported format version 99'):
        LastLayerNTKGP.load(tmp_path / 'v99.npz')
    _rewrite(path, tmp_path / 'shape.npz', gram=np.zeros((1, 3, 3)))
    with pytest.raises(ValueError, match='corrupt NTK-GP state.*gram'):
        LastLayerNTKGP.load(tmp_path / 'shape.npz')
    _rewrite(path, tmp_path / 'nan.npz', sigma2=np.array([np.nan]))
    with pytest.raises(ValueError, match='corrupt NTK-GP state.*sigma2'):
        LastLayerNTKGP.load(tmp_path / 'nan.npz')


def test_bad_inputs_raise_specific_errors(data):
    x, y, w, b = data
    gp = LastLayerNTKGP(w, b)
    with pytest.raises(ValueError, match='not fitted'):
        gp.predict(x[:2])
    gp.fit(x, y)
    bad = x[:3].copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match=r'non-finite values .* rows \[1\]'):
        gp.predict(bad)
    with pytest.raises(ValueError, match='must have 8 columns'):
        gp.predict(x[:3, :5])
    with pytest.raises(ValueError, match='must be 2-D'):
        gp.predict(x[0])
    with pytest.raises(ValueError, match='logits must have shape'):
        gp.predict(x[:3], np.zeros((3, C + 2)))
    with pytest.raises(ValueError, match='logits contain non-finite'):
        gp.predict(x[:2], np.full((2, C), np.inf))
    with pytest.raises(ValueError, match=r'label must lie in \[0, 4\]'):
        gp.update(x[0], C + 1)
    with pytest.raises(ValueError, match='feature contain non-finite'):
        gp.update(np.full(D, np.nan), 0)
    with pytest.raises(ValueError, match=r'labels must lie in \[0, 4\)'):
        LastLayerNTKGP(w, b).fit(x, y + 1)
    # A fit that fails midway (k-means already rerun on the first chunk) changes nothing.
    clustered = LastLayerNTKGP(w, b, NTKGPConfig(num_experts=3, kmeans_samples=100)).fit(x, y)
    before = clustered.predict(x[:50])
    with pytest.raises(ValueError, match='non-finite'):
        clustered.fit(iter([(2.0 * x[100:200], y[100:200]), (bad, y[:3])]))
    after = clustered.predict(x[:50])
    np.testing.assert_array_equal(after.gp_variance, before.gp_variance)
    np.testing.assert_array_equal(after.expert_id, before.expert_id)
    with pytest.raises(ValueError, match='zero feature rows'):
        LastLayerNTKGP(w, b).fit(x[:0], y[:0])
    with pytest.raises(ValueError, match='at least 2 classes'):
        LastLayerNTKGP(w[:1], b[:1])
    with pytest.raises(ValueError, match='ood_quantile'):
        NTKGPConfig(ood_quantile=1.0)
    assert gp.predict(x[:0]).gp_variance.shape == (0,)


def test_near_singular_precision_gets_jitter_and_a_warning(data, caplog):
    x, y, w, b = data
    gp = LastLayerNTKGP(w, b).fit(x[:4], y[:4])
    with caplog.at_level(logging.WARNING, logger='uq_perception.ntk'):
        gp.set_hyperparameters(sigma2=1e-6, delta=1e-14)
    assert 'near-singular' in caplog.text
    out = gp.predict(np.concatenate([x[:4], 100.0 * x[4:8]]))
    assert np.isfinite(out.gp_variance).all() and (out.gp_variance >= 0).all()
    with pytest.raises(ValueError, match='non-finite'):
        spd_inverse(np.full((2, 2), np.nan), 'test matrix')


def test_torch_query_matches_and_traces(data):
    x, y, w, b = data
    gp = LastLayerNTKGP(w, b, NTKGPConfig(num_experts=3)).fit(x, y)
    tensors = gp.gp_tensors()
    assert tensors['precision_inverse'].dtype == torch.float32
    assert tensors['precision_inverse'].shape == (3, D + 1, D + 1)
    queries = torch.tensor(x[:16], dtype=torch.float32)
    variance, expert = gp_variance_torch(queries, **tensors)
    reference = gp.predict(x[:16])
    np.testing.assert_array_equal(expert.numpy(), reference.expert_id)
    np.testing.assert_allclose(variance.numpy(), reference.gp_variance, rtol=1e-3, atol=1e-7)

    class Query(torch.nn.Module):
        def forward(self, features, centroids, precision_inverse):
            return gp_variance_torch(features, centroids, precision_inverse)

    # Exportable with a dynamic batch and the GP matrices as runtime inputs.
    exported = torch.export.export(
        Query(), (queries, tensors['centroids'], tensors['precision_inverse']),
        dynamic_shapes=({0: torch.export.Dim('batch')}, None, None)).module()
    again, _ = exported(queries[:5] * 2.0, tensors['centroids'], tensors['precision_inverse'])
    np.testing.assert_allclose(again.numpy(), gp.gp_variance(x[:5] * 2.0), rtol=1e-3, atol=1e-7)
    by_class = LastLayerNTKGP(w, b, NTKGPConfig(gating=Gating.CLASS)).fit(x, y)
    logits = torch.tensor(x[:16] @ w.T + b)
    variance, expert = gp_variance_torch(queries, **by_class.gp_tensors(),
                                         expert_id=logits.argmax(1))
    reference = by_class.predict(x[:16])
    np.testing.assert_array_equal(expert.numpy(), reference.expert_id)
    np.testing.assert_allclose(variance.numpy(), reference.gp_variance, rtol=1e-3, atol=1e-7)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 6), st.integers(1, 5), st.floats(0.0, 50.0), st.floats(0.0, 1e4),
       st.integers(0, 2**31 - 1))
def test_entropy_decomposition_invariants(classes, rows, logit_scale, variance_scale, seed):
    rng = np.random.default_rng(seed)
    mean = logit_scale * rng.standard_normal((rows, classes))
    variance = variance_scale * rng.random((rows, 1))
    draws = antithetic_normal_draws(32, classes, seed=0)
    probs, total, expected, mutual = summarise_gaussian_logits(mean, variance, draws,
                                                               math.pi / 8, 1.0)
    for values in (probs, total, expected, mutual):
        assert np.isfinite(values).all()
    np.testing.assert_allclose(probs.sum(1), 1.0)
    assert (mutual >= 0).all() and (expected >= -1e-12).all()
    assert (total <= math.log(classes) + 1e-9).all()
    np.testing.assert_allclose(total - expected, mutual, atol=1e-9)


@pytest.mark.parametrize('temperature', [1.0, 1.7])
def test_entropy_decomposition_is_the_gp_posterior_whatever_the_probit_factor(temperature):
    # lambda shapes the probabilities only; the entropies are of f ~ N(mu, sigma^2), and
    # for small sigma the mutual information is sigma^2 (1 - sum p^2) / (2 T^2).
    rng = np.random.default_rng(5)
    mean, variance = 4 * rng.standard_normal((7, 5)), 1e-4 * (1 + rng.random((7, 1)))
    draws = antithetic_normal_draws(32, 5, seed=0)
    outputs = [summarise_gaussian_logits(mean, variance, draws, lam, temperature)
               for lam in (0.0, math.pi / 8, 3.0)]
    for other in outputs[1:]:
        for a, b in zip(outputs[0][1:], other[1:], strict=True):
            np.testing.assert_array_equal(a, b)
    assert not np.allclose(outputs[0][0], outputs[2][0])
    mutual = outputs[0][3]
    p = np.exp(mean / temperature)
    p /= p.sum(1, keepdims=True)
    second_order = variance[:, 0] * (1 - (p * p).sum(1)) / (2 * temperature ** 2)
    assert (mutual > 0).all()
    # Whitened draws make the estimate exact to second order (rescaled ones: 30 % off).
    np.testing.assert_allclose(mutual, second_order, rtol=1e-2)


def test_draws_have_zero_mean_and_matched_second_moments():
    whitened = antithetic_normal_draws(32, 6, seed=3)
    np.testing.assert_allclose(whitened.mean(0), 0.0, atol=1e-15)
    np.testing.assert_allclose(whitened.T @ whitened / 32, np.eye(6), atol=1e-12)
    rescaled = antithetic_normal_draws(8, 6, seed=3)  # fewer pairs than dimensions
    np.testing.assert_allclose(rescaled.mean(0), 0.0, atol=1e-15)
    np.testing.assert_allclose((rescaled * rescaled).mean(0), 1.0)


def test_flipped_bit_in_saved_state_is_detected(tmp_path):
    rng = np.random.default_rng(3)
    features = rng.normal(size=(200, 8))
    weight, bias = rng.normal(size=(3, 8)), rng.normal(size=3)
    gp = LastLayerNTKGP(weight, bias, model_id='m').fit(features, rng.integers(0, 3, 200))
    path = tmp_path / 'gp.npz'
    gp.save(path)
    with np.load(path) as archive:
        arrays = {k: np.array(archive[k]) for k in archive.files}
    arrays['gram'][0, 1, 1] = np.nextafter(arrays['gram'][0, 1, 1], np.inf)
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match='checksum mismatch'):
        LastLayerNTKGP.load(path)


def test_huge_features_are_rejected_instead_of_infinite_variance():
    rng = np.random.default_rng(4)
    gp = LastLayerNTKGP(rng.normal(size=(3, 4)), rng.normal(size=3)).fit(
        rng.normal(size=(50, 4)), rng.integers(0, 3, 50))
    with pytest.raises(ValueError, match='overflow'):
        gp.predict(np.full((1, 4), 1e200))
