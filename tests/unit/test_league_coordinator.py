"""The league inside a real coordinator process, over HTTP: collect tasks and chunk-report
answers carry PFSP-drawn opponents, reported games land in the payoff and ratings, a
snapshot's weights are pinned in storage when it joins, an unloadable one is dropped,
evaluations play the bots and the newest snapshot and stop the run by win rate, and the
whole league comes back after a SIGKILL (snapshot plus journal)."""

from __future__ import annotations

import pytest

pytest.importorskip("openskill", reason="the games extra: pip install -e '.[games]'")

import requests  # noqa: E402
import torch  # noqa: E402

from rlfleet.shared.contract.codec import encode_weights  # noqa: E402
from rlfleet.shared.infra.storage import DirectoryStorage, snapshot_blob  # noqa: E402

from .helpers import (  # noqa: E402
    CoordinatorPool,
    collector_and_learner,
    get,
    kill_tree,
    make_config,
    ok,
    post,
    register,
    report,
    wait_for,
    wait_running,
    write_chunk,
)
from .test_status_cli import run_status  # noqa: E402

LEAGUE = {"bots": ["random", "perfect"], "snapshot_every_versions": 10,
          "snapshot_min_games": 1000, "eval_snapshots": 1,
          "stop_when": [{"opponent": "bot-perfect", "seat": "second", "max_loss": 0.0},
                        {"opponent": "bot-random", "seat": "first", "min_win": 0.9}]}


def league_config(**changes) -> dict:
    cfg = make_config(env={"id": "tictactoe_v3", "num_envs": 3},
                      eval={"every_env_steps": 1_000_000, "episodes": 20, "num_envs": 4,
                            "stop_value": None})
    cfg["league"] = {**LEAGUE, **changes}
    return cfg


def game(opponent: str, outcome: str, version: int = 0, first: bool = True,
         opponent_version: int | None = None) -> dict:
    return {"opponent": opponent, "policy_version": version,
            "opponent_version": opponent_version, "first": first, "outcome": outcome,
            "plies": 7}


def publish(c, version: int) -> None:
    weights = {"w": torch.full((3,), float(version))}
    DirectoryStorage(c.storage_dir).put_weights(
        version, encode_weights(weights, {"policy_version": str(version)}))


@pytest.fixture
def league_coordinator(coordinator_pool: CoordinatorPool, tmp_path):
    started = []

    def start(*args: str, snapshot_interval_s: float | None = 0.3, **changes):
        cfg = league_config(**changes)
        cfg["coordinator"]["snapshot_interval_s"] = snapshot_interval_s
        c = coordinator_pool.start(cfg, tmp_path / "storage", *args)
        started.append(c)
        return c

    yield start
    for c in started:
        coordinator_pool.release(c)


def test_opponents_come_with_the_task_and_each_answer(league_coordinator, task_sink):
    c = league_coordinator()
    col, collect, _, _ = collector_and_learner(c, task_sink)
    names = {"main", "bot-random", "bot-perfect"}
    assert len(collect["opponents"]) == 6  # two per table
    assert {o["name"] for o in collect["opponents"]} <= names
    games = [game("bot-random", "win"), game("bot-perfect", "draw", first=False),
             game("main", "loss")]
    answer = ok(report(c, col["worker_id"], collect["task_id"],
                       [(write_chunk(c, 12), 12)], games=games))
    assert len(answer["opponents"]) == 3
    assert all(o["name"] in names for o in answer["opponents"])
    view = get(c, "/league")
    assert view["games"] == 3
    pay = view["payoff"]
    i, j = pay["players"].index("main"), pay["players"].index("bot-random")
    assert pay["win"][i][j] == 1 and pay["loss"][j][i] == 1
    assert abs(sum(view["probabilities"].values()) - 1.0) < 1e-6
    assert view["ratings"]["bot-random"]  # rated; self-play is not
    status = c.status()
    assert status["league"]["games"] == 3 and "ratings" not in status["league"]
    out = run_status(c.url)  # rlfleet status prints the league
    assert out.returncode == 0, out.stderr
    assert "league: 3 games" in out.stdout
    line = next(x for x in out.stdout.splitlines() if "bot-random" in x)
    assert "1/0/0" in line and "%" in line


