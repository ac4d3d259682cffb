"""`uq data fetch` against a real HTTP server on this machine (``http.server`` in a thread).

The server serves the files of a temporary folder, answers ``Range`` requests like a
publisher's server (or ignores them, like some mirrors), and can close the connection in the
middle of a body, as a dropped network does. Every test checks what the download leaves on
disk: the publisher's file under its name, or nothing under that name.
"""

from __future__ import annotations

import hashlib
import http.server
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest

from uq_common import cli
from uq_eval.mnist.data import default_data_dir
from uq_eval.mnist.fetch import (
    DATASETS,
    PART_SUFFIX,
    ChecksumMismatch,
    Dataset,
    FetchError,
    PublishedFile,
    fetch_dataset,
    fetch_file,
    parse_mirrors,
    resolve_names,
    sha256_of,
)

SIZE = 300_000   # several read chunks
CUT_AT = 100_000


@dataclass
class Server:
    """A file server for one test: what it serves, how it misbehaves, what it was asked."""

    root: Path
    url: str = ''
    honour_ranges: bool = True
    cut_after: int | None = None  # close the connection after this many bytes of a body
    cuts_left: int = 0            # how many responses are cut off
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    body_bytes: int = 0         # bytes of bodies sent, over all requests


def _handler(state: Server) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            wanted = self.headers.get('Range')
            state.requests.append((self.path, wanted))
            relative = unquote(self.path).lstrip('/')
            path = state.root / relative
            if '..' in Path(relative).parts or not path.is_file():
                self.send_error(404)
                return
            data = path.read_bytes()
            start = 0
            if wanted and state.honour_ranges:
                match = re.fullmatch(r'bytes=(\d+)-', wanted)
                assert match, f'unexpected Range header {wanted!r}'
                start = int(match.group(1))
                if start >= len(data):
                    self.send_response(416)
                    self.send_header('Content-Range', f'bytes */{len(data)}')
                    self.send_header('Content-Length', '0')
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header('Content-Range', f'bytes {start}-{len(data) - 1}/{len(data)}')
            else:
                self.send_response(200)
            self.send_header('Content-Length', str(len(data) - start))
            self.end_headers()
            end = len(data)
            if state.cut_after is not None and state.cuts_left > 0:
                state.cuts_left -= 1
                end = min(end, start + state.cut_after)
                self.close_connection = True
            self.wfile.write(data[start:end])
            self.wfile.flush()
            state.body_bytes += end - start

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    state = Server(root=tmp_path / 'served')
    state.root.mkdir()
    httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _handler(state))
    httpd.daemon_threads = True
    # shutdown() waits for the serving loop to look at its flag, once a poll interval: the
    # default 0.5 s was half a second of every test's teardown.
    thread = threading.Thread(target=httpd.serve_forever, kwargs={'poll_interval': 0.02},
                              daemon=True)
    thread.start()
    state.url = f'http://127.0.0.1:{httpd.server_address[1]}'
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def _publish(server: Server, relative: str, data: bytes) -> PublishedFile:
    """Serve ``data`` at ``relative`` and describe it as its publisher would."""
    path = server.root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return PublishedFile(Path(relative).name, len(data), hashlib.sha256(data).hexdigest())


def _payload(seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, SIZE, dtype=np.uint8).tobytes()


def _fetch(server: Server, file: PublishedFile, dest: Path, **options: object):
    options = {'tries': 1, 'retry_pause_s': 0.0, 'progress': False, 'log': lambda _: None,
               **options}
    return fetch_file(dest, file, [f'{server.url}/set/'], **options)  # type: ignore[arg-type]


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


# --------------------------------------------------------------------------- downloads


def test_a_good_download_is_verified_and_takes_its_name(server: Server, tmp_path: Path) -> None:
    data = _payload()
    file = _publish(server, 'set/images.gz', data)
    dest = tmp_path / 'data' / 'set'
    lines: list[str] = []
    result = _fetch(server, file, dest, log=lines.append)
    assert result.status == 'downloaded' and result.received == SIZE
    assert (dest / 'images.gz').read_bytes() == data
    assert _leftovers(dest) == ['images.gz']
    assert any('SHA-256 verified' in line for line in lines)
    # A second run checks the file and asks the server for nothing.
    asked = len(server.requests)
    assert _fetch(server, file, dest).status == 'present'
    assert len(server.requests) == asked


