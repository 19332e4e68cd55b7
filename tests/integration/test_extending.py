"""The learner's hooks and the logger's writers, through `rlfleet up` (docs/extending.md):

- two hooks of the user's (`my_rl`) run at their stages in priority order; one adds a metric
  to every update, which is logged like the policy's; the other only marks its stages;
- a writer of the user's and rlfleet's MLflow writer (a local SQLite tracking store) get every
  record the run's own metrics.jsonl gets;
- a hook or writer path that does not import is refused at launch, naming the field.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlfleet.shared.telemetry.rundata import JSONL_NAME, read_records

from .helpers import REPO, marked_env, small_config

USERLAND = REPO / "tests" / "userland"


def test_hooks_and_writers_see_the_whole_run(launch, tmp_path):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed (make test does)")
    from mlflow.tracking import MlflowClient

    seen, lines = tmp_path / "hook.json", tmp_path / "records.jsonl"
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = small_config(
        tmp_path / "extending.yaml",
        learner={"hooks": [
            {"path": "my_rl:CountingHook", "priority": 5, "params": {"out": str(seen)}},
            {"path": "my_rl:FirstHook", "priority": -1}]},
        logging={"writers": [
            {"path": "my_rl:JsonLinesWriter", "params": {"path": str(lines)}},
            {"path": "rlfleet.shared.telemetry.mlflow_writer:MLflowWriter",
             "params": {"tracking_uri": store, "experiment": "extending"}}],
            "histograms": {"every_train_iterations": 200, "bins": 16}},
        eval={"every_env_steps": 1500, "episodes": 2, "num_envs": 2},
        stop={"max_env_steps": 4000, "max_wall_s": 90})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir),
                "--quiet", env={"PYTHONPATH": str(USERLAND)})
    code = up.wait(timeout=150)
    assert code == 3, f"exit code {code}:\n{up.stderr[-3000:]}"  # its budget ran out
    summary = json.loads((run_dir / "summary.json").read_text())

    hook = json.loads(seen.read_text())
    assert hook["order"] == ["first.before_run", "counting.before_run", "first.after_run",
                             "counting.after_run"]
    assert hook["started_at"] == 0 and hook["rank"] == 0
    assert hook["updates"] == hook["train_iterations"] == summary["train_iterations"] > 0
    records = list(read_records(run_dir / JSONL_NAME))
    train = [r for r in records if r["scope"] == "train"]
    assert train and all(r["train/hook_batch_rows"] == 64.0 for r in train)

    # the user's writer got every record metrics.jsonl got
    written = [json.loads(line) for line in lines.read_text().splitlines()]
    assert [(w["scope"], w["step"]) for w in written] == \
        [(r["scope"], r["step"]) for r in records]
    assert {w["run"] for w in written} == {summary_name(run_dir)}
    # ... and so did MLflow
    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("extending")
    (run,) = client.search_runs([experiment.experiment_id])
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in losses) == [r["step"] for r in train]
    assert run.data.params["algo.name"] == "dqn" and run.info.status == "FINISHED"

    # logging.histograms, in TensorBoard: weights and gradients of the Q-network (not of the
    # frozen target), the batch's actions, and Q-values
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"histograms": 0}).Reload()
    tags = acc.Tags()["histograms"]
    assert {"hist/actions", "hist/q_values"} <= set(tags)
    assert any(t.startswith("hist/weights/q.") for t in tags)
    assert any(t.startswith("hist/gradients/q.") for t in tags)
    assert not any(".target" in t or "weights/target" in t for t in tags)
    actions = acc.Histograms("hist/actions")
    assert len(actions) >= 2 and actions[-1].histogram_value.num == 64  # one batch
    assert actions[-1].histogram_value.min >= 0 and actions[-1].histogram_value.max <= 1
    up.assert_no_orphans()


def summary_name(run_dir) -> str:
    import yaml

    return yaml.safe_load((run_dir / "config.yaml").read_text())["name"]


@pytest.mark.parametrize("section,field", [
    ({"learner": {"hooks": ["my_rl:NoSuchHook"]}}, "learner.hooks[0]"),
    ({"logging": {"writers": ["no_such_module:Writer"]}}, "logging.writers[0]"),
])
def test_a_hook_or_writer_that_does_not_import_is_refused_at_launch(tmp_path, section, field):
    config = small_config(tmp_path / "bad.yaml", **section)
    done = subprocess.run([sys.executable, "-m", "rlfleet", "up", "--config", str(config),
                           "--run-dir", str(tmp_path / "run"), "--quiet"], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**marked_env("extending-bad"), "PYTHONPATH": str(USERLAND)})
    assert done.returncode == 2, done.stderr[-2000:]
    assert field in done.stderr, done.stderr[-2000:]
