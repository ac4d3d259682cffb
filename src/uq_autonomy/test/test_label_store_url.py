"""Which store a ``label_store_url`` names (``uq_autonomy.labels.url``), by rule: every case
spelling of every scheme, every number of slashes of an absolute SQLite path, and the URL
handed on to the PostgreSQL driver as libpq reads it."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from uq_autonomy.labels.store import LabelStoreError, LabelStoreReadOnlyError, PendingRequest
from uq_autonomy.labels.url import (
    StoreUrl,
    open_label_store,
    open_store_for_reading,
    parse_store_url,
)


def spellings(word: str) -> list[str]:
    """Every upper/lower-case spelling of ``word`` (2 ** len(word) of them)."""
    return [''.join(chars) for chars in itertools.product(*((c.lower(), c.upper())
                                                            for c in word))]


@pytest.mark.parametrize('scheme', ['sqlite', 'postgresql', 'postgres'])
def test_every_case_spelling_of_a_scheme_names_the_same_store(scheme: str) -> None:
    # RFC 3986 schemes are case-insensitive: SQLite:// or PostgreSQL:// (as people type
    # them from documentation) must not be refused as unknown schemes.
    variants = spellings(scheme)
    assert len(variants) == 2 ** len(scheme)
    for variant in variants:
        if scheme == 'sqlite':
            absolute = parse_store_url(f'{variant}:///var/lib/uq/labels.sqlite3')
            assert (absolute.kind, absolute.path) == (
                'sqlite', Path('/var/lib/uq/labels.sqlite3')), variant
            relative = parse_store_url(f'{variant}:rel/labels.sqlite3')
            assert (relative.kind, relative.path) == (
                'sqlite', Path('rel/labels.sqlite3')), variant
        else:
            where = parse_store_url(f'{variant}://fleet:secret@db.lab:5433/labels')
            assert where.kind == 'postgresql', variant
            # Only the scheme's case changes: user, password, host and database stay as
            # written (they are case-sensitive).
            assert where.url == f'{scheme}://fleet:secret@db.lab:5433/labels', variant


@pytest.mark.parametrize('scheme', ['postgresql', 'postgres'])
def test_the_url_handed_to_the_driver_is_one_libpq_reads(scheme: str) -> None:
    conninfo = pytest.importorskip('psycopg.conninfo',
                                   reason='psycopg is part of make setup\'s install')
    for variant in spellings(scheme):
        where = parse_store_url(f'{variant}://fleet@db.lab:5433/labels')
        assert conninfo.conninfo_to_dict(where.url) == {
            'user': 'fleet', 'host': 'db.lab', 'port': '5433', 'dbname': 'labels'}, variant


@pytest.mark.parametrize('url', ['sqlite3:///x.sqlite3', 'SQLITE3:///x.sqlite3',
                                 'postgresqlx://h/db', 'Postgre://h/db', 'MySQL://h/db',
                                 'pg://h/db'])  # two letters: a scheme (one is a drive)
def test_other_schemes_are_refused_whatever_their_case(url: str) -> None:
    with pytest.raises(ValueError, match='unknown scheme'):
        parse_store_url(url)


@pytest.mark.parametrize('slashes', [3, 4, 5])
@pytest.mark.parametrize('path', ['/tmp/labels.sqlite3', '/XY/labels.sqlite3'])
def test_an_absolute_sqlite_path_may_have_sqlalchemys_four_slashes(slashes: int,
                                                                   path: str) -> None:
    # sqlite:///abs (this workspace's form) and sqlite:////abs (SQLAlchemy's) name one file;
    # '//abs' left as is would reach sqlite3 as a URI with host 'abs'. Only slashes go.
    where = parse_store_url('sqlite:' + '/' * (slashes - 1) + path)
    assert where.kind == 'sqlite' and where.path == Path(path)
    assert str(where) == f'sqlite://{path}'
    assert parse_store_url(str(where)) == where


def test_both_absolute_forms_open_the_same_file_and_relative_stays_relative(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert tmp_path.is_absolute()
    file = tmp_path / 'labels.sqlite3'
    with open_label_store(f'sqlite://{file}') as store:  # three slashes
        store.add_request(PendingRequest('r1', reason='unsure', candidates=(('mug', 0.6),)))
    with open_label_store(f'sqlite:///{file}', create=False) as store:  # four slashes
        assert [r.request_id for r in store.pending_requests()] == ['r1']
    # sqlite:rel/path is relative to the working folder, as documented.
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'rel').mkdir()
    with open_label_store('sqlite:rel/labels.sqlite3') as store:
        store.add_request(PendingRequest('r2', reason='unsure', candidates=(('box', 0.5),)))
    assert (tmp_path / 'rel' / 'labels.sqlite3').is_file()


@pytest.mark.parametrize('url', ['sqlite:', 'sqlite://', 'sqlite:///', 'sqlite:////'])
def test_an_sqlite_url_without_a_file_is_one_line_naming_the_forms(url: str) -> None:
    with pytest.raises(ValueError, match='names no file: use sqlite:///absolute/path') as err:
        parse_store_url(url)
    assert '\n' not in str(err.value)


@pytest.mark.parametrize('value', ['', None, '   ', '\t\n'])
def test_an_empty_url_is_the_default_file(value, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('UQ_LABEL_STORE', str(tmp_path / 'default.sqlite3'))
    assert parse_store_url(value) == StoreUrl('sqlite', path=tmp_path / 'default.sqlite3')


@pytest.mark.parametrize(('value', 'path'), [
    ('labels.sqlite3', 'labels.sqlite3'),
    ('/var/lib/uq/labels.sqlite3', '/var/lib/uq/labels.sqlite3'),
    ('  /var/lib/uq/labels.sqlite3 ', '/var/lib/uq/labels.sqlite3'),  # stripped
    ('C:/robot/labels.sqlite3', 'C:/robot/labels.sqlite3'),  # a one-letter "scheme": a drive
    ('rel/dir:x/labels.sqlite3', 'rel/dir:x/labels.sqlite3'),  # '/' before ':': a path
    ('dossier-é:x/labels.sqlite3', 'dossier-é:x/labels.sqlite3'),  # not ASCII: a path
])
def test_a_plain_path_names_an_sqlite_file(value: str, path: str) -> None:
    assert parse_store_url(value) == StoreUrl('sqlite', path=Path(path))
    assert parse_store_url(Path(path)) == StoreUrl('sqlite', path=Path(path))


def test_a_home_folder_is_expanded_in_every_sqlite_form(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    monkeypatch.setenv('HOME', str(tmp_path))
    for value in ('~/labels.sqlite3', 'sqlite:~/labels.sqlite3'):
        assert parse_store_url(value).path == tmp_path / 'labels.sqlite3', value


def test_a_parsed_url_prints_as_a_url_that_parses_to_it() -> None:
    for value, text in (('sqlite:///var/x.sqlite3', 'sqlite:///var/x.sqlite3'),
                        ('sqlite:rel/x.sqlite3', 'sqlite:rel/x.sqlite3'),
                        ('postgresql://fleet@db:5432/labels', 'postgresql://fleet@db:5432/labels'),
                        ('postgres://h/db', 'postgres://h/db')):
        where = parse_store_url(value)
        assert str(where) == text and parse_store_url(str(where)) == where
    # The password never reaches a message or a log line.
    secret = parse_store_url('PostgreSQL://fleet:s3cret@db.lab:5433/labels')
    assert str(secret) == 'postgresql://fleet:***@db.lab:5433/labels'


@pytest.mark.parametrize('url', ['postgresql:db', 'postgres:/h/db', 'PostgreSQL:labels'])
def test_a_postgresql_url_without_its_slashes_is_refused_naming_the_form(url: str) -> None:
    with pytest.raises(ValueError, match='write postgresql://user@host:port/database'):
        parse_store_url(url)


def test_open_label_store_passes_on_what_it_is_asked(tmp_path: Path) -> None:
    file = tmp_path / 'labels.sqlite3'
    with pytest.raises(LabelStoreError, match='does not exist'):
        open_label_store(f'sqlite://{file}', create=False)
    assert not file.exists()
    with open_label_store(str(file), clock=lambda: 1234.5) as store:
        store.add_request(PendingRequest('r1', reason='unsure', candidates=(('mug', 0.6),)))
        assert store.pending_requests()[0].created == 1234.5
    with open_label_store(f'sqlite:{file}', readonly=True) as store:
        with pytest.raises(LabelStoreReadOnlyError):
            store.add_request(PendingRequest('r2', reason='unsure', candidates=(('b', 0.5),)))
    with open_label_store(file) as default, open_label_store(file, timeout_s=0.25) as short:
        assert (default.timeout_s, short.timeout_s) == (5.0, 0.25)


def test_a_store_opened_for_reading_lists_it_and_a_missing_one_is_an_error(
        tmp_path: Path) -> None:
    file = tmp_path / 'labels.sqlite3'
    with pytest.raises(LabelStoreError, match='does not exist'):
        open_store_for_reading(f'SQLite://{file}')
    with open_label_store(file) as store:
        store.add_request(PendingRequest('r1', reason='unsure', candidates=(('mug', 0.6),)))
    with open_store_for_reading(f'sqlite:///{file}', timeout_s=1.5) as store:
        assert [r.request_id for r in store.pending_requests()] == ['r1']
        assert store.timeout_s == 1.5
    with open_store_for_reading(file) as store:
        assert store.timeout_s == 5.0


def test_a_postgresql_url_opens_the_fleet_store_as_asked(postgres_url: str) -> None:
    # Through the URL as people write it (scheme in any case), with every setting passed on:
    # an empty database is no store until one is created; reading never writes.
    shouting = 'PostgreSQL' + postgres_url[postgres_url.index(':'):]
    with pytest.raises(LabelStoreError, match='empty database'):
        open_label_store(shouting, create=False)
    with open_label_store(shouting, timeout_s=2.0, clock=lambda: 4321.0) as store:
        assert (store.url, store.readonly, store.timeout_s) == (postgres_url, False, 2.0)
        store.add_request(PendingRequest('r1', reason='unsure', candidates=(('mug', 0.6),)))
        assert store.pending_requests()[0].created == 4321.0
    with open_label_store(shouting, readonly=True) as store:
        assert store.readonly and store.timeout_s == 5.0
    with open_store_for_reading(shouting, timeout_s=3.0) as store:
        assert (store.url, store.readonly, store.timeout_s) == (postgres_url, True, 3.0)
        assert [r.request_id for r in store.pending_requests()] == ['r1']
        with pytest.raises(LabelStoreReadOnlyError):
            store.add_request(PendingRequest('r2', reason='unsure', candidates=(('b', 0.5),)))
