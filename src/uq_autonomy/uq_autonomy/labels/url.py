"""Which label store to open: ``label_store_url`` values, shared by the ask-for-help node,
``uq labels`` and the labelling page (ROS-free).

Accepted forms (:func:`parse_store_url`):

- ``''`` (empty): the default SQLite file, ``$UQ_LABEL_STORE``, else
  ``$XDG_DATA_HOME/uq_autonomy/labels.sqlite3``;
- ``sqlite:///absolute/path.sqlite3`` (also SQLAlchemy's ``sqlite:////absolute/path.sqlite3``:
  the same file) or ``sqlite:relative/path.sqlite3``, or a plain file path: an SQLite file
  (one robot);
- ``postgresql://user[:password]@host[:port]/database`` (also ``postgres://``): a PostgreSQL
  database shared by a fleet. The driver (psycopg 3) is imported only for these.

Schemes are case-insensitive (``SQLite:``, ``PostgreSQL://``), as RFC 3986 has them; the URL
handed to the driver carries its scheme in lower case, the only spelling libpq reads.
Anything else is refused with a one-line :class:`ValueError`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from uq_autonomy.labels.store import (
    LabelStore,
    LabelStoreBase,
    LabelStoreError,
    default_store_path,
    open_for_reading,
)

POSTGRES_SCHEMES = ('postgresql', 'postgres')


@dataclass(frozen=True)
class StoreUrl:
    """A parsed ``label_store_url``: ``kind`` is ``'sqlite'`` (``path`` set) or
    ``'postgresql'`` (``url`` set)."""

    kind: str
    path: Path | None = None
    url: str = ''

    def __str__(self) -> str:
        if self.kind == 'sqlite':
            return f'sqlite://{self.path}' if str(self.path).startswith('/') else \
                f'sqlite:{self.path}'
        from uq_autonomy.labels.postgres import redact

        return redact(self.url)


def parse_store_url(value: str | os.PathLike[str] | None) -> StoreUrl:
    """The store a ``label_store_url`` names (see the module docstring).

    Raises
    ------
    ValueError
        On a scheme other than sqlite or postgresql, or an SQLite URL without a path.
    """
    text = '' if value is None else os.fspath(value).strip()
    if not text:
        return StoreUrl('sqlite', path=default_store_path())
    scheme, sep, rest = text.partition(':')
    if not sep or len(scheme) < 2 or '/' in scheme or not scheme.isascii():
        return StoreUrl('sqlite', path=Path(text).expanduser())  # a plain path
    scheme = scheme.lower()
    if scheme == 'sqlite':
        path = rest[2:] if rest.startswith('//') else rest
        # SQLAlchemy writes an absolute path with four slashes (sqlite:////abs): the same
        # file as sqlite:///abs. Left as '//abs', sqlite3 would read 'abs' as a URI host.
        if path.startswith('/'):
            path = '/' + path.lstrip('/')
        if not path or path == '/':
            raise ValueError(f'label store URL {text!r} names no file: use '
                             f'sqlite:///absolute/path.sqlite3 or sqlite:relative/path.sqlite3')
        return StoreUrl('sqlite', path=Path(path).expanduser())
    if scheme in POSTGRES_SCHEMES:
        if not rest.startswith('//'):
            raise ValueError(f'label store URL {text!r}: write postgresql://user@host:port/'
                             f'database')
        # libpq recognises a URI only by a lower-case prefix: PostgreSQL://... would be
        # read as a malformed key=value string.
        return StoreUrl('postgresql', url=f'{scheme}:{rest}')
    raise ValueError(f'label store URL {text!r}: unknown scheme {scheme!r}; use '
                     f'sqlite:///path.sqlite3 or postgresql://user@host:port/database')


def open_label_store(value: str | os.PathLike[str] | None, *, readonly: bool = False,
                     create: bool = True, timeout_s: float = 5.0,
                     clock: Callable[[], float] = time.time) -> LabelStoreBase:
    """Open the store a ``label_store_url`` names (created unless ``create`` is False).

    Raises
    ------
    ValueError
        On a malformed URL.
    LabelStoreError
        (a subclass) when the store cannot be opened; also when the PostgreSQL driver is
        not installed.
    """
    where = parse_store_url(value)
    if where.kind == 'sqlite':
        assert where.path is not None
        return LabelStore(where.path, readonly=readonly, create=create, timeout_s=timeout_s,
                          clock=clock)
    return _postgres(where.url, readonly=readonly, create=create, timeout_s=timeout_s,
                     clock=clock)


def open_store_for_reading(value: str | os.PathLike[str] | None,
                           timeout_s: float = 5.0) -> LabelStoreBase:
    """Open a store to list or export it: an SQLite file read-only when it cannot be
    written (:func:`uq_autonomy.labels.store.open_for_reading`), a PostgreSQL database
    read-only.

    Raises
    ------
    ValueError, LabelStoreError
        As :func:`open_label_store`; also when the SQLite file does not exist.
    """
    where = parse_store_url(value)
    if where.kind == 'sqlite':
        assert where.path is not None
        return open_for_reading(where.path, timeout_s=timeout_s)
    return _postgres(where.url, readonly=True, create=False, timeout_s=timeout_s,
                     clock=time.time)


def _postgres(url: str, **kwargs: object) -> LabelStoreBase:
    try:
        from uq_autonomy.labels.postgres import PostgresLabelStore
    except ImportError as err:
        raise LabelStoreError(
            f'a postgresql:// label store needs psycopg 3 ({err}); install it with '
            f"pip install 'psycopg[binary]'") from err
    return PostgresLabelStore(url, **kwargs)  # type: ignore[arg-type]
