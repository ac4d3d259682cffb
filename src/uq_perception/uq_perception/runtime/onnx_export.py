"""The shipped detector as an ONNX file, built once, cached and checked (ROS-free).

The ``onnxruntime`` backend (``uq_perception.runtime.backends``) runs the CenterNet network on ONNX
Runtime. Its ONNX file is exported from the loaded torch model on first start
(``torch.onnx.export``, the ``torch.export``-based exporter) and cached in the ``onnx``
folder of :func:`~uq_perception.runtime.onnx_runtime.default_cache_dir`, one file per model id,
named by the model id and weight digest. The graph takes the resized uint8 image and
returns the top-K candidates packed as the torch backends pack them (``scores, boxes,
embeddings, logits``), so the numpy decode and the GP query are shared.

Every start checks the file before it is used:

- its metadata (format version, model id, weight digest, input size, output widths) must
  name the torch model; a file that does not load, or names another model, is rebuilt;
- its outputs on fixed probe images must agree with the torch model's:
  ``|onnx - torch| / max(1, |torch|) <= 1e-4`` for scores, embeddings and logits, and for
  boxes in units of the input size; and, when a GP is given, the GP variance of the
  candidates' embeddings to ``1e-4`` relative (to each variance, or to their median where
  that is larger). A file that disagrees is rebuilt once; if
  the fresh export disagrees too, :class:`OnnxAgreementError` says by how much.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from uq_perception.runtime.onnx_runtime import (
    ExecutionProvider,
    OnnxRunner,
    OnnxRuntimeUnavailableError,
    default_cache_dir,
    import_onnxruntime,
)

if TYPE_CHECKING:
    import torch

    from uq_perception.detectors.centernet import CenterNetDetector
    from uq_perception.ntk import LastLayerNTKGP

EXPORT_FORMAT = 'uq_perception.centernet_onnx'
EXPORT_VERSION = 1
#: ONNX operator set of the exported graph (ONNX Runtime 1.15 and later run it).
OPSET = 18
INPUT_NAME = 'image'
OUTPUT_NAME = 'candidates'
#: Largest ``|onnx - torch| / max(1, |torch|)`` of the candidate outputs (boxes in units
#: of the input size).
OUTPUT_TOLERANCE = 1e-4
#: Largest relative difference of the GP variance of the candidates' embeddings.
GP_VARIANCE_TOLERANCE = 1e-4
_METADATA_KEY = 'uq_perception'


class OnnxExportError(RuntimeError):
    """The shipped detector cannot be run from an ONNX export (the message says why)."""


class OnnxAgreementError(OnnxExportError):
    """The exported network's outputs differ from the torch model's beyond tolerance."""


@dataclass(frozen=True)
class Agreement:
    """How closely an ONNX file reproduces the torch model on the probe images.

    Attributes
    ----------
    output_difference : float
        Largest ``|onnx - torch| / max(1, |torch|)`` over the candidate outputs (boxes in
        units of the input size).
    gp_variance_difference : float | None
        Largest relative difference of the candidates' GP variance (``None`` without a GP).
    """

    output_difference: float
    gp_variance_difference: float | None

    def passes(self) -> bool:
        """Whether both differences are within :data:`OUTPUT_TOLERANCE` and
        :data:`GP_VARIANCE_TOLERANCE`."""
        gp_ok = self.gp_variance_difference is None or \
            self.gp_variance_difference <= GP_VARIANCE_TOLERANCE
        return self.output_difference <= OUTPUT_TOLERANCE and gp_ok

    def describe(self) -> str:
        """One line with both figures and their limits."""
        gp = ('no GP given' if self.gp_variance_difference is None else
              f'GP variance {self.gp_variance_difference:.2e} (limit {GP_VARIANCE_TOLERANCE:g})')
        return f'outputs {self.output_difference:.2e} (limit {OUTPUT_TOLERANCE:g}), {gp}'


def export_metadata(model: CenterNetDetector) -> dict[str, Any]:
    """What the ONNX file must agree on with the torch model it runs for."""
    from uq_perception.detectors.centernet import model_digest

    return {'format': EXPORT_FORMAT, 'version': EXPORT_VERSION,
            'model_id': model.model_id, 'digest': model_digest(model),
            'input_size': [int(v) for v in model.input_size],
            'max_candidates': int(model.max_candidates),
            'embedding_dim': int(model.embedding_dim), 'num_classes': int(model.num_classes)}


def _cache_name(model_id: str) -> str:
    return re.sub(r'[^A-Za-z0-9._-]+', '_', model_id)[:80] or 'unnamed'


def cached_path(model: CenterNetDetector, cache_dir: str | Path | None = None) -> Path:
    """The cache file of ``model``: keyed by its model id and weight digest."""
    meta = export_metadata(model)
    folder = Path(cache_dir) if cache_dir else default_cache_dir()
    return folder / 'onnx' / f'{_cache_name(meta["model_id"])}-{meta["digest"][:16]}.onnx'


def _packed_module(model: CenterNetDetector) -> torch.nn.Module:
    import torch

    from uq_perception.detectors.candidates import pack_candidates
    from uq_perception.detectors.centernet import normalize_images

    class PackedCandidates(torch.nn.Module):
        """uint8 ``(1, 3, H, W)`` image -> packed ``(1, K, 1 + 4 + D + C)`` candidates."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, image: torch.Tensor) -> torch.Tensor:
            return pack_candidates(self.model(normalize_images(image)))[0]

    return PackedCandidates().eval()


