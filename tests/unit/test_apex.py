"""Ape-X exploration (`collector.epsilon_schedule: apex`):

- the formula, against hand-computed values;
- the config: the fields, and `apex` refused for an algorithm that does not explore with
  epsilon, naming the field;
- DQN acts with a fixed epsilon once given one, whatever the env step, and evaluates as before;
- the coordinator's task table hands out slots: the lowest free one, freed by a collector that
  leaves or dies, kept by one restarted under its id, shared beyond `apex_slots`, kept across
  a snapshot;
- a real coordinator with fake collectors: N collectors' tasks carry slots 0..N-1 and the
  formula's epsilons; one leaving and another joining keeps them distinct and unchanged;
  each collector's heartbeat epsilon shows in `GET /workers` and `rlfleet status`;
- a collector acts with its task's epsilon and reports it in its heartbeat.
"""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from rlfleet.collector.acting import Acting, PolicyRefresher
from rlfleet.collector.service import CollectorService
from rlfleet.coordinator.tasks import TaskTable
from rlfleet.shared.algos.capabilities import EpsilonGreedy
from rlfleet.shared.algos.dqn.config import DQNConfig
from rlfleet.shared.algos.registry import make_policy
from rlfleet.shared.contract.config import CollectorConfig, ConfigError, apex_epsilon
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.contract.wire.base import TaskKind, TaskState
from rlfleet.shared.contract.wire.tasks import CollectTask
from rlfleet.shared.infra.storage import DirectoryStorage
from rlfleet.shared.run.check import check_runnable
from rlfleet.shared.run.config import load_config, parse_config
from rlfleet.status import print_status

from .helpers import HTTP, closed_port, get, ok, post, register

REPO = Path(__file__).resolve().parents[2]
APEX_CARTPOLE = REPO / "configs" / "cartpole-dqn-apex.yaml"


# -- the formula ------------------------------------------------------------------------------

def test_the_ape_x_epsilons_are_the_papers_formula():
    assert apex_epsilon(0, 1, 0.4, 7.0) == 0.4  # one slot: eps
    assert apex_epsilon(0, 8, 0.4, 7.0) == 0.4  # the first slot: eps
    assert apex_epsilon(7, 8, 0.4, 7.0) == pytest.approx(0.4 ** 8) == pytest.approx(
        0.00065536)  # the last: eps ** (1 + alpha)
    # 4 slots, by hand: 0.4 ** (1 + 7/3), 0.4 ** (1 + 14/3)
    assert apex_epsilon(1, 4, 0.4, 7.0) == pytest.approx(0.0471556, rel=1e-5)
    assert apex_epsilon(2, 4, 0.4, 7.0) == pytest.approx(0.00555913, rel=1e-5)
    assert apex_epsilon(1, 3, 0.5, 2.0) == pytest.approx(0.25)  # 0.5 ** (1 + 2 * 1/2)
    assert apex_epsilon(3, 4, 0.3, 0.0) == pytest.approx(0.3)  # alpha 0: all alike
    assert apex_epsilon(1, 2) == pytest.approx(0.4 ** 8)  # the defaults are the paper's
    eps = [apex_epsilon(i, 8) for i in range(8)]
    assert eps == sorted(eps, reverse=True) and len(set(eps)) == 8
    for slot, slots in ((8, 8), (-1, 8), (0, 0)):
        with pytest.raises(ValueError, match="slot"):
            apex_epsilon(slot, slots)


# -- the config -------------------------------------------------------------------------------

def test_the_collector_section_has_ape_x_settings_and_linear_stays_the_default():
    c = CollectorConfig()
    assert (c.epsilon_schedule, c.apex_slots, c.apex_eps, c.apex_alpha) == (
        "linear", 8, 0.4, 7.0)
    cfg = load_config(APEX_CARTPOLE)
    assert cfg.collector.epsilon_schedule == "apex" and cfg.collector.apex_slots == 4
    pong = load_config(REPO / "configs" / "pong-apex.yaml")
    assert pong.collector.epsilon_schedule == "apex" and pong.algo.n_step == 3
    assert pong.buffers["replay"].kind == "prioritized"
    for bad in ({"apex_slots": 0}, {"apex_eps": 0}, {"apex_eps": 1.5}, {"apex_alpha": -1},
                {"epsilon_schedule": "exponential"}):
        with pytest.raises(ConfigError, match=f"collector.{next(iter(bad))}"):
            parse_config({"collector": bad})


def test_ape_x_needs_an_algorithm_that_explores_with_epsilon():
    ppo = {"algo": {"name": "ppo"}, "buffers": {"rollouts": {"kind": "queue"}},
           "learner": {"mix": [{"buffer": "rollouts", "fraction": 1.0}]}}
    parse_config(ppo)  # fine with the linear default
    with pytest.raises(ConfigError, match=r"field 'collector.epsilon_schedule'.*"
                                          r"algo.name='ppo' does not explore with epsilon"):
        parse_config({**ppo, "collector": {"epsilon_schedule": "apex"}})
    assert parse_config({"algo": {"name": "cql"}, "collector": {"epsilon_schedule": "apex"}})


