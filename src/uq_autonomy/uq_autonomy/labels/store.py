"""Durable label store: help requests and the labels people gave them, on SQLite (one robot,
stdlib ``sqlite3``) or PostgreSQL (a fleet, :mod:`uq_autonomy.labels.postgres`).

One API, two back ends
    :class:`LabelStoreBase` holds every operation once, as SQL that both back ends run
    unchanged (``?`` placeholders, ``INSERT ... ON CONFLICT DO NOTHING``); a back end only
    opens the connection, takes the write lock, maps its errors and creates or migrates the
    schema (:data:`SCHEMA_VERSION`, the same numbers on both). :class:`LabelStore` is the
    SQLite file; :func:`uq_autonomy.labels.url.open_label_store` opens either from a
    ``sqlite:///path`` or ``postgresql://...`` URL.

Durability
    SQLite: the file is in WAL mode with ``synchronous=FULL``: each answer is one ``BEGIN
    IMMEDIATE ... COMMIT`` transaction that is on disk (fsync'd) when :meth:`answer` returns.
    PostgreSQL: each answer is one transaction with ``synchronous_commit=on``, on the
    server's disk when it returns. Acknowledge an answer (``ProvideLabel.accepted``) only
    after that return: a process killed at any moment (``kill -9``) then loses no
    acknowledged label, and an answer cut off mid-transaction leaves no trace.

Concurrent writers
    Writers are serialised (SQLite's write lock; a transaction-level advisory lock on
    PostgreSQL), so a read-then-write (is this request answered already?) cannot race with
    another writer, and ``seq`` numbers are committed in increasing order: a consumer that
    follows :meth:`labels` with ``since_seq`` never skips a label committed late.

Idempotence and conflicts
    ``request_id`` is unique in the ``labels`` table. Answering a request again with the same
    label (after normalisation by the class label rule, :mod:`uq_common.class_labels`:
    surrounding spaces stripped, inner runs of spaces made one, case folded) is accepted and
    changes nothing (:attr:`AnswerStatus.DUPLICATE`). A
    *different* label for an answered request is refused (:attr:`AnswerStatus.CONFLICT`), with
    a message naming the first answer, who gave it and when: the first answer has already
    been taught to the detector, and a silent replacement by whichever click came last would
    hide a disagreement between labellers. An explicit ``overrule=True`` replaces it: the old
    answer goes to ``label_history`` (audit trail), the row keeps its id, its ``revision``
    increases and it gets a new ``seq``, so a consumer following :meth:`LabelStore.labels`
    with ``since_seq`` sees the change. Filing a request whose id exists changes nothing.

Robots
    Each request carries the ``robot_id`` of the robot that asked (empty in stores from
    before robots had ids); its label keeps it. :meth:`pending_requests` and :meth:`labels`
    filter by robot.

Schema versions
    SQLite keeps the version in ``PRAGMA user_version``, PostgreSQL in the one-row table
    ``uq_label_store_version``. Opening an older store migrates it in one transaction, step
    by step (``_MIGRATIONS``; v2 to v3, which adds the robot ids, is the same SQL on both back
    ends); a store from a newer version is refused (:class:`LabelStoreVersionError`) rather
    than misread.

Errors
    Every back-end failure surfaces as a :class:`LabelStoreError` subclass whose message names
    the store: :class:`LabelStoreLockedError`, :class:`LabelStoreCorruptError`,
    :class:`LabelStoreReadOnlyError`, :class:`LabelStoreVersionError`. Invalid input raises
    :class:`LabelValidationError` (a ``ValueError``). Readers degrade: rows that cannot be
    decoded are skipped with a warning, and :func:`open_for_reading` opens a read-only file
    read-only instead of failing.
"""

from __future__ import annotations

import abc
import contextlib
import json
import logging
import math
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from uq_autonomy.help.crops import png_size
from uq_autonomy.labels.validation import (
    MAX_LABELER_LENGTH,
    MAX_MODEL_ID_LENGTH,
    MAX_REASON_LENGTH,
    LabelValidationError,
    same_label,
    validate_box,
    validate_candidates,
    validate_crop,
    validate_embedding,
    validate_label,
    validate_labeler,
    validate_optional_text,
    validate_request_id,
    validate_robot_id,
)
from uq_common.class_labels import (
    MAX_LABEL_LENGTH,
)
from uq_common.str_enum import StrEnum

_log = logging.getLogger(__name__)

SCHEMA_VERSION = 3
ENV_STORE_PATH = 'UQ_LABEL_STORE'


def default_store_path() -> Path:
    """``$UQ_LABEL_STORE``, else ``$XDG_DATA_HOME/uq_autonomy/labels.sqlite3`` (XDG default
    ``~/.local/share``)."""
    explicit = os.environ.get(ENV_STORE_PATH)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get('XDG_DATA_HOME') or str(Path.home() / '.local' / 'share')
    return Path(base) / 'uq_autonomy' / 'labels.sqlite3'


# -- errors ----------------------------------------------------------------------------------

class LabelStoreError(Exception):
    """A label store could not be used; the message names the store (file or server)."""

    def __init__(self, message: str, path: Path | str | None = None) -> None:
        super().__init__(message)
        self.path = Path(path) if path is not None and '://' not in str(path) else None
        self.location = str(path) if path is not None else None


class LabelStoreLockedError(LabelStoreError):
    """Another connection held the lock longer than the busy timeout."""


