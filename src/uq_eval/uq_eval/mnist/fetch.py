"""Download the datasets of ``uq bench mnist`` from their publishers, every file checked.

ROS-free; the standard library's ``urllib`` does the transfers and tqdm draws the progress
bar. Each dataset is one folder of the data directory (:mod:`uq_eval.mnist.data`) holding
the publisher's files under their own names. The files are those the benchmark reads: both
splits of MNIST, and the test split (images and labels) of each unknown set.

What reaches a file's final name is exactly the publisher's file:

- the bytes go to ``NAME.part`` in the destination folder; once the last byte is in, the
  file is flushed to disk (fsync), its SHA-256 compared with the publisher's (hard-coded
  below), and only then renamed to ``NAME`` (atomic on one file system) and the folder
  synced;
- a file whose size or SHA-256 differs is deleted and refused (:class:`ChecksumMismatch`);
- a transfer cut off (the connection closed or timed out before the last byte) keeps
  ``NAME.part``: the next try, in the same run or a later one, asks only for the rest with
  an HTTP ``Range`` request. A server that ignores ``Range`` sends the whole file, which
  then starts over. The resumed file is checked as a whole like any other.

A file already present under its final name with the right SHA-256 is not downloaded
again; one with another SHA-256 is downloaded again and replaced once the new copy checks.

Each dataset has a list of sources (base URLs tried in order); a mirror laid out like the
data directory, or a base URL per dataset, replaces them (:func:`parse_mirrors`).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    'ALL',
    'ChecksumMismatch',
    'DATASETS',
    'Dataset',
    'FetchError',
    'FetchResult',
    'MIRROR_ENV',
    'PublishedFile',
    'fetch_dataset',
    'fetch_file',
    'parse_mirrors',
    'resolve_names',
    'sha256_of',
]

#: The name that stands for every dataset.
ALL = 'all'
#: Environment variable with a mirror for every dataset (same forms as ``--mirror``).
MIRROR_ENV = 'UQ_DATA_MIRROR'
PART_SUFFIX = '.part'
_CHUNK = 1 << 16
_USER_AGENT = 'uq-data-fetch/0.1 (Python urllib)'


@dataclass(frozen=True)
class PublishedFile:
    """One file as its publisher distributes it."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Dataset:
    """A dataset: its folder name, where it is published, and the files to fetch.

    ``sources`` are base URLs tried in order; a file's URL is the base URL followed by
    its name.
    """

    name: str
    title: str
    sources: tuple[str, ...]
    files: tuple[PublishedFile, ...]


def _files(*rows: tuple[str, int, str]) -> tuple[PublishedFile, ...]:
    return tuple(PublishedFile(*row) for row in rows)


#: The benchmark's datasets. The SHA-256 values are those of the publishers' files; for
#: MNIST the copies that PyTorch and TensorFlow host come first because the original site
#: often refuses scripted downloads; every copy must have the publisher's SHA-256.
DATASETS: dict[str, Dataset] = {d.name: d for d in (
    Dataset(
        'mnist', 'MNIST',
        ('https://ossci-datasets.s3.amazonaws.com/mnist/',
         'https://storage.googleapis.com/cvdf-datasets/mnist/',
         'http://yann.lecun.com/exdb/mnist/'),
        _files(
            ('train-images-idx3-ubyte.gz', 9912422,
             '440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609'),
            ('train-labels-idx1-ubyte.gz', 28881,
             '3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c'),
            ('t10k-images-idx3-ubyte.gz', 1648877,
             '8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6'),
            ('t10k-labels-idx1-ubyte.gz', 4542,
             'f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6'),
        )),
    Dataset(
        'fashion_mnist', 'Fashion-MNIST',
        ('http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/',
         'https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/'),
        _files(
            ('t10k-images-idx3-ubyte.gz', 4422102,
             '346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073'),
            ('t10k-labels-idx1-ubyte.gz', 5148,
             '67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5'),
        )),
    Dataset(
        'kmnist', 'Kuzushiji-MNIST',
        ('http://codh.rois.ac.jp/kmnist/dataset/kmnist/',),
        _files(
            ('t10k-images-idx3-ubyte.gz', 3041136,
             'edd7a857845ad6bb1d0ba43fe7e794d164fe2dce499a1694695a792adfac43c5'),
            ('t10k-labels-idx1-ubyte.gz', 5120,
             '20bb9a0ef54c7db3efc55a92eef5582c109615df22683c380526788f98e42a1c'),
        )),
    Dataset(
        'notmnist', 'notMNIST (10,000-glyph sample in MNIST format)',
        ('https://raw.githubusercontent.com/davidflanagan/notMNIST-to-MNIST/'
         '17823f4d4a3acd8317c07866702d2eb2ac79c7a0/',),
        _files(
            ('t10k-images-idx3-ubyte.gz', 3172375,
             '70ae9e06201f2827e5b0a3781a3169d735dd2efc69996b9eeaee7f10ed4044d7'),
            ('t10k-labels-idx1-ubyte.gz', 5118,
             '1fa03836e01c862542f8eb83463bb951bebec6fcb3efa28dad748c6b38a9021b'),
        )),
)}


