"""Label store: durability (kill -9), idempotence, conflicts, schema migration, bad files."""

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
from pathlib import Path

import numpy as np
import pytest

from uq_autonomy import label_store as ls
from uq_autonomy.crops import encode_png, png_size
from uq_autonomy.label_store import (
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
)
from uq_autonomy.label_validation import LabelValidationError, validate_label


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


@pytest.fixture
def store(tmp_path: Path) -> LabelStore:
    s = LabelStore(tmp_path / 'labels.sqlite3', clock=lambda: 1_700_000_000.0)
    yield s
    s.close()


# -- answers ---------------------------------------------------------------------------------

def test_answer_stores_the_request_data_durably(store: LabelStore) -> None:
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


def test_wal_mode_synchronous_full_and_schema_version(store: LabelStore) -> None:
    conn = sqlite3.connect(store.path)
    try:
        assert conn.execute('PRAGMA journal_mode').fetchone()[0] == 'wal'
        assert conn.execute('PRAGMA user_version').fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()
    assert store._connection().execute('PRAGMA synchronous').fetchone()[0] == 2  # FULL
    assert store.schema_version == SCHEMA_VERSION


def test_same_answer_twice_is_one_label(store: LabelStore) -> None:
    store.add_request(request('r1'))
    first = store.answer('r1', 'tea pot', 'alice')
    again = store.answer('r1', '  tea   pot ', 'bob')  # same label after normalisation
    assert again.status is AnswerStatus.DUPLICATE and again.accepted and not again.changed
    assert "already has this answer ('tea pot' by alice at 2023-11-14T22:13:20Z)" in again.message
    assert store.count_labels() == 1
    assert store.get_label('r1').seq == first.record.seq


def test_conflicting_answer_is_refused_unless_overruled(store: LabelStore) -> None:
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


def test_labels_since_seq_is_a_change_feed(store: LabelStore) -> None:
    for rid in ('a', 'b', 'c'):
        store.add_request(request(rid))
        store.answer(rid, 'mug', 'x')
    assert [r.request_id for r in store.labels()] == ['a', 'b', 'c']
    last = store.labels()[-1].seq
    assert store.labels(since_seq=last) == []
    store.answer('a', 'cup', 'y', overrule=True)
    assert [(r.request_id, r.label) for r in store.labels(since_seq=last)] == [('a', 'cup')]
    assert [r.request_id for r in store.labels(limit=2)] == ['b', 'c']


def test_unknown_and_withdrawn_requests_are_refused(store: LabelStore) -> None:
    unknown = store.answer('nope', 'mug', 'alice')
    assert unknown.status is AnswerStatus.UNKNOWN_REQUEST and not unknown.accepted
    assert unknown.message.startswith("unknown request 'nope': no such help request")
    store.add_request(request('r2'))
    assert store.withdraw_request('r2')
    assert not store.withdraw_request('r2')
    withdrawn = store.answer('r2', 'mug', 'alice')
    assert withdrawn.status is AnswerStatus.WITHDRAWN
    assert store.count_labels() == 0 and store.pending_requests() == []