class LabelStoreCorruptError(LabelStoreError):
    """The file is not an SQLite database, is damaged, or is not a label store."""


class LabelStoreReadOnlyError(LabelStoreError):
    """A write was attempted on a store opened read-only or that cannot be written."""


class LabelStoreVersionError(LabelStoreError):
    """The store's schema version is newer than this code understands."""


# -- records ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class PendingRequest:
    """A help request as stored (and shown on the labelling page).

    ``box`` is the object's box in crop pixels as COCO ``(x, y, width, height)``;
    ``crop_origin`` is the crop's top-left corner in the camera image and ``image_size`` the
    camera image's ``(width, height)``, so image coordinates can be recovered. ``robot_id``
    names the robot that asked (empty: not known).
    """

    request_id: str
    created: float = 0.0
    reason: str = ''
    candidates: tuple[tuple[str, float], ...] = ()
    crop_png: bytes | None = None
    embedding: NDArray[np.float32] | None = field(default=None, compare=False)
    box: tuple[float, float, float, float] | None = None
    crop_origin: tuple[float, float] = (0.0, 0.0)
    image_size: tuple[int, int] | None = None
    stamp: float = 0.0
    track_id: int = -1
    class_name: str = ''
    model_id: str = ''
    status: str = 'pending'
    robot_id: str = ''


@dataclass(frozen=True)
class LabelRecord:
    """One stored label (an answered request).

    ``seq`` increases with every insert or overrule (a change feed for consumers), ``id`` is
    the row's stable id (COCO image and annotation id), ``revision`` counts overrules + 1,
    ``robot_id`` names the robot whose request it answers.
    """

    request_id: str
    label: str
    labeler: str
    time: float
    model_id: str = ''
    crop_png: bytes | None = None
    embedding: NDArray[np.float32] | None = field(default=None, compare=False)
    box: tuple[float, float, float, float] | None = None
    crop_origin: tuple[float, float] = (0.0, 0.0)
    image_size: tuple[int, int] | None = None
    stamp: float = 0.0
    track_id: int = -1
    candidates: tuple[tuple[str, float], ...] = ()
    source: str = ''
    id: int = 0
    seq: int = 0
    revision: int = 1
    robot_id: str = ''


class AnswerStatus(StrEnum):
    """Outcome of :meth:`LabelStore.answer` / :meth:`LabelStore.put_label`."""

    STORED = 'stored'
    DUPLICATE = 'duplicate'  # same label again: accepted, nothing changed
    OVERRULED = 'overruled'  # different label with overrule=True: replaced
    CONFLICT = 'conflict'  # different label without overrule: refused
    UNKNOWN_REQUEST = 'unknown_request'
    WITHDRAWN = 'withdrawn'  # the request was withdrawn before it was answered


@dataclass(frozen=True)
class AnswerResult:
    """What happened to an answer; ``accepted`` and ``message`` map to ``ProvideLabel``."""

    status: AnswerStatus
    message: str
    record: LabelRecord | None = None

    @property
    def accepted(self) -> bool:
        """True when the store now holds this answer (stored, duplicate or overruled)."""
        return self.status in (AnswerStatus.STORED, AnswerStatus.DUPLICATE,
                               AnswerStatus.OVERRULED)

    @property
    def changed(self) -> bool:
        """True when the store changed (stored or overruled): the detector must learn it."""
        return self.status in (AnswerStatus.STORED, AnswerStatus.OVERRULED)


# -- schema ----------------------------------------------------------------------------------

# Column types per back end; the table definitions are written once with these names.
# SQLite's REAL is 8 bytes, PostgreSQL's 4: times and boxes are DOUBLE PRECISION there.
SQL_TYPES = {
    'sqlite': {'id': 'INTEGER PRIMARY KEY AUTOINCREMENT', 'real': 'REAL', 'blob': 'BLOB'},
    'postgresql': {'id': 'BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY',
                   'real': 'DOUBLE PRECISION', 'blob': 'BYTEA'},
}

_SCHEMA_V1 = """
CREATE TABLE labels (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL UNIQUE,
    label TEXT NOT NULL,
    labeler TEXT NOT NULL,
    time REAL NOT NULL,
    model_id TEXT NOT NULL DEFAULT '',
    crop BLOB,
    embedding BLOB,
    box TEXT
);
PRAGMA user_version = 1;
"""
# v1 (SQLite only) kept the box as JSON text [center_x, center_y, width, height] in crop
# pixels and had no pending requests; it is kept here for the migration test and as the
# migration's source.

_REQUESTS_V2 = """
CREATE TABLE requests (
    request_id TEXT PRIMARY KEY,
    created {real} NOT NULL,
    stamp {real} NOT NULL DEFAULT 0,
    track_id INTEGER NOT NULL DEFAULT -1,
    reason TEXT NOT NULL DEFAULT '',
    class_name TEXT NOT NULL DEFAULT '',
    candidates TEXT NOT NULL DEFAULT '[]',
    box_x {real}, box_y {real}, box_w {real}, box_h {real},
    crop_origin_x {real} NOT NULL DEFAULT 0, crop_origin_y {real} NOT NULL DEFAULT 0,
    image_width INTEGER, image_height INTEGER,
    crop {blob},
    embedding {blob},
    model_id TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'answered', 'withdrawn'))
);
CREATE INDEX requests_by_status ON requests (status, created);
CREATE TABLE label_history (
    id {id},
    request_id TEXT NOT NULL,
    label TEXT NOT NULL,
    labeler TEXT NOT NULL,
    time {real} NOT NULL,
    replaced_by_label TEXT NOT NULL,
    replaced_by_labeler TEXT NOT NULL,
    replaced_time {real} NOT NULL
);
"""

