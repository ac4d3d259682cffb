"""describe_file names what a file holds, from its bytes, without raising."""

from __future__ import annotations

import pickle
import zipfile

import numpy as np

from uq_common.file_kind import describe_file


def test_describes_common_kinds(tmp_path):
    empty = tmp_path / 'empty.pt'
    empty.write_bytes(b'')
    assert describe_file(empty) == 'an empty file (0 bytes)'

    npz = tmp_path / 'state.npz'
    np.savez(npz, meta=np.array('{}'), weights=np.zeros(3))
    assert describe_file(npz).startswith('an NTK-GP state file (NumPy .npz archive) with arrays '
                                         'meta, weights')
    plain = tmp_path / 'plain.npz'
    np.savez(plain, a=np.zeros(2))
    assert describe_file(plain).startswith('a NumPy .npz archive with arrays a')

    truncated = tmp_path / 'cut.npz'
    truncated.write_bytes(npz.read_bytes()[:40])
    assert describe_file(truncated).startswith('a truncated or damaged zip archive of 40 bytes')

    other_zip = tmp_path / 'other.zip'
    with zipfile.ZipFile(other_zip, 'w') as archive:
        archive.writestr('readme.txt', 'hello')
    assert 'holding readme.txt' in describe_file(other_zip)

    npy = tmp_path / 'a.npy'
    np.save(npy, np.zeros(2))
    assert describe_file(npy).startswith('a single NumPy .npy array')

    pickled = tmp_path / 'a.pkl'
    pickled.write_bytes(pickle.dumps({'a': 1}, protocol=4))
    assert describe_file(pickled).startswith('a Python pickle')

    text = tmp_path / 'notes.txt'
    text.write_text('hello world\nsecond line\n')
    assert describe_file(text) == "text (24 bytes) starting 'hello world'"

    binary = tmp_path / 'blob.bin'
    binary.write_bytes(bytes([0xff, 0xfe, 0x00, 0x81]))
    assert describe_file(binary) == '4 bytes of unrecognised binary data starting ff fe 00 81'


def test_missing_file_is_described_not_raised(tmp_path):
    assert describe_file(tmp_path / 'absent.pt').startswith('an unreadable file')
