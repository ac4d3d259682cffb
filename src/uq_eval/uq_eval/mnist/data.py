"""Readers for MNIST-format image sets (idx files, optionally gzipped, and KMNIST ``.npz``).

ROS-free and numpy-only. The benchmark layout is one folder per dataset with the
publishers' file names, as ``uq data fetch`` (:mod:`uq_eval.mnist.fetch`) writes it::

    mnist/train-images-idx3-ubyte.gz   mnist/train-labels-idx1-ubyte.gz
    mnist/t10k-images-idx3-ubyte.gz    mnist/t10k-labels-idx1-ubyte.gz
    fashion_mnist/t10k-images-idx3-ubyte.gz
    kmnist/t10k-images-idx3-ubyte.gz   (or kmnist/kmnist-test-imgs.npz)
    notmnist/t10k-images-idx3-ubyte.gz

Each file may also be present uncompressed (the name without ``.gz``).

More unknown sets can come from any file (``uq bench mnist --ood NAME=PATH``, read by
:func:`read_ood_images`): 28x28 grayscale images as an unsigned-byte IDX file (gzipped or
not) or an ``.npz`` archive, uint8 in 0..255 or float in [0, 1].
"""

from __future__ import annotations

import gzip
import os
import re
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    'MnistBenchmarkData',
    'OOD_SETS',
    'DATA_DIR_ENV',
    'configured_data_dir',
    'default_data_dir',
    'load_benchmark_data',
    'parse_ood_argument',
    'read_idx',
    'read_npz_images',
    'read_ood_images',
    'write_idx',
]

#: Unknown (out-of-distribution) sets: display name -> alternatives for the image file, each
#: relative to the data directory; the first alternative that exists is read.
OOD_SETS: dict[str, tuple[str, ...]] = {
    'FashionMNIST': ('fashion_mnist/t10k-images-idx3-ubyte.gz',),
    'KMNIST': ('kmnist/t10k-images-idx3-ubyte.gz', 'kmnist/kmnist-test-imgs.npz'),
    'notMNIST': ('notmnist/t10k-images-idx3-ubyte.gz',),
}

#: Environment variable that names the benchmark data directory.
DATA_DIR_ENV = 'UQ_DATA_DIR'

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
        Unknown sets keyed by display name: ``OOD_SETS`` in order, then any added with
        :meth:`with_extra_ood`. Pixel values in 0..255 (uint8, or float32 for sets given as
        floats in [0, 1]); their labels are unused.
    data_dir : Path
        Directory the files were read from.
    extra_ood_paths : dict of str to Path
        File of each unknown set added with :meth:`with_extra_ood`.
    """

    train_images: NDArray[np.uint8]
    train_labels: NDArray[np.uint8]
    test_images: NDArray[np.uint8]
    test_labels: NDArray[np.uint8]
    ood_images: dict[str, NDArray[np.uint8] | NDArray[np.float32]]
    data_dir: Path
    extra_ood_paths: dict[str, Path] = field(default_factory=dict)

    def with_extra_ood(self, extra: dict[str, tuple[Path, NDArray[np.uint8] | NDArray[np.float32]]]
                       ) -> MnistBenchmarkData:
        """A copy with more unknown sets (name -> (file, images)) after the built-in ones."""
        clashes = sorted(set(extra) & set(self.ood_images))
        if clashes:
            raise ValueError(f'unknown set name(s) {clashes} already used')
        return replace(
            self,
            ood_images={**self.ood_images, **{n: images for n, (_, images) in extra.items()}},
            extra_ood_paths={**self.extra_ood_paths,
                             **{n: path for n, (path, _) in extra.items()}})


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
        return _parse_idx(path, stream.read())


def _parse_idx(path: Path, raw: bytes) -> NDArray[np.uint8]:
    """The array of an unsigned-byte idx file's bytes ``raw`` (``path`` names it in errors)."""
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


def _workspace() -> Path:
    """The workspace root: ``$UQ_WORKSPACE`` (set by ``scripts/env.sh``) or, failing that,
    the source checkout this module lives in."""
    if os.environ.get('UQ_WORKSPACE'):
        return Path(os.environ['UQ_WORKSPACE'])
    # src/uq_eval/uq_eval/mnist/data.py -> workspace root is parents[4]; resolve() follows
    # colcon's symlink install back to the source tree.
    return Path(__file__).resolve().parents[4]


def configured_data_dir() -> tuple[Path, str]:
    """The benchmark data directory the settings name, whether or not it exists yet.

    Returns
    -------
    (Path, str)
        ``$UQ_DATA_DIR`` when set and not empty, else ``<workspace>/data``; and where that
        choice came from, for messages.
    """
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]), f'${DATA_DIR_ENV}'
    return _workspace() / 'data', 'the workspace default'


def default_data_dir() -> Path:
    """The benchmark data directory used when none is given: :func:`configured_data_dir`.

    Raises
    ------
    FileNotFoundError
        If that directory does not exist; the message names it and how to fill it.
    """
    path, origin = configured_data_dir()
    if not path.is_dir():
        raise FileNotFoundError(
            f'benchmark data directory {path} ({origin}) does not exist; download the data '
            f'with `uq data fetch all`, set {DATA_DIR_ENV} or pass --data-dir')
    return path.resolve()


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
                                f'file(s) (`uq data fetch all --data-dir {root}` downloads '
                                f'them):\n  {listing}')
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


