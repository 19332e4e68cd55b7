"""`rlfleet plot` on a self-play run: ratings over time, the payoff heatmap and the win-rate
curves are drawn from a real league's document and a real metrics file; a malformed
league.json is a warning, not a failed plot."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

pytest.importorskip("openskill", reason="the games extra: pip install -e '.[games]'")

from rlfleet.plot import plot_run  # noqa: E402
from rlfleet.plot_league import scores  # noqa: E402
from rlfleet.shared.contract.config import LeagueConfig  # noqa: E402
from rlfleet.shared.league.league import MAIN, League, snapshot_name  # noqa: E402


def _run_dir(tmp_path, league: League | None):
    lines = []
    for i, step in enumerate(range(1000, 6000, 1000)):
        lines.append({"scope": "collect", "step": step, "wall_time": 100.0 + i,
                      "collect/return_mean": 0.1 * i})
        lines.append({"scope": "eval", "step": step, "wall_time": 100.5 + i,
                      "eval/deterministic/return_mean": 0.1 * i,
                      "eval/vs_bot-random/win": 0.5 + 0.1 * i,
                      "eval/vs_bot-random/draw": 0.1, "eval/vs_bot-random/loss": 0.4 - 0.1 * i,
                      f"eval/vs_snapshot-{i}/win": 0.5})  # a new snapshot every evaluation
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    if league is not None:
        (tmp_path / "league.json").write_text(json.dumps(league.view(history=True)))
    return tmp_path


def _league() -> League:
    league = League(LeagueConfig(bots=("random", "perfect")))
    league.add_snapshot(0)
    rng = np.random.default_rng(0)
    for _ in range(300):
        league.record_game(MAIN, "bot-random", str(rng.choice(["win", "win", "draw"])))
        league.record_game(MAIN, "bot-perfect", str(rng.choice(["draw", "loss"])))
        league.record_game(MAIN, snapshot_name(0), "win")
    league.add_snapshot(100)
    return league


def test_a_league_run_gets_ratings_payoff_and_win_rate_panels(tmp_path):
    result = plot_run(_run_dir(tmp_path, _league()))
    assert result.path.is_file() and result.path.stat().st_size > 10_000
    for label in ("rating main", "rating bot-random", "rating bot-perfect",
                  "rating snapshot-0", "payoff heatmap", "vs bot-random win",
                  "vs bot-random loss"):
        assert label in result.series, label
    # snapshots met in one evaluation only would be a line of one point each: left out
    assert not any(s.startswith("vs snapshot-") for s in result.series)


def test_scores_are_wins_and_half_the_draws_over_games_blank_where_none():
    payoff = {"players": ["a", "b", "c"], "win": [[0, 3, 0], [1, 0, 0], [0, 0, 0]],
              "draw": [[0, 2, 0], [2, 0, 0], [0, 0, 0]], "loss": [[0, 1, 0], [3, 0, 0],
                                                                  [0, 0, 0]]}
    got = scores(payoff)
    assert got[0, 1] == pytest.approx((3 + 1) / 6) and got[1, 0] == pytest.approx(2 / 6)
    assert np.isnan(got[0, 2]) and np.isnan(got[2, 2])


@pytest.mark.parametrize("content", ["{not json", json.dumps({"games": 3})])
def test_a_malformed_league_is_a_warning_and_the_rest_is_drawn(tmp_path, caplog, content):
    run_dir = _run_dir(tmp_path, None)
    (run_dir / "league.json").write_text(content)
    with caplog.at_level(logging.WARNING, "rlfleet.plot"):
        result = plot_run(run_dir)
    assert "not a league document" in caplog.text
    assert "payoff heatmap" not in result.series and "vs bot-random win" in result.series