_SCHEMA_V2 = """
CREATE TABLE labels (
    id {id},
    request_id TEXT NOT NULL UNIQUE,
    label TEXT NOT NULL,
    labeler TEXT NOT NULL,
    time {real} NOT NULL,
    model_id TEXT NOT NULL DEFAULT '',
    crop {blob},
    embedding {blob},
    box_x {real}, box_y {real}, box_w {real}, box_h {real},
    crop_origin_x {real} NOT NULL DEFAULT 0, crop_origin_y {real} NOT NULL DEFAULT 0,
    image_width INTEGER, image_height INTEGER,
    stamp {real} NOT NULL DEFAULT 0,
    track_id INTEGER NOT NULL DEFAULT -1,
    candidates TEXT NOT NULL DEFAULT '[]',
    source TEXT NOT NULL DEFAULT '',
    seq INTEGER NOT NULL DEFAULT 0,
    revision INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX labels_by_seq ON labels (seq);
""" + _REQUESTS_V2

# v2 -> v3: the robot that asked, on requests and (copied at answer time) on labels.
_MIGRATION_V2_TO_V3 = """
ALTER TABLE requests ADD COLUMN robot_id TEXT NOT NULL DEFAULT '';
ALTER TABLE labels ADD COLUMN robot_id TEXT NOT NULL DEFAULT '';
CREATE INDEX requests_by_robot ON requests (robot_id, status, created)
"""


def statements(script: str, dialect: str) -> list[str]:
    """The statements of a schema script, its column types filled in for ``dialect``."""
    text = script.format(**SQL_TYPES[dialect])
    return [s.strip() for s in text.split(';') if s.strip()]


def schema_statements(version: int, dialect: str) -> list[str]:
    """The statements that create a store at schema ``version`` (2 or 3) from nothing."""
    if version not in (2, 3):
        raise ValueError(f'no schema of version {version} can be created from nothing')
    out = statements(_SCHEMA_V2, dialect)
    if version == 3:
        out += statements(_MIGRATION_V2_TO_V3, dialect)
    return out


def _migrate_v1_to_v2(conn: Any) -> None:
    """v1 -> v2 (SQLite only): box JSON (centre form) to COCO columns, change feed, requests
    and history."""
    for column in ('box_x REAL', 'box_y REAL', 'box_w REAL', 'box_h REAL',
                   'crop_origin_x REAL NOT NULL DEFAULT 0',
                   'crop_origin_y REAL NOT NULL DEFAULT 0',
                   'image_width INTEGER', 'image_height INTEGER',
                   'stamp REAL NOT NULL DEFAULT 0', 'track_id INTEGER NOT NULL DEFAULT -1',
                   "candidates TEXT NOT NULL DEFAULT '[]'", "source TEXT NOT NULL DEFAULT ''",
                   'seq INTEGER NOT NULL DEFAULT 0', 'revision INTEGER NOT NULL DEFAULT 1'):
        conn.execute(f'ALTER TABLE labels ADD COLUMN {column}')
    rows = conn.execute('SELECT id, box FROM labels').fetchall()
    for row_id, box_text in rows:
        box = None
        with contextlib.suppress(ValueError, TypeError):
            cx, cy, w, h = (float(v) for v in json.loads(box_text))
            box = (cx - w / 2, cy - h / 2, w, h)
        conn.execute('UPDATE labels SET box_x = ?, box_y = ?, box_w = ?, box_h = ?, seq = id '
                     'WHERE id = ?', (*(box or (None,) * 4), row_id))
    conn.execute('ALTER TABLE labels DROP COLUMN box')
    conn.execute('CREATE INDEX labels_by_seq ON labels (seq)')
    for statement in statements(_REQUESTS_V2, 'sqlite'):
        conn.execute(statement)


def _migrate_v2_to_v3(conn: Any, dialect: str) -> None:
    for statement in statements(_MIGRATION_V2_TO_V3, dialect):
        conn.execute(statement)


# Each entry upgrades from its key to key + 1 inside the caller's transaction:
# ``migration(connection, dialect)``.
_MIGRATIONS: dict[int, Callable[[Any, str], None]] = {
    1: lambda conn, dialect: _migrate_v1_to_v2(conn),
    2: _migrate_v2_to_v3,
}


# -- helpers ---------------------------------------------------------------------------------

def _embedding_blob(embedding: NDArray[np.float32] | None) -> bytes | None:
    return None if embedding is None else np.asarray(embedding, '<f4').tobytes()


def _embedding_from_blob(blob: bytes | None, where: str, request_id: str
                         ) -> NDArray[np.float32] | None:
    if blob is None:
        return None
    blob = bytes(blob)
    if len(blob) % 4 or not blob:
        _log.warning('label store %s: embedding of %s is %d bytes, not float32; ignored',
                     where, request_id, len(blob))
        return None
    return np.frombuffer(blob, dtype='<f4').astype(np.float32)


def _candidates_json(candidates: Sequence[tuple[str, float]]) -> str:
    return json.dumps([[label, p] for label, p in candidates])


def _candidates_from_json(text: str | None) -> tuple[tuple[str, float], ...]:
    try:
        return tuple((str(label), float(p)) for label, p in json.loads(text or '[]'))
    except (ValueError, TypeError):
        return ()


