"""The label store on PostgreSQL: one store for a fleet of robots (psycopg 3).

Same operations and SQL as the SQLite file (:class:`uq_autonomy.labels.store.LabelStoreBase`);
what differs is here:

- **Durability**: ``synchronous_commit=on`` for this connection, so a commit returns once
  the server has flushed it to its disk. A server with ``fsync=off`` could still lose
  acknowledged labels in a power cut: opening such a store logs a warning.
- **Writers serialised** by a transaction-level advisory lock (:data:`WRITE_LOCK_KEY`), the
  counterpart of SQLite's ``BEGIN IMMEDIATE``; waiting for it is bounded by ``lock_timeout``
  (:class:`~uq_autonomy.labels.store.LabelStoreLockedError` after ``timeout_s``).
- **Schema version** in the table ``uq_label_store_version``; the schema is created or
  migrated under the same lock, so robots starting together do it once.
- **Connection loss**: the failing call raises :class:`~uq_autonomy.labels.store.LabelStoreError`
  (nothing is acknowledged), and the next call connects again. An answer whose commit was cut
  off is safe to send again: answers are idempotent.

The URL's password is never shown in messages.
"""

from __future__ import annotations

import contextlib
import logging
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from uq_autonomy.labels.store import (
    _MIGRATIONS,
    SCHEMA_VERSION,
    LabelStoreBase,
    LabelStoreCorruptError,
    LabelStoreError,
    LabelStoreLockedError,
    LabelStoreReadOnlyError,
    LabelStoreVersionError,
    schema_statements,
)

_log = logging.getLogger(__name__)

# pg_advisory_xact_lock key of the store's writers ("uqlabels" as 8 ASCII bytes).
WRITE_LOCK_KEY = int.from_bytes(b'uqlabels', 'big') & 0x7FFF_FFFF_FFFF_FFFF
VERSION_TABLE = 'uq_label_store_version'
_STORE_TABLES = {'labels', 'requests', 'label_history'}


def redact(url: str) -> str:
    """The URL without its password."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit('@', 1)[1]
    user = urllib.parse.unquote(parts.username or '')
    return urllib.parse.urlunsplit(parts._replace(netloc=f'{user}:***@{netloc}'))


class _Row:
    """A row readable by column name (as ``sqlite3.Row``) and by position."""

    __slots__ = ('_names', '_values')

    def __init__(self, names: dict[str, int], values: Sequence[Any]) -> None:
        self._names = names
        self._values = values

    def __getitem__(self, key: int | str) -> Any:
        return self._values[key if isinstance(key, int) else self._names[key]]


def _row_factory(cursor: Any) -> Callable[[Sequence[Any]], _Row]:
    names = {c.name: i for i, c in enumerate(cursor.description or ())}
    return lambda values: _Row(names, values)


class _Connection:
    """The store's SQL (``?`` placeholders) on a psycopg connection (``%s``)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(sql.replace('%', '%%').replace('?', '%s'), tuple(params))


