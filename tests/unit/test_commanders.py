"""The run's commander (`coordinator.commander`): loading it, the env settings it gives tasks
over the wire (a real coordinator process), the collector's envs following them, and the
built-in corridor curriculum."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from pydantic import ValidationError

from rlfleet.collector.collecting import CollectLoop
from rlfleet.collector.inbox import TaskInbox
from rlfleet.shared.contract.commander import BaseCommander, TaskEnvSettings, load_commander
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.wire.tasks import CollectTask, EvaluateTask
from rlfleet.shared.envs.corridor import CorridorCurriculum, CorridorEnv
from rlfleet.shared.envs.make import LevelSeed, make_vector_env
from rlfleet.shared.run.config import parse_config

from .helpers import make_config, ok, post, register, report, wait_running, write_chunk

CORRIDOR = "rlfleet.shared.envs.corridor:CorridorCurriculum"


class NoMethods:
    def __init__(self, cfg) -> None:
        pass


class Broken(BaseCommander):
    def __init__(self, cfg) -> None:
        raise RuntimeError("no levels file")


def _run_config(commander: str | None, **sections: dict):
    cfg = make_config(**sections)
    cfg["coordinator"]["commander"] = commander
    return parse_config(cfg)


# -- loading ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "says"), [
    ("no_such_pkg.mod:Thing", "cannot import module"),
    ("rlfleet.shared.envs.corridor:Nope", "has no attribute"),
    ("not a path", "expected 'package.module:attr'"),
    ("rlfleet.shared.envs.corridor:CorridorCurriculum.LENGTHS", "not a class"),
    (f"{__name__}:NoMethods", "lacks collect_settings, evaluate_settings, on_evaluation"),
    (f"{__name__}:Broken", "making it failed: RuntimeError: no levels file"),
])
def test_a_bad_commander_is_a_config_error_naming_the_field(path, says):
    with pytest.raises(ConfigError) as err:
        load_commander(_run_config(path))
    assert "coordinator.commander" in str(err.value) and says in str(err.value)


def test_no_commander_and_the_built_in_one():
    assert load_commander(_run_config(None)) is None
    commander = load_commander(_run_config(CORRIDOR))
    assert isinstance(commander, CorridorCurriculum)
    assert commander.collect_settings("collector-1", 3) == TaskEnvSettings(
        env_kwargs={"length": 4})
    assert commander.evaluate_settings() == {"length": 4}
    assert commander.scalars() == {"level": 0.0, "length": 4.0}


def test_task_env_settings_are_bounded_json_scalars():
    task = CollectTask(task_id="collect-1", seed=1, env_kwargs={"a": True, "b": 3, "c": 0.5,
                                                                "d": "x", "e": None},
                       level_seeds=[0, 7])
    assert CollectTask.model_validate_json(task.model_dump_json()) == task
    for bad in ({"env_kwargs": {"a": [1]}}, {"env_kwargs": {"not an id": 1}},
                {"env_kwargs": {f"k{i}": i for i in range(65)}},
                {"env_kwargs": {"x": float("nan")}}, {"level_seeds": []},
                {"level_seeds": [-1]}, {"level_seeds": list(range(10_001))}):
        with pytest.raises(ValidationError):
            CollectTask(task_id="collect-1", seed=1, **bad)
    with pytest.raises(ValidationError):
        EvaluateTask(task_id="evaluate-1", policy_version=0, episodes=1, num_envs=1, seed=0,
                     env_kwargs={"a": {"nested": 1}})


# -- the corridor -----------------------------------------------------------------------------

def test_the_corridor_pays_at_its_end_and_truncates_at_its_time_limit():
    env = gym.make("rlfleet/Corridor-v0", length=5)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2,) and obs[0] == 0.0 and obs[1] == pytest.approx(0.2)
    total = 0.0
    for _ in range(4):
        obs, reward, terminated, truncated, info = env.step(1)
        total += reward
    assert terminated and not truncated and info["is_success"] is True
    assert info["corridor_length"] == 5
    assert obs[0] == 1.0 and total == pytest.approx(1.0 - 3 * 0.01)
    env.reset()
    env.step(0)  # the wall at cell 0
    assert env.unwrapped.pos == 0
    for _ in range(9):
        _, _, terminated, truncated, info = env.step(0)
    assert truncated and not terminated and info["is_success"] is False  # 2 * 5 steps
    with pytest.raises(ValueError, match="length=1"):
        CorridorEnv(length=1)


def test_the_curriculum_steps_up_on_success_of_its_current_level_and_solves_at_the_last():
    c = load_commander(_run_config(CORRIDOR))
    assert isinstance(c, CorridorCurriculum)

    def result(success: float):
        from rlfleet.shared.contract.wire.evaluation import EvaluationResult

        return EvaluationResult(task_id="evaluate-1", worker_id="w", policy_version=1,
                                env_steps=1, train_iterations=1, episodes=4, return_mean=0.9,
                                return_std=0, length_mean=4, wall_time=1,
                                success_rate=success)

    c.on_evaluation(result(0.5), {"length": 4})
    assert c.length == 4
    c.on_evaluation(result(1.0), {"length": 4})
    assert c.length == 8 and c.solved() is None
    c.on_evaluation(result(1.0), {"length": 4})  # a stale evaluation of the last level
    assert c.length == 8
    c.on_evaluation(result(1.0), {"length": 8})
    c.on_evaluation(result(1.0), {"length": 16})
    assert c.length == 16 and "length 16" in (c.solved() or "")


# -- the collector follows its task's settings ------------------------------------------------

def test_level_seeds_reset_each_env_with_its_level_at_every_episode():
    cfg = parse_config(make_config(env={"id": "rlfleet/Corridor-v0", "num_envs": 3,
                                        "kwargs": {"length": 2}})).env
    envs = make_vector_env(cfg, 3, seed=5, level_seeds=[11, 12])
    try:
        assert [e.level_seed for e in envs.envs] == [11, 12, 11]
        assert all(isinstance(e, LevelSeed) for e in envs.envs)
        first = [e.unwrapped.np_random_seed for e in envs.envs]
        envs.step(np.ones(3, dtype=np.int64))  # length 2: every episode ends and resets
        assert [e.unwrapped.np_random_seed for e in envs.envs] == first == [11, 12, 11]
    finally:
        envs.close()


def test_the_collect_loop_makes_its_envs_again_when_its_task_settings_change():
    cfg = parse_config(make_config(env={"id": "rlfleet/Corridor-v0", "num_envs": 2}))
    task = CollectTask(task_id="collect-1", seed=3, env_kwargs={"length": 4})
    loop = CollectLoop.__new__(CollectLoop)  # only the env-following part, no services
    loop.cfg, loop.task, loop.inbox, loop.rollout = cfg, task, TaskInbox(), None
    loop.inbox.put_collect(task)
    loop.env_settings, loop.env_rebuilds = (task.env_kwargs, task.level_seeds), 0
    loop.envs = loop._make_envs(task, task.seed)
    try:
        assert [e.unwrapped.length for e in loop.envs.envs] == [4, 4]
        old = loop.envs
        loop._follow_env_settings()
        assert loop.envs is old  # the same settings: the same envs
        loop.inbox.put_collect(task.model_copy(update={"env_kwargs": {"length": 8},
                                                       "level_seeds": [1, 2]}))
        loop._follow_env_settings()
        assert loop.envs is not old and loop.env_rebuilds == 1
        assert [e.unwrapped.length for e in loop.envs.envs] == [8, 8]
        assert [e.level_seed for e in loop.envs.envs] == [1, 2]
    finally:
        loop.envs.close()


# -- over the wire: a real coordinator ---------------------------------------------------------

CURRICULUM = {"coordinator": {"commander": CORRIDOR},
              "eval": {"every_env_steps": 256, "episodes": 4, "num_envs": 4,
                       "stochastic": False, "stop_value": None}}


class _Cluster:
    """A collector and a learner registered with a coordinator, its collect task running."""

    def __init__(self, c, task_sink) -> None:
        self.c, self.sink = c, task_sink()
        self.wid = register(c, "collector", self.sink)["worker_id"]
        self.lid = register(c, "learner", task_sink())["worker_id"]
        self.collect = self.sink.wait_task("collect")
        wait_running(c, self.collect["task_id"])

    def evaluate(self, version: int, returns: list[float], successes: list[bool],
                 length: int = 8) -> dict:
        """A chunk and a learner report (so an evaluation of `version` falls due), then the
        evaluation's report with these episodes; the evaluate task it answered."""
        c = self.c
        ok(report(c, self.wid, self.collect["task_id"], [(write_chunk(c, 256), 256)]))
        ok(post(c, "/learn-info", {"worker_id": self.lid,
                                   "train_iterations": 10 * (version + 1),
                                   "policy_version": version}))
        ev = _wait_tasks(self.sink, "evaluate", version + 1)[version]
        wait_running(c, ev["task_id"])
        ok(post(c, "/evaluations", {
            "worker_id": self.wid, "task_id": ev["task_id"], "policy_version": version,
            "deterministic": {"returns": returns, "lengths": [length] * len(returns),
                              "successes": successes}}))
        return ev


