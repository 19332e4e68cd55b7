"""What `rlfleet up` and `rlfleet resume` plan to start (`services/local/plan.py`), from their real
command lines, without starting a process: the resolved config as a `RunConfig` equal to the
file every child reads, the run directory's files, the counts, the storage's password kept
out of every file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from rlfleet.cli import build_parser
from rlfleet.commands.launch import resume_options, up_options
from rlfleet.local.plan import LAUNCH_FILE, Plan, make_plan
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.infra.storage.credentials import PASSWORD_ENV
from rlfleet.shared.run.config import load_config

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "cartpole-dqn.yaml"


def plan_of(*argv: str) -> Plan:
    args = build_parser().parse_args(argv)
    return make_plan(resume_options(args) if args.command == "resume" else up_options(args))


def write_config(path: Path, **sections: dict) -> Path:
    data = yaml.safe_load(CONFIG.read_text())
    for section, values in sections.items():
        data[section] = {**(data.get(section) or {}), **values}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_up_resolves_the_config_and_writes_it_to_the_run_directory(tmp_path: Path):
    run_dir = tmp_path / "run"
    plan = plan_of("up", "--config", str(CONFIG), "--run-dir", str(run_dir), "--seed", "7",
                   "--max-env-steps", "1234", "--max-wall-s", "56", "--collectors", "3",
                   "--port", "8123", "--collector-nice", "4", "--max-restarts", "2")
    assert plan.run_dir == run_dir.resolve() and not plan.resume
    assert plan.config_path == run_dir.resolve() / "config.yaml"
    # The plan's config is the file's: what every child reads.
    assert plan.config == load_config(plan.config_path)
    assert plan.config.seed == 7 and plan.config.name == "run"
    assert plan.config.stop.max_env_steps == 1234 and plan.config.stop.max_wall_s == 56
    assert plan.storage == plan.config.storage == str(run_dir.resolve() / "storage")
    assert plan.config_named == str(CONFIG)
    assert (plan.collectors, plan.learners, plan.learners_given) == (3, 1, None)
    assert (plan.port, plan.collector_nice, plan.max_restarts) == (8123, 4, 2)
    assert not plan.replaces_wish
    # A resume of a run killed before its summary starts again with these.
    assert json.loads((run_dir / LAUNCH_FILE).read_text()) == {"collectors": 3,
                                                              "learners": None}
    assert plan.headline() == (f"[bold]rlfleet up[/]: CartPole-v1 with 3 collectors, 1 "
                               f"learner, storage {plan.storage}, run dir {plan.run_dir}")


def test_a_learner_count_given_is_the_configs(tmp_path: Path):
    plan = plan_of("up", "--config", str(CONFIG), "--run-dir", str(tmp_path / "run"),
                   "--learners", "2")
    assert plan.config.learner.count == 2 == plan.learners == plan.learners_given
    assert "2 learners" in plan.headline()
    assert json.loads((plan.run_dir / LAUNCH_FILE).read_text())["learners"] == 2


def test_paths_the_workers_read_are_made_absolute(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path / "c.yaml", collector={"save_to": "episodes"})
    plan = plan_of("up", "--config", str(config), "--run-dir", "run")
    assert plan.config.collector.save_to == str(tmp_path / "run" / "episodes")
    assert Path(plan.config.collector.save_to).is_absolute()


def test_a_run_directory_defaults_to_one_named_after_the_run(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = plan_of("up", "--config", str(CONFIG))
    assert plan.run_dir.parent == tmp_path / "runs"
    assert plan.run_dir.name.startswith(f"{load_config(CONFIG).name}-")
    assert plan.config.name == plan.run_dir.name


def test_a_bad_config_fails_before_the_run_directory_exists(tmp_path: Path):
    config = write_config(tmp_path / "bad.yaml", eval={"episodes": 0})
    with pytest.raises(ConfigError, match=r"eval\.episodes"):
        plan_of("up", "--config", str(config), "--run-dir", str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_a_storage_password_stays_out_of_the_plan_and_its_files(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, "")  # so that the test's setting is undone after it
    plan = plan_of("up", "--config", str(CONFIG), "--run-dir", str(tmp_path / "run"),
                   "--storage", "redis://:hunter2@127.0.0.1:6379/0")
    assert "hunter2" not in plan.storage and plan.storage == plan.config.storage
    assert "hunter2" not in plan.config_path.read_text()
    # The children find it in the environment they inherit.
    assert os.environ[PASSWORD_ENV] == "hunter2"


def test_resume_continues_with_the_runs_counts_and_a_new_budget(tmp_path: Path):
    run_dir = tmp_path / "run"
    first = plan_of("up", "--config", str(CONFIG), "--run-dir", str(run_dir),
                    "--collectors", "3")
    # Killed before its summary: launch.json has the counts.
    plan = plan_of("resume", str(run_dir), "--max-wall-s", "99")
    assert plan.resume and not plan.replaces_wish
    assert (plan.collectors, plan.learners, plan.learners_given) == (3, 1, None)
    assert plan.config_path == first.config_path and plan.config_named == str(plan.config_path)
    assert plan.storage == first.storage and plan.config.seed == first.config.seed
    assert plan.config.stop.max_wall_s == 99
    assert plan.config == load_config(plan.config_path), "the new budget is written"
    assert plan.headline().startswith("[bold]rlfleet resume[/]: CartPole-v1 with 3 collectors")

    # Ended: summary.json has them; counts given replace them (and the coordinator's wish).
    (run_dir / "summary.json").write_text(json.dumps({"collectors": 4, "learners": 2}))
    assert (plan_of("resume", str(run_dir)).collectors,
            plan_of("resume", str(run_dir)).learners) == (4, 2)
    given = plan_of("resume", str(run_dir), "--collectors", "1", "--learners", "1")
    assert (given.collectors, given.learners, given.replaces_wish) == (1, 1, True)
    assert json.loads((run_dir / LAUNCH_FILE).read_text()) == {"collectors": 1, "learners": 1}


def test_resume_of_a_directory_up_did_not_make_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="is not a run directory: it has no config.yaml"):
        plan_of("resume", str(tmp_path))
