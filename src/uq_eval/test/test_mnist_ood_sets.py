"""`uq bench mnist --ood NAME=PATH`: reading extra unknown sets and rejecting bad ones."""

from __future__ import annotations

import gzip
import zipfile
from pathlib import Path

import numpy as np
import pytest

from uq_common import cli
from uq_eval.mnist.data import (
    OOD_SETS,
    MnistBenchmarkData,
    parse_ood_argument,
    read_ood_images,
    write_idx,
)

BUILT_IN = ['MNIST', *OOD_SETS]


def _images(n: int = 5, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 28, 28)).astype(np.uint8)


# --------------------------------------------------------------------------- good files


@pytest.mark.parametrize('name', ['set-idx3-ubyte.gz', 'set-idx3-ubyte', 'no_suffix.bin'])
def test_idx_gzipped_or_plain_is_read_whatever_its_name(tmp_path: Path, name: str) -> None:
    images = _images()
    if name.endswith('.gz') or name == 'no_suffix.bin':
        # The format is recognised from the content: a gzipped file need not end in .gz.
        raw = tmp_path / 'raw'
        write_idx(raw, images)
        (tmp_path / name).write_bytes(gzip.compress(raw.read_bytes()))
    else:
        write_idx(tmp_path / name, images)
    read = read_ood_images(tmp_path / name)
    assert read.dtype == np.uint8
    np.testing.assert_array_equal(read, images)


def test_npz_single_array_or_images_key(tmp_path: Path) -> None:
    images = _images()
    np.savez(tmp_path / 'one.npz', images)
    np.testing.assert_array_equal(read_ood_images(tmp_path / 'one.npz'), images)
    np.savez_compressed(tmp_path / 'keyed.npz', labels=np.arange(5), images=images)
    np.testing.assert_array_equal(read_ood_images(tmp_path / 'keyed.npz'), images)


def test_float_images_in_unit_range_become_pixel_units(tmp_path: Path) -> None:
    images = np.random.default_rng(1).random((4, 28, 28)).astype(np.float32)
    images[0, 0, 0], images[0, 0, 1] = 0.0, 1.0
    np.savez(tmp_path / 'float.npz', images=images)
    read = read_ood_images(tmp_path / 'float.npz')
    assert read.dtype == np.float32
    # Pixel units 0..255, as the uint8 sets, so the same standardisation applies to both.
    np.testing.assert_allclose(read, images.astype(np.float64) * 255.0, rtol=1e-6)


# --------------------------------------------------------------------------- bad files


def _write_bad(tmp_path: Path, case: str) -> Path:
    path = tmp_path / f'{case}.npz'
    if case == 'wrong_size':
        np.savez(path, np.zeros((3, 28, 27), np.uint8))
    elif case == 'wrong_rank':
        np.savez(path, np.zeros((3, 784), np.uint8))
    elif case == 'empty':
        np.savez(path, np.zeros((0, 28, 28), np.uint8))
    elif case == 'int16':
        np.savez(path, np.zeros((3, 28, 28), np.int16))
    elif case == 'float_range':
        np.savez(path, np.full((3, 28, 28), 255.0, np.float32))
    elif case == 'nan':
        images = np.zeros((3, 28, 28), np.float64)
        images[1, 2, 3] = np.nan
        np.savez(path, images)
    elif case == 'two_arrays':
        np.savez(path, a=_images(), b=_images())
    elif case == 'truncated_npz':
        np.savez(tmp_path / 'whole.npz', _images(50))
        path.write_bytes((tmp_path / 'whole.npz').read_bytes()[:600])
    elif case == 'truncated_gz':
        write_idx(tmp_path / 'whole-idx3-ubyte.gz', _images(50))
        path = tmp_path / 'cut-idx3-ubyte.gz'
        path.write_bytes((tmp_path / 'whole-idx3-ubyte.gz').read_bytes()[:100])
    elif case == 'idx_payload':
        path = tmp_path / 'short-idx3-ubyte'
        write_idx(path, _images(3))
        path.write_bytes(path.read_bytes()[:-10])
    elif case == 'idx_float':
        path = tmp_path / 'float-idx3'
        path.write_bytes(bytes([0, 0, 0x0D, 3]) + b''.join(
            n.to_bytes(4, 'big') for n in (1, 28, 28)) + b'\0' * 4 * 784)
    elif case == 'object_array':
        np.savez(path, np.array([{}], dtype=object))
    elif case == 'not_npy_member':
        with zipfile.ZipFile(path, 'w') as archive:
            archive.writestr('images.txt', 'hello')
    elif case == 'unknown_format':
        path = tmp_path / 'images.png'
        path.write_bytes(b'\x89PNG\r\n\x1a\n' + b'\0' * 64)
    elif case == 'missing':
        path = tmp_path / 'nowhere.npz'
    elif case == 'directory':
        path = tmp_path / 'folder.npz'
        path.mkdir()
    return path


