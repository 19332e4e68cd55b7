"""`rlfleet buffer save` and `rlfleet buffer load`: a buffer's transitions in one safetensors
file, and that file loaded into another run's buffer.

Saving reads the chunks a buffer refers to, whole, from the run's storage, and writes their
rows, column by column, to one file: every column the chunks hold (`obs`, `action`,
`reward`, `next_obs`, `terminated`, `truncated`, `cut`, ...; stacked frames unpacked),
`_chunk_lengths` (the rows of each chunk, so a load rebuilds the same chunks) and, for a
prioritized buffer, `_priority` (one per row). The header names the format, the rlfleet
version, the env id, the observation and action spaces (JSON), the buffer's kind and name,
and the row count. No pickle: the file is data, whoever wrote it.

- With `--coordinator`, save reads a *live* run: the chunk ids come from the coordinator
  (`GET /buffers/<name>/chunks`), and a prioritized buffer's priorities from its newest
  snapshot in storage (rows inserted since it get the largest priority saved, what new
  items get).
- Without, it reads a *stopped* run: its buffer's final snapshot in storage.

Loading always goes through a running coordinator: the rows are written to the run's storage
as chunks (`loaded-<id>`), as a collector writes them, and indexed in the one named buffer by
`POST /buffers/<name>/load` (journalled, acknowledged, never counted as env steps). A file
whose env id, observation space or action space differs from the run's is refused before
anything is written (`BufferFileError`, exit 2).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict
from pathlib import Path

import numpy as np

from rlfleet.shared.contract.codec import decode_arrays, encode_arrays
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.frames import unpack
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.infra.http import HttpClient, HttpError
from rlfleet.shared.infra.storage import Storage, open_storage
from rlfleet.shared.run.config import RunConfig, read_run_config

FORMAT = "rlfleet-buffer/1"
LENGTHS = "_chunk_lengths"
PRIORITY = "_priority"
CHUNKS_PER_REQUEST = 200  # a load's report: well under the coordinator's body limit


class BufferFileError(Exception):
    """A file, a run or a buffer that cannot be saved or loaded as asked (exit 2)."""


def _run(run_dir: str | Path) -> tuple[RunConfig, Storage]:
    try:
        cfg = read_run_config(Path(run_dir))
    except ConfigError as err:
        raise BufferFileError(str(err)) from None
    if not cfg.storage:
        raise BufferFileError(f"{Path(run_dir) / 'config.yaml'} names no storage")
    return cfg, open_storage(cfg.storage, cfg.name)


def spaces(cfg: RunConfig) -> dict[str, str]:
    """The env id and its observation and action spaces as JSON header strings."""
    from rlfleet.shared.envs.make import run_spec

    spec = asdict(run_spec(cfg))
    obs = {"shape": list(spec["obs_shape"])}
    if spec["n_actions"]:
        act = {"discrete": spec["n_actions"]}
    else:
        act = {"shape": list(spec["action_shape"]), "low": list(spec["action_low"]),
               "high": list(spec["action_high"])}
    return {"env_id": cfg.env.id, "obs_space": json.dumps(obs, sort_keys=True),
            "action_space": json.dumps(act, sort_keys=True)}


# -- saving ----------------------------------------------------------------------------------

def _client(url: str) -> HttpClient:
    return HttpClient(url, timeout_s=30, retries=2)


def _live_buffer(url: str, name: str) -> tuple[str, list[str]]:
    """(kind, chunk ids) of a live run's buffer."""
    client = _client(url)
    try:
        info = client.get(f"{API}/buffers/{name}")
        ids = client.get(f"{API}/buffers/{name}/chunks")["chunk_ids"]
    except HttpError as err:
        raise BufferFileError(f"buffer '{name}' at {url}: {err}") from None
    finally:
        client.close()
    return str(info["kind"]), list(dict.fromkeys(ids))


def _snapshot(storage: Storage, name: str) -> tuple[dict[str, np.ndarray], dict[str, str]] | None:
    raw = storage.get_blob("snapshot.coordinator")
    if raw is None:
        return None
    blob_name = json.loads(raw).get("buffers", {}).get(name)
    blob = storage.get_blob(blob_name) if blob_name else None
    return decode_arrays(blob) if blob is not None else None


