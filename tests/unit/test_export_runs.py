"""`rlfleet export --source snapshot` reads episodes out of stored chunks: only runs that are
whole episodes of one env, never the tail of an episode that began in an earlier chunk."""

from __future__ import annotations

import numpy as np

from rlfleet.export import _runs


def _chunk(done_rows: list[int], envs: int, rows_per_env: int) -> dict[str, np.ndarray]:
    """An env-major samples chunk whose rows number themselves (obs = row index)."""
    n = envs * rows_per_env
    terminated = np.zeros(n, dtype=bool)
    terminated[done_rows] = True
    cut = terminated.copy()
    cut[rows_per_env - 1::rows_per_env] = True  # each env block's last row
    rows = np.arange(n, dtype=np.float32)[:, None]
    return {"obs": rows, "next_obs": rows + 0.5, "action": np.zeros(n, dtype=np.int64),
            "reward": np.ones(n, dtype=np.float32), "terminated": terminated,
            "truncated": np.zeros(n, dtype=bool), "cut": cut}


def test_a_run_after_another_envs_episode_end_is_a_tail_not_an_episode():
    """Env 0 ends an episode on its block's last row (3). Env 1's first run (rows 4-5) ends
    done but began before the chunk: a tail. Its next run (rows 6-7) is whole."""
    arrays = _chunk([3, 5, 7], envs=2, rows_per_env=4)
    episodes = list(_runs(arrays, whole_chunks=False, envs=2))
    assert [ep["observations"][:, 0].tolist() for ep in episodes] == [[6.0, 7.0, 7.5]]


def test_within_one_env_every_run_after_an_end_is_whole():
    arrays = _chunk([1, 4, 9], envs=2, rows_per_env=6)  # env 0: rows 0-5; env 1: 6-11
    episodes = list(_runs(arrays, whole_chunks=False, envs=2))
    # env 0: rows 2-4 follow the end at row 1; row 0-1 and env 1's 6-9 began before the chunk
    assert [len(ep["actions"]) for ep in episodes] == [3]
    assert episodes[0]["observations"][0, 0] == 2.0


def test_chunks_cut_by_episodes_are_whole_runs_each():
    arrays = _chunk([1, 4, 7], envs=1, rows_per_env=8)
    assert [len(ep["actions"]) for ep in _runs(arrays, whole_chunks=True)] == [2, 3, 3]
