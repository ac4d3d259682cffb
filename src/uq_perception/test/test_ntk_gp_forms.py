"""The two exact NTK-GP forms agree with each other and with a brute-force GP (float64)."""

import logging
import math

import numpy as np
import pytest
import torch
from torch import nn

from uq_perception.ntk import (
    FunctionSpaceNTKGP,
    Gating,
    LastLayerNTKGP,
    NTKGPConfig,
    ParameterSubset,
    centred_basis,
    log_marginal_likelihood,
)

D, C, N = 5, 3, 48


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))


@pytest.fixture(scope='module')
def problem():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, D), nn.Tanh(), nn.Linear(D, C)).double().eval()
    with torch.no_grad():
        model[2].weight.mul_(4.0)
    inputs = torch.randn(N, 4, dtype=torch.float64)
    queries = torch.cat([torch.randn(5, 4, dtype=torch.float64),
                         3.0 * torch.randn(3, 4, dtype=torch.float64)])
    with torch.no_grad():
        feats = model[1](model[0](inputs)).numpy()
        query_feats = model[1](model[0](queries)).numpy()
        logits = model(inputs).numpy()
    rng = np.random.default_rng(1)
    labels = np.argmax(logits + 0.7 * rng.standard_normal(logits.shape), axis=1)
    head = (model[2].weight.detach().numpy(), model[2].bias.detach().numpy())
    return model, inputs, queries, feats, query_feats, labels, head


def _brute_force_variance(feats, query_feats, sigma2, delta):
    """k** - k*^T (K + sigma^2 I)^{-1} k* with k = (phi^T phi' + 1) / delta, dense solve."""
    kernel = (feats @ feats.T + 1.0) / delta
    cross = (feats @ query_feats.T + 1.0) / delta
    prior = ((query_feats * query_feats).sum(1) + 1.0) / delta
    solved = np.linalg.solve(kernel + sigma2 * np.eye(len(feats)), cross)
    return prior - (cross * solved).sum(0)


@pytest.mark.parametrize('config', [NTKGPConfig(), NTKGPConfig(num_experts=2),
                                    NTKGPConfig(num_experts=2, shared_noise=False),
                                    NTKGPConfig(gating=Gating.CLASS)],
                         ids=['m1', 'kmeans2', 'kmeans2-own-noise', 'class'])
def test_weight_and_function_space_agree_with_brute_force(problem, config):
    model, inputs, queries, feats, query_feats, labels, head = problem
    weight_space = LastLayerNTKGP(*head, config).fit(feats, labels)
    function_space = FunctionSpaceNTKGP(model, config=config).fit(inputs, labels)
    # Hyperparameters come from the same evidence, maximised separately by each form.
    np.testing.assert_allclose(function_space.sigma2, weight_space.sigma2, rtol=1e-6)
    np.testing.assert_allclose(function_space.delta, weight_space.delta, rtol=1e-6)
    ws = weight_space.predict(query_feats)
    fs = function_space.predict(queries)
    np.testing.assert_array_equal(fs.expert_id, ws.expert_id)
    assert _relative(fs.gp_variance, ws.gp_variance) < 1e-6
    assert _relative(fs.class_variance, ws.class_variance) < 1e-6
    _, cov, _ = function_space.predict_covariance(queries)
    off_diagonal = cov - np.einsum('bc,cd->bcd', np.diagonal(cov, axis1=1, axis2=2), np.eye(C))
    assert np.abs(off_diagonal).max() < 1e-9 * ws.gp_variance.max()
    np.testing.assert_allclose(fs.mutual_information, ws.mutual_information, atol=1e-9)
    np.testing.assert_allclose(fs.probabilities, ws.probabilities, atol=1e-9)
    # Brute force per expert, on that expert's training points.
    routed = ws.expert_id
    train_routes = weight_space.predict(feats).expert_id
    for e in np.unique(routed):
        rows = routed == e
        brute = _brute_force_variance(feats[train_routes == e], query_feats[rows],
                                      weight_space.sigma2[e], weight_space.delta[e])
        assert _relative(ws.gp_variance[rows], brute) < 1e-6


