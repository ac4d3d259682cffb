"""Readers for MNIST-format image sets (idx files, optionally gzipped, and KMNIST ``.npz``).

ROS-free and numpy-only. The benchmark layout is one folder per dataset with the
publishers' file names (see ``shared/data/README.md``)::

    mnist/train-images-idx3-ubyte.gz   mnist/train-labels-idx1-ubyte.gz
    mnist/t10k-images-idx3-ubyte.gz    mnist/t10k-labels-idx1-ubyte.gz
    fashion_mnist/t10k-images-idx3-ubyte.gz
    kmnist/t10k-images-idx3-ubyte.gz   (or kmnist/kmnist-test-imgs.npz)
    notmnist/t10k-images-idx3-ubyte.gz

Each file may also be present uncompressed (the name without ``.gz``).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

__all__ = [
    'MnistBenchmarkData',
    'OOD_SETS',
    'default_data_dir',
    'load_benchmark_data',
    'read_idx',
    'read_npz_images',
    'write_idx',
]

#: Unknown (out-of-distribution) sets: display name -> alternatives for the image file, each
#: relative to the data directory; the first alternative that exists is read.
OOD_SETS: dict[str, tuple[str, ...]] = {
    'FashionMNIST': ('fashion_mnist/t10k-images-idx3-ubyte.gz',),
    'KMNIST': ('kmnist/t10k-images-idx3-ubyte.gz', 'kmnist/kmnist-test-imgs.npz'),
    'notMNIST': ('notmnist/t10k-images-idx3-ubyte.gz',),
}

_MNIST_FILES = {
    'train_images': 'mnist/train-images-idx3-ubyte.gz',
    'train_labels': 'mnist/train-labels-idx1-ubyte.gz',
    'test_images': 'mnist/t10k-images-idx3-ubyte.gz',
    'test_labels': 'mnist/t10k-labels-idx1-ubyte.gz',
}


@dataclass(frozen=True)
class MnistBenchmarkData:
    """The images of the benchmark as uint8 arrays of shape ``(N, 28, 28)``.

    Attributes
    ----------
    train_images, train_labels : ndarray
        MNIST training split (60000 images in the original files).
    test_images, test_labels : ndarray
        MNIST test split, the in-distribution evaluation set.
    ood_images : dict of str to ndarray
        Unknown sets keyed by display name (``OOD_SETS`` order); their labels are unused.
    data_dir : Path
        Directory the files were read from.
    """

    train_images: NDArray[np.uint8]
    train_labels: NDArray[np.uint8]
    test_images: NDArray[np.uint8]
    test_labels: NDArray[np.uint8]
    ood_images: dict[str, NDArray[np.uint8]]
    data_dir: Path


def read_idx(path: str | os.PathLike[str]) -> NDArray[np.uint8]:
    """Read an unsigned-byte idx file (gzipped when the name ends in ``.gz``).

    Parameters
    ----------
    path : path-like
        An ``idx3-ubyte`` (images) or ``idx1-ubyte`` (labels) file.

    Returns
    -------
    ndarray of uint8
        Shape ``(N, rows, cols)`` for images, ``(N,)`` for labels.

    Raises
    ------
    ValueError
        If the header is not an unsigned-byte idx header or the payload size does not match
        the dimensions it declares.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == '.gz' else open
    with opener(path, 'rb') as stream:
        raw = stream.read()
    if len(raw) < 4:
        raise ValueError(f'{path}: too short for an idx header ({len(raw)} bytes)')
    magic = int.from_bytes(raw[:4], 'big')
    # Byte 2 is the element type (0x08 = unsigned byte), byte 3 the number of dimensions.
    if magic >> 8 != 0x08 or not 1 <= (magic & 0xFF) <= 4:
        raise ValueError(f'{path}: not an unsigned-byte idx file (magic {magic})')
    ndim = magic & 0xFF
    header_end = 4 + 4 * ndim
    if len(raw) < header_end:
        raise ValueError(f'{path}: truncated idx header')
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndim))
    expected = int(np.prod(shape))
    if len(raw) - header_end != expected:
        raise ValueError(f'{path}: idx header declares shape {shape} ({expected} bytes) but the '
                         f'payload has {len(raw) - header_end} bytes')
    return np.frombuffer(raw, dtype=np.uint8, offset=header_end).reshape(shape)


def write_idx(path: str | os.PathLike[str], array: NDArray[np.uint8]) -> None:
    """Write a uint8 array as an idx file (gzipped when the name ends in ``.gz``).

    The inverse of :func:`read_idx`; used to build small datasets in the same format.

    Parameters
    ----------
    path : path-like
        Destination file.
    array : ndarray of uint8
        One to four dimensions.
    """
    array = np.asarray(array)
    if array.dtype != np.uint8 or not 1 <= array.ndim <= 4:
        raise ValueError(f'write_idx needs a uint8 array of rank 1-4, got {array.dtype} '
                         f'rank {array.ndim}')
    header = (0x0800 | array.ndim).to_bytes(4, 'big') + b''.join(
        int(n).to_bytes(4, 'big') for n in array.shape)
    path = Path(path)
    opener = gzip.open if path.suffix == '.gz' else open
    with opener(path, 'wb') as stream:
        stream.write(header + np.ascontiguousarray(array).tobytes())


