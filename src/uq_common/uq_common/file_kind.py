"""What a file on disk looks like, for error messages about files of the wrong kind.

When a model or GP file cannot be read, the reader's own exception rarely says why ("[enforce
fail at inline_container.cc:180]", or nothing at all for an empty file). :func:`describe_file`
looks at the bytes and names what was found instead: an empty file, a truncated archive, an
NTK-GP state (``.npz``) where a detector was expected, a PyTorch checkpoint where a GP state
was expected, text, ...
"""

from __future__ import annotations

import zipfile
from pathlib import Path

_PREVIEW_BYTES = 24


def _zip_description(path: Path, size: int) -> str:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        return f'a truncated or damaged zip archive of {size} bytes ({exc})'
    if damaged is not None:
        return f'a zip archive of {size} bytes whose member {damaged!r} is damaged'
    if any(name.endswith('data.pkl') for name in names):
        return f'a PyTorch checkpoint (torch.save zip archive, {size} bytes)'
    if names and all(name.endswith('.npy') for name in names):
        members = sorted(name[:-4] for name in names)
        kind = ('an NTK-GP state file (NumPy .npz archive)' if 'meta' in members
                else 'a NumPy .npz archive')
        shown = ', '.join(members[:6]) + (', ...' if len(members) > 6 else '')
        return f'{kind} with arrays {shown} ({size} bytes)'
    shown = ', '.join(names[:4]) + (', ...' if len(names) > 4 else '')
    return f'a zip archive of {size} bytes holding {shown or "nothing"}'


def describe_file(path: str | Path) -> str:
    """A short description of what ``path`` holds, judged from its bytes.

    Never raises: an unreadable file is described as such.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open('rb') as handle:
            head = handle.read(_PREVIEW_BYTES)
    except OSError as exc:
        return f'an unreadable file ({exc.strerror or exc})'
    if size == 0:
        return 'an empty file (0 bytes)'
    if head.startswith(b'PK'):
        return _zip_description(path, size)
    if head.startswith(b'\x93NUMPY'):
        return f'a single NumPy .npy array ({size} bytes)'
    if head[:2] in (b'\x80\x02', b'\x80\x03', b'\x80\x04', b'\x80\x05'):
        return f'a Python pickle ({size} bytes; legacy torch.save format?)'
    try:
        text = head.decode('utf-8')
    except UnicodeDecodeError:
        return f'{size} bytes of unrecognised binary data starting {head[:8].hex(" ")}'
    return f'text ({size} bytes) starting {text.splitlines()[0][:_PREVIEW_BYTES]!r}' \
        if text.strip() else f'{size} bytes of blank text'
