"""The coordinator's snapshot format across versions: a snapshot written by an earlier
version (`tests/data/coordinator-snapshot-v0.tar.gz`, made by
`tests/data/make_coordinator_snapshot.py`: a snapshot, then a chunk only in the journal)
restores with everything it held: counters, tasks, buffers, evaluations, the operator's
wishes and the commander's state."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
import yaml

from rlfleet.coordinator.service import Coordinator
from rlfleet.shared.contract.wire.base import TaskState
from rlfleet.shared.run.config import parse_config

DATA = Path(__file__).resolve().parents[1] / "data"


def _unpack(tmp_path: Path, name: str) -> tuple[dict, Path]:
    with tarfile.open(DATA / f"{name}.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    unpacked = tmp_path / name
    return yaml.safe_load((unpacked / "config.yaml").read_text()), unpacked / "storage"


def test_a_snapshot_of_the_unversioned_format_restores_with_its_journal(tmp_path):
    config, storage = _unpack(tmp_path, "coordinator-snapshot-v0")
    c = Coordinator(parse_config(config), str(storage), resume=True)
    try:
        counters = c.status().counters
        # 400 env steps in the snapshot, 50 more in the journal after it
        assert (counters.env_steps, counters.chunks_accepted, counters.episodes) == (450, 5, 10)
        assert (counters.train_iterations, counters.policy_version,
                counters.granted_batches) == (2, 1, 2)
        assert {(r.task_id, r.worker_id, r.state) for r in c.tasks.all()} == {
            ("collect-1", "collector-a", TaskState.UNASSIGNED),
            ("learn-2", "learner-a", TaskState.UNASSIGNED)}
        chunks = sorted(set(c.readout.buffer_chunks("replay")))
        assert chunks == [f"{i:032x}" for i in range(5)]
        assert c.replay.size() == 450
        replay = c.replay.buffers["replay"].stats()
        assert (replay["sampled_items"], replay["priority_updates"]) == (16, 16)
        assert c.replay.buffers["replay"].max_priority == pytest.approx(2.0, abs=1e-5)
        evaluations = c.eval_schedule
        assert evaluations.total == 1 and evaluations.best_policy_version == 1
        assert evaluations.best_evaluation is not None
        assert evaluations.best_evaluation.task_id == "evaluate-3"
        assert evaluations.best_score == 2.9 and evaluations.next_eval_at == 656
        assert c.run_state().collectors_desired == 3
        assert c.env_settings.state() == {"level": 1, "passed_last": False}
    finally:
        c.close()
