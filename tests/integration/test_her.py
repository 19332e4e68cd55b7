"""Hindsight experience replay through the cluster: DQN with HER solves bit flipping with 10
bits (`rlfleet up`, the learner's data process relabelling sampled rows), measured as the
share of episodes its best policy brings to their goal; the same DQN without HER, for as
many env steps, almost never gets there (the bench, `bench/her.py`, runs 15 bits)."""

from __future__ import annotations

import json

import numpy as np
import yaml

from rlfleet.export import load_best_policy, read_run_config
from rlfleet.shared.envs.make import make_vector_env
from rlfleet.shared.rollout.rollout import evaluate
from rlfleet.shared.run.config import parse_config
from rlfleet.shared.telemetry.rundata import load_run
from rlfleet.single_process import run_single

from .helpers import REPO

N_BITS = 10


def _config(tmp_path, her: bool) -> dict:
    data = yaml.safe_load((REPO / "configs" / "bitflip-her.yaml").read_text())
    data["env"]["kwargs"]["n_bits"] = N_BITS
    if not her:
        data["algo"]["her"] = None
    # a fixed budget, twice what HER needs here, and the best of its evaluations: stopping
    # at the first good mean return can keep a policy that falls short of full success
    data["eval"].update(every_env_steps=2000, episodes=100, stop_value=None)
    data["stop"] = {"max_env_steps": 16_000, "max_wall_s": 240}
    return data


def test_her_solves_bit_flipping_through_the_cluster_and_plain_dqn_does_not(launch, tmp_path):
    path = tmp_path / "bitflip.yaml"
    path.write_text(yaml.safe_dump(_config(tmp_path, her=True), sort_keys=False))
    run = tmp_path / "her"
    up = launch("--config", str(path), "--collectors", "1", "--run-dir", str(run), "--quiet")
    code = up.wait(timeout=300)  # 3: the budget ran out, which is how this run ends
    summary = json.loads((run / "summary.json").read_text())
    assert code == 3 and summary["error"] is None, (code, summary, up.stderr[-3000:])
    assert summary["env_steps"] >= 16_000
    steps = summary["env_steps"]

    cfg = read_run_config(run)
    policy, _ = load_best_policy(cfg, run)
    envs = make_vector_env(cfg.env, 20, seed=12345)
    returns, _, successes, *_ = evaluate(envs, policy, 200, seed=12345)
    envs.close()
    success = float(np.mean(successes))
    assert success >= 0.9, (success, np.mean(returns))
    # an episode succeeds exactly when it returns more than -n_bits
    assert successes == [r > -N_BITS for r in returns]
    # the cluster's own evaluations count success as the env reports it, episode by episode
    evaluations = json.loads((run / "evaluations.json").read_text())
    assert evaluations and all(0.0 <= e["success_rate"] <= 1.0 for e in evaluations)
    assert summary["best_eval_success_rate"] is not None
    table = load_run(run).episodes
    evals = table[table["evaluation"]]
    assert len(evals) > 0 and (evals["success"] == (evals["return"] > -N_BITS)).all()

    plain = _config(tmp_path, her=False)
    plain["eval"].update(every_env_steps=4000, stop_value=None)
    plain["stop"] = {"max_env_steps": steps}
    res = run_single(parse_config(plain))
    assert res.env_steps >= steps and res.eval_success is not None
    assert res.eval_success < 0.1, res.evaluations
    assert max(e["success"] for e in res.evaluations) < 0.1, res.evaluations