def test_the_commanders_settings_reach_collect_and_evaluate_tasks(coordinator, task_sink):
    c = coordinator(**CURRICULUM)
    cluster = _Cluster(c, task_sink)
    col_sink, collect = cluster.sink, cluster.collect
    assert collect["env_kwargs"] == {"length": 4} and collect["level_seeds"] is None

    for version, length in enumerate((4, 8, 16)):
        ev = cluster.evaluate(version, [0.9] * 4, [True] * 4, length)
        assert ev["env_kwargs"] == {"length": length}
        if length < 16:  # the same collect task, pushed again with the next corridor
            pushed = _wait_tasks(col_sink, "collect", version + 2)[-1]
            assert pushed["task_id"] == collect["task_id"]
            assert pushed["env_kwargs"] == {"length": 2 * length}
    s = c.status()
    assert s["run"]["solved"] is True and "length 16" in s["run"]["stop_reason"]
    assert not col_sink.errors


def _wait_tasks(sink, kind: str, n: int, timeout_s: float = 10.0) -> list[dict]:
    """The first `n` (or more) tasks of `kind` pushed to `sink`, waiting for them."""
    import time

    deadline = time.monotonic() + timeout_s
    with sink.cond:
        while len(found := sink.tasks(kind)) < n:
            left = deadline - time.monotonic()
            assert left > 0, f"{len(found)} {kind} tasks, not {n}: {sink.bodies}"
            sink.cond.wait(left)
    return found