#: Key of the image array in an ``.npz`` archive that holds more than one array.
NPZ_IMAGES_KEY = 'images'
#: Characters allowed in the name of an extra unknown set (it becomes a table column).
_NAME_PATTERN = re.compile(r'[A-Za-z0-9][A-Za-z0-9_.+-]*')
_GZIP_MAGIC = b'\x1f\x8b'
_ZIP_MAGIC = b'PK\x03\x04'
# IDX files start with two zero bytes, then the element type and the rank.
_IDX_PREFIX = b'\x00\x00'


def parse_ood_argument(argument: str, taken: Sequence[str]) -> tuple[str, Path]:
    """Split a ``--ood NAME=PATH`` argument and check the name.

    Parameters
    ----------
    argument : str
        The text after ``--ood``.
    taken : sequence of str
        Names already in use (the built-in sets, the known set and earlier ``--ood`` names);
        compared without regard to case.

    Raises
    ------
    ValueError
        If ``=`` is missing, the name or path is empty, the name has characters other than
        letters, digits and ``_ . + -``, or it is already taken.
    """
    name, sep, path = argument.partition('=')
    name = name.strip()
    if not sep or not name or not path:
        raise ValueError(f'--ood {argument!r}: expected NAME=PATH (e.g. '
                         '--ood EMNIST=letters.npz)')
    if not _NAME_PATTERN.fullmatch(name):
        raise ValueError(f'--ood {argument!r}: the name {name!r} may contain only letters, '
                         'digits and _ . + - (and starts with a letter or digit)')
    clash = [t for t in taken if t.casefold() == name.casefold()]
    if clash:
        raise ValueError(f'--ood {argument!r}: the name {name!r} is already used by '
                         f'{clash[0]!r}; give each unknown set its own name')
    return name, Path(path)


def _read_ood_npz(path: Path) -> NDArray[Any]:
    with np.load(path, allow_pickle=False) as archive:
        names = list(archive.keys())
        if len(names) == 1:
            key = names[0]
        elif NPZ_IMAGES_KEY in names:
            key = NPZ_IMAGES_KEY
        else:
            raise ValueError(f'{path}: the archive holds {len(names)} arrays {names}; expected '
                             f'one, or one named {NPZ_IMAGES_KEY!r}')
        try:
            images = archive[key]
        except ValueError as error:  # an object array, refused without pickle
            raise ValueError(f'{path}: array {key!r} cannot be read ({error})') from None
        # A member that is not a .npy file comes back as raw bytes.
        if not isinstance(images, np.ndarray):
            raise ValueError(f'{path}: {key!r} in the archive is not a NumPy array')
        return images


def read_ood_images(path: str | os.PathLike[str]) -> NDArray[np.uint8] | NDArray[np.float32]:
    """Read an extra unknown set: 28x28 grayscale images from an IDX or ``.npz`` file.

    The format is recognised from the file's first bytes, not its name:

    - IDX with unsigned-byte elements and shape ``(N, 28, 28)``, plain or gzipped;
    - ``.npz`` holding one array, or several of which the one named ``images`` is read;
      shape ``(N, 28, 28)``, dtype uint8 (0..255) or float (values in [0, 1], finite).

    Parameters
    ----------
    path : path-like
        The file.

    Returns
    -------
    ndarray, shape (N, 28, 28)
        uint8 as stored, or float32 in 0..255 pixel units for float input.

    Raises
    ------
    ValueError
        If the file cannot be read, is corrupt, has an unknown format, or holds no images,
        images of another size or rank, another dtype, or float values outside [0, 1] or
        not finite. The message starts with the file name.
    """
    path = Path(path)
    try:
        with open(path, 'rb') as stream:
            head = stream.read(4)
        if head.startswith(_GZIP_MAGIC):
            raw = gzip.decompress(path.read_bytes())
            if not raw.startswith(_IDX_PREFIX):
                raise ValueError(f'{path}: gzipped, but not an IDX file inside (expected an '
                                 'unsigned-byte IDX file, gzipped or not, or an .npz archive)')
            images: NDArray[Any] = _parse_idx(path, raw)
        elif head.startswith(_ZIP_MAGIC):
            images = _read_ood_npz(path)
        elif head.startswith(_IDX_PREFIX) and len(head) == 4:
            images = _parse_idx(path, path.read_bytes())
        else:
            raise ValueError(f'{path}: unknown format (expected an unsigned-byte IDX file, '
                             'gzipped or not, or an .npz archive)')
    except (OSError, EOFError, zlib.error, zipfile.BadZipFile) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise ValueError(f'{path}: cannot be read ({reason})') from None
    if images.ndim != 3:
        raise ValueError(f'{path}: expected images of shape (N, 28, 28), got rank '
                         f'{images.ndim} {images.shape}')
    if images.shape[1:] != (28, 28):
        raise ValueError(f'{path}: expected 28x28 images, got {images.shape[1]}x'
                         f'{images.shape[2]} (shape {images.shape})')
    if images.shape[0] == 0:
        raise ValueError(f'{path}: holds no images (shape {images.shape})')
    if images.dtype == np.uint8:
        return images
    if not np.issubdtype(images.dtype, np.floating):
        raise ValueError(f'{path}: images must be uint8 (0..255) or float in [0, 1], got '
                         f'dtype {images.dtype}')
    finite = np.isfinite(images)
    if not finite.all():
        raise ValueError(f'{path}: {int((~finite).sum())} pixel value(s) are not finite')
    low, high = float(images.min()), float(images.max())
    if low < 0.0 or high > 1.0:
        raise ValueError(f'{path}: float images must lie in [0, 1], found values in '
                         f'[{low:g}, {high:g}] (store 0..255 values as uint8)')
    return (images.astype(np.float64) * 255.0).astype(np.float32)
