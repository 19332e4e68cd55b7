"""The coordinator's snapshot format across versions: a snapshot written by an earlier
version (`tests/data/coordinator-snapshot-v0.tar.gz`, made by
`tests/data/make_coordinator_snapshot.py`: a snapshot, then a chunk only in the journal)
restores with everything it held: counters, tasks, buffers, evaluations, the operator's
wishes and the commander's state. A snapshot names its format; one newer than this
coordinator reads is refused rather than read wrong."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import yaml

from rlfleet.coordinator.service import Coordinator
from rlfleet.coordinator.snapshot import FORMAT_VERSION, CoordinatorSnapshot, SnapshotFormatError
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


def test_a_snapshot_of_this_format_names_its_version_and_restores(tmp_path):
    """The fixture restored and closed: the final snapshot is of this format, and a second
    restart reads it back to the same run."""
    config, storage = _unpack(tmp_path, "coordinator-snapshot-v0")
    cfg = parse_config(config)
    Coordinator(cfg, str(storage), resume=True).close()
    saved = json.loads((storage / "blobs" / "snapshot.coordinator").read_text())["counters"]
    assert saved["format_version"] == FORMAT_VERSION
    assert CoordinatorSnapshot.read(saved).model_dump(mode="json") == saved
    c = Coordinator(cfg, str(storage), resume=True)
    try:
        counters = c.status().counters
        assert (counters.env_steps, counters.chunks_accepted, counters.episodes) == (450, 5, 10)
        assert {r.task_id for r in c.tasks.all()} == {"collect-1", "learn-2"}
        assert c.replay.size() == 450 and c.eval_schedule.total == 1
        assert c.env_settings.state() == {"level": 1, "passed_last": False}
    finally:
        c.close()


def test_a_snapshot_of_a_newer_format_is_refused_naming_both_versions(tmp_path):
    config, storage = _unpack(tmp_path, "coordinator-snapshot-v0")
    blob = storage / "blobs" / "snapshot.coordinator"
    raw = json.loads(blob.read_text())
    raw["counters"]["format_version"] = FORMAT_VERSION + 1
    blob.write_text(json.dumps(raw))
    with pytest.raises(SnapshotFormatError,
                       match=f"format_version={FORMAT_VERSION + 1}, newer than this "
                             f"coordinator reads \\(format {FORMAT_VERSION}\\)"):
        Coordinator(parse_config(config), str(storage), resume=True)


def test_a_snapshot_field_of_the_wrong_type_is_refused_naming_it():
    with pytest.raises(SnapshotFormatError, match="env_steps"):
        CoordinatorSnapshot.read({"format_version": 1, "env_steps": "many"})
