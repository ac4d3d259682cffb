"""The NTK-GP engine (ROS-free): sampling-free predictive uncertainty for a network's head.

The public API lives here; the modules split it by concern:

- :mod:`.config`: configuration, constants, the per-input :class:`UncertaintyOutput`;
- :mod:`.evidence`: the closed-form marginal likelihood and its maximisation;
- :mod:`.linalg`: guarded SPD inverses and input checks;
- :mod:`.gating`: k-means partition of feature space into experts;
- :mod:`.scale_gating`: one expert, OOD threshold and score reference per scale;
- :mod:`.predictive`: probit probabilities, entropy decomposition, torch query;
- :mod:`.calibrated_score`: the model-independent score of a GP variance and the signals
  it may rank;
- :mod:`.calibration`: OOD threshold, score reference, probit factor and temperature fitted
  on validation data;
- :mod:`.model`: :class:`LastLayerNTKGP`, the weight-space form (the fast path): fit, query
  and online update;
- :mod:`.function_space`: :class:`FunctionSpaceNTKGP`, the Jacobian (function-space) form
  (imported on first use: it needs torch);
- :mod:`.feature_map`: norm-aware feature maps, chosen by the evidence;
- :mod:`.layer_kernel`: the NTK of a layer before the last, its exact Jacobian features
  and their sketch for the weight-space form;
- :mod:`.persistence`: checksummed, atomic state files; saving and loading a GP.
"""

from uq_perception.ntk.calibrated_score import NO_CALIBRATED_SCORE, ScoreReference
from uq_perception.ntk.config import Gating, NTKGPConfig, UncertaintyOutput
from uq_perception.ntk.evidence import (
    SpectralEvidence,
    fit_expert_hyperparameters,
    fit_marginal_likelihood,
    fit_shared_noise,
    log_marginal_likelihood,
)
from uq_perception.ntk.feature_map import MapCandidate, NormFeatureMap, select_feature_map
from uq_perception.ntk.gating import kmeans
from uq_perception.ntk.linalg import spd_inverse
from uq_perception.ntk.model import LastLayerNTKGP
from uq_perception.ntk.persistence import arrays_digest
from uq_perception.ntk.predictive import (
    antithetic_normal_draws,
    gp_variance_torch,
    summarise_gaussian_logits,
)

__all__ = [
    'FunctionSpaceNTKGP', 'Gating', 'LastLayerNTKGP', 'MapCandidate', 'NO_CALIBRATED_SCORE',
    'NTKGPConfig', 'NormFeatureMap', 'ParameterSubset', 'ScoreReference', 'select_feature_map',
    'SpectralEvidence', 'UncertaintyOutput', 'antithetic_normal_draws', 'arrays_digest',
    'centred_basis', 'fit_expert_hyperparameters', 'fit_marginal_likelihood',
    'fit_shared_noise', 'gp_variance_torch', 'kmeans', 'log_marginal_likelihood',
    'spd_inverse', 'summarise_gaussian_logits',
]

# The function-space form needs torch (its Jacobians) at import; it is loaded on first use,
# so that querying a loaded weight-space GP (the detector's start) imports no torch.
_FUNCTION_SPACE = ('FunctionSpaceNTKGP', 'ParameterSubset', 'centred_basis')


def __getattr__(name: str):
    if name in _FUNCTION_SPACE:
        from uq_perception.ntk import function_space

        return getattr(function_space, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
