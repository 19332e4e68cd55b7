"""The league's arithmetic: openskill ratings as openskill documents them, PFSP frequencies
as AlphaStar's formula gives them, the payoff matrix, the snapshot rule, and a state that
comes back whole."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("openskill", reason="the games extra: pip install -e '.[games]'")

from openskill.models import PlackettLuce  # noqa: E402

from rlfleet.shared.contract.config import LeagueConfig  # noqa: E402
from rlfleet.shared.league.league import (  # noqa: E402
    MAIN,
    League,
    Payoff,
    Player,
    Ratings,
    bot_name,
    pfsp_probabilities,
    snapshot_name,
)


def test_the_rating_model_gives_openskills_documented_example():
    """openskill's README: two 2-player teams of fresh ratings, the first team wins."""
    model = Ratings().model
    r = model.rating
    [[a, b], [x, y]] = model.rate([[r(), r()], [r(), r()]])
    assert a.mu == pytest.approx(26.964294621803063) and a.sigma == pytest.approx(
        8.177962604389991)
    assert x.mu == pytest.approx(23.035705378196937) and x.sigma == pytest.approx(
        8.177962604389991)


@pytest.mark.parametrize("outcome,ranks", [("win", [0, 1]), ("draw", [0, 0]),
                                           ("loss", [1, 0])])
def test_a_game_rates_both_players_as_openskill_does(outcome, ranks):
    a, b = Player("a", "main", mu=27.0, sigma=6.0), Player("b", "bot", mu=22.0, sigma=4.0)
    Ratings().rate(a, b, outcome)
    model = PlackettLuce()
    [[ea], [eb]] = model.rate([[model.rating(mu=27.0, sigma=6.0)],
                               [model.rating(mu=22.0, sigma=4.0)]], ranks=ranks)
    assert (a.mu, a.sigma, b.mu, b.sigma) == pytest.approx((ea.mu, ea.sigma, eb.mu, eb.sigma))
    if outcome == "win":
        assert a.mu > 27.0 and b.mu < 22.0


@pytest.mark.parametrize("weighting,f", [
    ("hard", lambda p: (1 - p) ** 2),
    ("variance", lambda p: p * (1 - p)),
    ("linear", lambda p: 1 - p),
    ("uniform", lambda p: 1.0),
])
def test_pfsp_probabilities_are_the_formula(weighting, f):
    rates = [0.1, 0.5, 0.8, 0.95]
    weights = np.array([f(p) for p in rates])
    assert pfsp_probabilities(rates, weighting) == pytest.approx(weights / weights.sum())


def test_pfsp_with_nothing_left_to_learn_is_uniform():
    assert pfsp_probabilities([1.0, 1.0], "hard") == pytest.approx([0.5, 0.5])
    assert pfsp_probabilities([0.2, 0.4], "hard", power=1.0) == pytest.approx([8 / 14, 6 / 14])


def test_opponents_are_drawn_at_the_pfsp_frequencies():
    league = League(LeagueConfig(bots=("random", "perfect"), self_play_fraction=0.2))
    league.add_snapshot(0)
    for _ in range(9):  # main beats random 90% of the time...
        league.record_game(MAIN, bot_name("random"), "win")
    league.record_game(MAIN, bot_name("random"), "loss")
    for _ in range(10):  # ...draws the perfect player...
        league.record_game(MAIN, bot_name("perfect"), "draw")
    for _ in range(3):  # ...and beats its first snapshot 3 times in 4
        league.record_game(MAIN, snapshot_name(0), "win")
    league.record_game(MAIN, snapshot_name(0), "loss")

    f = {bot_name("random"): (1 - 0.9) ** 2, bot_name("perfect"): (1 - 0.5) ** 2,
         snapshot_name(0): (1 - 0.75) ** 2}
    total = sum(f.values())
    expected = {MAIN: 0.2, **{k: 0.8 * v / total for k, v in f.items()}}
    assert league.probabilities() == pytest.approx(expected)

    rng = np.random.default_rng(0)
    n = 20_000
    drawn: dict[str, int] = {}
    for _ in range(n):
        name = league.pick_opponent(rng).name
        drawn[name] = drawn.get(name, 0) + 1
    for name, p in expected.items():  # within 4 standard errors
        assert abs(drawn.get(name, 0) / n - p) < 4 * math.sqrt(p * (1 - p) / n), name