class PostgresLabelStore(LabelStoreBase):
    """A label store in a PostgreSQL database; safe to share between threads of a process.

    Parameters
    ----------
    url : str
        ``postgresql://user[:password]@host[:port]/database`` (libpq's URL form; its query
        parameters, e.g. ``sslmode``, pass through).
    readonly : bool
        Refuse writes (and open the session read-only on the server).
    create : bool
        Create the schema in an empty database (else an empty database is an error).
    timeout_s : float
        Connection timeout, and how long a write waits for another writer's lock.
    clock : callable
        Wall-clock time source for answer times (tests inject one).

    Raises
    ------
    LabelStoreError
        (a subclass) when the server cannot be reached, the database holds other tables
        under the store's names, or its schema is newer than this code.
    """

    dialect = 'postgresql'
    driver_error = psycopg.Error

    def __init__(self, url: str, *, readonly: bool = False, create: bool = True,
                 timeout_s: float = 5.0, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        self.url = url
        self.location = redact(url)
        self.readonly = readonly
        self.timeout_s = float(timeout_s)
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        with self._lock:
            self._connect()
            try:
                self._setup(create)
            except BaseException:
                self.close()
                raise

    def __repr__(self) -> str:
        return f'PostgresLabelStore({self.location!r}, readonly={self.readonly})'

    def __enter__(self) -> PostgresLabelStore:
        return self

    # -- connection --------------------------------------------------------------------

    def _connect(self) -> None:
        try:
            conn = psycopg.connect(self.url, autocommit=True,
                                   connect_timeout=max(1, round(self.timeout_s)),
                                   row_factory=_row_factory)  # type: ignore[arg-type]
        except psycopg.Error as err:
            raise LabelStoreError(
                f'cannot connect to label store {self.location}: {_first_line(err)}',
                self.location) from err
        try:
            conn.execute('SET synchronous_commit = on')
            conn.execute(f"SET lock_timeout = '{int(self.timeout_s * 1000)}ms'")
            if self.readonly:
                conn.execute('SET default_transaction_read_only = on')
        except psycopg.Error as err:
            conn.close()
            raise self._translate(err, 'opening') from err
        self._conn = conn

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(psycopg.Error):
                    self._conn.close()
                self._conn = None
            self._closed = True

    def _connection(self) -> _Connection:
        if self._closed:
            raise LabelStoreError(f'label store {self.location} is closed', self.location)
        if self._conn is None or self._conn.closed or self._conn.broken:
            # The server went away or restarted: connect again for this call.
            self._conn = None
            self._connect()
        assert self._conn is not None
        return _Connection(self._conn)

    # -- error mapping -----------------------------------------------------------------

    def _translate(self, err: Exception, doing: str) -> LabelStoreError:
        where = f'label store {self.location}'
        text = _first_line(err)
        if isinstance(err, pg_errors.LockNotAvailable | pg_errors.DeadlockDetected):
            return LabelStoreLockedError(
                f'{where} is locked by another writer (waited {self.timeout_s:g} s) while '
                f'{doing}; retry later', self.location)
        if isinstance(err, pg_errors.ReadOnlySqlTransaction | pg_errors.InsufficientPrivilege):
            return LabelStoreReadOnlyError(
                f'{where} cannot be written ({text}) while {doing}: it is opened read-only or '
                f'this database user may not write', self.location)
        if isinstance(err, pg_errors.DiskFull):
            return LabelStoreError(f'{where}: the server\'s disk is full while {doing}',
                                   self.location)
        if isinstance(err, pg_errors.DataCorrupted | pg_errors.IndexCorrupted):
            return LabelStoreCorruptError(f'{where} is damaged ({text}) while {doing}',
                                          self.location)
        if isinstance(err, psycopg.OperationalError | psycopg.InterfaceError):
            return LabelStoreError(
                f'{where}: connection lost ({text}) while {doing}; nothing was acknowledged, '
                f'retry (the next call connects again)', self.location)
        return LabelStoreError(f'{where}: {text} while {doing}', self.location)

    # -- transactions ------------------------------------------------------------------

    @contextlib.contextmanager
    def _write(self, doing: str) -> Iterator[_Connection]:
        """One write transaction holding the store's write lock; committed (flushed on the
        server, synchronous_commit=on) on normal exit."""
        if self.readonly:
            raise LabelStoreReadOnlyError(
                f'label store {self.location} is opened read-only; refused while {doing}',
                self.location)
        with self._lock, self._errors(doing):
            conn = self._connection()
            if self._in_batch:
                yield conn
                return
            conn.execute('BEGIN')
            try:
                conn.execute('SELECT pg_advisory_xact_lock(?)', (WRITE_LOCK_KEY,))
                yield conn
            except BaseException:
                with contextlib.suppress(psycopg.Error):
                    conn.execute('ROLLBACK')
                raise
            conn.execute('COMMIT')

    @contextlib.contextmanager
    def _read(self, doing: str) -> Iterator[_Connection]:
        with self._lock, self._errors(doing):
            yield self._connection()

    # -- schema ------------------------------------------------------------------------

    def _tables(self, conn: _Connection) -> set[str]:
        return {r[0] for r in conn.execute(
            'SELECT table_name FROM information_schema.tables '
            'WHERE table_schema = current_schema()').fetchall()}

    def _setup(self, create: bool) -> None:
        with self._read('opening') as conn:
            tables = self._tables(conn)
        if VERSION_TABLE not in tables:
            if tables & _STORE_TABLES:
                raise LabelStoreCorruptError(
                    f'{self.location} holds tables {sorted(tables & _STORE_TABLES)} but no '
                    f'{VERSION_TABLE}: it is not a label store; refusing to use it',
                    self.location)
            if self.readonly or not create:
                raise LabelStoreError(f'label store {self.location} has no label store '
                                      f'schema (an empty database)', self.location)
        elif self._read_version() > SCHEMA_VERSION:
            self._refuse_newer(self._read_version())
        if not self.readonly:
            with self._write('creating or migrating the schema') as conn:
                # Under the write lock: robots opening the store together do this once.
                tables = self._tables(conn)
                if VERSION_TABLE not in tables:
                    for statement in schema_statements(SCHEMA_VERSION, self.dialect):
                        conn.execute(statement)
                    conn.execute(f'CREATE TABLE {VERSION_TABLE} (version INTEGER NOT NULL)')
                    conn.execute(f'INSERT INTO {VERSION_TABLE} (version) VALUES (?)',
                                 (SCHEMA_VERSION,))
                version = int(conn.execute(
                    f'SELECT version FROM {VERSION_TABLE}').fetchone()[0])
                if version > SCHEMA_VERSION:
                    self._refuse_newer(version)
                start = version
                while version < SCHEMA_VERSION:
                    if version not in _MIGRATIONS or version < 2:
                        raise LabelStoreVersionError(
                            f'label store {self.location} has schema version {version}, '
                            f'which has no migration on PostgreSQL', self.location)
                    _MIGRATIONS[version](conn, self.dialect)
                    version += 1
                    conn.execute(f'UPDATE {VERSION_TABLE} SET version = ?', (version,))
            if version != start:
                _log.info('label store %s migrated to schema version %d', self.location,
                          version)
        version = self._read_version()
        if version < SCHEMA_VERSION:
            raise LabelStoreReadOnlyError(
                f'label store {self.location} has schema version {version} and needs a '
                f'migration to {SCHEMA_VERSION}, which a read-only open cannot do; open it '
                f'once for writing', self.location)
        self._version = version
        with self._read('checking durability') as conn:
            if str(conn.execute('SHOW fsync').fetchone()[0]).lower() != 'on':
                _log.warning('label store %s: the server runs with fsync=off; a power cut '
                             'can lose acknowledged labels', self.location)

    def _read_version(self) -> int:
        with self._read('reading the schema version') as conn:
            row = conn.execute(f'SELECT version FROM {VERSION_TABLE}').fetchone()
        if row is None:
            raise LabelStoreCorruptError(f'label store {self.location}: {VERSION_TABLE} is '
                                         f'empty', self.location)
        return int(row[0])

    def _refuse_newer(self, version: int) -> None:
        raise LabelStoreVersionError(
            f'label store {self.location} has schema version {version}, newer than this '
            f'code (version {SCHEMA_VERSION}); use a newer uq_autonomy to read it',
            self.location)

    def integrity_check(self) -> list[str]:
        """``['ok']`` when every table of the store can be read in full (the server checks
        its own pages); the problems otherwise."""
        problems = []
        with self._read('checking integrity') as conn:
            for table in sorted(_STORE_TABLES):
                try:
                    conn.execute(f'SELECT COUNT(*) FROM {table}').fetchone()
                except psycopg.Error as err:
                    problems.append(f'{table}: {_first_line(err)}')
            duplicates = conn.execute('SELECT COUNT(*) - COUNT(DISTINCT request_id) '
                                      'FROM labels').fetchone()[0]
            if duplicates:
                problems.append(f'labels: {duplicates} duplicate request ids')
        return problems or ['ok']


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
