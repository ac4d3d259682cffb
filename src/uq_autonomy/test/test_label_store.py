"""Label store: durability (kill -9), idempotence, conflicts, robots, concurrent writers and
schema migration, as one suite run on both back ends (an SQLite file and a database on a
private PostgreSQL server, see the ``postgres_url`` fixture); then what only one back end
has: SQLite's bad files and locks, PostgreSQL's unreachable server and lost connections."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uq_autonomy.help.crops import encode_png, png_size
from uq_autonomy.labels import store as ls
from uq_autonomy.labels.store import (
    SCHEMA_VERSION,
    AnswerStatus,
    LabelRecord,
    LabelStore,
    LabelStoreCorruptError,
    LabelStoreError,
    LabelStoreLockedError,
    LabelStoreReadOnlyError,
    LabelStoreVersionError,
    PendingRequest,
    create_v1_store_for_tests,
    open_for_reading,
    schema_statements,
)
from uq_autonomy.labels.url import open_label_store, open_store_for_reading, parse_store_url
from uq_autonomy.labels.validation import LabelValidationError, validate_label

CLOCK = 1_700_000_000.0


def crop(seed: int = 0, h: int = 12, w: int = 16) -> bytes:
    rng = np.random.default_rng(seed)
    return encode_png(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))


def request(rid: str, **kw: object) -> PendingRequest:
    fields = dict(reason='GP variance 0.03 above 0.02 in 4 of the last 5 frames',
                  candidates=(('mug', 0.6), ('box', 0.3)), crop_png=crop(),
                  embedding=np.arange(8, dtype=np.float32) / 7.0, box=(2.0, 3.0, 10.0, 6.0),
                  crop_origin=(100.0, 50.0), image_size=(320, 240), stamp=12.5, track_id=4,
                  class_name='mug', model_id='centernet-abc')
    fields.update(kw)
    return PendingRequest(rid, **fields)  # type: ignore[arg-type]


@pytest.fixture(params=['sqlite', 'postgresql'])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh store's URL on the back end under test."""
    if backend == 'sqlite':
        return f'sqlite://{tmp_path}/labels.sqlite3'
    return request.getfixturevalue('postgres_url')


@pytest.fixture
def store(store_url: str) -> Iterator[ls.LabelStoreBase]:
    s = open_label_store(store_url, clock=lambda: CLOCK)
    yield s
    s.close()


class Raw:
    """A plain connection to the store's database, beside the store (autocommit)."""

    def __init__(self, url: str) -> None:
        self.where = parse_store_url(url)
        if self.where.kind == 'sqlite':
            self.conn: Any = sqlite3.connect(self.where.path, isolation_level=None)
        else:
            import psycopg

            self.conn = psycopg.connect(self.where.url, autocommit=True)

    @property
    def dialect(self) -> str:
        return self.where.kind

    def execute(self, sql: str, params: tuple = ()) -> Any:
        if self.dialect == 'postgresql':
            sql = sql.replace('?', '%s')
        return self.conn.execute(sql, params)

    def hold_write_lock(self) -> None:
        """Take the store's write lock as another writer would, until :meth:`release`."""
        if self.dialect == 'sqlite':
            self.execute('BEGIN IMMEDIATE')
        else:
            from uq_autonomy.labels.postgres import WRITE_LOCK_KEY

            self.execute('BEGIN')
            self.execute('SELECT pg_advisory_xact_lock(?)', (WRITE_LOCK_KEY,))

    def release(self) -> None:
        self.execute('ROLLBACK')

    def set_version(self, version: int) -> None:
        if self.dialect == 'sqlite':
            self.execute(f'PRAGMA user_version = {version}')
        else:
            self.execute('UPDATE uq_label_store_version SET version = ?', (version,))

    def columns(self, table: str) -> list[str]:
        if self.dialect == 'sqlite':
            return [r[1] for r in self.execute(f'PRAGMA table_info({table})')]
        return [r[0] for r in self.execute(
            'SELECT column_name FROM information_schema.columns WHERE table_name = ?',
            (table,)).fetchall()]

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def raw(store_url: str) -> Iterator[Any]:
    """Opens a :class:`Raw` connection to a store URL; all are closed after the test."""
    opened: list[Raw] = []

    def open_raw(url: str = store_url) -> Raw:
        opened.append(Raw(url))
        return opened[-1]

    yield open_raw
    for conn in opened:
        conn.close()


# -- answers ---------------------------------------------------------------------------------

