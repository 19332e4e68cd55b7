"""Pong through the cluster, each figure beside its ceiling measured in the same run.

`configs/pong-dqn.yaml` made free-running (no replay-ratio throttling, no evaluations, a
constant epsilon so the Nature CNN acts on every step), one collector and one learner:

(a) Collector frames/s: one collector process steps Pong, packs each frame once, compresses
    and writes chunks and reports them; its rate comes from the coordinator's counters.
    Ceiling: `rlfleet.shared.rollout.rollout.Rollout` over the same vector env and network in this
    process (one torch thread), storing nothing. Measured for each `env.backend` (envpool
    where the package is installed).
(b) Bytes stored per env step: the chunks in storage after (a), beside what the same
    chunks would take with each frame stored once but uncompressed, and with `obs` and
    `next_obs` stored whole (8 frames a step).
(c) Learner updates/s: with the buffer filled and the collector stopped, one learner process
    trains the Nature DQN on what the coordinator samples, reading chunks from storage and
    rebuilding stacks from frames. Ceiling: the single-process update loop fed from memory
    (the same packed chunks, the same arena and gather), same batch and network.

Each ceiling is measured in two halves, one right before and one right after its cluster
window, so drift in the machine's load hits both alike; `--repeats` runs the whole in turn.

    python -m bench.atari [--seconds 20] [--backends sync async envpool] [--repeats 1] [--short]

Goals: `collector_ratio` >= 0.8, `bytes_per_step` <= 7,500, `learner_utilisation` >= 0.9.
The last line of stdout is one JSON object with those keys (medians over repeats, sync
backend), `collector_ratio_<backend>`, every run's figures under `runs`, and the ceilings.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from rich.table import Table

from bench.common import (
    REPO_ROOT,
    coordinator_up,
    fmt,
    free_running_data,
    log,
    mean_rate,
    median,
    parse_args,
    ratio,
    report,
    rounded,
    run_main,
    write_yaml,
)
from bench.throughput import (
    beside_ceiling,
    fill_memory_replay,
    rollout_steps_per_s,
    update_loop_per_s,
)
from rlfleet.local.launcher import LocalCluster
from rlfleet.shared.contract.codec import decode_arrays, encode_arrays
from rlfleet.shared.contract.frames import pack, unpack
from rlfleet.shared.infra.storage import DirectoryStorage
from rlfleet.shared.run.config import RunConfig, parse_config

CONFIG = REPO_ROOT / "configs" / "pong-dqn.yaml"
GOALS = {"collector_ratio": 0.8, "bytes_per_step": 7500, "learner_utilisation": 0.9}
FIGURES = ("collector_ratio", "bytes_per_step", "learner_utilisation", "collector_ratio_sync",
           "collector_ratio_async")
# Both default backends and the learner still, over 1 s windows after half a second of
# warm-up, on chunks of 32 steps of 4 envs (1,024 steps of 8 take a second each here): more
# of each chunk's bytes are its stacks' first frames, so its bytes per step are a little
# higher. Sample responses of 4 batches, not 16 (two thirds of a second of Nature DQN
# updates here): the learner trains sooner after it starts, reports several times in a 1 s
# window, and each half of its ceiling (a warm-up response, then at least one more) is
# shorter. The 1 s windows and the 4 envs stay: the collector's run is what fills the
# buffer for the learner (past `MIN_SIZE`, which one chunk passes).
SHORT = {"seconds": 1.0, "warmup": 0.5, "num_envs": 4, "chunk_size": 128,
         "batches_per_request": 4}


# The buffer's size before the learner may sample. The learner is measured on what the
# collector's window left in the buffer, the collector stopped: at 1,000 a short run on a
# machine slow enough to store fewer transitions in its 1 s window (896 on one) left the
# learner waiting for data until the test's limit. One chunk of a short run is enough.
MIN_SIZE = 128


def bench_config(name: str, storage: str, epsilon: float, backend: str,
                 num_envs: int | None = None, chunk_size: int | None = None,
                 batches_per_request: int | None = None) -> RunConfig:
    """The config made free-running on `backend`; `num_envs`, `chunk_size` and
    `batches_per_request` replace the config's where given (a short run's smaller chunks and
    sample responses)."""
    data = free_running_data(CONFIG, name, storage, epsilon)
    data["env"]["backend"] = backend
    if num_envs is not None:
        data["env"]["num_envs"] = num_envs
    if chunk_size is not None:
        data["collector"]["chunk_size"] = chunk_size
    if batches_per_request is not None:
        data["learner"]["batches_per_request"] = batches_per_request
    data["buffers"]["replay"]["rate_limit"]["min_size"] = MIN_SIZE
    return parse_config(data, f"bench config ({backend})")


def stored_bytes(storage: str) -> dict[str, float]:
    """Bytes per env step of the chunks in storage, and of the same chunks stored whole
    (obs and next_obs) and packed without compression."""
    store = DirectoryStorage(storage)
    ids = store.list_chunks()
    blobs = store.get_chunks(ids)
    rows = stored = packed_raw = whole = 0
    for blob in blobs:
        arrays, _ = decode_arrays(blob)
        rows += len(arrays["reward"])
        stored += len(blob)
        packed_raw += len(encode_arrays(arrays))
        whole += len(encode_arrays(unpack(arrays)))
    return {"chunks": len(ids), "rows": rows, "stored": stored / max(rows, 1),
            "packed_uncompressed": packed_raw / max(rows, 1), "whole": whole / max(rows, 1)}


def one_run(args, work: Path, run: int) -> dict:
    out: dict = {"collect": {}, "ceiling_collect": {}}
    storage_of_sync = None
    half = args.seconds / 2
    for backend in args.backends:
        name = f"bench-atari-{os.getpid()}-{run}-{backend}"
        storage = str(work / name / "storage")
        cfg = bench_config(name, storage, args.epsilon, backend, args.num_envs,
                           args.chunk_size, args.batches_per_request)
        run_dir = work / name
        cluster = LocalCluster(write_yaml(run_dir / "config.yaml", cfg), run_dir, storage)
        try:
            with coordinator_up(cluster) as local:
                window, halves = beside_ceiling(
                    local, f"[{run}] ({backend})", "rollout",
                    lambda cfg=cfg: rollout_steps_per_s(cfg, half, args.epsilon, args.seed),
                    "collector", "env_steps", args.seconds, args.warmup)
                out["collect"][backend] = window.rate
                out["ceiling_collect"][backend] = mean_rate(halves)
                if storage_of_sync is not None or backend != args.backends[0]:
                    continue
                storage_of_sync = storage
                out["bytes"] = stored_bytes(storage)
                if args.no_learner:
                    continue
                size = local.buffer_size()
                log(f"[{run}] (learner) filling an in-memory buffer to {size:,} transitions...")
                memory = fill_memory_replay(cfg, size, args.seed)
                memory.chunks = {cid: pack(a) for cid, a in memory.chunks.items()}
                learned, learn_halves = beside_ceiling(
                    local, f"[{run}]", "update loop",
                    lambda cfg=cfg, memory=memory: update_loop_per_s(cfg, memory, half,
                                                                     args.seed),
                    "learner", "train_iterations", args.seconds, args.warmup,
                    start_timeout_s=180)
                out["learn"] = learned.rate
                out["ceiling_learn"] = mean_rate(learn_halves)
                del memory
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
    return out


def figures(run: dict, frame_skip: int) -> dict:
    f: dict = {}
    for backend, rate in run["collect"].items():
        ceiling = run["ceiling_collect"][backend]
        f[f"collector_frames_per_s_{backend}"] = rounded(rate.per_s * frame_skip, 1)
        f[f"in_process_frames_per_s_{backend}"] = rounded(ceiling.per_s * frame_skip, 1)
        f[f"collector_ratio_{backend}"] = rounded(ratio(rate.per_s, ceiling.per_s))
    b = run.get("bytes")
    if b:
        f |= {"bytes_per_step": rounded(b["stored"], 1),
              "bytes_per_step_packed_uncompressed": rounded(b["packed_uncompressed"], 1),
              "bytes_per_step_whole": rounded(b["whole"], 1)}
    if "learn" in run:
        f |= {"learner_updates_per_s": rounded(run["learn"].per_s, 2),
              "in_process_updates_per_s": rounded(run["ceiling_learn"].per_s, 2),
              "learner_utilisation": rounded(ratio(run["learn"].per_s,
                                                   run["ceiling_learn"].per_s))}
    return f


def table(runs: list[dict], backends: list[str]) -> Table:
    t = Table(title="Pong (Nature DQN) through the cluster, beside the same work in one "
              "process")
    t.add_column("figure")
    for i in range(len(runs)):
        t.add_column(f"run {i + 1}", justify="right")
    t.add_column("goal", justify="right")
    rows = []
    for backend in backends:
        rows += [(f"collector frames/s ({backend})", f"collector_frames_per_s_{backend}", ".0f",
                  None),
                 (f"  in one process ({backend})", f"in_process_frames_per_s_{backend}", ".0f",
                  None),
                 (f"  collector_ratio ({backend})", f"collector_ratio_{backend}", ".3f",
                  f">= {GOALS['collector_ratio']}")]
    rows += [("bytes stored per env step", "bytes_per_step", ",.0f",
              f"<= {GOALS['bytes_per_step']:,}"),
             ("  frames once, uncompressed", "bytes_per_step_packed_uncompressed", ",.0f", None),
             ("  obs and next_obs whole", "bytes_per_step_whole", ",.0f", None),
             ("learner updates/s (batch 32)", "learner_updates_per_s", ".1f", None),
             ("  fed from memory", "in_process_updates_per_s", ".1f", None),
             ("  learner_utilisation", "learner_utilisation", ".3f",
              f">= {GOALS['learner_utilisation']}")]
    for label, key, spec, goal in rows:
        t.add_row(label, *(fmt(r.get(key), spec) for r in runs), goal or "")
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=20.0, help="length of each window")
    p.add_argument("--warmup", type=float, default=6.0,
                   help="seconds a worker runs before its window starts")
    p.add_argument("--epsilon", type=float, default=0.1)
    p.add_argument("--backends", nargs="+", choices=["sync", "async", "envpool"],
                   default=["sync", "async"])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--no-learner", action="store_true", help="skip (c)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-envs", type=int, default=None, help="envs per collector (default: "
                   "the config's)")
    p.add_argument("--chunk-size", type=int, default=None, help="transitions per chunk "
                   "(default: the config's)")
    p.add_argument("--batches-per-request", type=int, default=None, help="batches one "
                   "sample response carries (default: the config's)")
    args = parse_args(p, argv, SHORT)

    work = Path(tempfile.mkdtemp(prefix="rlfleet-atari-"))
    frame_skip = bench_config("x", str(work), args.epsilon, "sync").env.frame_skip
    runs = [figures(one_run(args, work, i + 1), frame_skip) for i in range(args.repeats)]
    shutil.rmtree(work, ignore_errors=True)
    first = args.backends[0]
    result = {
        "collector_ratio": rounded(median(r.get(f"collector_ratio_{first}") for r in runs)),
        "bytes_per_step": rounded(median(r.get("bytes_per_step") for r in runs), 1),
        "learner_utilisation": rounded(median(r.get("learner_utilisation") for r in runs)),
    }
    for backend in args.backends:
        result[f"collector_ratio_{backend}"] = rounded(
            median(r.get(f"collector_ratio_{backend}") for r in runs))
    result |= {"goals": GOALS, "seconds": args.seconds, "epsilon": args.epsilon,
               "backend": first, "runs": runs}
    report(result, table(runs, args.backends))
    return 0


if __name__ == "__main__":
    run_main(main)
