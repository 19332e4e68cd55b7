"""Battle collection on real PettingZoo games with real torch policies: chunks hold only the
learning side's legal moves, tile into whole games (or games cut with a value to bootstrap
from), and say both sides' versions and every outcome; the opponents are whom the queue
says, a snapshot is loaded from storage and one that cannot be is skipped and named; the
evaluator counts every game once from the seat it was played."""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("pettingzoo", reason="the games extra: pip install -e '.[games]'")

from rlfleet.shared.algos.registry import make_policy
from rlfleet.shared.contract.codec import encode_weights  # noqa: E402
from rlfleet.shared.contract.wire.experience import ChunkMeta  # noqa: E402
from rlfleet.shared.contract.wire.tasks import Opponent  # noqa: E402
from rlfleet.shared.envs.games.tictactoe import board_from_planes, perfect_move  # noqa: E402
from rlfleet.shared.envs.make import run_spec  # noqa: E402
from rlfleet.shared.infra.storage import DirectoryStorage, snapshot_blob  # noqa: E402
from rlfleet.shared.rollout.battle import BattleRollout, OpponentPool, battle_evaluate  # noqa: E402
from rlfleet.shared.run.config import parse_config

MAIN = Opponent(name="main", kind="main")
RANDOM = Opponent(name="bot-random", kind="bot", bot="random")
PERFECT = Opponent(name="bot-perfect", kind="bot", bot="perfect")


def _cfg(env_id: str = "tictactoe_v3", algo: str = "dqn", num_envs: int = 4):
    data = {"env": {"id": env_id, "num_envs": num_envs}, "algo": {"name": algo},
            "league": {"bots": ["random"]}}
    if algo == "ppo":
        data["buffers"] = {"rollouts": {"kind": "queue"}}
        data["learner"] = {"mix": [{"buffer": "rollouts", "fraction": 1.0}]}
    return parse_config(data)


def _setup(tmp_path, env_id="tictactoe_v3", algo="dqn", version=3):
    cfg = _cfg(env_id, algo)
    spec = run_spec(cfg)
    policy = make_policy(cfg.algo, spec, 0)
    policy.load_policy(version, policy.policy_state())
    storage = DirectoryStorage(tmp_path / "storage")
    return cfg, spec, policy, storage, OpponentPool(cfg, spec, storage, seed=1)


def _queue(*opponents: Opponent):
    items = list(opponents)

    def take() -> Opponent:
        return items.pop(0) if len(items) > 1 else items[0]
    return take


def _check_chunk(chunk, n_actions: int) -> None:
    a = chunk.arrays
    n = len(a["reward"])
    assert all(len(col) == n for col in a.values())
    rows = np.arange(n)
    assert a["action_mask"][rows, a["action"]].all(), "an illegal move was stored"
    # segments tile the rows; each segment's last row is cut, and only those
    covered = 0
    cut_rows = set()
    for start, length in chunk.segments:
        assert start == covered
        covered += length
        cut_rows.add(start + length - 1)
    assert covered == n
    assert set(np.flatnonzero(a["cut"]).tolist()) == cut_rows
    assert a["terminated"][a["terminated"]].size <= len(chunk.segments)
    assert a["action_mask"].shape == (n, n_actions)
    meta = ChunkMeta(chunk_id="c" * 8, length=n, policy_version=chunk.policy_version,
                     episode_returns=chunk.episode_returns,
                     episode_lengths=chunk.episode_lengths, segments=chunk.segments,
                     games=chunk.games, opponents_skipped=chunk.opponents_skipped)
    assert len(meta.games) == len(meta.episode_returns)