def test_a_corrupted_file_is_refused_named_and_not_kept(server: Server, tmp_path: Path) -> None:
    data = _payload()
    file = _publish(server, 'set/images.gz', data)
    corrupted = bytearray(data)
    corrupted[SIZE // 2] ^= 0xFF   # same size, one byte flipped
    (server.root / 'set' / 'images.gz').write_bytes(bytes(corrupted))
    dest = tmp_path / 'data' / 'set'
    with pytest.raises(ChecksumMismatch) as info:
        _fetch(server, file, dest, tries=3)
    message = str(info.value)
    assert 'images.gz' in message and file.sha256 in message and '\n' not in message
    assert _leftovers(dest) == []
    assert len(server.requests) == 1   # a wrong file is not asked for again


def test_a_file_of_another_size_is_refused(server: Server, tmp_path: Path) -> None:
    file = _publish(server, 'set/images.gz', _payload())
    dest = tmp_path / 'data' / 'set'
    for served in (b'short', _payload() + b'tail'):
        (server.root / 'set' / 'images.gz').write_bytes(served)
        with pytest.raises(ChecksumMismatch, match=r'images\.gz .*not the publisher'):
            _fetch(server, file, dest, tries=3)
        assert _leftovers(dest) == []


def test_an_interrupted_download_leaves_no_file_under_its_name(server: Server,
                                                               tmp_path: Path) -> None:
    file = _publish(server, 'set/images.gz', _payload())
    server.cut_after, server.cuts_left = CUT_AT, 10
    dest = tmp_path / 'data' / 'set'
    with pytest.raises(FetchError) as info:
        _fetch(server, file, dest, tries=2)
    assert not isinstance(info.value, ChecksumMismatch)
    assert 'images.gz' in str(info.value) and '\n' not in str(info.value)
    # The second try resumed from the kept bytes, and was cut off again.
    assert [r for _, r in server.requests] == [None, f'bytes={CUT_AT}-']
    assert f'{2 * CUT_AT:,} bytes received are kept' in str(info.value)
    assert not (dest / 'images.gz').exists()
    assert _leftovers(dest) == ['images.gz' + PART_SUFFIX]
    assert (dest / ('images.gz' + PART_SUFFIX)).stat().st_size == 2 * CUT_AT


def test_a_later_run_resumes_from_the_partial_file(server: Server, tmp_path: Path) -> None:
    data = _payload()
    file = _publish(server, 'set/images.gz', data)
    dest = tmp_path / 'data' / 'set'
    server.cut_after, server.cuts_left = CUT_AT, 1
    with pytest.raises(FetchError):
        _fetch(server, file, dest)
    server.requests.clear()
    server.body_bytes = 0
    result = _fetch(server, file, dest)
    assert server.requests == [('/set/images.gz', f'bytes={CUT_AT}-')]
    assert result.received == server.body_bytes == SIZE - CUT_AT
    assert (dest / 'images.gz').read_bytes() == data
    assert _leftovers(dest) == ['images.gz']


def test_one_run_resumes_a_cut_transfer_itself(server: Server, tmp_path: Path) -> None:
    data = _payload()
    file = _publish(server, 'set/images.gz', data)
    server.cut_after, server.cuts_left = CUT_AT, 1
    dest = tmp_path / 'data' / 'set'
    result = _fetch(server, file, dest, tries=2)
    assert result.status == 'downloaded' and result.received == SIZE - CUT_AT
    assert [r for _, r in server.requests] == [None, f'bytes={CUT_AT}-']
    assert server.body_bytes == SIZE
    assert (dest / 'images.gz').read_bytes() == data


def test_a_resume_that_the_server_ignores_starts_over(server: Server, tmp_path: Path) -> None:
    data = _payload()
    file = _publish(server, 'set/images.gz', data)
    dest = tmp_path / 'data' / 'set'
    server.cut_after, server.cuts_left = CUT_AT, 1
    with pytest.raises(FetchError):
        _fetch(server, file, dest)
    server.honour_ranges = False
    server.body_bytes = 0
    result = _fetch(server, file, dest)
    assert result.received == server.body_bytes == SIZE
    assert (dest / 'images.gz').read_bytes() == data
    assert _leftovers(dest) == ['images.gz']


def test_a_corrupted_resume_is_refused_and_the_partial_file_dropped(server: Server,
                                                                    tmp_path: Path) -> None:
    file = _publish(server, 'set/images.gz', _payload())
    dest = tmp_path / 'data' / 'set'
    dest.mkdir(parents=True)
    # Kept bytes that are not the start of the publisher's file.
    (dest / ('images.gz' + PART_SUFFIX)).write_bytes(b'\0' * CUT_AT)
    with pytest.raises(ChecksumMismatch, match='SHA-256'):
        _fetch(server, file, dest)
    assert _leftovers(dest) == []


def test_a_wrong_file_under_the_name_is_replaced_once_the_new_one_checks(
        server: Server, tmp_path: Path) -> None:
    data = _payload()
    file = _publish(server, 'set/images.gz', data)
    dest = tmp_path / 'data' / 'set'
    dest.mkdir(parents=True)
    (dest / 'images.gz').write_bytes(b'an older, different file')
    assert _fetch(server, file, dest).status == 'downloaded'
    assert (dest / 'images.gz').read_bytes() == data


def _same_size_wrong_bytes(data: bytes) -> dict[str, bytes]:
    """Files of the publisher's size that are not its file: one byte changed at the start,
    the middle or the end, every byte zero, the bytes reversed."""
    def flipped(at: int) -> bytes:
        out = bytearray(data)
        out[at] ^= 0x01
        return bytes(out)

    return {'first byte': flipped(0), 'middle byte': flipped(len(data) // 2),
            'last byte': flipped(len(data) - 1), 'zeros': bytes(len(data)),
            'reversed': data[::-1]}


def test_a_file_of_the_right_size_with_other_bytes_is_never_taken_as_verified(
        server: Server, tmp_path: Path) -> None:
    # The size alone proves nothing: a file already under its final name is used only when
    # its SHA-256 is the publisher's; otherwise it is fetched again and replaced.
    data = _payload()
    file = _publish(server, 'set/images.gz', data)
    for case, wrong in _same_size_wrong_bytes(data).items():
        assert len(wrong) == file.size and wrong != data, case
        dest = tmp_path / case.replace(' ', '_') / 'set'
        dest.mkdir(parents=True)
        (dest / 'images.gz').write_bytes(wrong)
        lines: list[str] = []
        asked = len(server.requests)
        result = _fetch(server, file, dest, log=lines.append)
        assert result.status == 'downloaded', case
        assert len(server.requests) == asked + 1, case
        assert (dest / 'images.gz').read_bytes() == data, case
        assert not any('present, SHA-256 verified' in line for line in lines), case
        assert _leftovers(dest) == ['images.gz'], case


def test_a_wrong_file_of_the_right_size_is_refused_when_no_source_has_the_file(
        server: Server, tmp_path: Path) -> None:
    # Nothing to replace it with: the run fails; the wrong file is never reported as the
    # publisher's.
    data = _payload()
    file = PublishedFile('absent.gz', len(data), hashlib.sha256(data).hexdigest())
    dest = tmp_path / 'data' / 'set'
    dest.mkdir(parents=True)
    (dest / 'absent.gz').write_bytes(_same_size_wrong_bytes(data)['last byte'])
    lines: list[str] = []
    with pytest.raises(FetchError, match='absent.gz could not be downloaded'):
        _fetch(server, file, dest, log=lines.append)
    assert not any('verified' in line for line in lines)


def _record_flushes_and_renames(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Record, in order, each os.fsync (the file's identity and size at that moment, or
    'folder') and each os.replace (the source's identity and size, and both names)."""
    import os
    import stat

    calls: list[tuple] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        info = os.fstat(fd)
        kind = 'folder' if stat.S_ISDIR(info.st_mode) else 'file'
        calls.append(('fsync', kind, (info.st_dev, info.st_ino), info.st_size))
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path, **kw: object) -> None:
        info = os.stat(src)
        calls.append(('replace', Path(src), Path(dst), (info.st_dev, info.st_ino),
                      info.st_size))
        real_replace(src, dst, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, 'fsync', fsync)
    monkeypatch.setattr(os, 'replace', replace)
    return calls


@pytest.mark.parametrize('how', ['whole', 'resumed in one run', 'resumed by a later run',
                                 'resume ignored by the server'])
def test_the_whole_file_is_flushed_to_disk_before_it_takes_its_name(
        server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    # A rename that reaches the disk before the bytes would leave, after a power cut, a file
    # under its final name that was never checked: every byte is fsynced first, then the
    # rename, then the folder (which makes the rename durable).
    data = _payload()
    file = _publish(server, 'set/images.gz', data)
    dest = tmp_path / 'data' / 'set'
    if how != 'whole':
        server.cut_after, server.cuts_left = CUT_AT, 1
    if how in ('resumed by a later run', 'resume ignored by the server'):
        with pytest.raises(FetchError):
            _fetch(server, file, dest)
        server.honour_ranges = how == 'resumed by a later run'
    calls = _record_flushes_and_renames(monkeypatch)
    _fetch(server, file, dest, tries=2)
    assert (dest / 'images.gz').read_bytes() == data
    renames = [i for i, c in enumerate(calls) if c[0] == 'replace']
    assert len(renames) == 1, calls
    _, src, dst, renamed, size = calls[renames[0]]
    assert (src.name, dst) == ('images.gz' + PART_SUFFIX, dest / 'images.gz')
    assert size == SIZE
    flushed = [c for c in calls[:renames[0]] if c[:3] == ('fsync', 'file', renamed)]
    assert flushed and flushed[-1][3] == SIZE, calls  # all of it, not only a first part
    assert any(c[:2] == ('fsync', 'folder') for c in calls[renames[0] + 1:]), calls


def test_the_next_source_is_tried_when_one_lacks_the_file(server: Server,
                                                          tmp_path: Path) -> None:
    data = _payload()
    file = _publish(server, 'second/images.gz', data)
    dest = tmp_path / 'data' / 'set'
    result = fetch_file(dest, file, [f'{server.url}/first/', f'{server.url}/second/'],
                        tries=1, progress=False, log=lambda _: None)
    assert result.url == f'{server.url}/second/images.gz'
    assert (dest / 'images.gz').read_bytes() == data
    with pytest.raises(FetchError, match=r'images\.gz could not be downloaded \(.*HTTP 404'):
        fetch_file(tmp_path / 'other', file, [f'{server.url}/first/'], tries=3,
                   progress=False, log=lambda _: None)
    assert _leftovers(tmp_path / 'other') == []


def test_a_dataset_lands_in_its_folder_from_a_mirror(server: Server, tmp_path: Path) -> None:
    files = tuple(_publish(server, f'toy/{name}', _payload(seed))
                  for seed, name in enumerate(('a.gz', 'b.gz')))
    toy = Dataset('toy', 'Toy', ('http://127.0.0.1:9/unused/',), files)
    results = fetch_dataset(tmp_path / 'data', toy, {'toy': (f'{server.url}/toy/',)},
                            progress=False, log=lambda _: None, tries=1)
    assert [r.status for r in results] == ['downloaded', 'downloaded']
    for file in files:
        assert sha256_of(tmp_path / 'data' / 'toy' / file.name) == file.sha256


# --------------------------------------------------------------------------- names, mirrors


def test_names_and_mirrors() -> None:
    assert resolve_names([]) == resolve_names(['all']) == list(DATASETS)
    assert resolve_names(['notmnist', 'mnist', 'mnist']) == ['mnist', 'notmnist']
    with pytest.raises(ValueError, match="unknown dataset 'emnist'"):
        resolve_names(['emnist'])
    everywhere = parse_mirrors(['http://mirror.example/data/'])
    assert everywhere['kmnist'] == ('http://mirror.example/data/kmnist/',)
    assert set(everywhere) == set(DATASETS)
    one = parse_mirrors(['kmnist=https://example.org/k/?a=b'])
    assert one == {'kmnist': ('https://example.org/k/?a=b',)}
    with pytest.raises(ValueError, match="'emnist' is no dataset"):
        parse_mirrors(['emnist=http://x/'])


def test_every_published_file_has_a_size_and_a_sha256() -> None:
    for dataset in DATASETS.values():
        assert dataset.sources and dataset.files
        for file in dataset.files:
            assert file.size > 0 and re.fullmatch(r'[0-9a-f]{64}', file.sha256)


# --------------------------------------------------------------------------- the command


def test_an_unknown_dataset_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(['data', 'fetch', 'mnist', 'emnist']) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and "unknown dataset 'emnist'" in err


def test_the_command_refuses_a_wrong_file_in_one_line(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = DATASETS['notmnist'].files[0]
    _publish(server, f'notmnist/{first.name}', b'not the publisher\'s file')
    code = cli.main(['data', 'fetch', 'notmnist', '--mirror', server.url, '--data-dir',
                     str(tmp_path / 'data'), '--no-progress', '--tries', '1'])
    assert code == 1
    err = capsys.readouterr().err
    assert err.count('\n') == 1
    assert f'notmnist/{first.name}' in err and "not the publisher's file" in err
    assert _leftovers(tmp_path / 'data' / 'notmnist') == []


def test_the_command_fetches_the_real_files_from_a_mirror(
        server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The hard-coded sizes and SHA-256 values against the publishers' files, where the
    data directory holds them (served by the local server as a mirror)."""
    try:
        source = default_data_dir()
    except FileNotFoundError as err:
        pytest.skip(f'benchmark data missing: {err}')
    missing = [f'{d.name}/{f.name}' for d in DATASETS.values() for f in d.files
               if not (source / d.name / f.name).is_file()]
    if missing:
        pytest.skip(f'{source} lacks {", ".join(missing)} (`uq data fetch all` gets them)')
    for dataset in DATASETS.values():
        (server.root / dataset.name).symlink_to(source / dataset.name)
    monkeypatch.setenv('UQ_DATA_MIRROR', server.url)
    monkeypatch.setenv('UQ_DATA_DIR', str(tmp_path / 'data'))
    assert cli.main(['data', 'fetch', 'all', '--no-progress']) == 0
    out = capsys.readouterr().out
    for dataset in DATASETS.values():
        for file in dataset.files:
            assert f'{dataset.name}/{file.name}: {file.size:,} bytes, SHA-256 verified' in out
            assert (tmp_path / 'data' / dataset.name / file.name).stat().st_size == file.size
