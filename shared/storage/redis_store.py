"""Redis backend: chunks and weights as binary values under one run's key prefix.

The class owns its keys (see `key_*`), so no key string is assembled elsewhere. Writes of
several chunks go in one pipelined transaction: one round trip for a whole batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import redis

from shared.storage.base import ChunkNotFound, Storage, StorageError, validate_id


class RedisStorage(Storage):
    def __init__(self, url: str, namespace: str = "run", client: redis.Redis | None = None):
        self.url = url
        self.namespace = namespace
        self.prefix = f"rlfleet:{namespace}:"
        self.client = client or redis.Redis.from_url(
            url, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30)

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

    def _call(self, what: str, fn, *args):
        try:
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
        values = self._call("get_chunks", self.client.mget,
                            [self.key_chunk(c) for c in chunk_ids])
        for chunk_id, value in zip(chunk_ids, values, strict=True):
            if value is None:
                raise ChunkNotFound(chunk_id)
        return values

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
        members = self._call("list_chunks", self.client.smembers, self.key_chunk_index)
        return sorted(m.decode() for m in members)

    def put_blob(self, name: str, data: bytes) -> None:
        self._call("put_blob", self.client.set, self.key_blob(name), data)

    def get_blob(self, name: str) -> bytes | None:
        return self._call("get_blob", self.client.get, self.key_blob(name))

    def delete_blob(self, name: str) -> None:
        self._call("delete_blob", self.client.delete, self.key_blob(name))

    def put_weights(self, version: int, data: bytes) -> None:
        version = int(version)

        def publish():
            pipe = self.client.pipeline(transaction=True)
            pipe.set(self.key_weights(version), data)
            pipe.zadd(self.key_versions, {str(version): version})
            pipe.set(self.key_latest, version)
            pipe.zrange(self.key_versions, 0, -self.keep_weight_versions - 1)
            old = pipe.execute()[-1]
            if old:
                pipe = self.client.pipeline(transaction=True)
                pipe.delete(*[self.key_weights(int(v)) for v in old])
                pipe.zrem(self.key_versions, *old)
                pipe.execute()

        self._call("put_weights", publish)

    def latest_version(self) -> int | None:
        value = self._call("latest_version", self.client.get, self.key_latest)
        return None if value is None else int(value)

    def get_weights(self, version: int | None = None) -> tuple[int, bytes] | None:
        for _ in range(3):
            v = self.latest_version() if version is None else version
            if v is None:
                return None
            data = self._call("get_weights", self.client.get, self.key_weights(v))
            if data is not None:
                return v, data
            if version is not None:
                return None
        return None

    def clear(self) -> None:
        """Delete every key of this run (tests, and `rlfleet up` starting a fresh run)."""
        def wipe():
            keys = list(self.client.scan_iter(match=f"{self.prefix}*", count=1000))
            for i in range(0, len(keys), 1000):
                self.client.delete(*keys[i:i + 1000])
        self._call("clear", wipe)

    def close(self) -> None:
        self.client.close()