def test_ape_x_is_refused_at_launch_for_a_users_policy_that_takes_no_epsilon(
        tmp_path, monkeypatch):
    (tmp_path / "no_eps.py").write_text(
        "from rlfleet.shared.algos.base import ActOutput\n"
        "from rlfleet.shared.algos.dqn.policy import DQN\n\n"
        "class FixedDQN(DQN):\n"
        "    epsilon = None  # a protocol member set to None: not EpsilonGreedy\n"
        "    set_epsilon = None\n\n"
        "    def act(self, obs, env_step, mask=None):\n"
        "        return ActOutput(self._epsilon_greedy(obs, 0.1, mask))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = {"algo": {"name": "dqn", "policy": "no_eps:FixedDQN"}}
    check_runnable(parse_config(cfg))  # fine with the linear default
    with pytest.raises(ConfigError, match=r"collector.epsilon_schedule=apex .*"
                                          r"it is not EpsilonGreedy"):
        check_runnable(parse_config({**cfg, "collector": {"epsilon_schedule": "apex"}}))


# -- the policy -------------------------------------------------------------------------------

def test_dqn_acts_with_a_fixed_epsilon_once_given_one_and_evaluates_as_before():
    policy = make_policy(DQNConfig(eps_start=1.0, eps_end=0.05, eps_decay_steps=1000),
                         EnvSpec(obs_shape=(4,), n_actions=2), 0)
    assert isinstance(policy, EpsilonGreedy)
    assert policy.epsilon(0) == 1.0 and policy.epsilon(10**6) == pytest.approx(0.05)  # decay
    obs = np.random.default_rng(1).standard_normal((20_000, 4)).astype(np.float32)
    greedy = policy.act_eval(obs)
    policy.set_epsilon(0.2)
    assert policy.epsilon(0) == policy.epsilon(10**9) == 0.2
    for step in (0, 10**6):  # however far the run is: half the random picks differ
        differ = float(np.mean(policy.act(obs, step).actions != greedy))
        assert differ == pytest.approx(0.1, abs=0.01), (step, differ)
    policy.set_epsilon(0.0)
    assert np.array_equal(policy.act(obs, 0).actions, greedy)
    policy.set_epsilon(1.0)
    assert np.array_equal(policy.act_eval(obs), greedy)  # evaluation stays greedy
    policy.set_epsilon(None)
    assert policy.epsilon(0) == 1.0  # back to the decay
    with pytest.raises(ValueError, match="probability"):
        policy.set_epsilon(1.5)


# -- the task table ---------------------------------------------------------------------------

APEX4 = CollectorConfig(epsilon_schedule="apex", apex_slots=4)


def _collect(table: TaskTable, worker: str) -> CollectTask:
    rec = table.claim(worker, TaskKind.COLLECT) or table.add(
        CollectTask(task_id=table.new_id(TaskKind.COLLECT), seed=0), worker)
    rec.state = TaskState.RUNNING
    return rec.task


def _slots(table: TaskTable) -> dict[str, int]:
    return {r.worker_id: r.task.apex_slot for r in table.active(TaskKind.COLLECT)
            if r.state is not TaskState.UNASSIGNED}


def test_a_joining_collector_takes_the_lowest_free_slot():
    table = TaskTable(APEX4)
    tasks = {w: _collect(table, w) for w in ("a", "b", "c", "d")}
    assert {w: t.apex_slot for w, t in tasks.items()} == {"a": 0, "b": 1, "c": 2, "d": 3}
    assert [tasks[w].epsilon for w in "abcd"] == [apex_epsilon(i, 4) for i in range(4)]

    # b leaves (its task ends): the next to join takes slot 1, the others keep theirs
    table.end(next(r.task_id for r in table.active_for("b")), TaskState.FINISHED)
    assert _collect(table, "e").apex_slot == 1
    # c dies (its task waits, unassigned), a leaves: a new collector takes c's task with the
    # lowest free slot, 0; a restarted d (same id) gets its own task and slot back
    table.unassign(next(r.task_id for r in table.active_for("c")), "died")
    table.end(next(r.task_id for r in table.active_for("a")), TaskState.FINISHED)
    taken = _collect(table, "f")
    assert taken.task_id == tasks["c"].task_id and taken.apex_slot == 0
    assert _collect(table, "d").apex_slot == 3
    assert _slots(table) == {"e": 1, "f": 0, "d": 3}
    # more collectors than slots: the extra ones share the least held slots, lowest first
    assert [_collect(table, w).apex_slot for w in ("g", "h", "i", "j")] == [2, 0, 1, 2]


def test_a_restarted_collector_keeps_its_slot_unless_another_took_it():
    table = TaskTable(APEX4)
    for w in ("a", "b"):
        _collect(table, w)
    # a dies; c joins and takes a's task (slot 0); a comes back under its id: a new slot
    table.unassign(next(r.task_id for r in table.active_for("a")), "died")
    assert _collect(table, "c").apex_slot == 0
    assert _collect(table, "a").apex_slot == 2
    # a restarted coordinator hands the snapshot's tasks back with their slots
    restored = TaskTable(APEX4)
    restored.restore(table.snapshot())
    assert [_collect(restored, w).apex_slot for w in ("b", "a", "c")] == [1, 2, 0]


def test_without_ape_x_collect_tasks_carry_no_slot():
    table = TaskTable(CollectorConfig())
    task = _collect(table, "a")
    assert task.apex_slot is None and task.epsilon is None


# -- a real coordinator, fake collectors ------------------------------------------------------

def _slots_of(c) -> dict[str, tuple[int, float]]:
    return {t["worker_id"]: (t["task"]["apex_slot"], t["task"]["epsilon"])
            for t in get(c, "/tasks")["tasks"]
            if t["kind"] == "collect" and t["state"] in ("pending", "running")}


def test_collectors_get_the_ape_x_epsilons_and_keep_them_as_others_come_and_go(
        coordinator, task_sink, monkeypatch):
    n = 4
    c = coordinator(collector={"epsilon_schedule": "apex", "apex_slots": n})
    sinks = [task_sink() for _ in range(n)]
    ids = [register(c, "collector", s)["worker_id"] for s in sinks]
    pushed = [s.wait_task("collect") for s in sinks]
    assert [t["apex_slot"] for t in pushed] == list(range(n))  # in the order they joined
    assert [t["epsilon"] for t in pushed] == pytest.approx(
        [0.4 ** (1 + 7 * i / (n - 1)) for i in range(n)], rel=1e-12)
    before = _slots_of(c)
    assert sorted(s for s, _ in before.values()) == list(range(n))

    # collector 1 (slot 1) leaves; a new collector joins and takes slot 1
    ok(HTTP.delete(c.api(f"/workers/{ids[1]}"), timeout=10))
    newcomer = task_sink()
    new_id = register(c, "collector", newcomer)["worker_id"]
    assert newcomer.wait_task("collect")["apex_slot"] == 1
    after = _slots_of(c)
    assert after[new_id] == before[ids[1]]
    assert {w: after[w] for w in ids if w != ids[1]} == {
        w: before[w] for w in ids if w != ids[1]}  # the others' slots did not change
    assert sorted(s for s, _ in after.values()) == list(range(n))  # distinct, all of them
    # collector 3 restarts under its id: its task, and its slot, come back
    register(c, "collector", sinks[3], worker_id=ids[3])
    assert _slots_of(c)[ids[3]] == before[ids[3]]

    # each collector's heartbeat epsilon shows in GET /workers and in `rlfleet status`
    for w in [*ids[:1], *ids[2:], new_id]:
        ok(post(c, f"/workers/{w}/heartbeat", {"status": {"env_steps": 0.0,
                                                          "epsilon": after[w][1]}}))
    shown = {w["worker_id"]: w["status"].get("epsilon") for w in get(c, "/workers")["workers"]
             if w["state"] == "alive"}
    assert shown == {w: after[w][1] for w in after}
    monkeypatch.setenv("COLUMNS", "200")
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert print_status(c.url) == 0
    text = buf.getvalue()
    assert "eps" in text
    for value in ("0.4", "0.04716", "0.005559", "0.0006554"):
        assert value in text, (value, text)


# -- the collector ----------------------------------------------------------------------------

class _Torch:
    """A torch loader that is ready at once (torch itself imports on first use)."""

    def start(self) -> None:
        pass

    def wait(self, timeout: float | None = None) -> bool:
        return True


def test_a_collector_acts_with_its_tasks_epsilon_and_reports_it(tmp_path):
    nowhere = f"http://127.0.0.1:{closed_port()}"
    service = CollectorService(nowhere, nowhere)  # never started: no registration
    try:
        cfg = load_config(APEX_CARTPOLE)
        task = CollectTask(task_id="collect-1", seed=0, apex_slot=2,
                           epsilon=apex_epsilon(2, 4))
        acting = Acting(cfg, task.seed, DirectoryStorage(tmp_path), _Torch(),
                        PolicyRefresher(service.counters), service.counters,
                        fixed_epsilon=task.epsilon, apex_slot=task.apex_slot)
        assert acting.warmup_steps == 0 and acting.policy is None  # no random warm-up
        assert acting.make_real(timeout=0)
        assert acting.policy.epsilon(0) == acting.policy.epsilon(10**7) == task.epsilon
        assert acting.epsilon(10**7) == task.epsilon
        beat = service.heartbeat_status()
        assert beat["epsilon"] == pytest.approx(task.epsilon) and beat["apex_slot"] == 2.0
        assert service.status()["epsilon"] == pytest.approx(task.epsilon)
    finally:
        service.close()