def test_answer_stores_the_request_data_durably(store: ls.LabelStoreBase) -> None:
    assert store.add_request(request('r1'))
    assert not store.add_request(request('r1', reason='other'))  # same id: unchanged
    assert [p.request_id for p in store.pending_requests()] == ['r1']
    assert store.get_request('r1').reason.startswith('GP variance')

    result = store.answer('r1', 'teapot', 'alice', source='web')
    assert result.status is AnswerStatus.STORED and result.accepted and result.changed
    assert result.message == "stored label 'teapot' for request r1 (by alice)"
    record = store.get_label('r1')
    assert (record.label, record.labeler, record.time, record.model_id, record.source) == (
        'teapot', 'alice', 1_700_000_000.0, 'centernet-abc', 'web')
    assert record.crop_png == crop() and png_size(record.crop_png) == (16, 12)
    np.testing.assert_array_equal(record.embedding, np.arange(8, dtype=np.float32) / 7.0)
    assert record.embedding.dtype == np.float32
    assert (record.box, record.crop_origin, record.image_size) == (
        (2.0, 3.0, 10.0, 6.0), (100.0, 50.0), (320, 240))
    assert (record.stamp, record.track_id, record.candidates) == (
        12.5, 4, (('mug', 0.6), ('box', 0.3)))
    assert (record.seq, record.revision) == (1, 1)
    assert store.pending_requests() == []
    assert store.get_request('r1').status == 'answered'
    assert store.class_names() == ['teapot'] and store.count_labels() == 1


def test_wal_mode_synchronous_full_and_schema_version(tmp_path: Path) -> None:
    store = LabelStore(tmp_path / 'labels.sqlite3')
    conn = sqlite3.connect(store.path)
    try:
        assert conn.execute('PRAGMA journal_mode').fetchone()[0] == 'wal'
        assert conn.execute('PRAGMA user_version').fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()
    assert store._connection().execute('PRAGMA synchronous').fetchone()[0] == 2  # FULL
    assert store.schema_version == SCHEMA_VERSION
    store.close()


def test_postgresql_commits_are_synchronous_and_versioned(postgres_url: str) -> None:
    with open_label_store(postgres_url) as store:
        conn = store._connection()
        assert conn.execute('SHOW synchronous_commit').fetchone()[0] == 'on'
        assert conn.execute('SHOW fsync').fetchone()[0] == 'on'
        assert conn.execute('SELECT version FROM uq_label_store_version').fetchone()[0] == \
            SCHEMA_VERSION
        assert store.schema_version == SCHEMA_VERSION


def test_same_answer_twice_is_one_label(store: ls.LabelStoreBase) -> None:
    store.add_request(request('r1'))
    first = store.answer('r1', 'tea pot', 'alice')
    again = store.answer('r1', '  tea   pot ', 'bob')  # same label after normalisation
    assert again.status is AnswerStatus.DUPLICATE and again.accepted and not again.changed
    assert "already has this answer ('tea pot' by alice at 2023-11-14T22:13:20Z)" in again.message
    assert store.count_labels() == 1
    assert store.get_label('r1').seq == first.record.seq


def test_conflicting_answer_is_refused_unless_overruled(store: ls.LabelStoreBase) -> None:
    store.add_request(request('r1'))
    store.answer('r1', 'teapot', 'alice')
    refused = store.answer('r1', 'kettle', 'bob')
    assert refused.status is AnswerStatus.CONFLICT and not refused.accepted
    assert refused.message == (
        "request r1 was already answered 'teapot' by alice at 2023-11-14T22:13:20Z; the new "
        "answer 'kettle' is refused (answer again with overrule to replace it)")
    assert store.get_label('r1').label == 'teapot'

    overruled = store.answer('r1', 'kettle', 'bob', overrule=True)
    assert overruled.status is AnswerStatus.OVERRULED and overruled.accepted
    assert "label 'kettle' by bob replaces 'teapot' by alice" in overruled.message
    record = store.get_label('r1')
    assert (record.label, record.labeler, record.revision, record.seq) == ('kettle', 'bob', 2, 2)
    assert store.history('r1') == [('teapot', 'alice', 1_700_000_000.0)]
    assert store.count_labels() == 1


