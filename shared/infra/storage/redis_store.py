"""Redis backend: chunks and weights as binary values under one run's key prefix.

The class owns its keys (see `key_*`), so no key string is assembled elsewhere. Writes of
several chunks go in one pipelined transaction: one round trip for a whole batch.

A Redis restart or a short outage is ridden out: connection errors and timeouts are retried
with exponential backoff (redis-py's own `Retry`, which covers single commands, pipelines and
transactions alike) for a bounded window, `retry_s`; only after it does a call raise
`StorageError`. Retrying is safe because every write here is idempotent (SET, SADD, ZADD, DEL)
but one: `append_journal`'s RPUSH, retried after the server ran it but before its reply came
back, appends the journal records twice. The coordinator deduplicates replayed records by
chunk id, so a duplicate costs nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from rlfleet.shared.infra.storage.base import (
    ChunkNotFound,
    Storage,
    StorageError,
    VersionConflict,
    validate_id,
)
from rlfleet.shared.infra.storage.credentials import connect_password, redact, without_userinfo

T = TypeVar("T")

DEFAULT_RETRY_S = 15.0

# ConnectionErrors that waiting cannot fix: a wrong password stays wrong. (BusyLoadingError, a
# restarted server still reading its append-only file, is retried: it is what a restart
# looks like.)
_NOT_TRANSIENT = (redis.AuthenticationError, redis.exceptions.AuthorizationError)


class WindowRetry(Retry):
    """redis-py's `Retry` with exponential backoff, bounded by time instead of a count.

    redis-py retries at several nested levels (taking a pooled connection reconnects, a
    command reconnects, a health check pings), each through the connection's retry object,
    and copies that object into every connection. A count would multiply across those levels;
    a window does not: the outermost call on a thread (or `window()`, which a storage call
    opens around all its commands) sets one deadline that every nested retry shares. So a
    call gives up after about `window_s`, plus at most one attempt (a connect timeout).
    """

    def __init__(self, window_s: float, base_s: float = 0.025, cap_s: float = 1.0) -> None:
        # The count only feeds redis-py's metrics; the window ends the retrying.
        super().__init__(ExponentialBackoff(cap=cap_s, base=base_s), retries=1_000_000,
                         supported_errors=(redis.ConnectionError, redis.TimeoutError))
        self.window_s = window_s
        self.failures = 0  # failed attempts so far, retried or not (for status and tests)
        self._count_lock = threading.Lock()
        self._local = threading.local()

    def __deepcopy__(self, memo: dict[int, Any]) -> WindowRetry:
        return self  # shared by every connection: the deadline lives per thread

    @contextmanager
    def window(self) -> Iterator[None]:
        """Every retry on this thread inside the block shares one deadline."""
        if getattr(self._local, "deadline", None) is not None:
            yield
            return
        self._local.deadline = time.monotonic() + self.window_s
        try:
            yield
        finally:
            self._local.deadline = None

    def call_with_retry(self, do: Callable[[], T], fail: Callable[..., Any],
                        is_retryable: Callable[[Exception], bool] | None = None,
                        with_failure_count: bool = False) -> T:
        with self.window():
            deadline = self._local.deadline
            self._backoff.reset()
            failures = 0
            while True:
                try:
                    return do()
                except self._supported_errors as error:
                    if isinstance(error, _NOT_TRANSIENT) or (
                            is_retryable and not is_retryable(error)):
                        raise
                    failures += 1
                    with self._count_lock:
                        self.failures += 1
                    if with_failure_count:
                        fail(error, failures)
                    else:
                        fail(error)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise
                    time.sleep(min(self._backoff.compute(failures), left))


class RedisStorage(Storage):
    """`retry_s`: how long connection errors and timeouts are retried before a call raises
    `StorageError` (a Redis restart takes a second or two; a failover longer).

    Its client never decodes replies (no `decode_responses`): they are bytes, which redis-py's
    types cannot tell from its decoding clients' str, so the readers below `cast` them."""

    def __init__(self, url: str, namespace: str = "run", client: redis.Redis | None = None,
                 retry_s: float = DEFAULT_RETRY_S, connect_timeout_s: float = 1.0) -> None:
        if retry_s < 0:
            raise ValueError(f"retry_s={retry_s} must be >= 0")
        self.url = redact(url)  # what messages show: never the password
        self.namespace = namespace
        self.prefix = f"rlfleet:{namespace}:"
        self.retry = WindowRetry(retry_s)
        # A short connect timeout: while the server is down each attempt should fail fast and
        # leave the window to the backoff, not spend it in one SYN.
        # The password apart from the URL (redis-py lets a URL's userinfo win over keyword
        # arguments): the URL's own, else the one configured (see credentials.py).
        self.client = client or redis.Redis.from_url(
            without_userinfo(url), username=urlsplit(url).username or None,
            password=connect_password(url),
            socket_timeout=10, socket_connect_timeout=connect_timeout_s,
            health_check_interval=30, retry=self.retry,
            retry_on_error=[redis.ConnectionError, redis.TimeoutError])

    def __repr__(self) -> str:
        return f"RedisStorage({self.url!r}, namespace={self.namespace!r})"

    def key_chunk(self, chunk_id: str) -> str:
        return f"{self.prefix}chunk:{validate_id(chunk_id)}"

    @property
    def key_chunk_index(self) -> str:
        return f"{self.prefix}chunks"

    def key_weights(self, version: int) -> str:
        return f"{self.prefix}weights:{int(version)}"

    def key_blob(self, name: str) -> str:
        return f"{self.prefix}blob:{validate_id(name)}"

    @property
    def key_latest(self) -> str:
        return f"{self.prefix}weights:latest"

    @property
    def key_versions(self) -> str:
        return f"{self.prefix}weights:versions"

    def key_journal(self, generation: int) -> str:
        return f"{self.prefix}journal:{int(generation)}"

    @property
    def key_journals(self) -> str:
        return f"{self.prefix}journals"

    def _call(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            with self.retry.window():  # one deadline for all the commands of this call
                return fn(*args)
        except redis.RedisError as err:
            raise StorageError(f"redis {what} failed at {self.url}: {err}") from err

    def put_chunks(self, chunks: Mapping[str, bytes]) -> None:
        if not chunks:
            return

        def write():
            pipe = self.client.pipeline(transaction=True)
            for chunk_id, data in chunks.items():
                pipe.set(self.key_chunk(chunk_id), data)
            pipe.sadd(self.key_chunk_index, *chunks.keys())
            pipe.execute()

        self._call("put_chunks", write)

    def get_chunks(self, chunk_ids: Sequence[str]) -> list[bytes]:
        if not chunk_ids:
            return []
        values = cast("list[bytes | None]", self._call(
            "get_chunks", self.client.mget, [self.key_chunk(c) for c in chunk_ids]))
        found: list[bytes] = []
        for chunk_id, value in zip(chunk_ids, values, strict=True):
            if value is None:
                raise ChunkNotFound(chunk_id)
            found.append(value)
        return found

    def delete_chunks(self, chunk_ids: Iterable[str]) -> int:
        ids = list(chunk_ids)
        if not ids:
            return 0

        def delete():
            pipe = self.client.pipeline(transaction=True)
            pipe.delete(*[self.key_chunk(c) for c in ids])
            pipe.srem(self.key_chunk_index, *ids)
            return pipe.execute()[0]

        return int(self._call("delete_chunks", delete))

    def list_chunks(self) -> list[str]:
        members = cast("set[bytes]", self._call("list_chunks", self.client.smembers,
                                                self.key_chunk_index))
        return sorted(m.decode() for m in members)

    def put_blob(self, name: str, data: bytes) -> None:
        self._call("put_blob", self.client.set, self.key_blob(name), data)

    def get_blob(self, name: str) -> bytes | None:
        return cast("bytes | None", self._call("get_blob", self.client.get, self.key_blob(name)))

    def delete_blob(self, name: str) -> None:
        self._call("delete_blob", self.client.delete, self.key_blob(name))

    # Store and announce a version only if it is newer than the latest, in one step: two
    # learners racing (one that hung and woke up outside its group) never both publish it.
    # 1: published (or this very blob already was: a retried call); 0: conflict.
    _PUBLISH = """
    local latest = redis.call('GET', KEYS[1])
    if latest and tonumber(latest) >= tonumber(ARGV[1]) then
        if redis.call('GET', KEYS[2]) == ARGV[2] then return 1 end
        return 0
    end
    redis.call('SET', KEYS[2], ARGV[2])
    redis.call('ZADD', KEYS[3], ARGV[1], ARGV[1])
    redis.call('SET', KEYS[1], ARGV[1])
    return 1
    """

    def put_weights(self, version: int, data: bytes) -> None:
        version = int(version)

        def publish():
            ok = self.client.eval(self._PUBLISH, 3, self.key_latest, self.key_weights(version),
                                  self.key_versions, version, data)
            if not ok:
                return False
            old = self.client.zrange(self.key_versions, 0, -self.keep_weight_versions - 1)
            if old:
                pipe = self.client.pipeline(transaction=True)
                pipe.delete(*[self.key_weights(int(v)) for v in old])
                pipe.zrem(self.key_versions, *old)
                pipe.execute()
            return True

        if not self._call("put_weights", publish):
            raise VersionConflict(f"policy version {version} is not newer than the latest "
                                  f"published in {self.url}")

    def latest_version(self) -> int | None:
        value = self._call("latest_version", self.client.get, self.key_latest)
        return None if value is None else int(value)

    def get_weights(self, version: int | None = None) -> tuple[int, bytes] | None:
        for _ in range(3):
            v = self.latest_version() if version is None else version
            if v is None:
                return None
            data = cast("bytes | None",
                        self._call("get_weights", self.client.get, self.key_weights(v)))
            if data is not None:
                return v, data
            if version is not None:
                return None
        return None

    # -- the coordinator's write-ahead journal ----------------------------------------------

    def append_journal(self, generation: int, records: Sequence[bytes]) -> None:
        """One MULTI/EXEC: the generation is listed and its records appended, or neither.
        A retry after a lost reply can append the records twice (see the module docstring:
        the coordinator deduplicates by chunk id)."""
        if not records:
            return
        generation = int(generation)

        def append() -> None:
            pipe = self.client.pipeline(transaction=True)
            pipe.zadd(self.key_journals, {str(generation): generation})
            pipe.rpush(self.key_journal(generation), *records)
            pipe.execute()

        self._call("append_journal", append)

    def read_journal(self, generation: int) -> list[bytes]:
        return cast("list[bytes]", self._call("read_journal", self.client.lrange,
                                              self.key_journal(generation), 0, -1))

    def journal_generations(self) -> list[int]:
        members = cast("list[bytes]", self._call("journal_generations", self.client.zrange,
                                                 self.key_journals, 0, -1))
        return sorted(int(m) for m in members)

    def delete_journals(self, before: int) -> None:
        def delete() -> None:
            old = cast("list[bytes]", self.client.zrangebyscore(self.key_journals, "-inf",
                                                                f"({int(before)}"))
            if not old:
                return
            pipe = self.client.pipeline(transaction=True)
            pipe.delete(*[self.key_journal(int(g)) for g in old])
            pipe.zrem(self.key_journals, *old)
            pipe.execute()

        self._call("delete_journals", delete)

    def clear(self) -> None:
        """Delete every key of this run (tests, and `rlfleet up` starting a fresh run)."""
        def wipe():
            keys = list(self.client.scan_iter(match=f"{self.prefix}*", count=1000))
            for i in range(0, len(keys), 1000):
                self.client.delete(*keys[i:i + 1000])
        self._call("clear", wipe)

    def close(self) -> None:
        self.client.close()
