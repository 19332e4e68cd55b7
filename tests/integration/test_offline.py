"""Offline RL end to end: a DQN run saves every episode, `rlfleet export` writes Minari
datasets that `minari.load_dataset` reads, and `rlfleet up --collectors 0` learns from them
(behaviour cloning on the expert episodes, discrete CQL on the expert episodes beside every
episode the run saved) with an evaluator stepping real envs and the metric evaluator scoring
a held-out dataset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import yaml

pytest.importorskip("minari", reason="the datasets extra: pip install -e '.[datasets]'")

from .helpers import REPO  # noqa: E402


def _cli(*args: str, env: dict | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "rlfleet", *args], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, **(env or {})}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _offline_config(tmp_path, base: str, source, **eval_extra) -> str:
    data = yaml.safe_load((REPO / "configs" / base).read_text())
    for buffer in data["buffers"].values():
        buffer["path"] = str(source)
    data["eval"].update(eval_extra)
    path = tmp_path / base
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_export_then_learn_offline(launch, tmp_path):
    import minari

    run = tmp_path / "dqn"
    up = launch("--config", str(REPO / "configs" / "cartpole-dqn-saved.yaml"), "--collectors",
                "2", "--run-dir", str(run), "--quiet", "--seed", "1")
    assert up.wait(timeout=300) == 0, up.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["solved"]

    root = tmp_path / "datasets"
    out = _cli("export", str(run), "--out", str(root), "--dataset-id",
               "rlfleet/cartpole-all-v0")  # every episode the buffer saver kept
    assert out.startswith("exported") and "from saved" in out and int(out.split()[1]) > 100
    # the solved run's best policy, acting as evaluated: 40 episodes, the good ones (a barely
    # solved policy may keep few of them, and CQL below needs enough expert steps)
    out = _cli("export", str(run), "--out", str(root), "--dataset-id",
               "rlfleet/cartpole-expert-v0", "--source", "policy", "--episodes", "40",
               "--min-return", "400", "--greedy")
    n_expert = int(out.split()[1])  # "exported N episodes ..."
    # as many of the run's first episodes, acted at random (epsilon 1): half and half
    _cli("export", str(run), "--out", str(root), "--dataset-id",
         "rlfleet/cartpole-random-v0", "--max-return", "60", "--limit", str(n_expert))
    # a buffer snapshot is the other source: only episodes wholly inside one chunk
    _cli("export", str(run), "--out", str(root), "--dataset-id", "rlfleet/cartpole-snap-v0",
         "--source", "snapshot")

    os.environ["MINARI_DATASETS_PATH"] = str(root)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expert = minari.load_dataset("rlfleet/cartpole-expert-v0")
            saved = minari.load_dataset("rlfleet/cartpole-all-v0")
            assert saved.total_steps >= 0.9 * json.loads(
                (run / "summary.json").read_text())["env_steps"]
            random_eps = minari.load_dataset("rlfleet/cartpole-random-v0")
            snap = minari.load_dataset("rlfleet/cartpole-snap-v0")
            assert expert.spec.env_spec.id == "CartPole-v1"
            assert expert.total_episodes >= 10 and snap.total_episodes >= 1
            for ep in expert.iterate_episodes():
                assert ep.rewards.sum() >= 400 and len(ep.observations) == len(ep.actions) + 1
                assert ep.terminations[-1] or ep.truncations[-1]
            assert random_eps.total_episodes == expert.total_episodes == n_expert
            # CQL's data: the experts beside every episode the run saved (random to expert).
            # With the random ones alone (881 steps beside 20,000 of experts that never
            # fail) CQL stalled near 250 on some runs' data.
            minari.combine_datasets([expert, saved], "rlfleet/cartpole-mixed-v0")
    finally:
        os.environ.pop("MINARI_DATASETS_PATH", None)

    bc_dir = tmp_path / "bc"
    bc = launch("--config", _offline_config(
        tmp_path, "cartpole-bc.yaml", root / "rlfleet" / "cartpole-expert-v0",
        dataset={"path": str(root / "rlfleet" / "cartpole-random-v0"),
                 "metric": "action_accuracy", "every_train_iterations": 500}),
        "--collectors", "0", "--run-dir", str(bc_dir), "--quiet")
    assert bc.wait(timeout=300) == 0, bc.stderr[-3000:]
    summary = json.loads((bc_dir / "summary.json").read_text())
    assert summary["solved"] and summary["eval_return"] >= 450, summary
    assert summary["env_steps"] == 0  # nothing was collected
    records = [json.loads(line) for line in (bc_dir / "metrics.jsonl").read_text().splitlines()]
    scores = [r["eval/dataset/action_accuracy"] for r in records
              if "eval/dataset/action_accuracy" in r]
    assert scores and all(0.0 <= s <= 1.0 for s in scores)

    cql_dir = tmp_path / "cql"
    cql = launch("--config", _offline_config(tmp_path, "cartpole-cql.yaml",
                                             root / "rlfleet" / "cartpole-mixed-v0"),
                 "--collectors", "0", "--run-dir", str(cql_dir), "--quiet")
    assert cql.wait(timeout=300) == 0, cql.stderr[-3000:]
    summary = json.loads((cql_dir / "summary.json").read_text())
    assert summary["solved"] and summary["eval_return"] >= 400, summary


def test_a_bad_dataset_stops_the_launch_by_name(launch, tmp_path):
    bad = tmp_path / "broken" / "data"
    bad.mkdir(parents=True)
    (bad / "metadata.json").write_text("{not json")
    up = launch("--config", _offline_config(tmp_path, "cartpole-bc.yaml", bad.parent),
                "--collectors", "0", "--run-dir", str(tmp_path / "run"), "--quiet")
    assert up.wait(timeout=120) != 0
    assert "buffers.expert.path" in up.stderr and "cannot be read" in up.stderr, up.stderr
