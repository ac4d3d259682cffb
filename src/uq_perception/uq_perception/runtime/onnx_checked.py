"""Start the shipped detector on ONNX Runtime without torch, from a checked export (ROS-free).

The ``onnxruntime`` backend finds the cached ONNX export of the torch model and checks it
against that model at every start (:mod:`uq_perception.runtime.onnx_export`): importing
torch, loading the model and running the check are most of a start (docs/performance.md,
"Restart"). Once an export has passed the check, a record in the cache folder says so, so
that the next start can skip all three:

- the record is found by the SHA-256 of the detector file's bytes (another file, or the
  same file changed, has none);
- it names the ONNX file and its SHA-256 (a file changed since the check does not match);
- it lists the GPs the check compared variances with (:meth:`LastLayerNTKGP.query_digest`):
  a GP changed since (labels learnt, another artefact) takes the full start once, which
  adds it;
- it holds what the runtime needs without the torch model: model id, class names, input
  size, candidate widths and the linear head.

A start whose detector file, ONNX file and GP all match opens the ONNX file directly
(:class:`CheckedOnnxDetector`: numpy before and after the session, as the torch backends'
:mod:`uq_perception.detectors.centernet_io`); any other start takes the full path, which
writes or extends the record when the check passes. Only the CPU provider is recorded: a
GPU provider's numerics are another check's.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from uq_perception.detectors.centernet_io import decode_candidates, image_array
from uq_perception.detectors.contract import Detections, DetectorContract, LinearHead
from uq_perception.runtime.backend_choice import BackendKind
from uq_perception.runtime.onnx_runtime import OnnxRunner, default_cache_dir

if TYPE_CHECKING:
    from uq_perception.detectors.centernet import CenterNetDetector
    from uq_perception.ntk import LastLayerNTKGP

RECORD_FORMAT = 'uq_perception.checked_onnx_export'
RECORD_VERSION = 1


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, 'rb') as stream:
        for block in iter(lambda: stream.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def record_path(detector_sha256: str, cache_dir: str | Path | None = None) -> Path:
    """Where the record of the detector file with this digest lies."""
    folder = Path(cache_dir) if cache_dir else default_cache_dir()
    return folder / 'onnx' / f'checked-{detector_sha256[:32]}.json'


@dataclass(frozen=True)
class CheckedExport:
    """A record: an ONNX export that passed the check against the detector file's model.

    Attributes
    ----------
    detector_sha256, onnx_sha256
        Digests of the detector file and of the ONNX file.
    onnx_path
        The ONNX file.
    model_id, class_names, input_size, embedding_dim, num_classes
        The model's identity and shapes (``input_size`` is ``(height, width)``).
    head_weight, head_bias
        The linear head, ``(C, D)`` and ``(C,)`` as nested lists.
    gp_digests
        :meth:`LastLayerNTKGP.query_digest` of every GP the check passed with.
    """

    detector_sha256: str
    onnx_path: str
    onnx_sha256: str
    model_id: str
    class_names: tuple[str, ...]
    input_size: tuple[int, int]
    embedding_dim: int
    num_classes: int
    head_weight: tuple[tuple[float, ...], ...]
    head_bias: tuple[float, ...]
    gp_digests: tuple[str, ...]

    def checked_with(self, gp: LastLayerNTKGP) -> bool:
        """Whether the check passed with a GP whose query is ``gp``'s."""
        return gp.query_digest() in self.gp_digests


def read_checked_export(model_path: str | Path, cache_dir: str | Path | None = None
                        ) -> CheckedExport | None:
    """The record of the detector file at ``model_path`` whose ONNX file is unchanged, or
    None (no record, an unreadable one, or an ONNX file missing or changed since)."""
    try:
        detector_sha256 = file_sha256(model_path)
        found = json.loads(record_path(detector_sha256, cache_dir).read_text(encoding='utf-8'))
        if found.pop('format') != RECORD_FORMAT or found.pop('version') != RECORD_VERSION:
            return None
        record = CheckedExport(**{**found, 'class_names': tuple(found['class_names']),
                                  'input_size': tuple(found['input_size']),
                                  'head_weight': tuple(map(tuple, found['head_weight'])),
                                  'head_bias': tuple(found['head_bias']),
                                  'gp_digests': tuple(found['gp_digests'])})
        if record.detector_sha256 != detector_sha256 or \
                file_sha256(record.onnx_path) != record.onnx_sha256:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # anything amiss: the full start checks again and rewrites it
    return record