def _box_from(row: Any) -> tuple[float, float, float, float] | None:
    values = (row['box_x'], row['box_y'], row['box_w'], row['box_h'])
    if any(v is None for v in values):
        return None
    return tuple(float(v) for v in values)  # type: ignore[return-value]


def _size_from(row: Any) -> tuple[int, int] | None:
    if row['image_width'] is None or row['image_height'] is None:
        return None
    return int(row['image_width']), int(row['image_height'])


def _blob(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def format_time(t: float) -> str:
    """Seconds since the epoch as ISO 8601 UTC (second resolution)."""
    return datetime.fromtimestamp(t, timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


_LABEL_COLUMNS = ('request_id, label, labeler, time, model_id, crop, embedding, box_x, box_y, '
                  'box_w, box_h, crop_origin_x, crop_origin_y, image_width, image_height, '
                  'stamp, track_id, candidates, source, seq, robot_id')
_LABEL_VALUES = ', '.join('?' * len(_LABEL_COLUMNS.split(',')))


# -- the store API, both back ends -----------------------------------------------------------

class LabelStoreBase(abc.ABC):
    """The label store's operations, written once for every back end; safe to share between
    threads of one process (one connection, one lock).

    A back end sets :attr:`location` (shown in messages), :attr:`readonly`, ``_clock`` and
    ``_lock``, and implements :meth:`_write` (one serialised, durable write transaction),
    :meth:`_read`, :meth:`close` and :meth:`integrity_check`. The connection it yields has
    ``execute(sql, params) -> cursor`` with ``?`` placeholders, rows read by column name.
    """

    #: ``'sqlite'`` or ``'postgresql'``.
    dialect = ''
    #: The database driver's error class, which :meth:`_errors` maps.
    driver_error: type[Exception] = Exception
    location = ''
    readonly = False
    _version = 0

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        # Inside batch(): the writes join its one transaction instead of committing each.
        self._in_batch = False

    # -- back end ----------------------------------------------------------------------

    @abc.abstractmethod
    def _write(self, doing: str) -> contextlib.AbstractContextManager[Any]:
        """One serialised, durable write transaction; yields the connection."""

    @abc.abstractmethod
    def _read(self, doing: str) -> contextlib.AbstractContextManager[Any]:
        """A consistent read; yields the connection."""

    @abc.abstractmethod
    def _translate(self, err: Exception, doing: str) -> LabelStoreError:
        """The store error, naming the store and ``doing``, of a driver error."""

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """Map the driver's errors (:attr:`driver_error`) to store errors."""
        try:
            yield
        except LabelStoreError:
            raise
        except self.driver_error as err:
            raise self._translate(err, doing) from err

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection(s)."""

    @abc.abstractmethod
    def integrity_check(self) -> list[str]:
        """Problems the back end's own check finds (empty: none)."""

    def __enter__(self) -> LabelStoreBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        """The store's schema version (always :data:`SCHEMA_VERSION` once open)."""
        return self._version

    @contextlib.contextmanager
    def batch(self, doing: str) -> Iterator[None]:
        """Make every write inside the block one transaction: all stored when the block
        ends normally, none when it raises (an import is all or nothing). Other writes wait
        until it ends."""
        with self._write(doing):
            self._in_batch = True
            try:
                yield
            finally:
                self._in_batch = False

    # -- requests ----------------------------------------------------------------------

    def add_request(self, request: PendingRequest) -> bool:
        """Store a pending request; False (and nothing changed) when its id already exists.

        Raises
        ------
        LabelValidationError
            On an invalid id, reason, candidates, crop, embedding, box or robot id.
        """
        rid = validate_request_id(request.request_id)
        reason = validate_optional_text(request.reason, 'reason', MAX_REASON_LENGTH)
        candidates = validate_candidates(request.candidates)
        crop = validate_crop(request.crop_png)
        embedding = validate_embedding(request.embedding)
        box = validate_box(request.box, 'box')
        model_id = validate_optional_text(request.model_id, 'model_id', MAX_MODEL_ID_LENGTH)
        class_name = validate_optional_text(request.class_name, 'class_name',
                                             MAX_LABEL_LENGTH)
        robot_id = validate_robot_id(request.robot_id)
        width, height = request.image_size or (None, None)
        created = float(request.created) if request.created else self._clock()
        with self._write(f'storing request {rid}') as conn:
            cur = conn.execute(
                'INSERT INTO requests (request_id, created, stamp, track_id, reason, '
                'class_name, candidates, box_x, box_y, box_w, box_h, crop_origin_x, '
                'crop_origin_y, image_width, image_height, crop, embedding, model_id, status, '
                "robot_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                "'pending', ?) ON CONFLICT (request_id) DO NOTHING",
                (rid, created, float(request.stamp), int(request.track_id), reason, class_name,
                 _candidates_json(candidates), *(box or (None,) * 4),
                 float(request.crop_origin[0]), float(request.crop_origin[1]), width, height,
                 crop, _embedding_blob(embedding), model_id, robot_id))
            return cur.rowcount == 1

    def withdraw_request(self, request_id: str) -> bool:
        """Mark a pending request withdrawn (answers to it are then refused); False unless it
        was pending."""
        rid = validate_request_id(request_id)
        with self._write(f'withdrawing request {rid}') as conn:
            cur = conn.execute("UPDATE requests SET status = 'withdrawn' "
                               "WHERE request_id = ? AND status = 'pending'", (rid,))
            return cur.rowcount == 1

    def _request_from_row(self, row: Any) -> PendingRequest:
        return PendingRequest(
            request_id=row['request_id'], created=float(row['created']), reason=row['reason'],
            candidates=_candidates_from_json(row['candidates']), crop_png=_blob(row['crop']),
            embedding=_embedding_from_blob(row['embedding'], self.location,
                                           row['request_id']),
            box=_box_from(row),
            crop_origin=(float(row['crop_origin_x']), float(row['crop_origin_y'])),
            image_size=_size_from(row), stamp=float(row['stamp']),
            track_id=int(row['track_id']), class_name=row['class_name'],
            model_id=row['model_id'], status=row['status'], robot_id=row['robot_id'])

    def _decode_rows(self, rows: list[Any], decode: Callable) -> list:
        out = []
        for row in rows:
            try:
                out.append(decode(row))
            except (TypeError, ValueError, KeyError, IndexError) as err:
                _log.warning('label store %s: skipped an undecodable row (%s)', self.location,
                             err)
        return out

    def get_request(self, request_id: str) -> PendingRequest | None:
        """The stored request with this id, whatever its status, or None."""
        with self._read('reading a request') as conn:
            row = conn.execute('SELECT * FROM requests WHERE request_id = ?',
                               (request_id,)).fetchone()
        return None if row is None else self._request_from_row(row)

    def pending_requests(self, limit: int | None = None,
                         robot_id: str | None = None) -> list[PendingRequest]:
        """Requests not answered or withdrawn yet, oldest first; only ``robot_id``'s when
        given."""
        sql = "SELECT * FROM requests WHERE status = 'pending'"
        params: tuple = ()
        if robot_id is not None:
            sql += ' AND robot_id = ?'
            params += (robot_id,)
        sql += ' ORDER BY created, request_id'
        if limit is not None:
            sql += ' LIMIT ?'
            params += (int(limit),)
        with self._read('listing pending requests') as conn:
            rows = conn.execute(sql, params).fetchall()
        return self._decode_rows(rows, self._request_from_row)

    def robot_ids(self) -> list[str]:
        """The robots that have filed requests (empty: not known), sorted."""
        with self._read('listing robots') as conn:
            return [r[0] for r in conn.execute(
                'SELECT DISTINCT robot_id FROM requests ORDER BY robot_id').fetchall()]

    # -- labels ------------------------------------------------------------------------

    def _label_from_row(self, row: Any) -> LabelRecord:
        return LabelRecord(
            request_id=row['request_id'], label=row['label'], labeler=row['labeler'],
            time=float(row['time']), model_id=row['model_id'], crop_png=_blob(row['crop']),
            embedding=_embedding_from_blob(row['embedding'], self.location,
                                           row['request_id']),
            box=_box_from(row),
            crop_origin=(float(row['crop_origin_x']), float(row['crop_origin_y'])),
            image_size=_size_from(row), stamp=float(row['stamp']),
            track_id=int(row['track_id']), candidates=_candidates_from_json(row['candidates']),
            source=row['source'], id=int(row['id']), seq=int(row['seq']),
            revision=int(row['revision']), robot_id=row['robot_id'])

    def get_label(self, request_id: str) -> LabelRecord | None:
        """The label stored for a request, or None."""
        with self._read('reading a label') as conn:
            row = conn.execute('SELECT * FROM labels WHERE request_id = ?',
                               (request_id,)).fetchone()
        return None if row is None else self._label_from_row(row)

    def labels(self, since_seq: int = 0, limit: int | None = None,
               robot_id: str | None = None) -> list[LabelRecord]:
        """Labels with ``seq > since_seq`` in ``seq`` order (a change feed: remember the last
        record's ``seq`` and ask again for what is new, overrules included); only those of
        ``robot_id``'s requests when given."""
        sql = 'SELECT * FROM labels WHERE seq > ?'
        params: tuple = (int(since_seq),)
        if robot_id is not None:
            sql += ' AND robot_id = ?'
            params += (robot_id,)
        sql += ' ORDER BY seq'
        if limit is not None:
            sql += ' LIMIT ?'
            params += (int(limit),)
        with self._read('listing labels') as conn:
            rows = conn.execute(sql, params).fetchall()
        return self._decode_rows(rows, self._label_from_row)

    def last_seq(self) -> int:
        """The highest ``seq`` stored (0 for none): where a change feed starts."""
        with self._read('reading the change feed') as conn:
            return int(conn.execute('SELECT COALESCE(MAX(seq), 0) FROM labels').fetchone()[0])

    def count_labels(self) -> int:
        """Number of labelled requests."""
        with self._read('counting labels') as conn:
            return int(conn.execute('SELECT COUNT(*) FROM labels').fetchone()[0])

    def class_names(self) -> list[str]:
        """Distinct labels, sorted."""
        with self._read('listing classes') as conn:
            return [r[0] for r in conn.execute(
                'SELECT DISTINCT label FROM labels ORDER BY label').fetchall()]

    def history(self, request_id: str) -> list[tuple[str, str, float]]:
        """Answers replaced by overrules for a request: ``(label, labeler, time)``, oldest
        first."""
        with self._read('reading label history') as conn:
            rows = conn.execute('SELECT label, labeler, time FROM label_history '
                                'WHERE request_id = ? ORDER BY id', (request_id,)).fetchall()
        return [(r[0], r[1], float(r[2])) for r in rows]

    def answer(self, request_id: str, label: str, labeler: str, *,
               overrule: bool = False, source: str = '') -> AnswerResult:
        """Store a person's answer to a stored request, in one durable transaction.

        The label row takes the request's crop, embedding, box, candidates, model id and
        robot id. See the module docstring for duplicates, conflicts and ``overrule``.

        Returns
        -------
        AnswerResult
            ``accepted`` is True only once the answer is committed to disk.

        Raises
        ------
        LabelValidationError
            On an invalid request id, label or labeler (nothing is written).
        LabelStoreError
            When the store cannot be written (locked, read-only, damaged, disk full,
            unreachable).
        """
        rid = validate_request_id(request_id)
        label = validate_label(label)
        labeler = validate_labeler(labeler)
        source = validate_optional_text(source, 'source', MAX_LABELER_LENGTH)
        with self._write(f'storing the answer to {rid}') as conn:
            existing = conn.execute('SELECT * FROM labels WHERE request_id = ?',
                                    (rid,)).fetchone()
            if existing is not None:
                return self._resolve_existing(conn, existing, label, labeler, overrule)
            request = conn.execute('SELECT * FROM requests WHERE request_id = ?',
                                   (rid,)).fetchone()
            if request is None:
                return AnswerResult(
                    AnswerStatus.UNKNOWN_REQUEST,
                    f'unknown request {rid!r}: no such help request was raised (or it is from '
                    f'another label store); nothing stored')
            if request['status'] == 'withdrawn':
                return AnswerResult(
                    AnswerStatus.WITHDRAWN,
                    f'request {rid!r} was withdrawn (it could not be shown); nothing stored')
            now = self._clock()
            seq = self._next_seq(conn)
            conn.execute(
                f'INSERT INTO labels ({_LABEL_COLUMNS}) VALUES ({_LABEL_VALUES})',
                (rid, label, labeler, now, request['model_id'], request['crop'],
                 request['embedding'], request['box_x'], request['box_y'], request['box_w'],
                 request['box_h'], request['crop_origin_x'], request['crop_origin_y'],
                 request['image_width'], request['image_height'], request['stamp'],
                 request['track_id'], request['candidates'], source, seq,
                 request['robot_id']))
            conn.execute("UPDATE requests SET status = 'answered' WHERE request_id = ?", (rid,))
            row = conn.execute('SELECT * FROM labels WHERE request_id = ?', (rid,)).fetchone()
            return AnswerResult(AnswerStatus.STORED,
                                f"stored label '{label}' for request {rid} (by {labeler})",
                                self._label_from_row(row))

    def put_label(self, record: LabelRecord, *, overrule: bool = False) -> AnswerResult:
        """Store a complete label (import path), with the same duplicate and conflict rules as
        :meth:`answer`; no pending request is needed. A pending request with the same id is
        marked answered.

        Raises
        ------
        LabelValidationError, LabelStoreError
            As :meth:`answer`; also on an invalid crop, embedding, box, candidates or robot
            id.
        """
        rid = validate_request_id(record.request_id)
        label = validate_label(record.label)
        labeler = validate_labeler(record.labeler)
        crop = validate_crop(record.crop_png)
        embedding = validate_embedding(record.embedding)
        box = validate_box(record.box, 'box')
        candidates = validate_candidates(record.candidates)
        model_id = validate_optional_text(record.model_id, 'model_id', MAX_MODEL_ID_LENGTH)
        source = validate_optional_text(record.source, 'source', MAX_LABELER_LENGTH)
        robot_id = validate_robot_id(record.robot_id)
        if not math.isfinite(float(record.time)):
            raise LabelValidationError(f'time must be finite, got {record.time!r}')
        size = record.image_size
        if size is None and crop is not None:
            with contextlib.suppress(ValueError):
                size = png_size(crop)
        with self._write(f'storing the label of {rid}') as conn:
            existing = conn.execute('SELECT * FROM labels WHERE request_id = ?',
                                    (rid,)).fetchone()
            if existing is not None:
                return self._resolve_existing(conn, existing, label, labeler, overrule)
            seq = self._next_seq(conn)
            conn.execute(
                f'INSERT INTO labels ({_LABEL_COLUMNS}) VALUES ({_LABEL_VALUES})',
                (rid, label, labeler, float(record.time), model_id, crop,
                 _embedding_blob(embedding), *(box or (None,) * 4),
                 float(record.crop_origin[0]), float(record.crop_origin[1]),
                 *(size or (None, None)), float(record.stamp), int(record.track_id),
                 _candidates_json(candidates), source, seq, robot_id))
            conn.execute("UPDATE requests SET status = 'answered' WHERE request_id = ?", (rid,))
            row = conn.execute('SELECT * FROM labels WHERE request_id = ?', (rid,)).fetchone()
            return AnswerResult(AnswerStatus.STORED,
                                f"stored label '{label}' for request {rid} (by {labeler})",
                                self._label_from_row(row))

    @staticmethod
    def _next_seq(conn: Any) -> int:
        # Writers are serialised (module docstring), so this is the next number and commits
        # happen in its order.
        return int(conn.execute('SELECT COALESCE(MAX(seq), 0) + 1 FROM labels').fetchone()[0])

    def _resolve_existing(self, conn: Any, existing: Any, label: str,
                          labeler: str, overrule: bool) -> AnswerResult:
        rid = existing['request_id']
        first = (f"'{existing['label']}' by {existing['labeler']} at "
                 f"{format_time(float(existing['time']))}")
        if same_label(existing['label'], label):
            return AnswerResult(
                AnswerStatus.DUPLICATE,
                f'request {rid} already has this answer ({first}); nothing changed',
                self._label_from_row(existing))
        if not overrule:
            return AnswerResult(
                AnswerStatus.CONFLICT,
                f"request {rid} was already answered {first}; the new answer '{label}' is "
                f'refused (answer again with overrule to replace it)',
                self._label_from_row(existing))
        now = self._clock()
        conn.execute(
            'INSERT INTO label_history (request_id, label, labeler, time, replaced_by_label, '
            'replaced_by_labeler, replaced_time) VALUES (?, ?, ?, ?, ?, ?, ?)',
            (rid, existing['label'], existing['labeler'], existing['time'], label, labeler, now))
        conn.execute('UPDATE labels SET label = ?, labeler = ?, time = ?, seq = ?, '
                     'revision = revision + 1 WHERE request_id = ?',
                     (label, labeler, now, self._next_seq(conn), rid))
        row = conn.execute('SELECT * FROM labels WHERE request_id = ?', (rid,)).fetchone()
        return AnswerResult(
            AnswerStatus.OVERRULED,
            f"request {rid}: label '{label}' by {labeler} replaces {first}",
            self._label_from_row(row))


# -- SQLite ----------------------------------------------------------------------------------

class LabelStore(LabelStoreBase):
    """An open label store file (SQLite); safe to share between threads of one process.

    Parameters
    ----------
    path : path-like
        The SQLite file (created with its directory unless ``readonly`` or ``create=False``).
    readonly : bool
        Open for reading only; writes raise :class:`LabelStoreReadOnlyError`.
    create : bool
        Create the file when missing.
    timeout_s : float
        How long to wait for another connection's lock before
        :class:`LabelStoreLockedError`.
    verify : bool
        Run ``PRAGMA quick_check`` on open, so a damaged file is reported at once rather than
        on the first unlucky query (cost: one read of the file).
    clock : callable
        Wall-clock time source for answer times (tests inject one).

    Raises
    ------
    LabelStoreError
        (a subclass) when the file cannot be opened, is not a label store, is damaged, is
        locked, cannot be written, or is from a newer schema.
    """

    dialect = 'sqlite'
    driver_error = sqlite3.Error

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False,
                 create: bool = True, timeout_s: float = 5.0, verify: bool = True,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        self.path = Path(path)
        self.location = str(self.path)
        self.readonly = readonly
        self.timeout_s = float(timeout_s)
        self._conn: sqlite3.Connection | None = None
        if readonly and not self.path.exists():
            raise LabelStoreError(f'label store {self.path} does not exist', self.path)
        if not readonly and not self.path.exists():
            if not create:
                raise LabelStoreError(f'label store {self.path} does not exist', self.path)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise LabelStoreReadOnlyError(
                    f'cannot create the directory of label store {self.path}: {err.strerror}',
                    self.path) from err
        if not readonly and self.path.exists() and not os.access(self.path, os.W_OK):
            raise LabelStoreReadOnlyError(
                f'label store {self.path} is not writable (file permissions); open it '
                f'read-only to read it, or fix its permissions to store labels', self.path)
        mode = 'ro' if readonly else 'rwc'
        uri = f'file:{urllib.parse.quote(str(self.path.absolute()))}?mode={mode}'
        with self._errors('opening'):
            self._conn = sqlite3.connect(uri, uri=True, timeout=self.timeout_s,
                                         isolation_level=None, check_same_thread=False)
            self._conn.row_factory = sqlite3.Row
            try:
                self._setup(verify)
            except BaseException:
                self._conn.close()
                self._conn = None
                raise

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
                self._conn = None

    def __enter__(self) -> LabelStore:
        return self

    def __repr__(self) -> str:
        return f'LabelStore({str(self.path)!r}, readonly={self.readonly})'

    # -- error mapping -----------------------------------------------------------------

    def _translate(self, err: Exception, doing: str) -> LabelStoreError:
        # Python 3.11 names the SQLite error code; 3.10 (JetPack 6) only has the message.
        name = getattr(err, 'sqlite_errorname', '') or ''
        text = str(err)
        where = f'label store {self.path}'
        if name.startswith(('SQLITE_BUSY', 'SQLITE_LOCKED')) or 'locked' in text:
            return LabelStoreLockedError(
                f'{where} is locked by another process or connection (waited '
                f'{self.timeout_s:g} s) while {doing}; retry later', self.path)
        if name.startswith(('SQLITE_CORRUPT', 'SQLITE_NOTADB')) or 'malformed' in text \
                or 'not a database' in text:
            return LabelStoreCorruptError(
                f'{where} is damaged or not an SQLite database ({text}) while {doing}; '
                f'move it aside and restore a backup (labels already exported as COCO can be '
                f're-imported with `uq labels import`)', self.path)
        if name.startswith('SQLITE_READONLY') or 'readonly' in text:
            return LabelStoreReadOnlyError(
                f'{where} cannot be written ({text}) while {doing}: it is opened read-only or '
                f'its file or directory is not writable', self.path)
        if name.startswith('SQLITE_CANTOPEN') or 'unable to open' in text:
            return LabelStoreError(f'cannot open {where} ({text}) while {doing}', self.path)
        if name.startswith('SQLITE_FULL') or 'is full' in text:
            return LabelStoreError(f'{where}: the disk is full while {doing}', self.path)
        return LabelStoreError(f'{where}: {text} while {doing}', self.path)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise LabelStoreError(f'label store {self.path} is closed', self.path)
        return self._conn

    @contextlib.contextmanager
    def _write(self, doing: str) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (IMMEDIATE) so it cannot fail half-way on a
        lock upgrade; committed (and fsync'd, synchronous=FULL) on normal exit."""
        if self.readonly:
            raise LabelStoreReadOnlyError(
                f'label store {self.path} is opened read-only; refused while {doing}', self.path)
        with self._lock, self._errors(doing):
            conn = self._connection()
            if self._in_batch:
                yield conn
                return
            conn.execute('BEGIN IMMEDIATE')
            try:
                yield conn
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute('ROLLBACK')
                raise
            conn.execute('COMMIT')

    @contextlib.contextmanager
    def _read(self, doing: str) -> Iterator[sqlite3.Connection]:
        with self._lock, self._errors(doing):
            yield self._connection()

    def _setup(self, verify: bool) -> None:
        conn = self._connection()
        # A non-database file fails on its first read; ask for the version first so the
        # error is "not a database" rather than a failed PRAGMA journal_mode.
        version = int(conn.execute('PRAGMA user_version').fetchone()[0])
        if not self.readonly:
            mode = conn.execute('PRAGMA journal_mode=WAL').fetchone()[0]
            if str(mode).lower() != 'wal':
                raise LabelStoreError(
                    f'label store {self.path} could not be switched to WAL mode (got {mode})',
                    self.path)
        conn.execute('PRAGMA synchronous=FULL')
        conn.execute('PRAGMA foreign_keys=ON')
        if verify:
            problems = [r[0] for r in conn.execute('PRAGMA quick_check').fetchall()]
            if problems != ['ok']:
                raise LabelStoreCorruptError(
                    f'label store {self.path} failed its integrity check: '
                    f'{"; ".join(problems[:5])}; move it aside and restore a backup', self.path)
        if version > SCHEMA_VERSION:
            raise LabelStoreVersionError(
                f'label store {self.path} has schema version {version}, newer than this '
                f'code (version {SCHEMA_VERSION}); use a newer uq_autonomy to read it',
                self.path)
        tables = {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}
        if version == 0:
            if tables - {'sqlite_sequence'}:
                raise LabelStoreCorruptError(
                    f'{self.path} is an SQLite database but not a label store (it has tables '
                    f'{sorted(tables)} and no schema version); refusing to use it', self.path)
            if self.readonly:
                raise LabelStoreCorruptError(
                    f'{self.path} is an empty database, not a label store', self.path)
            with self._write('creating the schema') as c:
                for statement in schema_statements(SCHEMA_VERSION, self.dialect):
                    c.execute(statement)
                c.execute(f'PRAGMA user_version = {SCHEMA_VERSION}')
            version = SCHEMA_VERSION
        if version < SCHEMA_VERSION:
            if self.readonly:
                raise LabelStoreReadOnlyError(
                    f'label store {self.path} has schema version {version} and needs a '
                    f'migration to {SCHEMA_VERSION}, which a read-only open cannot do; open '
                    f'it once for writing', self.path)
            with self._write(f'migrating the schema from version {version}') as c:
                while version < SCHEMA_VERSION:
                    _MIGRATIONS[version](c, self.dialect)
                    version += 1
                    c.execute(f'PRAGMA user_version = {version}')
            _log.info('label store %s migrated to schema version %d', self.path, version)
        self._version = version

    def integrity_check(self) -> list[str]:
        """``PRAGMA integrity_check`` rows: ``['ok']`` for a sound file."""
        with self._read('checking integrity') as conn:
            return [r[0] for r in conn.execute('PRAGMA integrity_check').fetchall()]


def open_for_reading(path: str | os.PathLike[str], timeout_s: float = 5.0,
                     verify: bool = True) -> LabelStore:
    """Open a store file for reading: writable files normally (migrating them if old),
    read-only files read-only, so that listing and exporting work on a file that cannot be
    written.

    Raises
    ------
    LabelStoreError
        (a subclass) when the file is missing, locked, damaged or from a newer schema.
    """
    p = Path(path)
    if not p.exists():
        raise LabelStoreError(f'label store {p} does not exist', p)
    writable = os.access(p, os.W_OK) and os.access(p.parent, os.W_OK)
    return LabelStore(p, readonly=not writable, create=False, timeout_s=timeout_s,
                      verify=verify)


def create_v1_store_for_tests(path: str | os.PathLike[str],
                              rows: Sequence[dict[str, object]]) -> None:
    """Write a schema-v1 file (the migration's source format) with the given label rows.

    Each row holds ``request_id, label, labeler, time`` and optionally ``model_id, crop,
    embedding`` (bytes) and ``box`` (JSON text, centre form).
    """
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.executescript(_SCHEMA_V1)
        for row in rows:
            conn.execute(
                'INSERT INTO labels (request_id, label, labeler, time, model_id, crop, '
                'embedding, box) VALUES (?, ?, ?, ?, ?, ?, ?, ?)',
                (row['request_id'], row['label'], row['labeler'], row['time'],
                 row.get('model_id', ''), row.get('crop'), row.get('embedding'),
                 row.get('box')))
    finally:
        conn.close()