@pytest.mark.parametrize("env_id", ["tictactoe_v3", "connect_four_v3"])
def test_episode_chunks_are_whole_games_of_legal_moves_with_both_versions(tmp_path, env_id):
    cfg, spec, policy, storage, pool = _setup(tmp_path, env_id)
    rollout = BattleRollout(cfg, policy, pool, _queue(RANDOM), mode="episodes",
                            episodes_per_chunk=6, seed=5)
    firsts = Counter()
    for _ in range(5):
        chunk = rollout.collect()
        _check_chunk(chunk, spec.n_actions)
        assert len(chunk.games) == 6 and len(chunk.segments) == 6
        assert chunk.arrays["terminated"].sum() == 6  # each game ends in the chunk
        for game, (start, length) in zip(chunk.games, chunk.segments, strict=True):
            assert game.opponent == "bot-random" and game.opponent_version is None
            assert game.policy_version == 3 == chunk.policy_version
            last_reward = chunk.arrays["reward"][start + length - 1]
            assert last_reward == {"win": 1.0, "draw": 0.0, "loss": -1.0}[game.outcome]
            firsts[game.first] += 1
        assert (chunk.arrays["opponent_version"] == -1).all()
        storage.close()
    assert firsts[True] > 0 and firsts[False] > 0  # both seats get played


def test_sample_chunks_cut_running_games_and_ppo_values_the_cut(tmp_path):
    cfg, spec, policy, storage, pool = _setup(tmp_path, algo="ppo")
    rollout = BattleRollout(cfg, policy, pool, _queue(MAIN), chunk_size=50, mode="samples",
                            seed=2)
    cut_alive = 0
    for _ in range(6):
        chunk = rollout.collect()
        _check_chunk(chunk, spec.n_actions)
        a = chunk.arrays
        assert len(a["reward"]) >= 50
        assert {"log_prob", "value", "bootstrap_value"} <= set(a)
        for start, length in chunk.segments:
            last = start + length - 1
            if not a["terminated"][last]:  # a game cut while running: valued where it stopped
                cut_alive += 1
                assert a["bootstrap_value"][last] != 0.0
            others = a["bootstrap_value"][start:last]
            assert (others == 0).all()
        for game in chunk.games:  # self-play: the opponent is the same policy, same version
            assert game.opponent == "main" and game.opponent_version == 3
    assert cut_alive > 0


def test_games_follow_the_queue_and_a_snapshot_comes_from_storage(tmp_path):
    cfg, spec, policy, storage, pool = _setup(tmp_path)
    frozen = make_policy(cfg.algo, spec, 9)
    storage.put_blob(snapshot_blob(1), encode_weights(frozen.policy_state(),
                                                      {"policy_version": "1"}))
    snap = Opponent(name="snapshot-1", kind="snapshot", policy_version=1)
    order = [snap, RANDOM, snap, MAIN] * 3
    rollout = BattleRollout(cfg, policy, pool, _queue(*order, MAIN), mode="episodes",
                            episodes_per_chunk=4, seed=0)
    seen = Counter()
    for _ in range(6):
        chunk = rollout.collect()
        for game in chunk.games:
            seen[game.opponent] += 1
            if game.opponent == "snapshot-1":
                assert game.opponent_version == 1
        rows = chunk.arrays["opponent_version"]
        assert set(rows.tolist()) <= {-1, 1, 3}
    assert seen["snapshot-1"] >= 6 and seen["bot-random"] >= 3
    assert pool.loads == 1  # loaded once, then kept


def test_a_snapshot_that_cannot_be_loaded_is_skipped_and_named(tmp_path, caplog):
    cfg, spec, policy, storage, pool = _setup(tmp_path)
    gone = Opponent(name="snapshot-7", kind="snapshot", policy_version=7)
    rollout = BattleRollout(cfg, policy, pool, _queue(gone), mode="episodes",
                            episodes_per_chunk=4, seed=0)
    with caplog.at_level(logging.WARNING, "rlfleet.collector"):
        first = rollout.collect()
        second = rollout.collect()
    assert first.opponents_skipped == ["snapshot-7"] and second.opponents_skipped == []
    assert {g.opponent for g in first.games + second.games} == {"main"}
    assert "snapshot-7" in caplog.text and "cannot be loaded" in caplog.text


class _PerfectPolicy:
    """The exact solver behind the Policy interface the evaluator drives."""

    version = 0

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def act_eval(self, obs, deterministic=True, mask=None):
        return np.array([perfect_move(board_from_planes(o), self.rng) for o in obs])


