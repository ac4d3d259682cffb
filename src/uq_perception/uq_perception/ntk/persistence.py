"""Checksummed, atomically written state files of the NTK-GP engine (``.npz`` + JSON meta).

:func:`save_model` and :func:`load_model` write and read a
:class:`~uq_perception.ntk.model.LastLayerNTKGP` (its ``save`` and ``load``);
:func:`write_state` and :func:`read_state` are the file underneath.

Two SHA-256 checksums are stored in the metadata: ``digest`` over the arrays and
``meta_digest`` over the rest of the metadata. Files written before ``meta_digest`` existed
have none and still load; their metadata is then guarded by the field checks of
:func:`load_model` alone.

A file has the lowest format version that holds its state, so a reader that predates a
feature refuses only the files that use it: version 2 the plain GP, 3 with a feature
transform or a score reference of another signal than the GP variance, 4 with scale gating.
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from uq_common.file_kind import describe_file
from uq_perception.ntk.box_calibration import BoxCalibration
from uq_perception.ntk.calibrated_score import ScoreReference
from uq_perception.ntk.config import (
    FORMAT_NAME,
    FORMAT_VERSION,
    PLAIN_FORMAT_VERSION,
    READABLE_FORMAT_VERSIONS,
    SCALE_FORMAT_VERSION,
    Gating,
    NTKGPConfig,
    check_integer,
    check_real,
)
from uq_perception.ntk.feature_transform import FeatureTransform
from uq_perception.ntk.scale_gating import ScaleGating

if TYPE_CHECKING:
    from uq_perception.ntk.model import LastLayerNTKGP


def arrays_digest(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes of ``arrays``: a flipped bit in a saved
    state must be an error, never a silently different variance."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f'{name}:{array.dtype.str}:{array.shape};'.encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


_DIGEST_KEYS = ('digest', 'meta_digest')


def meta_digest(meta: dict[str, Any]) -> str:
    """SHA-256 over the canonical JSON of ``meta`` without its checksums."""
    content = {k: v for k, v in meta.items() if k not in _DIGEST_KEYS}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(',', ':'))
                          .encode()).hexdigest()


def write_state(path: str | os.PathLike[str], meta: dict[str, Any],
                arrays: dict[str, np.ndarray]) -> None:
    """Write ``meta`` (with both checksums added, any stale ones replaced) and ``arrays``
    atomically: a temporary file in the same folder, fsynced, then renamed over ``path``."""
    # Through JSON first, so the checksum is of exactly what read_state will parse.
    meta = json.loads(json.dumps({k: v for k, v in meta.items() if k not in _DIGEST_KEYS}))
    meta.update(digest=arrays_digest(arrays), meta_digest=meta_digest(meta))
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f'.{target.name}.', dir=target.parent or '.')
    try:
        with os.fdopen(fd, 'wb') as handle:
            savez: Any = np.savez
            savez(handle, meta=np.array(json.dumps(meta)), **arrays)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_state(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read a file written by :func:`write_state` and check its format, version and
    checksums (``meta_digest`` only where the file has one).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file is not a readable state of this format and version, or is corrupt.
    """
    try:
        with np.load(path, allow_pickle=False) as archive:
            meta = json.loads(str(archive['meta']))
            arrays = {k: np.array(archive[k]) for k in archive.files if k != 'meta'}
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise ValueError(f'{path}: not a readable NTK-GP state file: expected a NumPy .npz '
                         f'archive with a "meta" entry (format {FORMAT_NAME}), found '
                         f'{describe_file(path)} ({str(exc).strip() or type(exc).__name__})'
                         ) from exc
    if not isinstance(meta, dict) or meta.get('format') != FORMAT_NAME:
        raise ValueError(f'{path}: not an NTK-GP state file (format '
                         f'{meta.get("format") if isinstance(meta, dict) else meta!r})')
    if meta.get('version') not in READABLE_FORMAT_VERSIONS:
        raise ValueError(f'{path}: unsupported format version {meta.get("version")!r} '
                         f'(this build reads versions '
                         f'{", ".join(map(str, READABLE_FORMAT_VERSIONS))})')
    if meta.get('digest') != arrays_digest(arrays):
        raise ValueError(f'{path}: checksum mismatch, the NTK-GP state file is corrupt')
    if 'meta_digest' in meta and meta['meta_digest'] != meta_digest(meta):
        raise ValueError(f'{path}: metadata checksum mismatch, the NTK-GP state file is '
                         'corrupt or was edited by hand')
    return meta, arrays


def format_version(gp: LastLayerNTKGP) -> int:
    """The lowest format version that holds the state of ``gp`` (module docstring)."""
    if gp.scale_gating is not None:
        return SCALE_FORMAT_VERSION
    reference = gp.score_reference
    if gp.feature_transform is not None or (
            reference is not None and reference.signal != 'gp_variance'):
        return FORMAT_VERSION
    return PLAIN_FORMAT_VERSION