def test_function_space_over_all_parameters_matches_brute_force(problem):
    model, inputs, queries, _, _, labels, _ = problem
    sigma2, delta = 0.3, 2.0
    gp = FunctionSpaceNTKGP(model, ParameterSubset.ALL).fit(
        inputs[:20], labels[:20], hyperparameters=(sigma2, delta))
    _, cov, _ = gp.predict_covariance(queries)
    params = tuple(p.detach().clone() for p in model.parameters())

    def jac_of(x):
        def out(*ps):
            state = dict(zip([n for n, _ in model.named_parameters()], ps, strict=True))
            return torch.func.functional_call(model, state, (x[None],))[0]
        parts = torch.autograd.functional.jacobian(out, params)
        return torch.cat([p.reshape(C, -1) for p in parts], dim=1).numpy()

    train = np.concatenate([jac_of(x) for x in inputs[:20]])
    kernel = train @ train.T / delta + sigma2 * np.eye(len(train))
    for b, x in enumerate(queries):
        jq = jac_of(x)
        cross = jq @ train.T / delta
        brute = jq @ jq.T / delta - cross @ np.linalg.solve(kernel, cross.T)
        assert np.abs(cov[b] - brute).max() < 1e-6 * np.abs(brute).max()
    # Hidden-layer parameters couple the classes.
    assert np.abs(cov[:, 0, 1]).max() > 1e-6 * np.abs(cov[:, 0, 0]).max()


def test_closed_form_evidence_matches_dense_gaussian_and_is_maximised(problem):
    _, _, _, feats, _, labels, head = problem
    gp = LastLayerNTKGP(*head).fit(feats, labels)
    sigma2, delta = float(gp.sigma2[0]), float(gp.delta[0])
    phi = np.hstack([feats, np.ones((N, 1))])
    q = centred_basis(C)
    targets = (np.eye(C)[labels] - 1.0 / C) @ q
    cov = phi @ phi.T / delta + sigma2 * np.eye(N)
    _, logdet = np.linalg.slogdet(cov)
    dense = sum(-0.5 * (t @ np.linalg.solve(cov, t) + logdet + N * math.log(2 * math.pi))
                for t in targets.T)
    assert gp.log_marginal_likelihood() == pytest.approx(dense, rel=1e-9)
    best = gp.log_marginal_likelihood()
    for fs in (0.9, 1.1):
        assert gp.log_marginal_likelihood(sigma2=sigma2 * fs) < best
        assert gp.log_marginal_likelihood(delta=delta * fs) < best
    # Stationary: central differences of the evidence in log-space vanish.
    step = 1e-4
    for kw, value in (('sigma2', sigma2), ('delta', delta)):
        up = gp.log_marginal_likelihood(**{kw: value * math.exp(step)})
        down = gp.log_marginal_likelihood(**{kw: value * math.exp(-step)})
        assert abs(up - down) / (2 * step) < 1e-4 * abs(best)
    assert log_marginal_likelihood([], sigma2, delta) == 0.0


def test_shared_noise_maximises_the_summed_expert_evidence(problem):
    _, _, _, feats, _, labels, head = problem
    gp = LastLayerNTKGP(*head, NTKGPConfig(num_experts=2, kmeans_samples=N)).fit(feats, labels)
    assert gp.sigma2[0] == gp.sigma2[1] and gp.delta[0] != gp.delta[1]

    def total(scale_sigma2=1.0, scale_delta=(1.0, 1.0)):
        return sum(gp.log_marginal_likelihood(e, sigma2=gp.sigma2[e] * scale_sigma2,
                                              delta=gp.delta[e] * scale_delta[e])
                   for e in range(2))

    best = total()
    for f in (0.95, 1.05):
        assert total(scale_sigma2=f) < best
        assert total(scale_delta=(f, 1.0)) < best
        assert total(scale_delta=(1.0, f)) < best
    own = LastLayerNTKGP(*head, NTKGPConfig(num_experts=2, shared_noise=False)).fit(feats, labels)
    for e in range(2):
        assert own.log_marginal_likelihood(e) >= gp.log_marginal_likelihood(e) - 1e-9