class FetchError(Exception):
    """A file could not be fetched; the message is one line that names it."""


class ChecksumMismatch(FetchError):
    """A downloaded file is not the publisher's file (size or SHA-256); it was deleted."""


class _Unavailable(Exception):
    """The source answered but does not serve the file (HTTP error): try another source."""


class _Interrupted(Exception):
    """The transfer failed or stopped early: another try may resume it."""


@dataclass(frozen=True)
class FetchResult:
    """What :func:`fetch_file` did: ``downloaded`` (from ``url``) or ``present``.

    ``received`` counts the bytes of the transfer that completed the file (the rest of it,
    when that transfer resumed a partial file).
    """

    path: Path
    status: str
    url: str | None = None
    received: int = 0


def resolve_names(names: Iterable[str]) -> list[str]:
    """The dataset names to fetch, in :data:`DATASETS` order, without repeats.

    ``all`` (or no name) stands for every dataset.

    Raises
    ------
    ValueError
        For a name that is no dataset; the message lists the valid ones.
    """
    names = list(names) or [ALL]
    unknown = [n for n in names if n != ALL and n not in DATASETS]
    if unknown:
        raise ValueError(f'unknown dataset {unknown[0]!r} (choose from '
                         f'{", ".join([*DATASETS, ALL])})')
    if ALL in names:
        return list(DATASETS)
    return [n for n in DATASETS if n in names]


