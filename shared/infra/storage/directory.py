"""Directory backend: the embedded default, and any shared filesystem (NFS, a volume).

Every write goes to a temporary file that is renamed into place, so a reader never sees a
half-written chunk and a crash mid-write leaves only a `.tmp` file behind.

The journal is the exception: it is appended to, one file per generation, each record framed
as length + crc32 + payload, so a crash mid-append leaves a torn last frame that reading
detects and drops instead of a file that cannot be parsed.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from rlfleet.shared.infra.storage.base import (
    ChunkNotFound,
    Storage,
    StorageError,
    VersionConflict,
    validate_id,
)

_SUFFIX = ".safetensors"
_JOURNAL_SUFFIX = ".log"
_FRAME = struct.Struct("<II")  # payload length, crc32 of the payload (little-endian)


class DirectoryStorage(Storage):
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.chunk_dir = self.root / "chunks"
        self.weight_dir = self.root / "weights"
        self.blob_dir = self.root / "blobs"
        self.journal_dir = self.root / "journal"
        self._published: list[int] | None = None
        self._journal_lock = threading.Lock()
        self._journal_checked: set[int] = set()  # generations whose torn tail was cut
        try:
            self.journal_dir.mkdir(parents=True, exist_ok=True)
            self.blob_dir.mkdir(parents=True, exist_ok=True)
            self.chunk_dir.mkdir(parents=True, exist_ok=True)
            self.weight_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StorageError(f"cannot create storage directory {self.root}: {err}") from None

    def __repr__(self) -> str:
        return f"DirectoryStorage({str(self.root)!r})"

    def chunk_path(self, chunk_id: str) -> Path:
        return self.chunk_dir / f"{validate_id(chunk_id)}{_SUFFIX}"

    def weights_path(self, version: int) -> Path:
        return self.weight_dir / f"{int(version):012d}{_SUFFIX}"

    @staticmethod
    def _atomic_write(path: Path, data: bytes) -> None:
        # A temporary name unique to this process, thread and target (cheaper than mkstemp's
        # random names, a cost that counts at tens of publishes a second).
        tmp = path.parent / f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def put_chunks(self, chunks: Mapping[str, bytes]) -> None:
        for chunk_id, data in chunks.items():
            try:
                self._atomic_write(self.chunk_path(chunk_id), data)
            except OSError as err:
                raise StorageError(f"cannot write chunk '{chunk_id}': {err}") from None

    def get_chunks(self, chunk_ids: Sequence[str]) -> list[bytes]:
        out = []
        for chunk_id in chunk_ids:
            try:
                out.append(self.chunk_path(chunk_id).read_bytes())
            except FileNotFoundError:
                raise ChunkNotFound(chunk_id) from None
        return out

    def delete_chunks(self, chunk_ids: Iterable[str]) -> int:
        n = 0
        for chunk_id in chunk_ids:
            try:
                self.chunk_path(chunk_id).unlink()
                n += 1
            except FileNotFoundError:
                continue
        return n

    def list_chunks(self) -> list[str]:
        return sorted(p.name[: -len(_SUFFIX)] for p in self.chunk_dir.glob(f"*{_SUFFIX}"))

    def put_blob(self, name: str, data: bytes) -> None:
        try:
            self._atomic_write(self.blob_dir / validate_id(name), data)
        except OSError as err:
            raise StorageError(f"cannot write blob '{name}': {err}") from None

    def get_blob(self, name: str) -> bytes | None:
        try:
            return (self.blob_dir / validate_id(name)).read_bytes()
        except FileNotFoundError:
            return None

    def delete_blob(self, name: str) -> None:
        (self.blob_dir / validate_id(name)).unlink(missing_ok=True)

    def put_weights(self, version: int, data: bytes) -> None:
        latest = self.latest_version()
        if latest is not None and latest >= int(version):
            try:
                same = self.weights_path(version).read_bytes() == data
            except FileNotFoundError:
                same = False
            if same:  # a retried call: already published
                return
            raise VersionConflict(f"policy version {version} is not newer than the latest "
                                  f"({latest}) in {self.root}")
        self._atomic_write(self.weights_path(version), data)
        self._atomic_write(self.weight_dir / "LATEST", str(int(version)).encode())
        # Learners publish tens of times a second: list the directory once, then prune from
        # memory rather than globbing on every publish.
        if self._published is None:
            self._published = sorted(self._versions())
        else:
            self._published.append(int(version))
        while len(self._published) > self.keep_weight_versions:
            self.weights_path(self._published.pop(0)).unlink(missing_ok=True)

    def _versions(self) -> list[int]:
        return [int(p.name[: -len(_SUFFIX)]) for p in self.weight_dir.glob(f"*{_SUFFIX}")]

    def latest_version(self) -> int | None:
        try:
            return int((self.weight_dir / "LATEST").read_bytes())
        except FileNotFoundError:
            return None
        except ValueError:
            raise StorageError(f"{self.weight_dir / 'LATEST'} does not hold a version") from None

    def get_weights(self, version: int | None = None) -> tuple[int, bytes] | None:
        for _ in range(3):  # the latest may be replaced and pruned between two reads
            v = self.latest_version() if version is None else version
            if v is None:
                return None
            try:
                return v, self.weights_path(v).read_bytes()
            except FileNotFoundError:
                if version is not None:
                    return None
        return None

    # -- the coordinator's write-ahead journal ----------------------------------------------

    def journal_path(self, generation: int) -> Path:
        return self.journal_dir / f"{int(generation):012d}{_JOURNAL_SUFFIX}"

    def append_journal(self, generation: int, records: Sequence[bytes]) -> None:
        """All records of a call go in one `write` on an `O_APPEND` descriptor, so a process
        crash leaves either all of them or a torn tail that `read_journal` drops.

        A torn tail must not hide later records, so it is cut off before this process first
        appends to a generation (a restart that goes on with the same generation), and a short
        write (a full disk) is cut off again at once."""
        if not records:
            return
        frames = b"".join(_FRAME.pack(len(r), zlib.crc32(r)) + bytes(r) for r in records)
        path = self.journal_path(generation)
        with self._journal_lock:  # one writer at a time: the truncations need the end
            try:
                if int(generation) not in self._journal_checked:
                    self._cut_torn_tail(path)
                    self._journal_checked.add(int(generation))
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError as err:
                raise StorageError(f"cannot open journal {path}: {err}") from None
            try:
                start = os.fstat(fd).st_size
                try:
                    written = os.write(fd, frames)
                except OSError as err:
                    raise StorageError(f"cannot append to journal {path}: {err}") from None
                if written != len(frames):
                    os.ftruncate(fd, start)
                    raise StorageError(f"short append to journal {path}: {written} of "
                                       f"{len(frames)} bytes (disk full?)")
            finally:
                os.close(fd)

    @staticmethod
    def _cut_torn_tail(path: Path) -> None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        end = _parse_frames(data)[1]
        if end < len(data):
            os.truncate(path, end)

    def read_journal(self, generation: int) -> list[bytes]:
        path = self.journal_path(generation)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as err:
            raise StorageError(f"cannot read journal {path}: {err}") from None
        return _parse_frames(data)[0]

    def journal_generations(self) -> list[int]:
        names = (p.name[: -len(_JOURNAL_SUFFIX)]
                 for p in self.journal_dir.glob(f"*{_JOURNAL_SUFFIX}"))
        return sorted(int(n) for n in names if n.isdigit())

    def delete_journals(self, before: int) -> None:
        for generation in self.journal_generations():
            if generation < before:
                self.journal_path(generation).unlink(missing_ok=True)


def _parse_frames(data: bytes) -> tuple[list[bytes], int]:
    """The whole records at the start of a journal file, and where they end: parsing stops at
    the first frame that is cut short or fails its checksum (a crash mid-append)."""
    records, pos = [], 0
    while pos + _FRAME.size <= len(data):
        length, crc = _FRAME.unpack_from(data, pos)
        end = pos + _FRAME.size + length
        payload = data[pos + _FRAME.size:end]
        if end > len(data) or zlib.crc32(payload) != crc:
            break
        records.append(payload)
        pos = end
    return records, pos