def export_onnx(model: CenterNetDetector, path: str | Path) -> Path:
    """Export ``model`` (in eval mode, on the CPU) to an ONNX file at ``path``, atomically,
    with :func:`export_metadata` in the file's metadata."""
    import onnx
    import torch

    height, width = model.input_size
    example = torch.zeros((1, 3, height, width), dtype=torch.uint8)
    module = _packed_module(model)
    # The exporter logs at length about torchvision operators it cannot register (there is
    # no torchvision on the CPU path, and the detector needs none), about its graph
    # optimiser's choices, and warns about its own deprecated internals: none of it is the
    # user's to act on.
    loggers = [logging.getLogger(name) for name in ('torch.onnx', 'onnxscript')]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter('ignore', FutureWarning)
            warnings.simplefilter('ignore', DeprecationWarning)
            program = torch.onnx.export(module, (example,), dynamo=True, verbose=False,
                                        opset_version=OPSET, input_names=[INPUT_NAME],
                                        output_names=[OUTPUT_NAME])
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)
    if program is None:
        raise RuntimeError('torch.onnx.export returned no program')
    proto = program.model_proto
    entry = proto.metadata_props.add()
    entry.key, entry.value = _METADATA_KEY, json.dumps(export_metadata(model), sort_keys=True)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed: a concurrent start never reads half a file.
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix='.tmp', dir=path.parent)
    try:
        with os.fdopen(fd, 'wb') as handle:
            handle.write(proto.SerializeToString())
        onnx.checker.check_model(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_export_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata :func:`export_onnx` wrote into ``path``.

    Raises
    ------
    ValueError
        If the file is not a readable ONNX model with that metadata.
    """
    import onnx

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises its own decode errors
        raise ValueError(f'{path} is not a readable ONNX file ({type(exc).__name__})') from exc
    for entry in proto.metadata_props:
        if entry.key == _METADATA_KEY:
            try:
                found = json.loads(entry.value)
            except ValueError as exc:
                raise ValueError(f'{path}: unreadable {_METADATA_KEY} metadata') from exc
            if not isinstance(found, dict):
                raise ValueError(f'{path}: {_METADATA_KEY} metadata is not an object')
            return found
    raise ValueError(f'{path} has no {_METADATA_KEY} metadata: not built by this exporter')


def probe_images(input_size: tuple[int, int]) -> list[np.ndarray]:
    """Fixed uint8 ``(1, 3, H, W)`` inputs of the agreement check: smooth noise at two
    scales (blobs of many sizes, so peaks and boxes vary, and scores rarely tie)."""
    import cv2

    height, width = input_size
    rng = np.random.default_rng(20240607)
    images = []
    for cell in (8, 24):
        noise = rng.random((height // cell + 2, width // cell + 2, 3)).astype(np.float32)
        smooth = cv2.resize(noise, (width, height), interpolation=cv2.INTER_CUBIC)
        image = np.clip(smooth * 255.0, 0, 255).astype(np.uint8)
        images.append(np.ascontiguousarray(image.transpose(2, 0, 1)[None]))
    return images


def _matched_difference(found: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Row-wise ``|found - reference| / max(1, |reference|)``, each reference candidate
    paired with the closest unpaired found one: candidates whose scores tie up to float
    round-off may come in either order."""
    cost = (np.abs(found[None, :, :] - reference[:, None, :])
            / np.maximum(1.0, np.abs(reference))[:, None, :]).max(axis=2)
    cost = np.nan_to_num(cost, nan=np.inf)
    free = np.ones(len(found), bool)
    worst = np.zeros(len(reference))
    for i in range(len(reference)):
        j = int(np.argmin(np.where(free, cost[i], np.inf)))
        worst[i], free[j] = cost[i, j], False
    return worst


def measure_agreement(model: CenterNetDetector, runner: OnnxRunner,
                      gp: LastLayerNTKGP | None = None) -> Agreement:
    """Compare ``runner`` (an export of ``model``) with ``model`` on :func:`probe_images`."""
    import torch

    module = _packed_module(model)
    d, height, width = model.embedding_dim, *model.input_size
    box_units = np.array([width, height, width, height], np.float64)
    worst_output, worst_gp = 0.0, None if gp is None else 0.0
    for image in probe_images(model.input_size):
        with torch.inference_mode():
            reference = module(torch.from_numpy(image)).numpy().astype(np.float64)[0]
        found = runner.run({INPUT_NAME: image})[OUTPUT_NAME].astype(np.float64)[0]
        if found.shape != reference.shape:
            raise OnnxAgreementError(f'the ONNX file gives candidates of shape {found.shape}, '
                                     f'the torch model {reference.shape}')
        found[:, 1:5] /= box_units
        reference[:, 1:5] /= box_units
        worst_output = max(worst_output, float(_matched_difference(found, reference).max()))
        if gp is not None and worst_gp is not None:
            # Sorted variances: the pairing of tied candidates does not matter.
            expected = np.sort(gp.gp_variance(reference[:, 5:5 + d]))
            got = np.sort(gp.gp_variance(found[:, 5:5 + d]))
            # Relative to each variance, or to the median where that is larger: a variance
            # far below the others lies along the GP's best-known directions, where float32
            # round-off of the features, amplified by the GP's conditioning, is all there is
            # to measure.
            size = np.maximum(expected, np.median(expected))
            relative = np.abs(got - expected) / np.maximum(size, np.finfo(np.float64).tiny)
            worst_gp = max(worst_gp, float(np.nan_to_num(relative, nan=np.inf).max()))
    return Agreement(worst_output, worst_gp)


def _usable(path: Path, model: CenterNetDetector) -> str:
    """Why the cached ``path`` cannot serve ``model`` ('' when its metadata fits)."""
    if not path.is_file():
        return 'not built yet'
    try:
        found = read_export_metadata(path)
    except ValueError as exc:
        return str(exc)
    expected = export_metadata(model)
    for key, value in expected.items():
        if found.get(key) != value:
            return f'{key} is {found.get(key)!r}, the model needs {value!r}'
    return ''


@dataclass(frozen=True)
class PreparedOnnx:
    """A checked ONNX Runtime session of the shipped detector.

    Attributes
    ----------
    runner
        The session.
    path
        The ONNX file it runs.
    agreement
        Its measured agreement with the torch model.
    rebuilt
        Why the file was (re)built on this start ('' when the cache served it).
    """

    runner: OnnxRunner
    path: Path
    agreement: Agreement
    rebuilt: str


def prepare_onnx(model: CenterNetDetector, provider: ExecutionProvider | str = 'cpu',
                 threads: int = 1, cache_dir: str | Path | None = None,
                 gp: LastLayerNTKGP | None = None) -> PreparedOnnx:
    """Load the cached ONNX export of ``model`` (building it when missing, corrupt, stale or
    in disagreement) and check it against the torch model.

    Raises
    ------
    OnnxExportError
        If the export fails, or a fresh export disagrees with the torch model beyond the
        tolerances (:class:`OnnxAgreementError`).
    uq_perception.runtime.onnx_runtime.OnnxRuntimeUnavailableError
        If onnxruntime or the provider is missing.
    """
    import_onnxruntime()
    try:
        import onnx  # noqa: F401 - the exporter and the metadata reader need it
    except ImportError as exc:
        raise OnnxRuntimeUnavailableError(
            f'onnx is not installed ({exc}); install it with `pip install -r '
            'requirements/app.in -c requirements/constraints.txt`') from exc
    path = cached_path(model, cache_dir)
    reason = _usable(path, model)
    if not reason:
        try:
            runner, agreement = _open_checked(path, model, provider, threads, gp)
        except (ValueError, OnnxAgreementError) as exc:
            reason = f'the cached file fails: {exc}'
        else:
            if agreement.passes():
                return PreparedOnnx(runner, path, agreement, '')
            reason = f'the cached file disagrees with the torch model ({agreement.describe()})'
    try:
        export_onnx(model, path)
    except Exception as exc:  # noqa: BLE001 - the exporter raises many types
        raise OnnxExportError(f'exporting model {model.model_id!r} to ONNX failed: '
                              f'{type(exc).__name__}: {exc}') from exc
    # One file per model id: exports of earlier weights under the same id (retrained
    # models, test models) would otherwise pile up in the cache.
    same_id = re.compile(re.escape(_cache_name(model.model_id)) + r'-[0-9a-f]{16}\.onnx')
    for older in path.parent.iterdir():
        if older != path and same_id.fullmatch(older.name):
            older.unlink(missing_ok=True)
    try:
        runner, agreement = _open_checked(path, model, provider, threads, gp)
    except (ValueError, OnnxAgreementError) as exc:
        raise OnnxAgreementError(f'the fresh ONNX export {path} fails: {exc}') from exc
    if not agreement.passes():
        raise OnnxAgreementError(
            f'the ONNX export of model {model.model_id!r} disagrees with the torch model: '
            f'{agreement.describe()}')
    return PreparedOnnx(runner, path, agreement, reason)


def _open_checked(path: Path, model: CenterNetDetector, provider: ExecutionProvider | str,
                  threads: int, gp: LastLayerNTKGP | None) -> tuple[OnnxRunner, Agreement]:
    # The file lies in <cache>/onnx: TensorRT engines go beside it, in <cache>/tensorrt.
    runner = OnnxRunner(path, provider, threads, cache_dir=path.parent.parent)
    return runner, measure_agreement(model, runner, gp)
