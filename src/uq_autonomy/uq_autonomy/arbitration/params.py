"""Parameters of the arbitration node, declared once, and their conversion to the arbiter's
configuration.

ROS-free so the table, the defaults and ``config/arbitration.yaml`` can be checked without a
ROS context; ``arbitration_node.py`` declares them through :mod:`uq_common.parameters` and
validates every change with :func:`config_from_values` (per-value checks plus the rules
across parameters).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from uq_autonomy.arbitration.config import (
    NUM_LEVELS,
    ArbiterConfig,
    DrivingDetection,
    SuspectConfig,
    Thresholds,
    UncertaintySignal,
)
from uq_common.parameters import ParameterSpec, ParameterValue, validate_value

NODE_NAME = 'arbitration_node'

_DEFAULT = ArbiterConfig()
_LEVELS = f'{NUM_LEVELS - 1} values, index i for the step between level i and i+1'

PARAMETERS: tuple[ParameterSpec, ...] = (
    ParameterSpec('uncertainty_signal', _DEFAULT.uncertainty_signal.value,
                  'Epistemic uncertainty of a detection that drives the level.',
                  choices=[m.value for m in UncertaintySignal]),
    ParameterSpec('driving_detection', _DEFAULT.driving_detection.value,
                  'Which detection of a frame drives the decision (autonomy_target: the track '
                  'announced on autonomy/target_track_id).',
                  choices=[m.value for m in DrivingDetection]),
    ParameterSpec('target_class', _DEFAULT.target_class,
                  "Class name followed when driving_detection is 'target_class'; also the only "
                  'class whose label lifts the suspect cap (any label when empty).'),
    ParameterSpec('target_track_id', _DEFAULT.target_track_id,
                  "Track id followed when driving_detection is 'track_id'.",
                  min_value=-1, max_value=2**31 - 1),
    ParameterSpec('image_width', _DEFAULT.image_width,
                  "Image width in pixels, for driving_detection 'nearest_center'.",
                  min_value=1, max_value=100000),
    ParameterSpec('image_height', _DEFAULT.image_height,
                  "Image height in pixels, for driving_detection 'nearest_center'.",
                  min_value=1, max_value=100000),
    ParameterSpec('thresholds.calibrated_score.up',
                  list(_DEFAULT.calibrated_score_thresholds.up),
                  'Calibrated score (fraction of known validation objects less uncertain) '
                  'below which a step up from level i is allowed.', min_value=0.0,
                  max_value=1.0, constraints=f'{_LEVELS}; strictly decreasing; < down; > 0'),
    ParameterSpec('thresholds.calibrated_score.down',
                  list(_DEFAULT.calibrated_score_thresholds.down),
                  'Calibrated score above which level i+1 steps down to i.', min_value=0.0,
                  max_value=1.0, constraints=f'{_LEVELS}; strictly decreasing; > up; < 1'),
    ParameterSpec('thresholds.gp_variance.up', list(_DEFAULT.gp_variance_thresholds.up),
                  'GP variance (logit^2, one model\'s unit) below which a step up from level '
                  'i is allowed.', min_value=0.0,
                  constraints=f'{_LEVELS}; strictly decreasing; < down'),
    ParameterSpec('thresholds.gp_variance.down', list(_DEFAULT.gp_variance_thresholds.down),
                  'GP variance (logit^2, one model\'s unit) above which level i+1 steps down '
                  'to i; refused at run time when far above the loaded model\'s range.',
                  min_value=0.0, constraints=f'{_LEVELS}; strictly decreasing; > up'),
    ParameterSpec('thresholds.mutual_information.up',
                  list(_DEFAULT.mutual_information_thresholds.up),
                  'Mutual information (nats) below which a step up from level i is allowed.',
                  min_value=0.0, constraints=f'{_LEVELS}; strictly decreasing; < down'),
    ParameterSpec('thresholds.mutual_information.down',
                  list(_DEFAULT.mutual_information_thresholds.down),
                  'Mutual information (nats) above which level i+1 steps down to i.',
                  min_value=0.0, constraints=f'{_LEVELS}; strictly decreasing; > up'),
    ParameterSpec('min_dwell_s', _DEFAULT.min_dwell_s,
                  'Seconds the step-up condition must hold, and minimum time between a level '
                  'change and the next step up.', min_value=0.0, max_value=600.0),
    ParameterSpec('perception_deadline_s', _DEFAULT.perception_deadline_s,
                  'Longest gap between valid DetectionArray messages before falling back to '
                  'teleoperation.', min_value=0.001, max_value=60.0,
                  constraints='>= decision_period_s'),
    ParameterSpec('resume_window_s', _DEFAULT.resume_window_s,
                  'After a perception outage this short (from the last usable frame), the '
                  'level held before it is restored once the returning frames of the same '
                  'model confirm it; 0: the climb always starts again from teleoperation.',
                  min_value=0.0, max_value=600.0),
    ParameterSpec('resume_confirm_s', _DEFAULT.resume_confirm_s,
                  'How long the returning perception must stay below the up threshold of the '
                  'level held before the outage before that level is restored.',
                  min_value=0.0, max_value=60.0),
    ParameterSpec('operator_timeout_s', _DEFAULT.operator_timeout_s,
                  'Age after which the operator command counts as zero.',
                  min_value=0.001, max_value=60.0),
    ParameterSpec('autonomy_timeout_s', _DEFAULT.autonomy_timeout_s,
                  'Age after which the autonomy command counts as zero.',
                  min_value=0.001, max_value=60.0),
    ParameterSpec('operator_deadband', _DEFAULT.operator_deadband,
                  'At assistance, an operator command with any component above this magnitude '
                  '(m/s or rad/s) overrides the autonomy.', min_value=0.0, max_value=100.0),
    ParameterSpec('blend_alpha_min', _DEFAULT.blend_alpha_min,
                  'Autonomy weight at the shared level when confidence is lowest.',
                  min_value=0.0, max_value=1.0, constraints='<= blend_alpha_max'),
    ParameterSpec('blend_alpha_max', _DEFAULT.blend_alpha_max,
                  'Autonomy weight at the shared level when confidence is highest.',
                  min_value=0.0, max_value=1.0, constraints='>= blend_alpha_min'),
    ParameterSpec('max_detections', _DEFAULT.max_detections,
                  'A DetectionArray with more detections is invalid (counted before it is '
                  'decoded, so the excess costs no work).', min_value=1, max_value=1000000),
    ParameterSpec('max_frame_age_s', _DEFAULT.max_frame_age_s,
                  'A DetectionArray stamped longer ago than this on the node clock (ROS time, '
                  'so /clock under use_sim_time) is invalid.', min_value=0.001,
                  max_value=3600.0),
    ParameterSpec('max_future_stamp_s', _DEFAULT.max_future_stamp_s,
                  'A DetectionArray stamped further ahead of the node clock than this is '
                  'invalid.', min_value=0.001, max_value=3600.0),
    ParameterSpec('max_linear_speed', _DEFAULT.max_linear_speed,
                  'Largest norm of the linear part of any cmd_vel sent (m/s).',
                  min_value=0.001, max_value=100.0),
    ParameterSpec('max_angular_speed', _DEFAULT.max_angular_speed,
                  'Largest norm of the angular part of any cmd_vel sent (rad/s).',
                  min_value=0.001, max_value=100.0),
    ParameterSpec('max_linear_accel', _DEFAULT.max_linear_accel,
                  'Largest rate of change of the linear part of cmd_vel, up and down (m/s^2).',
                  min_value=0.001, max_value=1000.0),
    ParameterSpec('max_angular_accel', _DEFAULT.max_angular_accel,
                  'Largest rate of change of the angular part of cmd_vel, up and down '
                  '(rad/s^2).', min_value=0.001, max_value=1000.0),
    ParameterSpec('suspect.enabled', _DEFAULT.suspect.enabled,
                  'Keep the level at guided while the driving track is suspect: its track '
                  'score (mean calibrated score over its distinct views) reached '
                  'suspect.threshold, and it was neither confirmed familiar nor labelled.'),
    ParameterSpec('suspect.threshold', _DEFAULT.suspect.threshold,
                  'Track score at or above which the driving track becomes suspect; fixed on '
                  'known objects (a high quantile of their track scores, uq eval tracks).',
                  min_value=0.0, max_value=1.0, constraints='in (0, 1)'),
    ParameterSpec('suspect.min_views', _DEFAULT.suspect.min_views,
                  'Distinct views a track needs before its track score can make it suspect.',
                  min_value=1, max_value=10000),
    ParameterSpec('suspect.confirm_frames', _DEFAULT.suspect.confirm_frames,
                  'Frames in a row, each from a view differing by suspect.confirm_view_change, '
                  'with a calibrated score below suspect.threshold that confirm a suspect track '
                  'familiar.', min_value=1, max_value=10000),
    ParameterSpec('suspect.confirm_view_change', _DEFAULT.suspect.confirm_view_change,
                  'Least change between two confirming views: box displacement over its '
                  'diagonal, or |log| of the area ratio, whichever is larger.',
                  min_value=0.0, max_value=100.0),
    ParameterSpec('suspect.hold_on_rival', _DEFAULT.suspect.hold_on_rival,
                  'With target_class set: hold the level at guided while another object also '
                  'passes for the target (a detection of target_class elsewhere in the frame '
                  'whose track read as target_class in at least suspect.min_views frames and '
                  'in most of its frames, not suspect itself), until a person labels the '
                  'driving track as the target.'),
    ParameterSpec('decision_period_s', 0.05,
                  'Period of the decision timer: fail-safe checks, override expiry and cmd_vel '
                  'publication.', min_value=0.001, max_value=1.0, read_only=True),
    ParameterSpec('state_publish_period_s', 0.5,
                  'Period of the AutonomyState heartbeat (it is also published on every change).',
                  min_value=0.01, max_value=60.0, read_only=True),
    ParameterSpec('diagnostics_period_s', 1.0,
                  'Period of the /diagnostics status.', min_value=0.1, max_value=60.0,
                  read_only=True),
)

SPECS: dict[str, ParameterSpec] = {spec.name: spec for spec in PARAMETERS}


def default_values() -> dict[str, ParameterValue]:
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
        error = validate_value(SPECS[name], value)
        if error:
            raise ValueError(error)
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
        calibrated_score_thresholds=thresholds('calibrated_score'),
        gp_variance_thresholds=thresholds('gp_variance'),
        mutual_information_thresholds=thresholds('mutual_information'),
        driving_detection=values['driving_detection'],
        target_class=values['target_class'],
        target_track_id=values['target_track_id'],
        image_width=values['image_width'],
        image_height=values['image_height'],
        min_dwell_s=values['min_dwell_s'],
        perception_deadline_s=values['perception_deadline_s'],
        resume_window_s=values['resume_window_s'],
        resume_confirm_s=values['resume_confirm_s'],
        operator_timeout_s=values['operator_timeout_s'],
        autonomy_timeout_s=values['autonomy_timeout_s'],
        operator_deadband=values['operator_deadband'],
        blend_alpha_min=values['blend_alpha_min'],
        blend_alpha_max=values['blend_alpha_max'],
        max_detections=values['max_detections'],
        max_frame_age_s=values['max_frame_age_s'],
        max_future_stamp_s=values['max_future_stamp_s'],
        max_linear_speed=values['max_linear_speed'],
        max_angular_speed=values['max_angular_speed'],
        max_linear_accel=values['max_linear_accel'],
        max_angular_accel=values['max_angular_accel'],
        suspect=SuspectConfig(
            enabled=values['suspect.enabled'], threshold=values['suspect.threshold'],
            min_views=values['suspect.min_views'],
            confirm_frames=values['suspect.confirm_frames'],
            confirm_view_change=values['suspect.confirm_view_change'],
            hold_on_rival=values['suspect.hold_on_rival']),
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
