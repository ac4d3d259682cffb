"""Parameters of the arbitration node, declared once, and their conversion to the arbiter's
configuration.

ROS-free so the table, the defaults and ``config/arbitration.yaml`` can be checked without a
ROS context; ``arbitration_node.py`` turns each :class:`ParamSpec` into a
``rcl_interfaces/ParameterDescriptor`` and validates every change with
:func:`config_from_values`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uq_autonomy.arbiter import (
    NUM_LEVELS,
    ArbiterConfig,
    DrivingDetection,
    Thresholds,
    UncertaintySignal,
)

NODE_NAME = 'arbitration_node'

ParamValue = bool | int | float | str | list[float]


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: name, default (which also fixes its type), description and limits.

    ``minimum``/``maximum`` bound a scalar (inclusive) or every element of a float list.
    ``read_only`` parameters are fixed at start-up (they size timers).
    """

    name: str
    default: ParamValue
    description: str
    minimum: float | None = None
    maximum: float | None = None
    read_only: bool = False
    constraints: str = ''


_DEFAULT = ArbiterConfig()
_LEVELS = f'{NUM_LEVELS - 1} values, index i for the step between level i and i+1'

PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec('uncertainty_signal', _DEFAULT.uncertainty_signal.value,
              'Epistemic uncertainty of a detection that drives the level.',
              constraints=' | '.join(m.value for m in UncertaintySignal)),
    ParamSpec('driving_detection', _DEFAULT.driving_detection.value,
              'Which detection of a frame drives the decision.',
              constraints=' | '.join(m.value for m in DrivingDetection)),
    ParamSpec('target_class', _DEFAULT.target_class,
              "Class name followed when driving_detection is 'target_class'."),
    ParamSpec('target_track_id', _DEFAULT.target_track_id,
              "Track id followed when driving_detection is 'track_id'.",
              minimum=-1, maximum=2**31 - 1),
    ParamSpec('image_width', _DEFAULT.image_width,
              "Image width in pixels, for driving_detection 'nearest_center'.",
              minimum=1, maximum=100000),
    ParamSpec('image_height', _DEFAULT.image_height,
              "Image height in pixels, for driving_detection 'nearest_center'.",
              minimum=1, maximum=100000),
    ParamSpec('thresholds.gp_variance.up', list(_DEFAULT.gp_variance_thresholds.up),
              'GP variance (logit^2) below which a step up from level i is allowed.',
              minimum=0.0, constraints=f'{_LEVELS}; strictly decreasing; < down'),
    ParamSpec('thresholds.gp_variance.down', list(_DEFAULT.gp_variance_thresholds.down),
              'GP variance (logit^2) above which level i+1 steps down to i.',
              minimum=0.0, constraints=f'{_LEVELS}; strictly decreasing; > up'),
    ParamSpec('thresholds.mutual_information.up',
              list(_DEFAULT.mutual_information_thresholds.up),
              'Mutual information (nats) below which a step up from level i is allowed.',
              minimum=0.0, constraints=f'{_LEVELS}; strictly decreasing; < down'),
    ParamSpec('thresholds.mutual_information.down',
              list(_DEFAULT.mutual_information_thresholds.down),
              'Mutual information (nats) above which level i+1 steps down to i.',
              minimum=0.0, constraints=f'{_LEVELS}; strictly decreasing; > up'),
    ParamSpec('min_dwell_s', _DEFAULT.min_dwell_s,
              'Seconds the step-up condition must hold, and minimum time between a level '
              'change and the next step up.', minimum=0.0, maximum=600.0),
    ParamSpec('perception_deadline_s', _DEFAULT.perception_deadline_s,
              'Longest gap between valid DetectionArray messages before falling back to '
              'teleoperation.', minimum=0.001, maximum=60.0,
              constraints='>= decision_period_s'),
    ParamSpec('operator_timeout_s', _DEFAULT.operator_timeout_s,
              'Age after which the operator command counts as zero.',
              minimum=0.001, maximum=60.0),
    ParamSpec('autonomy_timeout_s', _DEFAULT.autonomy_timeout_s,
              'Age after which the autonomy command counts as zero.',
              minimum=0.001, maximum=60.0),
    ParamSpec('operator_deadband', _DEFAULT.operator_deadband,
              'At assistance, an operator command with any component above this magnitude '
              '(m/s or rad/s) overrides the autonomy.', minimum=0.0, maximum=100.0),
    ParamSpec('blend_alpha_min', _DEFAULT.blend_alpha_min,
              'Autonomy weight at the shared level when confidence is lowest.',
              minimum=0.0, maximum=1.0, constraints='<= blend_alpha_max'),
    ParamSpec('blend_alpha_max', _DEFAULT.blend_alpha_max,
              'Autonomy weight at the shared level when confidence is highest.',
              minimum=0.0, maximum=1.0, constraints='>= blend_alpha_min'),
    ParamSpec('decision_period_s', 0.05,
              'Period of the decision timer: fail-safe checks, override expiry and cmd_vel '
              'publication.', minimum=0.001, maximum=1.0, read_only=True),
    ParamSpec('state_publish_period_s', 0.5,
              'Period of the AutonomyState heartbeat (it is also published on every change).',
              minimum=0.01, maximum=60.0, read_only=True),
    ParamSpec('diagnostics_period_s', 1.0,
              'Period of the /diagnostics status.', minimum=0.1, maximum=60.0,
              read_only=True),
)