def save_model(gp: LastLayerNTKGP, path: str | os.PathLike[str]) -> None:
    """Write the state of the fitted ``gp`` to ``path`` with :func:`write_state`."""
    config = asdict(gp.config)
    config['gating'] = gp.config.gating.value
    meta = {
        'format': FORMAT_NAME, 'version': format_version(gp),
        'feature_dim': gp.feature_dim, 'class_names': gp.class_names,
        'num_base_classes': gp.num_base_classes, 'model_id': gp.model_id,
        'config': config, 'ood_threshold': gp.ood_threshold,
        'probit_lambda': gp.probit_lambda, 'temperature': gp.temperature,
        'applied_updates': gp.applied_updates,
        'box_calibration': None if gp.box_calibration is None
        else gp.box_calibration.to_meta(),
        'score_reference': None if gp.score_reference is None
        else gp.score_reference.to_meta(),
        'feature_transform': None if gp.feature_transform is None
        else gp.feature_transform.to_meta(),
    }
    # Written only when used: a reader that predates scale gating refuses the file
    # (its version), and reads every other state as before.
    if gp.scale_gating is not None:
        meta['scale_gating'] = gp.scale_gating.to_meta()
    arrays = gp._state_arrays()
    if gp.feature_transform is not None:
        arrays['feature_transform_means'] = gp.feature_transform.means_array()
    write_state(path, meta, arrays)


def load_model(model_type: type[LastLayerNTKGP], path: str | os.PathLike[str], *,
               feature_dim: int | None = None, class_names: Sequence[str] | None = None,
               model_id: str | None = None) -> LastLayerNTKGP:
    """Read a state written by :func:`save_model` as a ``model_type`` and check it against
    the caller's model.

    Parameters
    ----------
    feature_dim, class_names, model_id : optional
        Expected values; ``class_names`` may also equal the head's original classes (those
        taught online follow them).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file is not a readable state of this format and version, is internally
        inconsistent, has a metadata field of the wrong type or out of range (every field is
        checked: :func:`_checked_config`), or disagrees with an expected value (the message
        names the file and the field).
    """
    path = Path(path)
    meta, arrays = read_state(path)
    try:
        model = _model_from_state(model_type, meta, arrays)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f'{path}: corrupt NTK-GP state ({exc})') from exc
    if feature_dim is not None and int(feature_dim) != model.feature_dim:
        raise ValueError(f'{path}: feature dimension mismatch: file has '
                         f'{model.feature_dim}, expected {feature_dim}')
    if class_names is not None:
        expected = [str(n) for n in class_names]
        if expected not in (model.class_names, model.class_names[:model.num_base_classes]):
            raise ValueError(f'{path}: class names mismatch: file has '
                             f'{model.class_names}, expected {expected}')
    if model_id is not None and str(model_id) != model.model_id:
        raise ValueError(f'{path}: model id mismatch: file has {model.model_id!r}, '
                         f'expected {model_id!r}')
    return model


def _checked_config(meta: dict[str, Any]) -> NTKGPConfig:
    """Check the type and range of every metadata field :func:`save_model` writes; return
    the configuration (checked by :class:`NTKGPConfig` itself)."""
    required = ('feature_dim', 'class_names', 'num_base_classes', 'model_id', 'config',
                'ood_threshold', 'probit_lambda', 'temperature')
    missing = [key for key in required if key not in meta]
    if missing:
        raise ValueError(f'missing metadata fields {missing}')
    check_integer('feature_dim', meta['feature_dim'], 1)
    check_integer('num_base_classes', meta['num_base_classes'], 2)
    names = meta['class_names']
    if not (isinstance(names, list) and names
            and all(isinstance(n, str) and n and n.isprintable() for n in names)):
        raise ValueError(f'class_names must be a list of non-empty printable strings, '
                         f'got {names!r:.200}')
    if len(set(names)) != len(names) or len(names) < meta['num_base_classes']:
        raise ValueError(f'class_names must be unique and at least num_base_classes '
                         f'({meta["num_base_classes"]}), got {names!r:.200}')
    if not isinstance(meta['model_id'], str):
        raise ValueError(f'model_id must be a string, got {meta["model_id"]!r:.80}')
    if meta['ood_threshold'] is not None:
        check_real('ood_threshold', meta['ood_threshold'], 0.0)
    check_real('probit_lambda', meta['probit_lambda'], 0.0)
    check_real('temperature', meta['temperature'], positive=True)
    updates = meta.get('applied_updates', [])
    if not (isinstance(updates, list) and all(isinstance(u, str) and u for u in updates)):
        raise ValueError(f'applied_updates must be a list of non-empty strings, got '
                         f'{updates!r:.80}')
    box = meta.get('box_calibration')
    if box is not None:
        # Types here; BoxCalibration checks the values' ranges and counts.
        if not (isinstance(box, dict) and isinstance(box.get('coordinates'), list)
                and all(isinstance(c, str) for c in box['coordinates'])
                and all(isinstance(box.get(k), list)
                        and all(isinstance(v, numbers.Real) and not isinstance(v, bool)
                                for v in box[k]) for k in ('noise', 'scale'))):
            raise ValueError(f'box_calibration must hold coordinates (names), noise and '
                             f'scale (lists of numbers) and samples, got {box!r:.200}')
        check_integer('box_calibration.samples', box.get('samples'), 2)
    reference = meta.get('score_reference')
    if reference is not None and ScoreReference.from_meta(reference).model_id \
            != meta['model_id']:
        raise ValueError(f'score_reference belongs to model '
                         f'{reference["model_id"]!r}, the state to {meta["model_id"]!r}')
    if not isinstance(meta['config'], dict):
        raise ValueError(f'config must be a JSON object, got {meta["config"]!r:.80}')
    try:
        return NTKGPConfig(**meta['config'])
    except (TypeError, ValueError) as exc:
        raise ValueError(f'config: {exc}') from None