def test_function_space_caps_experts_and_validates(problem, caplog):
    model, inputs, queries, _, _, labels, _ = problem
    with caplog.at_level(logging.WARNING, logger='uq_perception.ntk'):
        gp = FunctionSpaceNTKGP(model, max_system_size=10 * C).fit(inputs, labels)
    assert 'capped to 10' in caplog.text
    assert gp._experts[0]['jac'].shape == (10, C, C * (D + 1))
    threshold = gp.calibrate_ood(inputs)
    assert gp.predict(inputs).out_of_distribution.mean() <= 0.1
    assert threshold == gp.ood_threshold > 0
    with pytest.raises(ValueError, match='unknown or empty parameter names'):
        FunctionSpaceNTKGP(model, ['0.weight', 'nope'])
    with pytest.raises(ValueError, match='not fitted'):
        FunctionSpaceNTKGP(model).predict(queries)
    model.train()
    try:
        with pytest.raises(ValueError, match='eval mode'):
            FunctionSpaceNTKGP(model)
    finally:
        model.eval()


def _exact_variance(feats: np.ndarray, query_feats: np.ndarray, sigma2: float,
                    delta: float) -> np.ndarray:
    """k** - k*^T (K + sigma^2 I)^{-1} k* in 50-digit arithmetic (mpmath)."""
    import mpmath

    mpmath.mp.dps = 50
    n = len(feats)
    f = mpmath.matrix(feats.tolist())
    q = mpmath.matrix(query_feats.tolist())
    d, s2 = mpmath.mpf(delta), mpmath.mpf(sigma2)
    kernel = (f * f.T + mpmath.ones(n, n)) / d + s2 * mpmath.eye(n)
    out = []
    # One LU factorisation for every query, with lu_solve's 10 guard bits: lu_solve itself
    # factorises a copy of the kernel on each call (its cache stays on the copy), which made
    # eight 50-digit factorisations of the 80x80 system most of this test's time.
    with mpmath.mp.extraprec(10):
        lu, pivots = mpmath.mp.LU_decomp(kernel)
        for i in range(q.rows):
            row = q[i, :]
            cross = (f * row.T + mpmath.ones(n, 1)) / d
            prior = ((row * row.T)[0] + 1) / d
            solved = mpmath.mp.U_solve(lu, mpmath.mp.L_solve(lu, cross, pivots))
            out.append(float(prior - (cross.T * solved)[0]))
    return np.array(out)


@pytest.mark.parametrize(('sigma2', 'delta'), [(1e-3, 1e-3), (0.5, 2.0)],
                         ids=['ill-conditioned', 'well-conditioned'])
def test_both_forms_match_high_precision_arithmetic(sigma2, delta):
    # 80 training points of a small ReLU MLP with 24-dimensional features: at
    # sigma^2 = delta = 1e-3 the function-space system has a condition number near 1e8.
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, 24), nn.ReLU(), nn.Linear(24, C)).double().eval()
    inputs = torch.randn(80, 6, dtype=torch.float64)
    queries = torch.cat([torch.randn(6, 6, dtype=torch.float64),
                         4.0 * torch.randn(2, 6, dtype=torch.float64)])
    with torch.no_grad():
        feats = model[1](model[0](inputs)).numpy()
        query_feats = model[1](model[0](queries)).numpy()
        labels = model(inputs).argmax(1).numpy()
    head = (model[2].weight.detach().numpy(), model[2].bias.detach().numpy())
    system = (feats @ feats.T + 1.0) / delta + sigma2 * np.eye(len(feats))
    if sigma2 < 1e-2:
        assert np.linalg.cond(system) > 1e7
    exact = _exact_variance(feats, query_feats, sigma2, delta)

    function_space = FunctionSpaceNTKGP(model).fit(inputs, labels,
                                                   hyperparameters=(sigma2, delta))
    weight_space = LastLayerNTKGP(*head)
    weight_space.fit(feats, labels)
    weight_space.set_hyperparameters(sigma2, delta)
    assert _relative(function_space.predict(queries).gp_variance, exact) < 1e-6
    assert _relative(weight_space.predict(query_feats).gp_variance, exact) < 1e-9
