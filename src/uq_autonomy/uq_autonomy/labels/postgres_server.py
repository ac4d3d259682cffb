"""A private PostgreSQL server in a temporary directory, for tests and benchmarks of the fleet
label store (ROS-free).

:class:`TemporaryPostgres` runs Debian's (or any) PostgreSQL binaries: ``initdb`` into a
fresh directory, ``pg_ctl start`` on a free loopback port with trust authentication (only
this machine can connect), ``pg_ctl stop`` and removal of the directory at the end. The
binaries are found through ``$UQ_PG_BINDIR``, then ``pg_config --bindir``, then
``/usr/lib/postgresql/<newest>/bin``.

PostgreSQL refuses to run as root (``initdb`` stops with "cannot be run as root"). When this
process is root, the server runs as an unprivileged account instead, through ``runuser``:
``postgres`` (the account Debian's package creates) when it exists, else ``nobody``; its
directory is created in the system's temporary folder and handed to that account.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

ENV_BINDIR = 'UQ_PG_BINDIR'
SUPERUSER = 'uq'


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL server binaries are not installed (or cannot run here)."""


def find_bindir() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``.

    Raises
    ------
    PostgresUnavailable
        When none is found; the message says how to install them.
    """
    candidates: list[Path] = []
    if os.environ.get(ENV_BINDIR):
        candidates.append(Path(os.environ[ENV_BINDIR]))
    if shutil.which('pg_config'):
        try:
            out = subprocess.run(['pg_config', '--bindir'], capture_output=True, text=True,
                                 timeout=10, check=True).stdout.strip()
            candidates.append(Path(out))
        except (OSError, subprocess.SubprocessError):
            pass
    versions = sorted(Path('/usr/lib/postgresql').glob('*/bin'),
                      key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
                      reverse=True)
    candidates.extend(versions)
    for bindir in candidates:
        if (bindir / 'initdb').is_file() and (bindir / 'pg_ctl').is_file():
            return bindir
    raise PostgresUnavailable(
        'PostgreSQL server binaries (initdb, pg_ctl) not found: install Debian\'s postgresql '
        f'package (make setup does), or set ${ENV_BINDIR}')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return int(s.getsockname()[1])


def _server_account() -> str | None:
    """The account to run the server as: None for this one, unless it is root."""
    if os.geteuid() != 0:
        return None
    for name in ('postgres', 'nobody'):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise PostgresUnavailable('running as root and neither a postgres nor a nobody account '
                              'exists to run the PostgreSQL server as')


class TemporaryPostgres:
    """A throwaway PostgreSQL server: ``with TemporaryPostgres() as pg: pg.url('labels')``.

    Parameters
    ----------
    fsync : bool
        Keep the server's ``fsync`` on (the default, as a real deployment), so durability
        and throughput figures measured on it are honest.
    max_connections : int
        The server's connection limit.
    """

    def __init__(self, fsync: bool = True, max_connections: int = 100) -> None:
        self.bindir = find_bindir()
        self.fsync = fsync
        self.max_connections = int(max_connections)
        self.account = _server_account()
        self.directory: Path | None = None
        self.port = 0

    @property
    def data_dir(self) -> Path:
        assert self.directory is not None
        return self.directory / 'data'

    def _run(self, args: list[str], timeout: float = 120.0) -> subprocess.CompletedProcess:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.account is not None:
            command = ['runuser', '-u', self.account, '--', *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                cwd=self.directory)
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise PostgresUnavailable(f'{args[0]} failed: {detail[-1] if detail else "?"}')
        return result

    def start(self) -> TemporaryPostgres:
        """Create the cluster and start the server (waits until it accepts connections)."""
        self.directory = Path(tempfile.mkdtemp(prefix='uq-postgres-'))
        if self.account is not None:
            entry = pwd.getpwnam(self.account)
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        try:
            self._run(['initdb', '-D', str(self.data_dir), '-U', SUPERUSER, '--auth=trust',
                       '--encoding=UTF8', '--locale=C', '--no-instructions'])
            last: Exception | None = None
            for _ in range(3):  # a free port may be taken before the server binds it
                self.port = _free_port()
                options = (f'-p {self.port} -c listen_addresses=127.0.0.1 '
                           f'-k {self.directory} -c fsync={"on" if self.fsync else "off"} '
                           f'-c max_connections={self.max_connections}')
                try:
                    self._run(['pg_ctl', '-D', str(self.data_dir), '-o', options, '-l',
                               str(self.directory / 'server.log'), '-w', '-t', '60', 'start'])
                    return self
                except PostgresUnavailable as err:
                    last = err
            raise PostgresUnavailable(f'the PostgreSQL server did not start: {last}')
        except BaseException:
            self.stop()
            raise

    def url(self, database: str = 'postgres') -> str:
        """The connection URL of a database on this server."""
        return f'postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}'

    def create_database(self, name: str) -> str:
        """Create an empty database and return its URL."""
        import psycopg

        if not name.replace('_', '').isalnum():
            raise ValueError(f'database name {name!r}: use letters, digits and _')
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE {name}')
        return self.url(name)

    def stop(self) -> None:
        """Stop the server and remove its directory (idempotent)."""
        if self.directory is None:
            return
        if (self.data_dir / 'postmaster.pid').exists():
            try:
                self._run(['pg_ctl', '-D', str(self.data_dir), '-m', 'immediate', '-w',
                           'stop'], timeout=60)
            except (PostgresUnavailable, subprocess.SubprocessError):
                pass
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory = None

    def __enter__(self) -> TemporaryPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