def test_the_evaluator_counts_every_game_from_its_seat(tmp_path):
    cfg, spec, policy, storage, pool = _setup(tmp_path)
    tallies = battle_evaluate(cfg, _PerfectPolicy(), pool, [RANDOM, PERFECT], games=40,
                              seed=3, tables=7)
    by = {(t.opponent, t.first): t for t in tallies}
    assert set(by) == {("bot-random", True), ("bot-random", False), ("bot-perfect", True),
                       ("bot-perfect", False)}
    for t in tallies:
        assert t.win + t.draw + t.loss == 40 == len(t.returns) == len(t.plies)
        assert t.loss == 0  # the solver never loses, from either seat
    assert by[("bot-perfect", True)].draw == 40 == by[("bot-perfect", False)].draw
    assert by[("bot-random", True)].win > 30


def corner_bot(env_id, rng):
    """A user's bot by import path: the lowest legal action."""
    return lambda obs, mask: int(np.flatnonzero(mask)[0])


def test_a_users_own_game_and_bot_by_import_path(tmp_path):
    cfg = parse_config({"env": {"id": "pettingzoo.classic.tictactoe.tictactoe:env",
                                "num_envs": 3}, "algo": {"name": "dqn"},
                        "league": {"bots": ["tests.unit.test_battle:corner_bot"]}})
    spec = run_spec(cfg)
    policy = make_policy(cfg.algo, spec, 0)
    pool = OpponentPool(cfg, spec, DirectoryStorage(tmp_path / "s"), seed=0)
    mine = Opponent(name="bot-tests.unit.test_battle:corner_bot", kind="bot",
                    bot="tests.unit.test_battle:corner_bot")
    rollout = BattleRollout(cfg, policy, pool, _queue(mine), mode="episodes",
                            episodes_per_chunk=5)
    chunk = rollout.collect()
    _check_chunk(chunk, spec.n_actions)
    assert {g.opponent for g in chunk.games} == {mine.name}


def test_one_process_plays_learns_and_snapshots_like_the_cluster(tmp_path):
    from rlfleet.single_process import run_single

    cfg = parse_config({
        "env": {"id": "tictactoe_v3", "num_envs": 8}, "algo": {"name": "dqn"},
        "collector": {"mode": "episodes", "episodes_per_chunk": 8},
        "buffers": {"replay": {"rate_limit": {"min_size": 200, "samples_per_insert": 8}}},
        "learner": {"publish_every": 5},
        "league": {"bots": ["random", "perfect"], "snapshot_every_versions": 20,
                   "stop_when": [{"opponent": "bot-perfect", "max_loss": 1.0}]},
        "eval": {"every_env_steps": 3000, "episodes": 10, "num_envs": 8, "stop_value": None},
        "stop": {"max_env_steps": 6000}})
    result = run_single(cfg, run_dir=tmp_path)
    assert result.games and result.games > 500 and result.train_iterations > 100
    assert result.solved  # a rule any evaluation meets: the first one ends the run
    assert list(tmp_path.glob("storage/**/*league-snapshot-*"))


def test_rlfleet_battle_plays_the_kept_policy_from_each_seat(tmp_path):
    import json

    import yaml

    from rlfleet.battle import battle_run

    data = {"name": "ttt", "env": {"id": "tictactoe_v3", "num_envs": 2},
            "algo": {"name": "dqn"}, "league": {"bots": ["random", "perfect"]}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data))
    cfg = parse_config(data)
    policy = make_policy(cfg.algo, run_spec(cfg), 0)
    blob = encode_weights(policy.policy_state(), {"policy_version": "42"})
    (tmp_path / "best_policy.safetensors").write_bytes(blob)
    storage = DirectoryStorage(tmp_path / "storage")
    storage.put_blob(snapshot_blob(3), blob)
    (tmp_path / "league.json").write_text(json.dumps({"first_snapshot": "snapshot-3"}))
    result = battle_run(tmp_path, games=12, seed=1)
    assert result["policy_version"] == 42
    seats = {(c["opponent"], c["first"]) for c in result["counts"]}
    assert seats == {(o, f) for o in ("bot-random", "bot-perfect", "snapshot-3")
                     for f in (True, False)}
    assert all(c["win"] + c["draw"] + c["loss"] == 12 for c in result["counts"])
    assert result["rates"]["bot-perfect"]["win"] == 0.0
