"""Fixtures shared by every test folder of the workspace: rclpy contexts on a ROS domain
private to the test module, so that test modules running side by side do not hear each
other; a ROS home private to the test run, so that what a detector learns in one test (its
learnt state persists under the ROS home by default) never reaches another test or the
user's own ``~/.ros``; the product's loggers kept propagating under the optional launch
kit; and a private PostgreSQL server for the fleet label store's tests (started once per test
run in a temporary directory, one fresh database per test, torn down at the end; tests that
need it skip, saying why, where the PostgreSQL binaries are not installed)."""

from __future__ import annotations

import gc
import logging
import os
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

WORKSPACE = Path(__file__).resolve().parent
# ONNX exports of the shipped model for the onnxruntime backend, built once for every test
# run of this checkout (a fresh export takes seconds, too long for each node start).
TEST_CACHE = WORKSPACE / 'build' / 'test-cache'


def pytest_configure(config: pytest.Config) -> None:
    # Set before any test starts a node process, which inherits them.
    os.environ['ROS_HOME'] = tempfile.mkdtemp(prefix='uq-test-ros-home-')
    os.environ.setdefault('UQ_CACHE_DIR', str(TEST_CACHE))
    _export_shipped_model(Path(os.environ['UQ_CACHE_DIR']))


def _export_shipped_model(cache: Path) -> None:
    """Build (or check) the cached ONNX export of the shipped model with the shipped GP, as
    a detector node's start does (which records the check), so that detector nodes started
    by the tests find it and start from it; without the workspace's packages there is
    nothing to do, and an export that cannot run leaves the nodes to fall back to
    pytorch-cpu, as they do."""
    try:
        from uq_perception.detectors.model_files import default_detector_path, default_gp_path
        from uq_perception.ntk import LastLayerNTKGP
        from uq_perception.runtime.loading import RuntimeSettings, load_model, start_detector
    except ImportError:
        return
    model_path, gp_path = default_detector_path(), default_gp_path()
    if model_path.is_file() and gp_path.is_file():
        runtime = RuntimeSettings(onnx_cache_dir=cache)
        loaded = load_model('torch', model_path, runtime)
        start_detector(loaded, runtime, LastLayerNTKGP.load(
            gp_path, feature_dim=loaded.feature_dim, model_id=loaded.model_id))


def _private_context(module_name: str) -> Iterator[Any]:
    import rclpy

    domain_id = 100 + zlib.crc32(module_name.encode()) % 100
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain_id)
    try:
        yield context
    finally:
        context.try_shutdown()
        # A shut-down context keeps its DDS participant, and the entities of the test's
        # nodes with it, until the objects that hold them are collected: earlier tests'
        # participants then stayed in the graph, and a half-destroyed service of one made
        # a later test's service of the same name look unavailable. Collect the test's
        # objects, then free the participant now.
        gc.collect()
        context.destroy()


@pytest.fixture
def ros_context(request: pytest.FixtureRequest) -> Iterator[Any]:
    """An initialised rclpy context for one test."""
    yield from _private_context(request.module.__name__)


@pytest.fixture(scope='module')
def module_ros_context(request: pytest.FixtureRequest) -> Iterator[Any]:
    """An initialised rclpy context shared by the tests of one module."""
    yield from _private_context(request.module.__name__)


@pytest.fixture(scope='session')
def postgres_server() -> Iterator[Any]:
    """A private PostgreSQL server for the whole test run
    (:class:`uq_autonomy.labels.postgres_server.TemporaryPostgres`: ``initdb`` and ``pg_ctl`` in a
    temporary directory, as an unprivileged account when the tests run as root)."""
    from uq_autonomy.labels.postgres_server import (
        PostgresUnavailable,
        TemporaryPostgres,
        find_bindir,
    )

    try:
        find_bindir()
    except PostgresUnavailable as err:
        pytest.skip(str(err))
    pytest.importorskip('psycopg', reason='psycopg 3 is not installed (make setup installs it)')
    server = TemporaryPostgres().start()
    try:
        yield server
    finally:
        server.stop()


_databases = iter(range(1, 1_000_000))


@pytest.fixture
def postgres_url(postgres_server: Any) -> str:
    """The URL of a fresh, empty database on the test run's PostgreSQL server."""
    return postgres_server.create_database(f'test_{os.getpid()}_{next(_databases)}')


PRODUCT_PACKAGES = ('uq_autonomy', 'uq_common', 'uq_eval', 'uq_perception', 'uq_sim')


@pytest.fixture(autouse=True)
def _product_loggers_propagate() -> Iterator[None]:
    """Importing ``launch`` (the launch kit's pytest plugins do, when it is active) makes
    every logger created afterwards a non-propagating ``LaunchLogger``, which hides the
    product's log records from ``caplog``. During each test the product's loggers, existing
    and created, propagate, as they do without the kit."""
    launch_class = logging.getLoggerClass()
    if launch_class is logging.Logger:
        yield
        return
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.split('.')[0] in PRODUCT_PACKAGES:
            logger.propagate = True

    class ProductLoggersPropagate(launch_class):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if self.name.split('.')[0] in PRODUCT_PACKAGES:
                self.propagate = True

    logging.setLoggerClass(ProductLoggersPropagate)
    try:
        yield
    finally:
        logging.setLoggerClass(launch_class)