def test_labels_since_seq_is_a_change_feed(store: ls.LabelStoreBase) -> None:
    for rid in ('a', 'b', 'c'):
        store.add_request(request(rid))
        store.answer(rid, 'mug', 'x')
    assert [r.request_id for r in store.labels()] == ['a', 'b', 'c']
    last = store.labels()[-1].seq
    assert store.labels(since_seq=last) == []
    store.answer('a', 'cup', 'y', overrule=True)
    assert [(r.request_id, r.label) for r in store.labels(since_seq=last)] == [('a', 'cup')]
    assert [r.request_id for r in store.labels(limit=2)] == ['b', 'c']


def test_unknown_and_withdrawn_requests_are_refused(store: ls.LabelStoreBase) -> None:
    unknown = store.answer('nope', 'mug', 'alice')
    assert unknown.status is AnswerStatus.UNKNOWN_REQUEST and not unknown.accepted
    assert unknown.message.startswith("unknown request 'nope': no such help request")
    store.add_request(request('r2'))
    assert store.withdraw_request('r2')
    assert not store.withdraw_request('r2')
    withdrawn = store.answer('r2', 'mug', 'alice')
    assert withdrawn.status is AnswerStatus.WITHDRAWN
    assert store.count_labels() == 0 and store.pending_requests() == []


def test_put_label_imports_complete_records_idempotently(store: ls.LabelStoreBase) -> None:
    record = LabelRecord('imp-1', 'mug', 'cvat', 1.5e9, crop_png=crop(3, 20, 30),
                         box=(1.0, 1.0, 5.0, 5.0), source='import')
    assert store.put_label(record).status is AnswerStatus.STORED
    assert store.put_label(record).status is AnswerStatus.DUPLICATE
    stored = store.get_label('imp-1')
    assert stored.image_size == (30, 20)  # from the PNG header
    conflict = store.put_label(LabelRecord('imp-1', 'cup', 'cvat', 1.6e9))
    assert conflict.status is AnswerStatus.CONFLICT


# -- validation ------------------------------------------------------------------------------

@pytest.mark.parametrize(('label', 'message'), [
    ('', 'label must not be empty'),
    ('    ', 'label must not be empty'),
    ('x' * 65, 'label is 65 characters long; at most 64 are allowed'),
    ('tea\npot', r"label contains the non-printable character '\\n'"),
    ('tea\tpot', r"label contains the non-printable character '\\t'"),
    ('nul\x00', r"label contains the non-printable character '\\x00'"),
    ('bell\x07', 'label contains the non-printable character'),
    ('rtl\u202emark', 'label contains the non-printable character'),
    (42, 'label must be a string, got int'),
    (None, 'label must be a string, got NoneType'),
    # The detector's class name rule (uq_common.class_labels): refused here at once, not
    # stored and then refused by teach_object forever.
    ("Tom's mug", 'may hold only letters, digits, spaces and'),
    ('mug, red', 'may hold only letters'),
    ('mug #2', 'may hold only letters'),
    ('mug+lid', 'may hold only letters'),
    ('"x"', 'may hold only letters'),
    ('-mug', 'starting with a letter, digit or _'),
])
def test_invalid_labels_are_refused_before_writing(store: ls.LabelStoreBase, label: object,
                                                   message: str) -> None:
    store.add_request(request('r1'))
    with pytest.raises(LabelValidationError, match=message):
        store.answer('r1', label, 'alice')  # type: ignore[arg-type]
    assert store.count_labels() == 0


def test_valid_labels_are_normalised() -> None:
    assert validate_label('  coffee   mug ') == 'coffee mug'
    assert validate_label('Kaffeebecher ü') == 'kaffeebecher ü'
    assert validate_label('tasse à café') == 'tasse à café'
    assert validate_label('T-joint (steel) 2/3') == 't-joint (steel) 2/3'
    assert validate_label('x' * 64) == 'x' * 64


def test_labels_differing_only_in_case_are_one_answer(store: ls.LabelStoreBase) -> None:
    store.add_request(request('r1'))
    assert store.answer('r1', 'Mug', 'alice').record.label == 'mug'
    assert store.answer('r1', 'MUG ', 'bob').status is AnswerStatus.DUPLICATE
    assert store.class_names() == ['mug']


def test_a_label_stored_before_case_folding_is_the_same_answer_folded(tmp_path: Path) -> None:
    path = tmp_path / 'old.sqlite3'
    create_v1_store_for_tests(path, [{'request_id': 'r1', 'label': 'Mug', 'labeler': 'alice',
                                      'time': 1.0}])
    store = LabelStore(path)
    assert store.answer('r1', 'Mug', 'bob').status is AnswerStatus.DUPLICATE
    assert store.answer('r1', 'cup', 'bob').status is AnswerStatus.CONFLICT