# -- the coordinator's side, in process ---------------------------------------------------------

class Flaky(BaseCommander):
    """Length 4, then 6 after the first evaluation; `scalars` raises."""

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.length = 4

    def collect_settings(self, worker_id, task_seed):
        return {"env_kwargs": {"length": self.length}, "level_seeds": [task_seed]}

    def on_evaluation(self, result, env_kwargs):
        self.length = 6

    def scalars(self):
        raise KeyError("level")


def test_changed_settings_update_live_collect_tasks_and_a_raising_commander_stops_the_run():
    from rlfleet.coordinator.env_settings import EnvSettings
    from rlfleet.coordinator.tasks import TaskTable
    from rlfleet.shared.contract.wire.base import TaskKind, TaskState
    from rlfleet.shared.contract.wire.evaluation import EvaluationResult

    stops: list[str] = []
    settings = EnvSettings(Flaky(None), stops.append)
    tasks = TaskTable()
    a = tasks.add(settings.collect_task(CollectTask(task_id="collect-1", seed=7), "c1"), "c1")
    b = tasks.add(settings.collect_task(CollectTask(task_id="collect-2", seed=8), "c2"), "c2")
    assert a.task.env_kwargs == {"length": 4} and a.task.level_seeds == [7]
    assert settings.evaluate_kwargs() == {"length": 4}
    tasks.end(b.task_id, TaskState.FAILED, "gone")
    result = EvaluationResult(task_id="evaluate-1", worker_id="c1", policy_version=0,
                              env_steps=0, train_iterations=0, episodes=1, return_mean=0,
                              return_std=0, length_mean=1, wall_time=0)
    changed = settings.on_evaluation(result, {"length": 4}, tasks)
    assert [r.task_id for r in changed] == ["collect-1"]  # the ended task stays as it was
    assert tasks.get("collect-1").task.env_kwargs == {"length": 6}
    assert tasks.get("collect-2").task.env_kwargs == {"length": 4}
    assert settings.on_evaluation(result, {"length": 6}, tasks) == []  # nothing new
    assert tasks.active(TaskKind.COLLECT)[0].task.kind is TaskKind.COLLECT
    assert stops == []
    assert settings.scalars() == {}
    assert stops == ["coordinator.commander failed in scalars: KeyError: 'level'"]
    assert EnvSettings(None, stops.append).scalars() == {}


