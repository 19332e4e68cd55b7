"""The batch log (`logging.batch_log`, docs/batch-log.md) through `rlfleet up` and `load_run`:

- the unique-samples table counts every sample the coordinator handed out (its counts add up
  to the run's granted batches times the batch size), with the first and last train
  iteration of each item, though its memory table holds fewer items than the run sampled;
- the per-sample values of DQN (`td_error`, `q`) and of a user's hook (`ctx.add_log`) are
  logged once per `every_train_iterations`, at most `samples_per_update` a time, each beside
  the item it belongs to; a value that is not one per row is left out, and the run goes on;
- both tables read back as DataFrames, the samples with their last logged values;
- a bad `logging.batch_log` is refused at launch, naming the field.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlfleet.shared.telemetry.rundata import BATCH_LOG_NAME, SAMPLES_NAME, load_run

from .helpers import REPO, marked_env, small_config

USERLAND = REPO / "tests" / "userland"
EVERY, PER_UPDATE, BATCH = 20, 48, 64


def test_the_batch_log_names_every_sample_and_its_values(launch, tmp_path):
    pytest.importorskip("pandas", reason="load_run's tables need the tables extra")
    config = small_config(
        tmp_path / "batch-log.yaml",
        learner={"hooks": ["my_rl:SampleLogHook"]},
        logging={"batch_log": {"every_train_iterations": EVERY, "samples_per_update": PER_UPDATE,
                               "unique_in_memory": 1024, "flush_s": 1.0}},
        stop={"max_env_steps": 6000, "max_wall_s": 90})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir),
                "--quiet", env={"PYTHONPATH": str(USERLAND)})
    code = up.wait(timeout=150)
    assert code == 3, f"exit code {code}:\n{up.stderr[-3000:]}"  # its budget ran out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (run_dir / SAMPLES_NAME).is_file() and (run_dir / BATCH_LOG_NAME).is_file()
    run = load_run(run_dir)

    samples = run.samples
    assert list(samples.columns[:6]) == ["buffer", "buffer_clears", "item_id", "times_sampled",
                                         "first_iteration", "last_iteration"]
    assert set(samples["buffer"]) == {"replay"} and set(samples["buffer_clears"]) == {0}
    assert samples["item_id"].is_unique  # rows of several flushes were added up
    # every sample handed out is counted, though the table in memory held only 1024 items
    assert int(samples["times_sampled"].sum()) == summary["granted_batches"] * BATCH
    assert len(samples) > 1024
    assert (samples["first_iteration"] <= samples["last_iteration"]).all()
    assert samples["item_id"].max() < summary["env_steps"]  # ids name inserted transitions

    logged = run.batch_log
    assert {"td_error", "q", "reward", "row"} <= set(logged.columns)
    assert "not_per_row" not in logged.columns
    iterations = sorted(set(logged["train_iteration"]))
    assert iterations and all(i % EVERY == 0 for i in iterations)
    assert iterations[-1] <= summary["train_iterations"]
    for _, update in logged.groupby("train_iteration"):
        assert len(update) == PER_UPDATE  # the first rows of a 64-row batch
        assert update["row"].tolist() == list(range(PER_UPDATE))  # values line up with items
    assert (logged["reward"] == 1.0).all()  # CartPole pays 1 a step
    assert (logged["td_error"] >= 0).all() and logged["q"].notna().all()
    assert set(logged["worker_id"]) and logged["env_step"].max() <= summary["env_steps"]
    # every logged item is in the unique-samples table, with the value last logged for it
    joined = samples.dropna(subset=["td_error"])
    assert len(joined) == logged[["buffer", "item_id"]].drop_duplicates().shape[0]
    assert (joined["times_logged"] >= 1).all() and (joined["times_sampled"] >= 1).all()
    last = logged.sort_values("train_iteration", kind="stable").groupby("item_id").last()
    some = joined.iloc[0]
    assert some["td_error"] == pytest.approx(last.loc[some["item_id"], "td_error"])
    learner_log = "".join(p.read_text() for p in (run_dir / "logs").glob("learner*.log"))
    assert "'not_per_row' is not logged" in learner_log  # the value not one per row, named
    up.assert_no_orphans()


def test_the_batch_log_is_off_by_default(launch, tmp_path):
    config = small_config(tmp_path / "plain.yaml", stop={"max_env_steps": 1500,
                                                         "max_wall_s": 60})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir),
                "--quiet")
    assert up.wait(timeout=120) == 3, up.stderr[-3000:]
    assert not (run_dir / SAMPLES_NAME).exists() and not (run_dir / BATCH_LOG_NAME).exists()
    if pytest.importorskip("pandas", reason="load_run's tables need the tables extra"):
        assert load_run(run_dir).samples.empty and load_run(run_dir).batch_log.empty


@pytest.mark.parametrize("batch_log,field", [
    ({"every_train_iterations": 0}, "logging.batch_log.every_train_iterations"),
    ({"unique_in_memory": 10}, "logging.batch_log.unique_in_memory"),
    ({"samples_per_update": "many"}, "logging.batch_log.samples_per_update"),
    ({"flush": 1}, "logging.batch_log.flush"),
])
def test_a_bad_batch_log_is_refused_at_launch(tmp_path, batch_log, field):
    config = small_config(tmp_path / "bad.yaml", logging={"batch_log": batch_log})
    done = subprocess.run([sys.executable, "-m", "rlfleet", "up", "--config", str(config),
                           "--run-dir", str(tmp_path / "run"), "--quiet"], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env=marked_env("batch-log-bad"))
    assert done.returncode == 2, done.stderr[-2000:]
    assert field in done.stderr, done.stderr[-2000:]
