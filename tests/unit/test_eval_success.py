"""Goal success in evaluations: what an env says in `info["is_success"]` at an episode's last
step, counted by the collector, validated in its report, summarised by the coordinator and
shown wherever evaluation returns are (`GET /evaluations`, `/status` metrics,
metrics.jsonl, the episode table, Prometheus). An env that says nothing has a success rate
of None, never 0.

The end-to-end test drives a real collector service's evaluation (real vector envs, a real
torch DQN) against a real coordinator process: bit flipping with 4 bits, then CartPole.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import requests
from pydantic import ValidationError

from rlfleet.collector.acting import Acting
from rlfleet.collector.evaluator import Evaluator
from rlfleet.collector.service import CollectorService
from rlfleet.shared.contract.config import EnvConfig
from rlfleet.shared.contract.wire.evaluation import EvalEpisodes, EvaluationReport, EvaluationResult
from rlfleet.shared.contract.wire.tasks import EvaluateTask
from rlfleet.shared.envs.make import make_vector_env
from rlfleet.shared.infra.storage import DirectoryStorage
from rlfleet.shared.rollout.rollout import evaluate
from rlfleet.shared.run.config import parse_config
from rlfleet.shared.telemetry.rundata import EPISODES_NAME

from .helpers import HTTP, TIMEOUT, ok, post, register, wait_for, wait_running

N_BITS = 4
EVAL = {"every_env_steps": None, "every_train_iterations": 1, "episodes": 8, "num_envs": 4,
        "stochastic": True}
BITFLIP = {"env": {"id": "rlfleet/BitFlip-v0", "kwargs": {"n_bits": N_BITS}, "num_envs": 4},
           "eval": EVAL}
CARTPOLE = {"eval": EVAL}
BOOTS = {"test_a_collector_evaluation_reports_success_where_the_env_says[bitflip]": BITFLIP,
         "test_a_collector_evaluation_reports_success_where_the_env_says[cartpole]": CARTPOLE}


@pytest.fixture(scope="module", autouse=True)
def _boot_coordinators(request, coordinator_pool):
    """Boot the coordinators the selected tests will take, side by side."""
    names = {item.name for item in request.session.items if item.module is request.module}
    coordinator_pool.prewarm(*[cfg for name, cfg in BOOTS.items() if name in names])


# -- the report's validation ------------------------------------------------------------------

def _result(**changes) -> dict:
    body = {"task_id": "evaluate-1", "worker_id": "collector-1", "policy_version": 3,
            "env_steps": 100, "train_iterations": 10, "episodes": 2, "return_mean": 1.0,
            "return_std": 0.0, "length_mean": 5.0, "wall_time": 1.0}
    return {**body, **changes}


def test_successes_are_checked_and_old_reports_still_validate():
    ep = EvalEpisodes(returns=[-4.0, 0.0, -1.0], lengths=[4, 1, 2],
                      successes=[False, True, None])
    assert ep.success_rate == 0.5  # over the episodes whose env said
    old = EvalEpisodes.model_validate({"returns": [1.0], "lengths": [1]})  # before the field
    assert old.successes is None and old.success_rate is None
    assert EvalEpisodes(returns=[1.0], lengths=[1], successes=[None]).success_rate is None
    with pytest.raises(ValidationError, match="successes has 1 entries but returns has 2"):
        EvalEpisodes(returns=[1.0, 2.0], lengths=[1, 2], successes=[True])
    for bad in (1, "yes", 0.5):  # a bool or null, nothing that reads as one
        with pytest.raises(ValidationError, match="successes.0"):
            EvalEpisodes(returns=[1.0], lengths=[1], successes=[bad])
    report = EvaluationReport.model_validate_json(json.dumps({
        "worker_id": "collector-1", "task_id": "evaluate-1", "policy_version": 0,
        "deterministic": {"returns": [0.0], "lengths": [1], "successes": [True]}}))
    assert report.deterministic.success_rate == 1.0 and report.stochastic is None


@pytest.mark.parametrize("rate", [0.0, 0.25, 1.0, None])
def test_a_result_carries_a_success_rate_between_0_and_1_or_none(rate):
    assert EvaluationResult.model_validate(_result(success_rate=rate)).success_rate == rate


@pytest.mark.parametrize("rate", [-0.01, 1.01, float("nan"), float("inf")])
def test_a_success_rate_outside_0_to_1_is_refused(rate):
    with pytest.raises(ValidationError, match="success_rate"):
        EvaluationResult.model_validate(_result(success_rate=rate))
    with pytest.raises(ValidationError, match="success_rate"):
        EvaluationResult.model_validate(_result(deterministic={
            "episodes": 1, "return_mean": 0.0, "return_std": 0.0, "return_min": 0.0,
            "return_max": 0.0, "length_mean": 1.0, "success_rate": rate}))


def test_a_result_kept_before_success_rates_restores_with_none():
    old = _result(deterministic={"episodes": 2, "return_mean": 1.0, "return_std": 0.0,
                                 "return_min": 1.0, "return_max": 1.0, "length_mean": 5.0})
    result = EvaluationResult.model_validate(old)
    assert result.success_rate is None and result.deterministic.success_rate is None


# -- the evaluation loop ----------------------------------------------------------------------

class _Perfect:
    """Flips the first bit where state and goal differ: every episode succeeds."""

    def act_eval(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        return (obs[:, N_BITS:2 * N_BITS] != obs[:, 2 * N_BITS:]).argmax(axis=1)


def test_success_is_read_from_the_final_step_not_the_next_reset():
    """Same-step autoreset puts the new episode's reset info (`is_success: False`) at the
    top of `info`; only `final_info` says how the finished episode ended."""
    envs = make_vector_env(EnvConfig(id="rlfleet/BitFlip-v0", kwargs={"n_bits": N_BITS}), 3,
                           seed=0)
    try:
        done = evaluate(envs, _Perfect(), 7, seed=0)
    finally:
        envs.close()
    assert done.successes == [True] * 7 and done.success_rate == 1.0


# -- a collector's evaluation through a real coordinator --------------------------------------

@pytest.mark.parametrize("env", ["bitflip", "cartpole"])
def test_a_collector_evaluation_reports_success_where_the_env_says(env, coordinator,
                                                                   task_sink):
    c = coordinator(**(BITFLIP if env == "bitflip" else CARTPOLE))
    cfg = parse_config(c.config)
    sink = task_sink()
    service = CollectorService(c.url, sink.url)  # its loop is not started: driven here
    evaluator = None
    try:
        service.agent._register(retries=0)
        wait_running(c, sink.wait_task("collect")["task_id"])
        learner = register(c, "learner", task_sink())
        ok(post(c, "/learn-info", {"worker_id": learner["worker_id"], "train_iterations": 1,
                                   "policy_version": 0}))
        task = EvaluateTask.model_validate(sink.wait_task("evaluate"))
        wait_running(c, task.task_id)
        storage = DirectoryStorage(c.storage_dir)
        acting = Acting(cfg, 0, storage, service.torch, service.refresher, service.counters)
        assert acting.make_real(timeout=60)
        policy = acting.policy
        policy.load_policy(0, policy.policy_state())
        evaluator = Evaluator(cfg, storage, service.agent, service.counters)
        evaluator.run(task, acting)
        assert service.status()["evaluations"] == 1
    finally:
        if evaluator is not None:
            evaluator.close()
        service.close()

    page = ok(HTTP.get(c.api("/evaluations"), timeout=TIMEOUT))
    (result,) = page["evaluations"]
    assert result["task_id"] == task.task_id and result["episodes"] == EVAL["episodes"]
    metrics = c.status()["metrics"]
    wait_for(lambda: (c.run_dir / EPISODES_NAME).is_file()
             and len(_rows(c, task.task_id)) == 2 * EVAL["episodes"], what="episode rows")
    rows = _rows(c, task.task_id)
    greedy = [r for r in rows if r["deterministic"]]
    if env == "cartpole":  # no `is_success`: nothing measured, and nothing reads as 0
        assert result["success_rate"] is None
        assert result["deterministic"]["success_rate"] is None
        assert result["stochastic"]["success_rate"] is None
        assert not [k for k in metrics if k.endswith("success_rate")]
        assert all(r["success"] is None for r in rows)
        assert "rlfleet_eval_success_rate" not in _prometheus(c)
        return
    rate = result["success_rate"]
    assert rate is not None and 0.0 <= rate <= 1.0
    assert rate == result["deterministic"]["success_rate"]
    assert 0.0 <= result["stochastic"]["success_rate"] <= 1.0
    # each episode's success, as the env said it: bit flipping's return says it too
    assert all(isinstance(r["success"], bool) for r in rows)
    assert all(r["success"] == (r["return"] > -N_BITS) for r in rows)
    assert rate == pytest.approx(np.mean([r["success"] for r in greedy]))
    assert metrics["eval/deterministic/success_rate"] == pytest.approx(rate)
    wait_for(lambda: _logged(c, "eval/deterministic/success_rate") == [rate],
             what="the success rate in metrics.jsonl")
    assert _gauge(_prometheus(c), 'rlfleet_eval_success_rate{mode="deterministic"}') == \
        pytest.approx(rate)


def _rows(c, task_id: str) -> list[dict]:
    lines = (c.run_dir / EPISODES_NAME).read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["task_id"] == task_id]


def _logged(c, key: str) -> list[float]:
    path = c.run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [r[key] for r in map(json.loads, path.read_text().splitlines()) if key in r]


def _prometheus(c) -> str:
    return requests.get(f"{c.url}/metrics", timeout=TIMEOUT).text


def _gauge(text: str, name: str) -> float | None:
    """A sample's value in Prometheus's text format."""
    return next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith(name + " ")), None)