def test_a_resumed_run_goes_on_at_the_level_its_commander_had_reached(
        coordinator, coordinator_pool, task_sink):
    """The commander's `state_dict` rides in the snapshot a stopping coordinator writes, and
    the resumed coordinator gives it back before anything is asked: its evaluations and any
    new collect task run the level the run had reached, not the first."""
    c = coordinator(**CURRICULUM)
    cluster = _Cluster(c, task_sink)
    cluster.evaluate(0, [0.9] * 4, [True] * 4, length=4)
    assert _wait_tasks(cluster.sink, "collect", 2)[-1]["env_kwargs"] == {"length": 8}
    c.proc.terminate()  # an orderly stop: the final snapshot holds the commander's level
    assert c.proc.wait(timeout=30) == 0

    resumed = coordinator_pool.start(c.config, c.storage_dir, "--resume",
                                     "--name", c.config["name"])
    try:
        again = _Cluster(resumed, task_sink)
        assert again.collect["env_kwargs"] == {"length": 8}
        assert again.evaluate(0, [0.1] * 4, [False] * 4)["env_kwargs"] == {"length": 8}
    finally:
        coordinator_pool.release(resumed)


def test_the_curriculum_state_round_trips_and_a_base_commander_keeps_none():
    commander = load_commander(_run_config(CORRIDOR))
    commander.level = 2
    commander.passed_last = True
    again = load_commander(_run_config(CORRIDOR))
    again.load_state_dict(commander.state_dict())
    assert (again.level, again.passed_last, again.length) == (2, True, 16)
    assert BaseCommander(None).state_dict() == {}


def test_the_best_policy_is_the_one_that_walked_the_longest_corridor(coordinator, task_sink):
    """The commander scores evaluations for the run's best policy: a policy that walks the
    8-cell corridor a quarter of the time beats one that walked the 4-cell corridor always,
    though its mean return is lower."""
    c = coordinator(**CURRICULUM)
    cluster = _Cluster(c, task_sink)
    cluster.evaluate(0, [0.95] * 4, [True] * 4, length=4)
    cluster.evaluate(1, [0.5] * 4, [True, False, False, False])
    best = c.status()["best_evaluation"]
    assert best["policy_version"] == 1 and best["return_mean"] == 0.5


def test_the_corridor_scores_levels_first_then_success_then_return():
    from rlfleet.shared.contract.wire.evaluation import EvaluationResult

    commander = load_commander(_run_config(CORRIDOR))

    def result(ret: float, success: float) -> EvaluationResult:
        return EvaluationResult(task_id="evaluate-1", worker_id="c1", policy_version=0,
                                env_steps=0, train_iterations=0, episodes=4, return_mean=ret,
                                return_std=0, length_mean=1, wall_time=0,
                                success_rate=success)

    easy_perfect = commander.score(result(1.0, 1.0), {"length": 4})
    hard_poor = commander.score(result(-0.3, 0.0), {"length": 8})
    assert hard_poor > easy_perfect
    assert commander.score(result(0.9, 1.0), {"length": 8}) > \
        commander.score(result(0.95, 0.75), {"length": 8})
    assert commander.score(result(1.0, 1.0), {"length": 5}) is None  # not a level of it
    assert BaseCommander(None).score(result(0.7, 0.0), {}) == 0.7