def _stopped_buffer(cfg: RunConfig, storage: Storage, name: str) -> tuple[str, list[str]]:
    """(kind, chunk ids) of a stopped run's buffer, from its last snapshot."""
    from rlfleet.shared.replay.replay import Replay

    if name not in cfg.buffers:
        raise BufferFileError(f"buffer '{name}' does not exist (the run has "
                              f"{', '.join(cfg.buffers)})")
    if storage.get_blob("snapshot.coordinator") is None:
        raise BufferFileError(f"{cfg.storage} holds no snapshot of run {cfg.name}: "
                              "nothing to save (give --coordinator for a live run)")
    replay = Replay(cfg, storage)
    replay.load(storage)
    buf = replay.buffers[name]
    return buf.kind, list(dict.fromkeys(buf.chunk_occurrences()))


def _snapshot_priorities(cfg: RunConfig, storage: Storage, name: str
                         ) -> dict[tuple[str, int], float]:
    """(chunk id, row) -> priority, from a prioritized buffer's newest snapshot (the sum
    tree holds priority^alpha)."""
    snap = _snapshot(storage, name)
    if snap is None:
        return {}
    arrays, _ = snap
    ids = arrays["table_ids"].tobytes().decode().split("\n") if arrays["table_ids"].size else []
    id_of = dict(zip(arrays["table_index"].tolist(), ids, strict=True))
    alpha = float(cfg.buffers[name].alpha or 1.0)
    filled = np.flatnonzero(arrays["uid"] >= 0)
    prio = arrays["priority"].astype(np.float64)[filled] ** (1.0 / alpha)
    return {(id_of[c], r): float(p) for c, r, p in zip(
        arrays["chunk"][filled].tolist(), arrays["row"][filled].tolist(), prio.tolist(),
        strict=True) if c in id_of}


def save(run_dir: str | Path, buffer: str, out: str | Path,
         coordinator: str | None = None) -> int:
    """Write the buffer's transitions to `out`; returns the row count."""
    cfg, storage = _run(run_dir)
    try:
        if coordinator:
            kind, ids = _live_buffer(coordinator, buffer)
        else:
            kind, ids = _stopped_buffer(cfg, storage, buffer)
        if kind == "dataset":
            raise BufferFileError(f"buffer '{buffer}' is a dataset buffer: its dataset file "
                                  "is already the saved form")
        if not ids:
            raise BufferFileError(f"buffer '{buffer}' is empty: nothing to save")
        columns: dict[str, list[np.ndarray]] = {}
        lengths: list[int] = []
        for k in range(0, len(ids), 256):
            for chunk_id, blob in zip(ids[k:k + 256], storage.get_chunks(ids[k:k + 256]),
                                      strict=True):
                arrays = unpack(decode_arrays(blob)[0])
                n = len(arrays["reward"])
                if columns and set(arrays) != set(columns):
                    raise BufferFileError(f"chunk {chunk_id} has columns {sorted(arrays)}, "
                                          f"others {sorted(columns)}")
                for key, col in arrays.items():
                    columns.setdefault(key, []).append(col)
                lengths.append(n)
        rows = sum(lengths)
        out_arrays = {key: np.concatenate(parts) for key, parts in columns.items()}
        out_arrays[LENGTHS] = np.asarray(lengths, dtype=np.int64)
        if kind == "prioritized":
            known = _snapshot_priorities(cfg, storage, buffer)
            fill = max(known.values(), default=1.0)
            out_arrays[PRIORITY] = np.asarray(
                [known.get((cid, r), fill) for cid, n in zip(ids, lengths, strict=True)
                 for r in range(n)], dtype=np.float64)
    finally:
        storage.close()
    from rlfleet import __version__

    meta = {"format": FORMAT, "rlfleet_version": __version__, **spaces(cfg),
            "buffer_kind": kind, "buffer_name": buffer, "rows": str(rows),
            "chunks": str(len(lengths)), "run": cfg.name}
    Path(out).write_bytes(encode_arrays(out_arrays, meta))
    return rows


# -- loading ---------------------------------------------------------------------------------