SPECS: dict[str, ParamSpec] = {spec.name: spec for spec in PARAMETERS}


def _check_type(spec: ParamSpec, value: Any) -> None:
    default = spec.default
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, float)
    elif isinstance(default, str):
        ok = isinstance(value, str)
    else:
        ok = isinstance(value, list | tuple) and all(isinstance(v, float) for v in value)
    if not ok:
        kind = 'list of floats' if isinstance(default, list) else type(default).__name__
        raise ValueError(f'{spec.name} must be a {kind}, got {value!r}')


def _check_range(spec: ParamSpec, value: Any) -> None:
    values = list(value) if isinstance(value, list | tuple) else [value]
    for v in values:
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f'{spec.name} must be finite, got {value!r}')
        if spec.minimum is not None and v < spec.minimum:
            raise ValueError(f'{spec.name} must be >= {spec.minimum:g}, got {value!r}')
        if spec.maximum is not None and v > spec.maximum:
            raise ValueError(f'{spec.name} must be <= {spec.maximum:g}, got {value!r}')


def default_values() -> dict[str, ParamValue]:
    """Name to default value of every parameter."""
    return {spec.name: spec.default for spec in PARAMETERS}


def config_from_values(values: Mapping[str, Any]) -> ArbiterConfig:
    """Validate a complete set of parameter values and build the arbiter configuration.

    Parameters
    ----------
    values : mapping
        Name to value for every parameter of :data:`PARAMETERS` (unknown names are errors).

    Returns
    -------
    ArbiterConfig

    Raises
    ------
    ValueError
        With a message naming the first offending parameter: wrong type, out of range,
        unordered thresholds, empty hysteresis band, a deadline shorter than the decision
        period, ...
    """
    unknown = sorted(set(values) - set(SPECS))
    if unknown:
        raise ValueError(f'unknown parameters: {", ".join(unknown)}')
    missing = sorted(set(SPECS) - set(values))
    if missing:
        raise ValueError(f'missing parameters: {", ".join(missing)}')
    for name, value in values.items():
        _check_type(SPECS[name], value)
        _check_range(SPECS[name], value)
    if values['perception_deadline_s'] < values['decision_period_s']:
        raise ValueError(
            'perception_deadline_s must be >= decision_period_s (the fail-safe is checked '
            f'once per period), got {values["perception_deadline_s"]:g} < '
            f'{values["decision_period_s"]:g}')

    def thresholds(signal: str) -> Thresholds:
        try:
            return Thresholds(up=tuple(values[f'thresholds.{signal}.up']),
                              down=tuple(values[f'thresholds.{signal}.down']))
        except ValueError as err:
            raise ValueError(f'thresholds.{signal}: {err}') from None

    return ArbiterConfig(
        uncertainty_signal=values['uncertainty_signal'],
        gp_variance_thresholds=thresholds('gp_variance'),
        mutual_information_thresholds=thresholds('mutual_information'),
        driving_detection=values['driving_detection'],
        target_class=values['target_class'],
        target_track_id=values['target_track_id'],
        image_width=values['image_width'],
        image_height=values['image_height'],
        min_dwell_s=values['min_dwell_s'],
        perception_deadline_s=values['perception_deadline_s'],
        operator_timeout_s=values['operator_timeout_s'],
        autonomy_timeout_s=values['autonomy_timeout_s'],
        operator_deadband=values['operator_deadband'],
        blend_alpha_min=values['blend_alpha_min'],
        blend_alpha_max=values['blend_alpha_max'],
    )


def _flatten(tree: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f'{prefix}{key}'
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f'{name}.'))
        else:
            flat[name] = value
    return flat


def load_parameters_file(path: str | Path, node_name: str = NODE_NAME) -> dict[str, Any]:
    """Read the ``node_name: ros__parameters:`` section of a ROS 2 parameters YAML file,
    flattened to dotted names (as rcl reads it).

    Raises
    ------
    ValueError
        When the file has no such section.
    """
    import yaml

    with open(path, encoding='utf-8') as stream:
        document = yaml.safe_load(stream) or {}
    for key in (node_name, f'/{node_name}', '/**'):
        section = document.get(key)
        if isinstance(section, Mapping) and 'ros__parameters' in section:
            return _flatten(section['ros__parameters'])
    raise ValueError(f'{path}: no "{node_name}: ros__parameters:" section')
