"""Checksummed, atomically written state files of the NTK-GP engine (``.npz`` + JSON meta).

Two SHA-256 checksums are stored in the metadata: ``digest`` over the arrays and
``meta_digest`` over the rest of the metadata. Files written before ``meta_digest`` existed
have none and still load; their metadata is then guarded by the field checks of
:meth:`LastLayerNTKGP.load` alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from uq_common.file_kind import describe_file
from uq_perception.ntk.config import FORMAT_NAME, READABLE_FORMAT_VERSIONS


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