def test_put_label_imports_complete_records_idempotently(store: LabelStore) -> None:
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
def test_invalid_labels_are_refused_before_writing(store: LabelStore, label: object,
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


def test_labels_differing_only_in_case_are_one_answer(store: LabelStore) -> None:
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
def test_invalid_labelers_are_refused(store: LabelStore, labeler: str, message: str) -> None:
    store.add_request(request('r1'))
    with pytest.raises(LabelValidationError, match=message):
        store.answer('r1', 'mug', labeler)


@pytest.mark.parametrize('rid', ['', '../etc', 'a b', '-lead', 'x' * 129, 'ü', 'a/b'])
def test_invalid_request_ids_are_refused(store: LabelStore, rid: str) -> None:
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
def test_invalid_requests_are_refused(store: LabelStore, fields: dict, message: str) -> None:
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


def test_v1_file_is_migrated_to_v2(tmp_path: Path) -> None:
    path = tmp_path / 'v1.sqlite3'
    create_v1_store_for_tests(path, v1_rows())
    with LabelStore(path) as store:
        assert store.schema_version == 2
        first, second = store.labels()
        assert (first.request_id, first.label, first.box, first.seq) == (
            'old-1', 'mug', (8.0, 5.0, 4.0, 6.0), 1)  # centre form -> COCO xywh
        np.testing.assert_array_equal(first.embedding, np.ones(4, np.float32))
        assert first.crop_png == crop(1)
        assert (second.box, second.seq, second.revision) == (None, 2, 1)
        # The migrated file works as a v2 store.
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

    def broken(conn: sqlite3.Connection) -> None:
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


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / 'future.sqlite3'
    LabelStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute('PRAGMA user_version = 99')
    conn.close()
    with pytest.raises(LabelStoreVersionError,
                       match=rf'label store {path} has schema version 99, newer'):
        LabelStore(path)


def test_foreign_sqlite_database_is_not_taken_over(tmp_path: Path) -> None:
    path = tmp_path / 'other.sqlite3'
    conn = sqlite3.connect(path)
    conn.execute('CREATE TABLE customers (id INTEGER)')
    conn.commit()
    conn.close()
    with pytest.raises(LabelStoreCorruptError, match='is an SQLite database but not a label '
                                                     'store'):
        LabelStore(path)


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


def test_locked_file_gives_a_clear_error_and_readers_keep_working(tmp_path: Path) -> None:
    path = tmp_path / 'locked.sqlite3'
    with LabelStore(path) as setup:
        setup.add_request(request('r1'))
    store = LabelStore(path, timeout_s=0.2)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute('BEGIN IMMEDIATE')  # another writer holds the write lock
        with pytest.raises(LabelStoreLockedError,
                           match=rf'label store {path} is locked by another process or '
                                 r'connection \(waited 0.2 s\) while storing the answer to r1'):
            store.answer('r1', 'mug', 'alice')
        assert [p.request_id for p in store.pending_requests()] == ['r1']  # WAL: reads go on
        other.execute('ROLLBACK')
        assert store.answer('r1', 'mug', 'alice').accepted  # and it recovers
    finally:
        other.close()
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


def test_read_only_open_refuses_writes_but_reads(tmp_path: Path) -> None:
    path = tmp_path / 'ro.sqlite3'
    with LabelStore(path) as store:
        store.add_request(request('r1'))
        store.answer('r1', 'mug', 'alice')
    with LabelStore(path, readonly=True) as reader:
        assert [r.label for r in reader.labels()] == ['mug']
        with pytest.raises(LabelStoreReadOnlyError,
                           match=f'label store {path} is opened read-only; refused while '
                                 'storing the answer to r1'):
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
def test_errors_are_classified_from_the_message_alone(store: LabelStore, error: Exception,
                                                      kind: type, message: str) -> None:
    # Errors built here carry no sqlite_errorname, like every error on Python 3.10.
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
    store = LabelStore(tmp_path / 'closed.sqlite3')
    store.close()
    store.close()
    with pytest.raises(LabelStoreError, match='closed.sqlite3 is closed'):
        store.pending_requests()


def test_undecodable_fields_degrade_instead_of_crashing(store: LabelStore) -> None:
    store.add_request(request('r1'))
    store.answer('r1', 'mug', 'alice')
    conn = store._connection()
    conn.execute("UPDATE labels SET embedding = x'0102030405', candidates = '{broken'")
    record = store.labels()[0]
    assert record.embedding is None and record.candidates == ()
    assert record.label == 'mug'


# -- concurrency and durability --------------------------------------------------------------

def test_concurrent_answers_from_threads_and_connections(tmp_path: Path) -> None:
    path = tmp_path / 'threads.sqlite3'
    stores = [LabelStore(path), LabelStore(path)]
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
    from uq_autonomy.crops import encode_png
    from uq_autonomy.label_store import LabelStore, PendingRequest

    path, prefix = sys.argv[1], sys.argv[2]
    store = LabelStore(path)
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


def test_acknowledged_labels_survive_kill_9(tmp_path: Path) -> None:
    path = tmp_path / 'kill.sqlite3'
    acknowledged: dict[str, str] = {}
    rng = random.Random(1)
    for round_ in range(4):
        proc = subprocess.Popen([sys.executable, '-c', WRITER, str(path), f'round{round_}'],
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

        with LabelStore(path) as store:
            assert store.integrity_check() == ['ok']
            rows = store._connection().execute(
                'SELECT request_id, COUNT(*) FROM labels GROUP BY request_id').fetchall()
            counts = {rid: n for rid, n in rows}
            labels = {r.request_id: r.label for r in store.labels()}
        missing = [rid for rid in acknowledged if rid not in labels]
        assert missing == []
        assert all(counts[rid] == 1 for rid in acknowledged)
        assert all(labels[rid] == label for rid, label in acknowledged.items())
    assert len(acknowledged) >= 4 * 5
