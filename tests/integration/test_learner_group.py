"""Several learners as one data-parallel group, end to end through `rlfleet up --learners 2`:
PPO (dealt-out rollouts) solves CartPole; DQN (sharded replay batches) trains as one group
to a budget (its solve takes minutes and is `-m slow`); the group is visible in the run's
records either way. That two ranks' math equals one learner's is in tests/unit; killing and
adding learners mid-run is in tests/chaos."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .helpers import REPO, config_from


def _records(run_dir: Path, key: str) -> list[float]:
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if key in record:
            out.append(record[key])
    return out


@pytest.mark.parametrize("base,solve", [
    pytest.param("cartpole-dqn.yaml", True, marks=pytest.mark.slow),
    ("cartpole-dqn.yaml", False),
    ("cartpole-ppo.yaml", True),
])
def test_two_learners_train_one_policy(launch, tmp_path, base, solve):
    stop = {"max_wall_s": 420} if solve else {"max_env_steps": 12_000}
    # to the budget: no stop value, or a lucky early evaluation can end the run solved
    # before it, within a few thousand env steps
    config = config_from(tmp_path, base, stop=stop,
                         **({} if solve else {"eval": {"stop_value": None}}))
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "2", "--learners", "2",
                "--run-dir", str(run_dir), "--quiet")
    code = up.wait(timeout=480)
    summary = json.loads((run_dir / "summary.json").read_text())
    if solve:
        assert code == 0, f"exit code {code}:\n{up.stderr[-3000:]}"
        assert summary["solved"] is True and summary["eval_return"] >= 475
    else:  # to the budget: it ran as a group and learned (a random policy returns about 22)
        assert code == 3, f"exit code {code}:\n{up.stderr[-3000:]}"
        assert summary["env_steps"] >= 12_000 and summary["policy_version"] > 0
        assert max(_records(run_dir, "eval/deterministic/return_mean")) > 50, summary
    assert summary["learners"] == 2
    group = summary["learner_group"]  # the last status read while the run was going
    assert group["world_size"] == 2
    ranks = [r["worker_id"] for r in group["ranks"]]  # whichever asked first is rank 0
    assert sorted(ranks) == ["learner", "learner-2"]
    # lockstep ranks update together (every update is a collective over both); a rank that
    # joined last may not have reported a rate yet when a fast run (PPO) stops
    assert any(r["updates_per_s"] > 0 for r in group["ranks"]), group
    assert any(r["allreduce_ms"] > 0 for r in group["ranks"]), group
    # both learners formed the group of two, one as rank 0 (the publisher), one as rank 1
    logs = run_dir / "logs"
    formed = {name: re.findall(r"formed: rank (\d) of (\d)", (logs / f"{name}.log").read_text())
              for name in ranks}
    assert ("0", "2") in formed[ranks[0]] and ("1", "2") in formed[ranks[1]], formed
    # the group and its all-reduce time are in the run's records
    assert max(_records(run_dir, "cluster/learner_group/world_size")) == 2.0
    assert any(v > 0 for v in _records(run_dir, "timers/learner/allreduce_ms"))
    up.assert_no_orphans()


def test_a_learner_count_the_batch_cannot_split_is_refused_at_launch(launch, tmp_path):
    up = launch("--config", str(REPO / "configs" / "cartpole-dqn.yaml"), "--learners", "3",
                "--run-dir", str(tmp_path / "run"), "--quiet")
    code = up.wait(timeout=60)
    assert code == 2, up.stderr
    assert "learner.count" in up.stderr and "not divisible by the 3 learners" in up.stderr