@pytest.mark.parametrize(('labeler', 'message'), [
    ('', 'labeler must not be empty'),
    ('a' * 65, 'labeler is 65 characters long'),
    ('eve\r', 'labeler contains the non-printable character'),
])
def test_invalid_labelers_are_refused(store: ls.LabelStoreBase, labeler: str, message: str) -> None:
    store.add_request(request('r1'))
    with pytest.raises(LabelValidationError, match=message):
        store.answer('r1', 'mug', labeler)


@pytest.mark.parametrize('rid', ['', '../etc', 'a b', '-lead', 'x' * 129, 'ü', 'a/b'])
def test_invalid_request_ids_are_refused(store: ls.LabelStoreBase, rid: str) -> None:
    with pytest.raises(LabelValidationError, match='request_id .* is invalid'):
        store.answer(rid, 'mug', 'alice')


@pytest.mark.parametrize(('fields', 'message'), [
    ({'crop_png': b'GIF89a....'}, 'crop must be PNG bytes'),
    ({'embedding': [1.0, float('nan')]}, 'embedding contains non-finite values'),
    ({'embedding': []}, 'embedding must have 1..65536 values, got 0'),
    ({'candidates': (('mug', 1.5),)}, r"candidate probability must be in \[0, 1\]"),
    ({'candidates': (('', 0.5),)}, 'label must not be empty'),
    ({'candidates': ('mug',)}, 'a candidate must be a \\(label, probability\\) pair'),
    ({'box': (0.0, 0.0, -1.0, 2.0)}, 'box width and height must be >= 0'),
    ({'box': (0.0, 0.0, 1.0)}, 'box must be 4 finite numbers'),
    ({'reason': 'line\nbreak'}, 'reason contains non-printable characters'),
    ({'reason': 'r' * 2001}, 'reason is 2001 characters long'),
])
def test_invalid_requests_are_refused(store: ls.LabelStoreBase, fields: dict, message: str) -> None:
    with pytest.raises(LabelValidationError, match=message):
        store.add_request(request('r1', **fields))
    assert store.pending_requests() == []


# -- schema versions -------------------------------------------------------------------------

def v1_rows() -> list[dict[str, object]]:
    return [
        {'request_id': 'old-1', 'label': 'mug', 'labeler': 'alice', 'time': 1.6e9,
         'model_id': 'm1', 'crop': crop(1), 'embedding': np.ones(4, '<f4').tobytes(),
         'box': '[10.0, 8.0, 4.0, 6.0]'},
        {'request_id': 'old-2', 'label': 'box', 'labeler': 'bob', 'time': 1.6e9 + 5,
         'box': 'not json'},
    ]


def test_v1_file_is_migrated_to_the_current_version(tmp_path: Path) -> None:
    path = tmp_path / 'v1.sqlite3'
    create_v1_store_for_tests(path, v1_rows())
    with LabelStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION == 3
        first, second = store.labels()
        assert (first.request_id, first.label, first.box, first.seq) == (
            'old-1', 'mug', (8.0, 5.0, 4.0, 6.0), 1)  # centre form -> COCO xywh
        np.testing.assert_array_equal(first.embedding, np.ones(4, np.float32))
        assert first.crop_png == crop(1)
        assert (second.box, second.seq, second.revision, second.robot_id) == (None, 2, 1, '')
        # The migrated file works as a current store.
        store.add_request(request('new-1'))
        assert store.answer('new-1', 'cup', 'carol').status is AnswerStatus.STORED
        assert store.labels()[-1].seq == 3
        assert store.integrity_check() == ['ok']
    with LabelStore(path) as again:  # a second open does not migrate again
        assert again.count_labels() == 3