def write_checked_export(model_path: str | Path, model: CenterNetDetector, onnx_path: Path,
                         gp: LastLayerNTKGP, cache_dir: str | Path | None = None) -> Path:
    """Record that ``onnx_path`` passed the check against ``model`` (read from
    ``model_path``) with ``gp``, keeping the GPs of an existing record of the same files.
    Written atomically."""
    detector_sha256 = file_sha256(model_path)
    onnx_sha256 = file_sha256(onnx_path)
    earlier = read_checked_export(model_path, cache_dir)
    digests = [gp.query_digest()]
    if earlier is not None and earlier.onnx_sha256 == onnx_sha256:
        digests = sorted({*earlier.gp_digests, *digests})
    head = model.head
    record = CheckedExport(
        detector_sha256=detector_sha256, onnx_path=str(Path(onnx_path).resolve()),
        onnx_sha256=onnx_sha256, model_id=model.model_id,
        class_names=tuple(model.class_names),
        input_size=(int(model.input_size[0]), int(model.input_size[1])),
        embedding_dim=int(model.embedding_dim), num_classes=int(model.num_classes),
        head_weight=tuple(map(tuple, head.weight.detach().cpu().double().tolist())),
        head_bias=tuple(head.bias.detach().cpu().double().tolist()),
        gp_digests=tuple(digests))
    path = record_path(detector_sha256, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix='.tmp', dir=path.parent)
    try:
        with os.fdopen(fd, 'w', encoding='utf-8') as stream:
            json.dump({'format': RECORD_FORMAT, 'version': RECORD_VERSION, **asdict(record)},
                      stream)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class CheckedOnnxDetector(DetectorContract):
    """The shipped detector's checked ONNX export on ONNX Runtime's CPU provider, without
    torch: the same candidates, decode and GP inputs as
    :class:`~uq_perception.runtime.backends.OnnxRuntimeBackend` running that file.

    Parameters
    ----------
    record
        The export's record (:func:`read_checked_export`).
    threads
        Intra-op CPU threads.
    """

    def __init__(self, record: CheckedExport, threads: int = 1) -> None:
        from uq_perception.runtime.onnx_export import INPUT_NAME, OUTPUT_NAME

        self.record = record
        self._runner = OnnxRunner(record.onnx_path, 'cpu', threads)
        self._names = (INPUT_NAME, [OUTPUT_NAME])
        # Column ends of scores, boxes, embeddings and logits in the packed candidates.
        self._splits = np.cumsum([1, 4, record.embedding_dim])
        self._head = LinearHead(np.asarray(record.head_weight, np.float32),
                                np.asarray(record.head_bias, np.float32))
        # The session reads a contiguous (1, 3, h, w) image: filled in place frame after frame.
        self._input = np.empty((1, 3, *record.input_size), np.uint8)

    @property
    def model_id(self) -> str:
        return self.record.model_id

    @property
    def class_names(self) -> list[str]:
        return list(self.record.class_names)

    @property
    def input_size(self) -> tuple[int, int]:
        return self.record.input_size

    @property
    def backend_name(self) -> str:
        return BackendKind.ONNXRUNTIME.value

    @property
    def device_name(self) -> str:
        return self._runner.device_name

    def head(self) -> LinearHead:
        return self._head

    def infer(self, image_rgb: np.ndarray, score_threshold: float,
              max_detections: int) -> Detections:
        start = time.perf_counter()
        np.copyto(self._input, image_array(image_rgb, self.record.input_size))
        self.preprocess_ms = (time.perf_counter() - start) * 1e3
        input_name, outputs = self._names
        packed = self._runner.run({input_name: self._input}, outputs)[outputs[0]]
        scores, boxes, embeddings, logits = np.split(packed, self._splits, axis=2)
        return decode_candidates(scores[..., 0], boxes, embeddings, logits,
                                 self.record.input_size, score_threshold, max_detections,
                                 [image_rgb.shape[:2]])[0]