BAD_CASES = {
    'wrong_size': r'expected 28x28 images, got 28x27',
    'wrong_rank': r'rank 2',
    'empty': r'holds no images',
    'int16': r'uint8 \(0\.\.255\) or float in \[0, 1\], got dtype int16',
    'float_range': r'must lie in \[0, 1\], found values in \[255, 255\]',
    'nan': r'1 pixel value\(s\) are not finite',
    'two_arrays': r"holds 2 arrays \['a', 'b'\]; expected one, or one named 'images'",
    'truncated_npz': r'cannot be read',
    'truncated_gz': r'cannot be read',
    'idx_payload': r'payload has',
    'idx_float': r'not an unsigned-byte idx file',
    'object_array': r"array 'arr_0' cannot be read \(Object arrays",
    'not_npy_member': r"'images.txt' in the archive is not a NumPy array",
    'unknown_format': r'unknown format \(expected an unsigned-byte IDX file',
    'missing': r'cannot be read \(No such file or directory\)',
    'directory': r'cannot be read \(Is a directory\)',
}


@pytest.mark.parametrize('case', sorted(BAD_CASES))
def test_bad_files_get_one_error_naming_the_file(tmp_path: Path, case: str) -> None:
    path = _write_bad(tmp_path, case)
    with pytest.raises(ValueError, match=BAD_CASES[case]) as info:
        read_ood_images(path)
    assert str(info.value).startswith(f'{path}: ')


# --------------------------------------------------------------------------- names


def test_parse_ood_argument() -> None:
    assert parse_ood_argument('EMNIST=data/x=y.npz', BUILT_IN) == ('EMNIST', Path('data/x=y.npz'))
    with pytest.raises(ValueError, match='expected NAME=PATH'):
        parse_ood_argument('letters.npz', BUILT_IN)
    with pytest.raises(ValueError, match='expected NAME=PATH'):
        parse_ood_argument('=letters.npz', BUILT_IN)
    with pytest.raises(ValueError, match="already used by 'FashionMNIST'"):
        parse_ood_argument('fashionmnist=letters.npz', BUILT_IN)
    with pytest.raises(ValueError, match="already used by 'MNIST'"):
        parse_ood_argument('MNIST=letters.npz', BUILT_IN)
    with pytest.raises(ValueError, match='may contain only'):
        parse_ood_argument('a|b=letters.npz', BUILT_IN)


def test_with_extra_ood_appends_after_the_built_in_sets(tmp_path: Path) -> None:
    data = MnistBenchmarkData(_images(), np.zeros(5, np.uint8), _images(), np.zeros(5, np.uint8),
                              {name: _images() for name in OOD_SETS}, tmp_path)
    extra = data.with_extra_ood({'Noise': (tmp_path / 'n.npz', _images(3))})
    assert list(extra.ood_images) == [*OOD_SETS, 'Noise']
    assert extra.extra_ood_paths == {'Noise': tmp_path / 'n.npz'}
    with pytest.raises(ValueError, match='already used'):
        extra.with_extra_ood({'Noise': (tmp_path / 'n.npz', _images(3))})


# --------------------------------------------------------------------------- command line


@pytest.mark.parametrize('arguments, message', [
    (['--ood', 'letters.npz'], "--ood 'letters.npz': expected NAME=PATH"),
    (['--ood', 'KMNIST={good}'], "the name 'KMNIST' is already used by 'KMNIST'"),
    (['--ood', 'A={good}', '--ood', 'a={good}'], "the name 'a' is already used by 'A'"),
    (['--ood', 'A={good}', '--ood', 'B={bad}'], '{bad}: expected 28x28 images, got 28x27'),
])
def test_command_rejects_bad_ood_with_exit_code_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str],
        message: str) -> None:
    good = tmp_path / 'good.npz'
    np.savez(good, _images())
    bad = _write_bad(tmp_path, 'wrong_size')
    arguments = [a.format(good=good, bad=bad) for a in arguments]
    # The --ood sets are checked before the benchmark data is read, so no data is needed.
    code = cli.main(['bench', 'mnist', '--data-dir', str(tmp_path), '--out',
                     str(tmp_path / 'out'), '--no-progress', *arguments])
    err = capsys.readouterr().err
    assert code == 2
    assert message.format(bad=bad) in err
    assert 'Traceback' not in err
    assert not (tmp_path / 'out').exists()