def _model_from_state(model_type: type[LastLayerNTKGP], meta: dict[str, Any],
                      arrays: dict[str, np.ndarray]) -> LastLayerNTKGP:
    config = _checked_config(meta)
    names = list(meta['class_names'])
    base, d = meta['num_base_classes'], meta['feature_dim']
    c, p = len(names), d + 1
    missing = [key for key in ('weight', 'bias', 'centroids', 'gram', 'class_sums',
                               'extra_residual', 'sigma2', 'delta') if key not in arrays]
    if missing:
        raise ValueError(f'missing arrays {missing}')
    m = int(arrays['sigma2'].shape[0]) if arrays['sigma2'].ndim == 1 else -1
    if m < 1 or (config.gating in (Gating.KMEANS, Gating.SCALE)
                 and m != config.num_experts) or (
            config.gating is Gating.CLASS and m != base):
        raise ValueError(f'{m} experts disagree with the configuration')
    # Every shape is checked before the model allocates its (M, D+1, D+1) state, so a
    # file that misstates a size is an error, not an allocation of its misstated size.
    shapes = {'weight': (base, d), 'bias': (base,), 'centroids': (m, d),
              'gram': (m, p, p), 'class_sums': (m, p, c), 'extra_residual': (m, c - base, p),
              'sigma2': (m,), 'delta': (m,)}
    for key, shape in shapes.items():
        if arrays[key].shape != shape:
            raise ValueError(f'{key} has shape {arrays[key].shape}, expected {shape} '
                             f'(feature_dim {d}, {c} classes, {base} base, {m} experts)')
        if arrays[key].dtype.kind not in 'fiu' or not np.isfinite(arrays[key]).all():
            raise ValueError(f'{key} has non-finite values or is not a real array '
                             f'({arrays[key].dtype})')
    if (arrays['sigma2'] <= 0).any() or (arrays['delta'] <= 0).any():
        raise ValueError('hyperparameters must be positive')
    model = model_type(arrays['weight'], arrays['bias'], config, names[:base], meta['model_id'])
    model.class_names = names
    threshold = meta['ood_threshold']
    model.ood_threshold = None if threshold is None else float(threshold)
    model.probit_lambda = float(meta['probit_lambda'])
    model.temperature = float(meta['temperature'])
    model.applied_updates = list(meta.get('applied_updates', []))
    box_meta = meta.get('box_calibration')
    model.box_calibration = None if box_meta is None else BoxCalibration.from_meta(box_meta)
    reference = meta.get('score_reference')
    model.score_reference = None if reference is None else ScoreReference.from_meta(reference)
    transform = meta.get('feature_transform')
    if transform is not None:
        if 'feature_transform_means' not in arrays:
            raise ValueError('feature_transform without its means array')
        model.feature_transform = FeatureTransform.from_meta(
            transform, arrays['feature_transform_means'], d)
    scales = meta.get('scale_gating')
    if scales is not None:
        if meta['version'] < SCALE_FORMAT_VERSION:
            raise ValueError(f'scale_gating in a version {meta["version"]} state')
        model.scale_gating = ScaleGating.from_meta(scales, d)
        for reference in model.scale_gating.references:
            if reference is not None and reference.model_id != model.model_id:
                raise ValueError(f'a scale score reference belongs to model '
                                 f'{reference.model_id!r}, the state to {model.model_id!r}')
    model._restore_state_arrays(arrays)
    return model