def parse_mirrors(values: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The sources that replace the publishers', from ``--mirror`` values.

    ``URL`` is a mirror laid out like the data directory: dataset ``NAME``'s files are read
    from ``URL/NAME/``. ``NAME=URL`` gives dataset ``NAME``'s base URL itself. Later values
    win.

    Returns
    -------
    dict
        Dataset name -> the base URL to use instead of its sources.

    Raises
    ------
    ValueError
        For an empty URL or a ``NAME=`` that names no dataset.
    """
    chosen: dict[str, tuple[str, ...]] = {}
    for value in values:
        head, sep, tail = value.partition('=')
        if sep and '/' not in head and ':' not in head:
            if head not in DATASETS:
                raise ValueError(f'--mirror {value!r}: {head!r} is no dataset (choose from '
                                 f'{", ".join(DATASETS)})')
            if not tail:
                raise ValueError(f'--mirror {value!r}: the URL is empty')
            chosen[head] = (tail,)
            continue
        if not value:
            raise ValueError('--mirror: the URL is empty')
        for name in DATASETS:
            chosen[name] = (f'{value.rstrip("/")}/{name}/',)
    return chosen


def sha256_of(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, 'rb') as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b''):
            digest.update(chunk)
    return digest.hexdigest()


def _url(base: str, name: str) -> str:
    return f'{base.rstrip("/")}/{name}'


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the platform allows opening folders)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _transfer(url: str, part: Path, file: PublishedFile, label: str, timeout_s: float,
              progress: bool, log: Callable[[str], None]) -> int:
    """Bring ``part`` up to the file's full size from ``url``, resuming what it holds.

    Returns the bytes received. Raises :class:`_Unavailable`, :class:`_Interrupted` or
    :class:`ChecksumMismatch` (a file larger or, received whole, smaller than the
    publisher's).
    """
    from tqdm import tqdm

    offset = _size_of(part)
    if offset > file.size:
        part.unlink()
        offset = 0
    if offset == file.size:
        return 0
    headers = {'User-Agent': _USER_AGENT}
    if offset:
        headers['Range'] = f'bytes={offset}-'
    log(f'{label}: downloading from {url}'
        + (f' (resuming at byte {offset:,} of {file.size:,})' if offset else ''))
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                          timeout=timeout_s)
    except urllib.error.HTTPError as error:
        error.close()
        if error.code == 416 and offset:
            # The server refuses the range of the kept bytes: they cannot be resumed.
            part.unlink()
            raise _Interrupted(f'{url}: HTTP 416, the kept partial file was dropped') from None
        raise _Unavailable(f'{url}: HTTP {error.code} {error.reason}') from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        reason = getattr(error, 'reason', None) or error
        raise _Interrupted(f'{url}: {reason}') from None
    received = 0
    with response:
        if offset and response.status == 206 and not response.headers.get(
                'Content-Range', '').startswith(f'bytes {offset}-'):
            part.unlink()
            raise _Interrupted(f'{url}: the server answered the resume request with another '
                               f'range ({response.headers.get("Content-Range")}); the kept '
                               'partial file was dropped')
        if offset and response.status != 206:
            log(f'{label}: the server sends the whole file; starting over')
            offset = 0
        with open(part, 'ab' if offset else 'wb') as out, tqdm(
                total=file.size, initial=offset, unit='B', unit_scale=True,
                unit_divisor=1024, desc=label, disable=not progress, leave=False) as bar:
            try:
                while chunk := response.read(_CHUNK):
                    if offset + received + len(chunk) > file.size:
                        raise ChecksumMismatch(_refusal(
                            label, url, f'more than the expected {file.size:,} bytes'))
                    out.write(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
            except (OSError, http.client.HTTPException) as error:
                why = str(error) or type(error).__name__
                raise _Interrupted(f'{url}: transfer stopped after {offset + received:,} '
                                   f'of {file.size:,} bytes ({why})') from None
            finally:
                out.flush()
                os.fsync(out.fileno())
        whole_body = _body_was_whole(response, received)
    if offset + received < file.size:
        if whole_body:
            raise ChecksumMismatch(_refusal(
                label, url, f'{offset + received:,} bytes, expected {file.size:,}'))
        raise _Interrupted(f'{url}: the connection closed after {offset + received:,} of '
                           f'{file.size:,} bytes')
    return received


def _body_was_whole(response: object, received: int) -> bool:
    """Whether the response ended where it said it would (a short file, not a cut transfer).

    True when all of a declared ``Content-Length`` arrived, or a chunked body ended with
    its last chunk (http.client raises on a chunked body cut off); a body delimited only by
    the closing connection cannot tell and counts as cut off.
    """
    headers = getattr(response, 'headers', {})
    declared = headers.get('Content-Length')
    if declared is not None:
        return declared.strip().isdigit() and received == int(declared)
    return headers.get('Transfer-Encoding', '').lower() == 'chunked'


def fetch_file(folder: str | os.PathLike[str], file: PublishedFile, sources: Sequence[str],
               *, label: str | None = None, tries: int = 3, timeout_s: float = 60.0,
               retry_pause_s: float = 2.0, progress: bool = True,
               log: Callable[[str], None] = print) -> FetchResult:
    """Put the publisher's ``file`` into ``folder``, checked, from the first source that has it.

    Parameters
    ----------
    folder : path-like
        Destination folder (created if missing).
    file : PublishedFile
        Name, size and SHA-256 of the publisher's file.
    sources : sequence of str
        Base URLs (``http``, ``https`` or ``file``), tried in order.
    label : str, optional
        How messages name the file (default: its name).
    tries : int
        Rounds over the sources while transfers are cut off; each round resumes from the
        bytes already received. A round in which every source answers with an HTTP error
        ends the attempts.
    timeout_s : float
        Socket timeout of each connection and read.
    retry_pause_s : float
        Pause before another round.
    progress : bool
        Draw a progress bar on stderr.
    log : callable
        Receives one line per step (which source, resumes, the result).

    Returns
    -------
    FetchResult

    Raises
    ------
    ChecksumMismatch
        If the downloaded file's size or SHA-256 is not the publisher's; nothing is left
        under its name, final or partial.
    FetchError
        If no source delivered the file; a partial download is kept as ``NAME.part`` for
        the next run to resume.
    OSError
        If the folder cannot be written.
    """
    if tries < 1:
        raise ValueError(f'tries must be >= 1, got {tries}')
    if not sources:
        raise ValueError(f'no source for {file.name}')
    folder = Path(folder)
    label = label or file.name
    final = folder / file.name
    if final.is_file():
        if final.stat().st_size == file.size and sha256_of(final) == file.sha256:
            log(f'{label}: present, SHA-256 verified')
            return FetchResult(final, 'present')
        log(f'{label}: present but not the publisher\'s file (size or SHA-256 differs); '
            'downloading it again')
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / (file.name + PART_SUFFIX)
    reasons: list[str] = []
    for attempt in range(tries):
        if attempt:
            time.sleep(retry_pause_s)
        interrupted = False
        for base in sources:
            url = _url(base, file.name)
            try:
                received = _transfer(url, part, file, label, timeout_s, progress, log)
            except _Unavailable as error:
                reasons.append(str(error))
                continue
            except _Interrupted as error:
                reasons.append(str(error))
                interrupted = True
                continue
            except ChecksumMismatch:
                part.unlink(missing_ok=True)
                raise
            return _accept(part, final, file, label, url, received, log)
        if not interrupted:
            break
    kept = _size_of(part)
    if part.exists() and not kept:
        part.unlink()
    note = (f'; the {kept:,} bytes received are kept in {part.name} and the next run '
            'resumes from them') if kept else ''
    raise FetchError(f'{label} could not be downloaded ({reasons[-1]}){note}')


def _refusal(label: str, url: str, difference: str) -> str:
    return f'{label} from {url} is not the publisher\'s file ({difference}); it was deleted'


def _accept(part: Path, final: Path, file: PublishedFile, label: str, url: str,
            received: int, log: Callable[[str], None]) -> FetchResult:
    """Check the complete ``part`` and give it the final name, or delete it and refuse it."""
    digest = sha256_of(part)
    if digest != file.sha256:
        part.unlink()
        raise ChecksumMismatch(_refusal(label, url,
                                        f'SHA-256 {digest}, expected {file.sha256}'))
    # A part completed by an earlier run that was killed may never have reached the disk;
    # the final name must only ever hold flushed, verified bytes.
    with open(part, 'rb+') as stream:
        os.fsync(stream.fileno())
    os.replace(part, final)
    _fsync_folder(final.parent)
    log(f'{label}: {file.size:,} bytes, SHA-256 verified')
    return FetchResult(final, 'downloaded', url, received)


def fetch_dataset(root: str | os.PathLike[str], dataset: Dataset,
                  sources: Mapping[str, Sequence[str]] | None = None, *, tries: int = 3,
                  timeout_s: float = 60.0, retry_pause_s: float = 2.0, progress: bool = True,
                  log: Callable[[str], None] = print) -> list[FetchResult]:
    """Fetch every file of ``dataset`` into ``root/<dataset.name>/`` (:func:`fetch_file`).

    ``sources`` maps dataset names to base URLs that replace the dataset's own
    (:func:`parse_mirrors`); the other arguments are :func:`fetch_file`'s. Stops at the
    first file that fails.
    """
    bases = tuple((sources or {}).get(dataset.name, dataset.sources))
    folder = Path(root) / dataset.name
    return [fetch_file(folder, file, bases, label=f'{dataset.name}/{file.name}', tries=tries,
                       timeout_s=timeout_s, retry_pause_s=retry_pause_s, progress=progress,
                       log=log)
            for file in dataset.files]
