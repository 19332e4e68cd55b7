"""Fixtures for the unit and contract tests: real Redis, real HTTP servers, no mocks."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis_server import RedisServer

from rlfleet.shared.infra.storage import DirectoryStorage, RedisStorage, Storage

from .helpers import REDIS_URL, CoordinatorPool, CoordinatorProc, TaskSink

# -- storage ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis the suite needs; fails (not skips) when it is not there."""
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except redis.RedisError as err:
        pytest.fail(f"the unit tests need a Redis server at {REDIS_URL}: {err}")
    return REDIS_URL


@pytest.fixture
def redis_storage(redis_url: str) -> Iterator[RedisStorage]:
    """A RedisStorage under a namespace of its own, whose keys are deleted afterwards."""
    store = RedisStorage(redis_url, namespace=f"test-{uuid.uuid4().hex}")
    try:
        yield store
    finally:
        store.clear()
        store.close()


@pytest.fixture(params=["directory", "redis"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    """Every test that takes `storage` runs once per backend."""
    if request.param == "directory":
        return DirectoryStorage(tmp_path / "storage")
    return request.getfixturevalue("redis_storage")


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own (`tests/redis_server.py`), for tests that kill or
    restart Redis; stopped afterwards."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.close()


# -- fake workers -------------------------------------------------------------------------------


def _sink_factory() -> Iterator[Callable[[], TaskSink]]:
    sinks: list[TaskSink] = []

    def make() -> TaskSink:
        sinks.append(TaskSink.start())
        return sinks[-1]

    try:
        yield make
    finally:
        for s in sinks:
            s.close()


@pytest.fixture
def task_sink() -> Iterator[Callable[[], TaskSink]]:
    """A factory: each call starts one more fake worker; all are shut down afterwards."""
    yield from _sink_factory()


@pytest.fixture(scope="module")
def module_task_sink() -> Iterator[Callable[[], TaskSink]]:
    yield from _sink_factory()


# -- real coordinators ---------------------------------------------------------------------------


@pytest.fixture(scope="package")
def coordinator_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorPool]:
    """The unit suite's coordinators, every one stopped when the suite ends: a prewarmed spare
    nobody took would otherwise idle (and tick) through the slow suites after it."""
    pool = CoordinatorPool(tmp_path_factory.mktemp("coordinators"))
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def coordinator(coordinator_pool: CoordinatorPool) -> Iterator[Callable[..., CoordinatorProc]]:
    """A factory: `coordinator(algo={...}, ...)` returns a real coordinator process running
    the test config (`helpers.make_config`) with those sections changed; it is terminated
    when the test ends."""
    taken: list[CoordinatorProc] = []

    def take(**overrides: dict) -> CoordinatorProc:
        taken.append(coordinator_pool.take(**overrides))
        return taken[-1]

    try:
        yield take
    finally:
        for c in taken:
            coordinator_pool.release(c)


@pytest.fixture(scope="module")
def module_coordinator(coordinator_pool: CoordinatorPool) -> Iterator[CoordinatorProc]:
    """One default coordinator shared by a module's tests (each must leave it as it found it)."""
    c = coordinator_pool.take()
    try:
        yield c
    finally:
        coordinator_pool.release(c)