@pytest.mark.parametrize("snapshot_interval_s", [0.3, None], ids=["snapshots", "journal-only"])
def test_snapshots_are_pinned_dropped_and_survive_a_sigkill(league_coordinator, task_sink,
                                                           coordinator_pool,
                                                           snapshot_interval_s):
    c = league_coordinator(snapshot_interval_s=snapshot_interval_s)
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    storage = DirectoryStorage(c.storage_dir)
    for version in (0, 12, 25):
        publish(c, version)
        ok(post(c, "/learn-info", {"worker_id": lrn["worker_id"], "train_iterations": version,
                                   "policy_version": version, "consumed": []}))
        wait_for(lambda v=version: f"snapshot-{v}" in
                 {p["name"] for p in get(c, "/league")["players"]}, 10,
                 what=f"snapshot of version {version}")
    for version in (0, 12, 25):  # pinned: kept after the published version is pruned
        assert storage.get_blob(snapshot_blob(version)) is not None
    games = [game("snapshot-12", "win", 25, opponent_version=12)] * 5 + \
            [game("bot-perfect", "loss", 25, first=False)] * 2
    ok(report(c, col["worker_id"], collect["task_id"], [(write_chunk(c, 20), 20)],
              games=games, opponents_skipped=["snapshot-0"]))
    before = get(c, "/league")
    assert "snapshot-0" not in {p["name"] for p in before["players"]}
    assert before["games"] == 7

    kill_tree(c.proc)  # SIGKILL: the games since the last snapshot live in the journal only
    again = coordinator_pool.start(c.config, c.storage_dir, "--resume")
    try:
        after = get(again, "/league")
        assert after == before
        assert "restored run at" in again.log()
    finally:
        coordinator_pool.release(again)


def test_an_evaluation_plays_bots_and_snapshots_and_stops_by_win_rate(
        coordinator_pool, tmp_path, task_sink):
    cfg = league_config()
    cfg["eval"].update(every_env_steps=100)
    c = coordinator_pool.start(cfg, tmp_path / "storage")
    try:
        col_sink, lrn_sink = task_sink(), task_sink()
        col = register(c, "collector", col_sink)
        lrn = register(c, "learner", lrn_sink)
        collect = col_sink.wait_task("collect")
        wait_running(c, collect["task_id"])
        for version in (3, 15):
            publish(c, version)
            ok(post(c, "/learn-info", {"worker_id": lrn["worker_id"],
                                       "train_iterations": version,
                                       "policy_version": version, "consumed": []}))
            wait_for(lambda v=version: f"snapshot-{v}" in
                     {p["name"] for p in get(c, "/league")["players"]}, 10,
                     what=f"snapshot {version}")
        ok(report(c, col["worker_id"], collect["task_id"], [(write_chunk(c, 150), 150)]))
        first = col_sink.wait_task("evaluate")
        # every bot, the first snapshot (kept for good), the newest
        assert [o["name"] for o in first["battles"]] == ["bot-random", "bot-perfect",
                                                         "snapshot-3", "snapshot-15"]
        result = ok(post(c, "/evaluations", evaluation(col, first, perfect_second_loss=1,
                                                       random_first_win=20)))
        assert result["battles"]["bot-perfect/second"]["loss"] == pytest.approx(0.05)
        assert result["battles"]["bot-random"]["games"] == 40
        assert c.status()["run"]["state"] == "running"  # one loss to the perfect player

        ok(report(c, col["worker_id"], collect["task_id"], [(write_chunk(c, 150), 150)]))
        second = wait_for(lambda: [t for t in col_sink.tasks("evaluate")
                                   if t["task_id"] != first["task_id"]], 10,
                          what="the second evaluation")[0]
        ok(post(c, "/evaluations", evaluation(col, second, perfect_second_loss=0,
                                              random_first_win=19)))
        run = c.status()["run"]
        assert run["solved"] and run["state"] == "stopped"
        assert "bot-perfect/second loss 0.000 <= 0.0" in run["stop_reason"]
        metrics = c.status()["metrics"]
        assert "eval/deterministic/return_mean" in metrics
    finally:
        coordinator_pool.release(c)


def evaluation(col: dict, task: dict, perfect_second_loss: int, random_first_win: int
               ) -> dict:
    battles = [{"opponent": "bot-perfect", "first": True, "win": 0, "draw": 20, "loss": 0},
               {"opponent": "bot-perfect", "first": False, "win": 0,
                "draw": 20 - perfect_second_loss, "loss": perfect_second_loss},
               {"opponent": "bot-random", "first": True, "win": random_first_win,
                "draw": 20 - random_first_win, "loss": 0},
               {"opponent": "bot-random", "first": False, "win": 10, "draw": 5, "loss": 5}]
    returns = [1.0 if k == "win" else 0.0 if k == "draw" else -1.0
               for b in battles for k in ("win", "draw", "loss") for _ in range(b[k])]
    return {"worker_id": col["worker_id"], "task_id": task["task_id"], "policy_version": 15,
            "deterministic": {"returns": returns, "lengths": [7] * len(returns)},
            "battles": battles}


def test_a_run_without_a_league_answers_404_by_name(coordinator):
    c = coordinator()
    r = requests.get(c.api("/league"), timeout=5)
    assert r.status_code == 404 and r.json()["field"] == "league"
