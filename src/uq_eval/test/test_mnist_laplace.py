"""The laplace-torch peer baseline of `uq bench mnist` on a tiny problem."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from uq_eval.mnist.cnn import SmallCNN, TrainConfig, to_tensor, train
from uq_eval.mnist.laplace import (
    LaplaceVariant,
    fit_laplace,
    laplace_probabilities,
    laplace_version,
    prior_precision,
    restore_laplace,
)

pytestmark = pytest.mark.skipif(
    laplace_version() is None,
    reason='laplace-torch is not installed (optional; `make laplace` installs it)')


def _problem() -> tuple[SmallCNN, torch.Tensor, torch.Tensor]:
    """A square whose position is the class, learnt by a briefly trained network."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 400)
    images = rng.integers(0, 40, (400, 28, 28)).astype(np.uint8)
    for i, label in enumerate(labels):
        r, c = divmod(int(label), 5)
        images[i, 4 + 10 * r:12 + 10 * r, 1 + 5 * c:6 + 5 * c] = 250
    x = to_tensor(images, 0.1, 0.3)
    y = torch.from_numpy(labels.astype(np.int64))
    torch.manual_seed(0)
    model = SmallCNN()
    train(model, x[:300], y[:300], TrainConfig(epochs=2, batch_size=32), seed=0, progress=False)
    return model.eval(), x, y


@pytest.fixture
def one_thread() -> object:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_last_layer_laplace_fits_predicts_and_restores(one_thread: object) -> None:
    model, x, y = _problem()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    variant = LaplaceVariant('last_layer', grid_size=5)
    la = fit_laplace(model, variant, x[:300], y[:300], x[300:], y[300:], batch_size=64)
    # The benchmark's network is left as it was (the library works on a copy).
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    # The grid search picks one of its log-spaced points.
    assert np.isclose(np.logspace(-4, 4, 5), prior_precision(la), rtol=1e-5).sum() == 1

    probs = laplace_probabilities(la, x[300:])
    assert probs.shape == (100, 10) and np.isfinite(probs).all()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert (probs.argmax(axis=1) == y[300:].numpy()).mean() > 0.5

    # The timing worker rebuilds the approximation from its state: same predictions.
    restored = restore_laplace(model, variant, la.state_dict())
    np.testing.assert_allclose(laplace_probabilities(restored, x[300:]), probs, atol=1e-6)

    # A weak prior (wide posterior) makes the GLM probit predictive less confident than the
    # network's softmax: its mean entropy is higher.
    weak = fit_laplace(model, LaplaceVariant('last_layer', log_prior_precision_range=(-2, -2),
                                             grid_size=1), x[:300], y[:300], x[300:], y[300:])
    assert prior_precision(weak) == pytest.approx(1e-2)
    with torch.no_grad():
        softmax = torch.softmax(model(x[300:]), dim=1).numpy()

    def entropy(p: np.ndarray) -> float:
        return float(-(p * np.log(np.clip(p, 1e-12, 1.0))).sum(axis=1).mean())

    assert entropy(laplace_probabilities(weak, x[300:])) > entropy(softmax) + 0.05