def read_npz_images(path: str | os.PathLike[str]) -> NDArray[np.uint8]:
    """Read the single ``arr_0`` image array of a KMNIST-style ``.npz`` file.

    Parameters
    ----------
    path : path-like
        ``.npz`` archive holding one uint8 array of shape ``(N, 28, 28)``.

    Returns
    -------
    ndarray of uint8, shape (N, 28, 28)

    Raises
    ------
    ValueError
        If the archive does not hold exactly one uint8 array of rank 3.
    """
    with np.load(path, allow_pickle=False) as archive:
        names = list(archive.keys())
        if len(names) != 1:
            raise ValueError(f'{path}: expected one array, found {names}')
        images = archive[names[0]]
    if images.dtype != np.uint8 or images.ndim != 3:
        raise ValueError(f'{path}: expected uint8 images (N, H, W), got {images.dtype} '
                         f'{images.shape}')
    return images


def _candidates(relative: str) -> tuple[str, ...]:
    """The file name and, for ``.gz`` names, its uncompressed form."""
    return (relative, relative[:-3]) if relative.endswith('.gz') else (relative,)


def _resolve(data_dir: Path, alternatives: Sequence[str]) -> Path | None:
    for relative in alternatives:
        for name in _candidates(relative):
            if (data_dir / name).is_file():
                return data_dir / name
    return None


def _read_images(path: Path) -> NDArray[np.uint8]:
    images = read_npz_images(path) if path.suffix == '.npz' else read_idx(path)
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise ValueError(f'{path}: expected 28x28 images, got shape {images.shape}')
    return images


def _read_labels(path: Path, count: int) -> NDArray[np.uint8]:
    labels = read_idx(path)
    if labels.shape != (count,):
        raise ValueError(f'{path}: expected {count} labels, got shape {labels.shape}')
    if labels.max() > 9:
        raise ValueError(f'{path}: labels must be digits 0-9, found {labels.max()}')
    return labels


def default_data_dir() -> Path:
    """The benchmark data directory used when none is given.

    The first existing one of ``$UQ_DATA_DIR`` and ``<workspace>/../shared/data``, where
    the workspace is ``$UQ_WORKSPACE`` (set by ``scripts/env.sh``) or, failing that, the
    source checkout this module lives in.

    Raises
    ------
    FileNotFoundError
        If none of the candidates exists; the message lists them.
    """
    candidates: list[Path] = []
    if os.environ.get('UQ_DATA_DIR'):
        candidates.append(Path(os.environ['UQ_DATA_DIR']))
    if os.environ.get('UQ_WORKSPACE'):
        candidates.append(Path(os.environ['UQ_WORKSPACE']) / '..' / 'shared' / 'data')
    # src/uq_perception/uq_perception/mnist_data.py -> workspace root is parents[3]; resolve()
    # follows colcon's symlink install back to the source tree.
    candidates.append(Path(__file__).resolve().parents[3] / '..' / 'shared' / 'data')
    for candidate in candidates:
        if candidate.is_dir():
            return candidate.resolve()
    tried = ', '.join(str(c) for c in candidates)
    raise FileNotFoundError(f'no benchmark data directory found (tried {tried}); pass '
                            '--data-dir or set UQ_DATA_DIR')


def load_benchmark_data(data_dir: str | os.PathLike[str]) -> MnistBenchmarkData:
    """Read MNIST (train and test) and the unknown sets from ``data_dir``.

    Parameters
    ----------
    data_dir : path-like
        Directory laid out as described in the module docstring.

    Returns
    -------
    MnistBenchmarkData

    Raises
    ------
    FileNotFoundError
        If the directory or any required file is missing; the message names every missing
        file (with its accepted alternatives), not only the first.
    ValueError
        If a file is present but malformed.
    """
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f'benchmark data directory {root} does not exist')
    required: dict[str, tuple[str, ...]] = {key: (name,) for key, name in _MNIST_FILES.items()}
    required.update({f'ood:{name}': alts for name, alts in OOD_SETS.items()})
    resolved = {key: _resolve(root, alts) for key, alts in required.items()}
    missing = [
        ' or '.join(name for alt in required[key] for name in _candidates(alt))
        for key, path in resolved.items() if path is None
    ]
    if missing:
        listing = '\n  '.join(missing)
        raise FileNotFoundError(f'benchmark data directory {root} lacks {len(missing)} '
                                f'file(s):\n  {listing}')
    paths = {key: path for key, path in resolved.items() if path is not None}
    train_images = _read_images(paths['train_images'])
    test_images = _read_images(paths['test_images'])
    return MnistBenchmarkData(
        train_images=train_images,
        train_labels=_read_labels(paths['train_labels'], len(train_images)),
        test_images=test_images,
        test_labels=_read_labels(paths['test_labels'], len(test_images)),
        ood_images={name: _read_images(paths[f'ood:{name}']) for name in OOD_SETS},
        data_dir=root,
    )