def test_failed_migration_leaves_the_file_at_v1(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / 'v1.sqlite3'
    create_v1_store_for_tests(path, v1_rows())

    def broken(conn: sqlite3.Connection, dialect: str) -> None:
        ls._migrate_v1_to_v2(conn)
        raise sqlite3.OperationalError('simulated failure half-way')

    monkeypatch.setitem(ls._MIGRATIONS, 1, broken)
    with pytest.raises(LabelStoreError, match='simulated failure half-way while migrating the '
                                              'schema from version 1'):
        LabelStore(path)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute('PRAGMA user_version').fetchone()[0] == 1
        columns = [r[1] for r in conn.execute('PRAGMA table_info(labels)')]
        assert 'box' in columns and 'seq' not in columns
    finally:
        conn.close()
    monkeypatch.undo()
    with LabelStore(path) as store:
        assert store.count_labels() == 2


def make_v2_store(raw: Raw) -> None:
    """A store at schema version 2 (before robot ids), one answered request in it."""
    for statement in schema_statements(2, raw.dialect):
        raw.execute(statement)
    if raw.dialect == 'postgresql':
        raw.execute('CREATE TABLE uq_label_store_version (version INTEGER NOT NULL)')
        raw.execute('INSERT INTO uq_label_store_version VALUES (2)')
    raw.set_version(2)
    raw.execute("INSERT INTO requests (request_id, created, status) VALUES ('old', 1.0, "
                "'answered')")
    raw.execute("INSERT INTO labels (request_id, label, labeler, time, seq) VALUES "
                "('old', 'mug', 'alice', 2.0, 1)")


def test_v2_store_is_migrated_to_v3_on_both_back_ends(store_url: str, raw: Any) -> None:
    make_v2_store(raw())
    with open_label_store(store_url) as store:
        assert store.schema_version == 3
        (old,) = store.labels()
        assert (old.request_id, old.label, old.robot_id, old.seq) == ('old', 'mug', '', 1)
        assert store.add_request(request('new', robot_id='robot-b'))
        assert store.answer('new', 'cup', 'carol').record.robot_id == 'robot-b'
        assert store.integrity_check() == ['ok']
    with open_label_store(store_url) as again:  # a second open does not migrate again
        assert again.count_labels() == 2 and again.robot_ids() == ['', 'robot-b']


def test_failed_migration_leaves_the_store_at_v2(store_url: str, raw: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    conn = raw()
    make_v2_store(conn)

    def broken(c: Any, dialect: str) -> None:
        ls._migrate_v2_to_v3(c, dialect)
        raise LabelStoreError('simulated failure half-way')

    monkeypatch.setitem(ls._MIGRATIONS, 2, broken)
    with pytest.raises(LabelStoreError, match='simulated failure half-way'):
        open_label_store(store_url)
    assert 'robot_id' not in conn.columns('requests')
    monkeypatch.undo()
    with open_label_store(store_url) as store:
        assert store.schema_version == 3 and store.count_labels() == 1
    assert 'robot_id' in conn.columns('requests')


def test_newer_schema_is_refused(store_url: str, raw: Any) -> None:
    open_label_store(store_url).close()
    raw().set_version(99)
    with pytest.raises(LabelStoreVersionError, match='has schema version 99, newer than this '
                                                     r'code \(version 3\)'):
        open_label_store(store_url)


def test_foreign_database_is_not_taken_over(store_url: str, raw: Any, backend: str) -> None:
    # Any table in an SQLite file; tables under the store's names in a PostgreSQL database
    # (which may hold other applications' tables).
    raw().execute('CREATE TABLE customers (id INTEGER)' if backend == 'sqlite'
                  else 'CREATE TABLE labels (id INTEGER)')
    with pytest.raises(LabelStoreCorruptError, match='not a label store'):
        open_label_store(store_url)


# -- bad files -------------------------------------------------------------------------------

def test_garbage_file_is_reported_as_corrupt(tmp_path: Path) -> None:
    path = tmp_path / 'garbage.sqlite3'
    path.write_bytes(b'this is not a database at all' * 200)
    with pytest.raises(LabelStoreCorruptError,
                       match=rf'label store {path} is damaged or not an SQLite database'):
        LabelStore(path)
    with pytest.raises(LabelStoreCorruptError, match='not an SQLite database'):
        open_for_reading(path)


def test_damaged_pages_are_reported_as_corrupt(tmp_path: Path) -> None:
    path = tmp_path / 'damaged.sqlite3'
    with LabelStore(path) as store:
        for i in range(60):
            store.add_request(request(f'r{i}', crop_png=crop(i, 40, 40)))
            store.answer(f'r{i}', 'mug', 'alice')
    size = path.stat().st_size
    assert size > 40_000
    with path.open('r+b') as f:  # scribble over pages after the header page
        rng = random.Random(0)
        for offset in range(4096, size, 4096 * 3):
            f.seek(offset + 100)
            f.write(bytes(rng.randrange(256) for _ in range(600)))
    with pytest.raises(LabelStoreCorruptError, match=f'label store {path}'):
        LabelStore(path)


def test_a_held_write_lock_gives_a_clear_error_and_readers_keep_working(
        store_url: str, raw: Any) -> None:
    with open_label_store(store_url) as setup:
        setup.add_request(request('r1'))
    store = open_label_store(store_url, timeout_s=0.2)
    other = raw()
    try:
        other.hold_write_lock()  # another writer holds the write lock
        with pytest.raises(LabelStoreLockedError,
                           match=rf'label store {store.location} is locked by another .*'
                                 r'\(waited 0.2 s\) while storing the answer to r1'):
            store.answer('r1', 'mug', 'alice')
        assert [p.request_id for p in store.pending_requests()] == ['r1']  # reads go on
        other.release()
        assert store.answer('r1', 'mug', 'alice').accepted  # and it recovers
    finally:
        store.close()


def test_exclusively_locked_file_blocks_readers_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / 'exclusive.sqlite3'
    LabelStore(path).close()
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute('PRAGMA locking_mode = EXCLUSIVE')
        other.execute('BEGIN EXCLUSIVE')
        with pytest.raises(LabelStoreLockedError, match=f'label store {path} is locked'):
            LabelStore(path, timeout_s=0.2)
    finally:
        other.close()


def test_read_only_open_refuses_writes_but_reads(store_url: str) -> None:
    with open_label_store(store_url) as store:
        store.add_request(request('r1'))
        store.answer('r1', 'mug', 'alice')
    with open_store_for_reading(store_url) as reader:
        assert [r.label for r in reader.labels()] == ['mug']
    with open_label_store(store_url, readonly=True) as reader:
        assert [r.label for r in reader.labels()] == ['mug']
        with pytest.raises(LabelStoreReadOnlyError,
                           match=f'label store {reader.location} is opened read-only; refused '
                                 'while storing the answer to r1'):
            reader.answer('r1', 'cup', 'bob', overrule=True)
        with pytest.raises(LabelStoreReadOnlyError, match='opened read-only'):
            reader.add_request(request('r2'))


def test_unwritable_file_is_refused_for_writing_and_opened_read_only_for_reading(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / 'perm.sqlite3'
    with LabelStore(path) as store:
        store.add_request(request('r1'))
        store.answer('r1', 'mug', 'alice')
    if os.geteuid() == 0:
        # root ignores file modes: make the store see the file as unwritable instead.
        real_access = os.access
        monkeypatch.setattr(ls.os, 'access', lambda p, mode: (
            False if Path(p) == path and mode == os.W_OK else real_access(p, mode)))
    else:
        path.chmod(0o444)
    try:
        with pytest.raises(LabelStoreReadOnlyError,
                           match=f'label store {path} is not writable \\(file permissions\\)'):
            LabelStore(path)
        with open_for_reading(path) as reader:
            assert reader.readonly
            assert [r.label for r in reader.labels()] == ['mug']
    finally:
        path.chmod(0o644)


@pytest.mark.parametrize(('error', 'kind', 'message'), [
    (sqlite3.OperationalError('database is locked'), LabelStoreLockedError, 'is locked'),
    (sqlite3.DatabaseError('database disk image is malformed'), LabelStoreCorruptError,
     'is damaged or not an SQLite database'),
    (sqlite3.DatabaseError('file is not a database'), LabelStoreCorruptError, 'is damaged'),
    (sqlite3.OperationalError('attempt to write a readonly database'),
     LabelStoreReadOnlyError, 'cannot be written'),
    (sqlite3.OperationalError('unable to open database file'), LabelStoreError,
     'cannot open label store'),
    (sqlite3.OperationalError('database or disk is full'), LabelStoreError, 'the disk is full'),
    (sqlite3.OperationalError('something else'), LabelStoreError, 'something else while x'),
])
def test_errors_are_classified_from_the_message_alone(tmp_path: Path, error: Exception,
                                                      kind: type, message: str) -> None:
    # Errors built here carry no sqlite_errorname, like every error on Python 3.10.
    store = LabelStore(tmp_path / 'labels.sqlite3')
    translated = store._translate(error, 'x')  # type: ignore[arg-type]
    assert type(translated) is kind
    with pytest.raises(kind, match=message):
        raise translated
    assert str(store.path) in str(translated)


def test_missing_and_closed_stores(tmp_path: Path) -> None:
    with pytest.raises(LabelStoreError, match='label store .*missing.sqlite3 does not exist'):
        open_for_reading(tmp_path / 'missing.sqlite3')
    with pytest.raises(LabelStoreError, match='does not exist'):
        LabelStore(tmp_path / 'missing.sqlite3', create=False)


def test_a_closed_store_says_so(store_url: str) -> None:
    store = open_label_store(store_url)
    store.close()
    store.close()
    with pytest.raises(LabelStoreError, match=f'label store {store.location} is closed'):
        store.pending_requests()


def test_undecodable_fields_degrade_instead_of_crashing(store: ls.LabelStoreBase) -> None:
    store.add_request(request('r1'))
    store.answer('r1', 'mug', 'alice')
    store._connection().execute("UPDATE labels SET embedding = ?, candidates = '{broken'",
                                (b'\x01\x02\x03\x04\x05',))
    record = store.labels()[0]
    assert record.embedding is None and record.candidates == ()
    assert record.label == 'mug'


# -- concurrency and durability --------------------------------------------------------------

def test_concurrent_answers_from_threads_and_connections(store_url: str) -> None:
    stores = [open_label_store(store_url), open_label_store(store_url)]
    for i in range(20):
        stores[0].add_request(request(f'r{i}'))
    results: list[AnswerStatus] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(4)  # all four race from the first answer on

    def worker(k: int) -> None:
        # An exception in a thread is only a pytest warning: it is collected and fails
        # the test below, so a worker that dies on "database is locked" is a failure.
        try:
            start.wait(timeout=10.0)
            for i in range(20):
                r = stores[k % 2].answer(f'r{i}', 'mug' if k < 3 else 'cup', f'w{k}')
                with lock:
                    results.append(r.status)
        except BaseException as err:
            with lock:
                errors.append(err)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == 4 * 20  # every worker answered every request
    assert stores[0].count_labels() == 20
    assert results.count(AnswerStatus.STORED) == 20
    assert set(results) <= {AnswerStatus.STORED, AnswerStatus.DUPLICATE, AnswerStatus.CONFLICT}
    for s in stores:
        s.close()


WRITER = textwrap.dedent('''
    import sys
    import numpy as np
    from uq_autonomy.help.crops import encode_png
    from uq_autonomy.labels.store import PendingRequest
    from uq_autonomy.labels.url import open_label_store

    url, prefix = sys.argv[1], sys.argv[2]
    store = open_label_store(url)
    rng = np.random.default_rng(abs(hash(prefix)) % 2**32)
    print('READY', flush=True)
    i = 0
    while True:
        rid = f'{prefix}-{i}'
        pixels = rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)
        store.add_request(PendingRequest(rid, reason='burst', candidates=(('mug', 0.5),),
                                         crop_png=encode_png(pixels),
                                         embedding=rng.normal(size=64)))
        label = f'class-{i % 7}'
        result = store.answer(rid, label, 'writer')
        if result.accepted:  # acknowledged only after the commit returned
            print(f'ACK {rid} {label}', flush=True)
        if i % 3 == 0 and i:  # re-answers: must stay one label each
            store.answer(f'{prefix}-{i - 1}', f'class-{(i - 1) % 7}', 'writer')
        i += 1
''')


def test_acknowledged_labels_survive_kill_9(store_url: str, raw: Any) -> None:
    acknowledged: dict[str, str] = {}
    rng = random.Random(1)
    for round_ in range(4):
        proc = subprocess.Popen([sys.executable, '-c', WRITER, store_url, f'round{round_}'],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == 'READY', proc.stderr.read()
            target = rng.randint(5, 60)
            count = 0
            while count < target:
                line = proc.stdout.readline()
                assert line, f'writer died: {proc.stderr.read()}'
                count += line.startswith('ACK ')
                if line.startswith('ACK ') and line.endswith('\n'):
                    _, rid, label = line.split()
                    acknowledged[rid] = label
            time.sleep(rng.random() * 0.02)  # land the kill anywhere in the next answer
            os.kill(proc.pid, signal.SIGKILL)
            rest, _ = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == -signal.SIGKILL  # it was killed mid-burst, not finished
        for line in rest.splitlines(keepends=True):
            if line.startswith('ACK ') and line.endswith('\n'):
                _, rid, label = line.split()
                acknowledged[rid] = label

        with open_label_store(store_url) as store:
            assert store.integrity_check() == ['ok']
            labels = {r.request_id: r.label for r in store.labels()}
        rows = raw().execute(
            'SELECT request_id, COUNT(*) FROM labels GROUP BY request_id').fetchall()
        counts = {rid: n for rid, n in rows}
        missing = [rid for rid in acknowledged if rid not in labels]
        assert missing == []
        assert all(counts[rid] == 1 for rid in acknowledged)
        assert all(labels[rid] == label for rid, label in acknowledged.items())
    assert len(acknowledged) >= 4 * 5


# -- robots ----------------------------------------------------------------------------------

def test_requests_and_labels_carry_the_robot_that_asked(store: ls.LabelStoreBase) -> None:
    store.add_request(request('a1', robot_id='robot-a', created=1.0))
    store.add_request(request('b1', robot_id='robot-b', created=2.0))
    store.add_request(request('a2', robot_id='robot-a', created=3.0))
    assert [r.request_id for r in store.pending_requests()] == ['a1', 'b1', 'a2']
    assert [r.request_id for r in store.pending_requests(robot_id='robot-a')] == ['a1', 'a2']
    assert [r.request_id for r in store.pending_requests(1, robot_id='robot-a')] == ['a1']
    assert store.get_request('b1').robot_id == 'robot-b'
    assert store.robot_ids() == ['robot-a', 'robot-b']
    store.answer('b1', 'mug', 'alice')
    store.answer('a1', 'cup', 'alice')
    assert [(r.request_id, r.robot_id) for r in store.labels()] == [
        ('b1', 'robot-b'), ('a1', 'robot-a')]
    assert [r.request_id for r in store.labels(robot_id='robot-a')] == ['a1']
    assert store.last_seq() == 2 and store.labels(since_seq=store.last_seq()) == []


@pytest.mark.parametrize('robot_id', ['-lead', 'a b', 'x' * 65, 'robot/1', 'ü'])
def test_invalid_robot_ids_are_refused(store: ls.LabelStoreBase, robot_id: str) -> None:
    with pytest.raises(LabelValidationError, match='robot_id .* is invalid'):
        store.add_request(request('r1', robot_id=robot_id))
    assert store.pending_requests() == []


# -- store URLs ------------------------------------------------------------------------------

def test_store_urls_name_a_file_or_a_database(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('UQ_LABEL_STORE', str(tmp_path / 'default.sqlite3'))
    assert parse_store_url('').path == tmp_path / 'default.sqlite3'
    assert parse_store_url(None).kind == 'sqlite'
    assert parse_store_url('sqlite:///var/lib/x.sqlite3').path == Path('/var/lib/x.sqlite3')
    assert parse_store_url('sqlite:rel/x.sqlite3').path == Path('rel/x.sqlite3')
    assert parse_store_url(tmp_path / 'plain.sqlite3').path == tmp_path / 'plain.sqlite3'
    pg = parse_store_url('postgresql://fleet:secret@db.local:5433/labels')
    assert pg.kind == 'postgresql' and str(pg) == 'postgresql://fleet:***@db.local:5433/labels'
    assert parse_store_url('postgres://h/db').kind == 'postgresql'
    for bad, message in (('mysql://h/db', "unknown scheme 'mysql'"),
                         ('sqlite://', 'names no file'),
                         ('postgresql:db', 'write postgresql://')):
        with pytest.raises(ValueError, match=message):
            parse_store_url(bad)


# -- PostgreSQL only -------------------------------------------------------------------------

def test_an_unreachable_server_is_one_clear_error_without_the_password(
        postgres_server: Any) -> None:
    url = f'postgresql://fleet:secret@127.0.0.1:{postgres_server.port}/no_such_database'
    with pytest.raises(LabelStoreError) as refused:
        open_label_store(url, timeout_s=2.0)
    message = str(refused.value)
    assert message.startswith('cannot connect to label store postgresql://fleet:***@127.0.0.1')
    assert 'secret' not in message and '\n' not in message


def test_a_lost_connection_fails_one_call_and_the_next_reconnects(postgres_url: str) -> None:
    import psycopg

    with open_label_store(postgres_url) as store:
        store.add_request(request('r1'))
        pid = store._connection().conn.info.backend_pid
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute('SELECT pg_terminate_backend(%s)', (pid,))
        with pytest.raises(LabelStoreError, match='connection lost .* nothing was acknowledged'):
            store.answer('r1', 'mug', 'alice')
        assert store.answer('r1', 'mug', 'alice').status is AnswerStatus.STORED
        assert store.count_labels() == 1
