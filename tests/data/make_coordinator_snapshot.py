"""Make `coordinator-snapshot-v0.tar.gz`: the storage a coordinator of the snapshot format
before it had a version (`format_version` 0) leaves behind mid-run, and the config it ran.

    .venv/bin/python tests/data/make_coordinator_snapshot.py

It drives a `Coordinator` in this process, as its routes would: a collector and a learner
register, the collector reports chunks with finished episodes, the learner samples and
reports its progress and priorities, an evaluation runs and steps the curriculum's commander
up a level, and an operator asks for three collectors. A periodic snapshot is written, then
one more chunk goes only into the journal, and storage is copied as it stands (a coordinator
killed then), before the coordinator closes. `tests/unit/test_snapshot_format.py` restores
it with the code of today. The script was run at the commit before snapshots had a version,
against that commit's `Coordinator`; it stays as the record of how the fixture was made."""

from __future__ import annotations

import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from rlfleet.coordinator.service import Coordinator  # noqa: E402
from rlfleet.shared.contract.codec import encode_arrays  # noqa: E402
from rlfleet.shared.contract.wire.base import Role, TaskKind, TaskState  # noqa: E402
from rlfleet.shared.contract.wire.evaluation import EvalEpisodes, EvaluationReport  # noqa: E402
from rlfleet.shared.contract.wire.experience import ChunkMeta, ChunkReport  # noqa: E402
from rlfleet.shared.contract.wire.membership import RegisterRequest  # noqa: E402
from rlfleet.shared.contract.wire.sampling import (  # noqa: E402
    LearnInfo,
    PriorityUpdate,
    SampleRequest,
)
from rlfleet.shared.infra.storage import DirectoryStorage, evaluated_blob  # noqa: E402
from rlfleet.shared.run.config import parse_config  # noqa: E402
from tests.unit.helpers import buffer_config, make_config  # noqa: E402

NAME = "coordinator-snapshot-v0"
CONFIG = make_config(
    name="snapshot-v0",
    buffers={"replay": buffer_config(kind="prioritized", capacity=1000)},
    coordinator={"commander": "rlfleet.shared.envs.corridor:CorridorCurriculum",
                 "snapshot_interval_s": None},
    eval={"every_env_steps": 256, "episodes": 4, "num_envs": 4, "stochastic": False,
          "stop_value": None})


def chunk(storage: DirectoryStorage, i: int, n: int, version: int) -> ChunkMeta:
    rng = np.random.default_rng(i)
    arrays = {"obs": rng.standard_normal((n, 4)).astype(np.float32),
              "action": rng.integers(0, 2, n).astype(np.int64),
              "reward": np.ones(n, np.float32),
              "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
              "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}
    chunk_id = f"{i:032x}"
    storage.put_chunk(chunk_id, encode_arrays(arrays, {"policy_version": str(version)}))
    return ChunkMeta(chunk_id=chunk_id, length=n, policy_version=version,
                     episode_returns=[float(n // 2), float(n - n // 2)],
                     episode_lengths=[n // 2, n - n // 2])


def main() -> None:
    cfg = parse_config(CONFIG)
    with tempfile.TemporaryDirectory() as tmp:
        store_dir = Path(tmp) / "storage"
        c = Coordinator(cfg, str(store_dir))  # not started: pushes wait in the queue
        storage = DirectoryStorage(store_dir)
        col = c.register(RegisterRequest(role=Role.COLLECTOR, url="http://127.0.0.1:9",
                                         worker_id="collector-a"))
        lrn = c.register(RegisterRequest(role=Role.LEARNER, url="http://127.0.0.1:10",
                                         worker_id="learner-a"))
        collect = c.tasks.active_for(col.worker_id)[0]
        collect.state = TaskState.RUNNING  # as the dispatcher marks an acknowledged push
        for i in range(4):
            c.report_chunks(ChunkReport(worker_id=col.worker_id, task_id=collect.task_id,
                                        chunks=[chunk(storage, i, 100, -1)]))
        sampled = c.sample(SampleRequest(worker_id=lrn.worker_id, num_batches=2, batch_size=8,
                                         wait_s=1))
        part = sampled[1][0]
        items = part.item_ids.reshape(-1).tolist()
        c.learn_info(LearnInfo(
            worker_id=lrn.worker_id, train_iterations=2, policy_version=1,
            metrics={"loss": 0.25}, priorities=[PriorityUpdate(
                buffer=part.buffer, item_ids=items, priorities=[2.0] * len(items))]))
        c._tick()  # the evaluation falls due
        evaluate = c.tasks.active(TaskKind.EVALUATE)[0]
        storage.put_blob(evaluated_blob(evaluate.task_id), b"the weights it evaluated")
        c.report_evaluation(EvaluationReport(
            worker_id=evaluate.worker_id, task_id=evaluate.task_id, policy_version=1,
            deterministic=EvalEpisodes(returns=[0.9] * 4, lengths=[4] * 4,
                                       successes=[True] * 4)))
        c.scale(collectors=3)
        c.durability.save_snapshot()
        c.report_chunks(ChunkReport(worker_id=col.worker_id, task_id=collect.task_id,
                                    chunks=[chunk(storage, 4, 50, 1)]))  # journal only
        out = Path(tmp) / NAME
        shutil.copytree(store_dir, out / "storage")
        (out / "config.yaml").write_text(yaml.safe_dump(CONFIG, sort_keys=False))
        with tarfile.open(HERE / f"{NAME}.tar.gz", "w:gz") as tar:
            tar.add(out, arcname=NAME)
        s = c.status()
        print(s.counters, s.buffer, [t.task_id for t in s.tasks], c.env_settings.state())
        c.close()


if __name__ == "__main__":
    main()