def read_file(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    try:
        arrays, meta = decode_arrays(Path(path).read_bytes())
    except OSError as err:
        raise BufferFileError(f"{path}: {err}") from None
    except Exception as err:  # a file that is no safetensors, or a damaged one
        raise BufferFileError(f"{path}: not a buffer file ({err})") from None
    if meta.get("format") != FORMAT or LENGTHS not in arrays:
        raise BufferFileError(f"{path}: not a buffer file of `rlfleet buffer save` "
                              f"(format {meta.get('format')!r})")
    return arrays, meta


def check_matches(path: str | Path, meta: dict[str, str], cfg: RunConfig) -> None:
    """Refuse a file saved from another env: its id, observation or action space."""
    run = spaces(cfg)
    for key in ("env_id", "obs_space", "action_space"):
        if meta.get(key) != run[key]:
            raise BufferFileError(f"{path}: its {key} {meta.get(key)} does not match the "
                                  f"run's {run[key]} ({cfg.name})")


def _segments(cut: np.ndarray | None, n: int) -> list[tuple[int, int]]:
    """Runs of rows that end at each cut (an episode's end or its chunk's)."""
    if cut is None:
        return []
    ends = [int(e) + 1 for e in np.flatnonzero(np.asarray(cut, dtype=bool))]
    if not ends or ends[-1] != n:
        ends.append(n)
    starts = [0, *ends[:-1]]
    return [(s, e - s) for s, e in zip(starts, ends, strict=True)]


def load(run_dir: str | Path, coordinator: str, buffer: str, path: str | Path
         ) -> tuple[int, int, int]:
    """Load the file into the run's buffer: (chunks accepted, rows, the buffer's items)."""
    arrays, meta = read_file(path)
    cfg, storage = _run(run_dir)
    client = _client(coordinator)
    try:
        check_matches(path, meta, cfg)
        try:
            kind = client.get(f"{API}/buffers/{buffer}")["kind"]
        except HttpError as err:
            raise BufferFileError(f"buffer '{buffer}' at {coordinator}: {err}") from None
        lengths = arrays.pop(LENGTHS).tolist()
        priority = arrays.pop(PRIORITY, None)
        rows = sum(lengths)
        if any(len(col) != rows for col in arrays.values()):
            raise BufferFileError(f"{path}: columns of unequal length (not {rows} rows)")
        sent_priority = priority if kind == "prioritized" else None  # only a prioritized takes it
        send_priorities = sent_priority is not None
        accepted, items, start = 0, 0, 0
        batch: list[dict] = []
        batch_prio: list[list[float]] = []

        def flush() -> None:
            nonlocal accepted, items
            body: dict = {"chunks": batch}
            if send_priorities:
                body["priorities"] = batch_prio
            try:
                answer = client.post(f"{API}/buffers/{buffer}/load", body)
            except HttpError as err:
                raise BufferFileError(f"loading into buffer '{buffer}': {err}") from None
            accepted += int(answer["accepted"])
            items = int(answer["items"])
            batch.clear()
            batch_prio.clear()

        for n in lengths:
            part = {key: np.ascontiguousarray(col[start:start + n])
                    for key, col in arrays.items()}
            chunk_id = f"loaded-{uuid.uuid4().hex}"
            storage.put_chunk(chunk_id, encode_arrays(part, {"policy_version": "-1",
                                                             "loaded_from": meta["run"]}))
            batch.append({"chunk_id": chunk_id, "length": n, "policy_version": -1,
                          "segments": _segments(part.get("cut"), n)})
            if sent_priority is not None:
                batch_prio.append(sent_priority[start:start + n].tolist())
            start += n
            if len(batch) >= CHUNKS_PER_REQUEST:
                flush()
        if batch:
            flush()
    finally:
        client.close()
        storage.close()
    return accepted, rows, items


def main_save(args) -> int:
    rows = save(args.run_dir, args.buffer, args.out, args.coordinator)
    print(f"saved {rows} rows of buffer {args.buffer} to {args.out}")
    return 0


def main_load(args) -> int:
    chunks, rows, items = load(args.run_dir, args.coordinator, args.buffer, args.input)
    print(f"loaded {rows} rows ({chunks} chunks) into buffer {args.buffer}: it holds "
          f"{items} items")
    return 0
