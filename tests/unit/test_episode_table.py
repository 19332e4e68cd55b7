"""The episode table's rows from chunk and evaluation reports, read back as a DataFrame."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from rlfleet.coordinator.episodes import EpisodeTable
from rlfleet.shared.contract.schemas import ChunkMeta, EvaluationReport
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