def test_the_payoff_matrix_counts_each_game_from_both_sides():
    payoff = Payoff()
    payoff.record("a", "b", "win")
    payoff.record("a", "b", "draw")
    payoff.record("b", "a", "win")
    assert payoff.counts[("a", "b")] == [1, 1, 1] and payoff.counts[("b", "a")] == [1, 1, 1]
    assert payoff.win_rate("a", "b") == pytest.approx(0.5)
    assert payoff.win_rate("a", "c") == 0.5 and payoff.games("a", "c") == 0


def test_snapshots_join_every_k_versions_or_when_beaten_often_enough():
    league = League(LeagueConfig(snapshot_every_versions=100, snapshot_win_rate=0.7,
                                   snapshot_min_games=10, max_snapshots=2))
    assert league.snapshot_due(0)  # the first: the league's first past self
    league.add_snapshot(0)
    assert not league.snapshot_due(50) and league.snapshot_due(100)
    for _ in range(7):
        league.record_game(MAIN, snapshot_name(0), "win")
    assert not league.snapshot_due(50)  # 7 games: too few to tell
    for _ in range(3):
        league.record_game(MAIN, snapshot_name(0), "loss")
    assert league.snapshot_due(50)  # 7 of 10
    league.add_snapshot(50)
    league.add_snapshot(150)
    assert [p for p in league.opponents() if p.startswith("snapshot")] == [
        snapshot_name(0), snapshot_name(150)]  # the oldest left, but not the first
    league.add_snapshot(250)
    assert [p for p in league.opponents() if p.startswith("snapshot")] == [
        snapshot_name(0), snapshot_name(250)]
    assert league.first_snapshot == snapshot_name(0)


def test_self_play_games_do_not_move_ratings_and_unknown_players_only_count():
    league = League()
    league.record_game(MAIN, MAIN, "win")
    league.record_game(MAIN, snapshot_name(7), "win")  # dropped from the pool meanwhile
    main = league.players[MAIN]
    assert (main.mu, main.games) == (25.0, 0) and league.games == 2
    with pytest.raises(ValueError, match="outcome"):
        league.record_game(MAIN, bot_name("random"), "won")


def test_a_league_comes_back_whole_from_its_state_or_its_records():
    records = [{"kind": "snapshot", "version": 0}]
    records += [{"kind": "game", "player": MAIN, "opponent": opp, "outcome": out}
                for opp, out in [(bot_name("random"), "win"), (snapshot_name(0), "draw"),
                                 (snapshot_name(0), "loss"), (bot_name("random"), "win")]]
    league = League()
    for record in records:
        league.apply(record)

    restored = League()
    restored.restore(json.loads(json.dumps(league.state())))  # through JSON, as stored
    assert restored.view() == league.view()
    assert restored.state() == json.loads(json.dumps(league.state()))

    replayed = League()
    for record in records:
        replayed.apply(record)
    assert replayed.view() == league.view()
    view = league.view()
    assert view["games"] == 4 and {p["name"] for p in view["players"]} == {
        MAIN, bot_name("random"), snapshot_name(0)}
    i, j = (view["payoff"]["players"].index(n) for n in (MAIN, bot_name("random")))
    assert view["payoff"]["win"][i][j] == 2 and view["payoff"]["loss"][j][i] == 2


def test_a_bad_weighting_is_refused_by_name():
    with pytest.raises(ValueError, match="weighting"):
        LeagueConfig(weighting="hardest")


def test_rating_history_spans_the_whole_run_at_falling_resolution():
    league = League(LeagueConfig(bots=("random",)), rating_history=16)
    for _ in range(200):
        league.record_game(MAIN, "bot-random", "win")
    points = league.players[MAIN].ratings
    assert len(points) <= 16
    games = [g for g, _, _ in points]
    assert games == sorted(games) and games[0] <= 16 and games[-1] >= 200 - 16
    again = League(LeagueConfig(bots=("random",)), rating_history=16)
    again.restore(league.state())
    assert again.players[MAIN].ratings == points
    assert again.players[MAIN].stride == league.players[MAIN].stride
