"""Peer baselines of ``uq bench mnist`` from laplace-torch, the library users would pick instead.

laplace-torch is optional (``make laplace`` installs the pinned versions of
``requirements/laplace.txt``); :func:`laplace_version` says whether it can be used, and the
benchmark skips these rows, saying so, when it cannot. Only the library's own API is used:

- ``Laplace(model, 'classification', subset_of_weights=..., hessian_structure='kron')`` around
  a copy of the trained network, ``fit`` on the training images;
- the prior precision by the library's grid search of the validation NLL of the same GLM
  predictive (``optimize_prior_precision(method='gridsearch', val_loader=...)``), on the
  validation split every other method is fitted on;
- predictions ``la(x, pred_type='glm', link_approx='probit')``.

The fitted approximation travels to the timing worker as the library's ``state_dict`` and
is rebuilt there around the same network (:func:`restore_laplace`).
"""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

__all__ = [
    'LAPLACE_INSTALL_HINT',
    'LaplaceVariant',
    'fit_laplace',
    'laplace_probabilities',
    'laplace_version',
    'prior_precision',
    'restore_laplace',
]

LAPLACE_INSTALL_HINT = 'install it with `make laplace` (pinned in requirements/laplace.txt)'


def laplace_version() -> str | None:
    """The installed laplace-torch version, or None when ``laplace`` cannot be imported."""
    if importlib.util.find_spec('laplace') is None:
        return None
    try:
        return importlib.metadata.version('laplace-torch')
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class LaplaceVariant:
    """Which weights the Laplace approximation covers and how its prior is searched.

    Attributes
    ----------
    subset_of_weights : str
        ``'last_layer'`` (the linear head) or ``'all'`` (every weight of the network).
    hessian_structure : str
        Structure of the generalised Gauss-Newton curvature (``'kron'``: Kronecker-factored
        per layer, the library's default).
    log_prior_precision_range : tuple of float
        Decimal exponents bounding the grid of prior precisions.
    grid_size : int
        Prior precisions tried, log-spaced over the range.
    """

    subset_of_weights: str
    hessian_structure: str = 'kron'
    log_prior_precision_range: tuple[float, float] = (-4.0, 4.0)
    grid_size: int = 21


def _loader(x: torch.Tensor, y: torch.Tensor, batch_size: int) -> DataLoader[Any]:
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


def _new_laplace(model: nn.Module, variant: LaplaceVariant) -> Any:
    from laplace import Laplace

    # A copy in eval mode: dropout off, and the library's hooks and buffers stay off the
    # network the other methods use.
    return Laplace(copy.deepcopy(model).eval(), 'classification',
                   subset_of_weights=variant.subset_of_weights,
                   hessian_structure=variant.hessian_structure)


def fit_laplace(model: nn.Module, variant: LaplaceVariant, x_train: torch.Tensor,
                y_train: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor,
                batch_size: int = 256) -> Any:
    """Fit a laplace-torch approximation and its prior precision.

    Parameters
    ----------
    model : nn.Module
        The trained network (not modified).
    variant : LaplaceVariant
        Weights covered, curvature structure and prior grid.
    x_train, y_train : Tensor
        Training images ``(N, 1, 28, 28)`` and labels ``(N,)`` for the curvature.
    x_val, y_val : Tensor
        Validation images and labels for the prior precision (lowest validation NLL of the
        GLM predictive with the probit link).
    batch_size : int
        Mini-batch size of the library's passes.

    Returns
    -------
    laplace.BaseLaplace
        The fitted approximation.
    """
    la = _new_laplace(model, variant)
    la.fit(_loader(x_train, y_train, batch_size))
    low, high = variant.log_prior_precision_range
    with warnings.catch_warnings():
        # The library warns on every call that the link defaults to probit; it is set here.
        warnings.filterwarnings('ignore', message='By default `link_approx` is `probit`')
        la.optimize_prior_precision(
            pred_type='glm', method='gridsearch', link_approx='probit',
            val_loader=_loader(x_val, y_val, batch_size), log_prior_prec_min=low,
            log_prior_prec_max=high, grid_size=variant.grid_size)
    return la


def restore_laplace(model: nn.Module, variant: LaplaceVariant, state: dict[str, Any]) -> Any:
    """Rebuild a fitted approximation from its ``state_dict`` around the same network."""
    la = _new_laplace(model, variant)
    la.load_state_dict(state)
    return la


def laplace_probabilities(la: Any, x: torch.Tensor) -> NDArray[np.float64]:
    """Class probabilities of the GLM predictive with the probit link, shape ``(B, C)``."""
    return la(x, pred_type='glm', link_approx='probit').detach().numpy().astype(np.float64)


def prior_precision(la: Any) -> float:
    """The fitted scalar prior precision."""
    return float(torch.as_tensor(la.prior_precision).reshape(-1)[0])
