"""The episode table's rows from chunk and evaluation reports, read back as a DataFrame, and
the table kept within its size limit by rotating into time-named parts."""

from __future__ import annotations

import json
import re

import pytest
from pydantic import ValidationError

from rlfleet.coordinator.episodes import EpisodeTable
from rlfleet.shared.contract.wire.evaluation import EvaluationReport
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.telemetry.rotating import RotatingJsonl, table_files
from rlfleet.shared.telemetry.rundata import EPISODES_NAME, load_run


def _chunk(n: int, returns: list[float], envs: list[int], comps=None) -> ChunkMeta:
    return ChunkMeta(chunk_id=f"c{n}", length=n, policy_version=3, episode_returns=returns,
                     episode_lengths=[5] * len(returns), episode_envs=envs,
                     episode_return_components=comps or [])


def test_rows_carry_what_collectors_and_the_coordinator_know(tmp_path):
    pytest.importorskip("pandas", reason="the tables extra (pandas) reads the episode table")
    (tmp_path / "metrics.jsonl").write_text("")
    table = EpisodeTable("run-a", tmp_path)
    table.on_chunks("collector-1", "collect-1", 100,
                    [_chunk(8, [1.0, 2.0], [0, 3], [[0.5, 0.5], [1.0, 1.0]]),
                     _chunk(4, [], [])], env_steps_after=112, wall_time=5.0)
    table.on_evaluation(EvaluationReport(
        worker_id="collector-2", task_id="evaluate-7", policy_version=3,
        deterministic={"returns": [9.0], "lengths": [9]},
        stochastic={"returns": [4.0, 6.0], "lengths": [4, 6]}), 77, 112, 6.0)
    table.close()
    table.on_chunks("collector-1", "collect-1", 100, [_chunk(8, [1.0], [0])], 120, 7.0)

    lines = (tmp_path / EPISODES_NAME).read_text().splitlines()
    assert len(lines) == 5 and table.rows_written == 5  # nothing after close
    first = json.loads(lines[0])
    assert first == {"run": "run-a", "worker_id": "collector-1", "task_id": "collect-1",
                     "env_index": 0, "seed": 100, "policy_version": 3, "return": 1.0,
                     "length": 5, "return_components": [0.5, 0.5], "wall_time": 5.0,
                     "env_step": 108, "evaluation": False}
    assert json.loads(lines[1])["seed"] == 103  # the env's own seed: task seed + env index

    frame = load_run(tmp_path).episodes
    assert list(frame["evaluation"]) == [False, False, True, True, True]
    assert list(frame["return_0"][:2]) == [0.5, 1.0]  # components as columns
    assert frame[frame["evaluation"]]["deterministic"].tolist() == [True, False, False]
    assert frame["return"].sum() == pytest.approx(22.0)


def test_a_run_without_a_table_has_an_empty_one_and_a_torn_line_is_skipped(tmp_path):
    pytest.importorskip("pandas", reason="the tables extra (pandas) reads the episode table")
    (tmp_path / "metrics.jsonl").write_text("")
    assert load_run(tmp_path).episodes.empty
    (tmp_path / EPISODES_NAME).write_text('{"return": 1.0, "evaluation": false}\n{"ret')
    assert len(load_run(tmp_path).episodes) == 1


def test_episode_envs_must_match_the_episodes():
    with pytest.raises(ValidationError, match="episode_envs has 1 entries"):
        _chunk(8, [1.0, 2.0], [0])


def _rows(path_dir, name=EPISODES_NAME) -> list[dict]:
    return [json.loads(line) for p in table_files(path_dir, name)
            for line in p.read_text().splitlines()]


def _size(path_dir) -> int:
    return sum(p.stat().st_size for p in table_files(path_dir, EPISODES_NAME))


def test_a_table_past_its_limit_rotates_into_time_named_parts_and_drops_the_oldest(tmp_path):
    """A 2,000-byte limit and rows of about 40 bytes: the file rotates at 250 bytes, and the
    table never holds more than its limit plus the one write that crossed a threshold."""
    table = RotatingJsonl(tmp_path / EPISODES_NAME, max_bytes=2000)
    for i in range(400):
        table.write(json.dumps({"i": i, "pad": "x" * 20}) + "\n")
        rows = _rows(tmp_path)
        assert rows[-1]["i"] == i  # flushed as written
        assert _size(tmp_path) <= 2000 + 40
    table.close()
    files = table_files(tmp_path, EPISODES_NAME)
    parts = files[:-1]
    assert files[-1].name == EPISODES_NAME and len(parts) >= 5
    assert all(re.fullmatch(r"episodes-\d{8}T\d{6}\.\d{6}Z\.jsonl", p.name) for p in parts)
    assert parts == sorted(parts) == table.parts  # names sort as the parts were made
    # what is left is the newest rows, whole and in order: only the oldest went
    kept = [r["i"] for r in _rows(tmp_path)]
    assert kept == list(range(kept[0], 400)) and kept[0] > 300
    # and no more went than needed: a part's share of the limit at a time
    assert _size(tmp_path) >= 2000 - 2 * (2000 // 8 + 40)


def test_a_restarted_writer_goes_on_from_the_parts_already_there(tmp_path):
    first = RotatingJsonl(tmp_path / EPISODES_NAME, max_bytes=800)
    for i in range(60):
        first.write(json.dumps({"i": i}) + "\n")
    first.close()
    before = table_files(tmp_path, EPISODES_NAME)[:-1]
    again = RotatingJsonl(tmp_path / EPISODES_NAME, max_bytes=800)
    assert again.parts == before
    for i in range(60, 200):
        again.write(json.dumps({"i": i}) + "\n")
    again.close()
    kept = [r["i"] for r in _rows(tmp_path)]
    assert kept == list(range(kept[0], 200)) and _size(tmp_path) <= 800 + 20
    assert not set(before) & set(table_files(tmp_path, EPISODES_NAME))  # the old ones went


def test_without_a_limit_the_table_is_one_file():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        table = RotatingJsonl(Path(tmp) / EPISODES_NAME, max_bytes=None)
        for i in range(300):
            table.write(json.dumps({"i": i}) + "\n")
        table.close()
        assert [p.name for p in table_files(Path(tmp), EPISODES_NAME)] == [EPISODES_NAME]
    with pytest.raises(ValueError, match="max_bytes=0"):
        RotatingJsonl(Path("unused.jsonl"), max_bytes=0)


def test_load_run_reads_the_rotated_parts_oldest_first_then_the_current_file(tmp_path):
    pytest.importorskip("pandas", reason="the tables extra (pandas) reads the episode table")
    (tmp_path / "metrics.jsonl").write_text("")
    table = EpisodeTable("run-a", tmp_path, max_bytes=4000)
    for k in range(40):
        table.on_chunks("collector-1", "collect-1", 100, [_chunk(8, [float(k)], [0])],
                        env_steps_after=8 * (k + 1), wall_time=float(k))
    table.on_evaluation(EvaluationReport(
        worker_id="collector-2", task_id="evaluate-7", policy_version=3,
        deterministic={"returns": [9.0, 3.0], "lengths": [9, 3],
                       "truncated": [True, False]}), 77, 320, 41.0)
    table.close()
    assert len(table_files(tmp_path, EPISODES_NAME)) > 2  # rotated
    frame = load_run(tmp_path).episodes
    training = frame[~frame["evaluation"]]
    # the newest training rows, in the order they were written, across the files
    assert training["return"].tolist() == [float(k) for k in range(40 - len(training), 40)]
    assert 3 < len(training) < 40
    assert frame[frame["evaluation"]]["truncated"].tolist() == [True, False]
