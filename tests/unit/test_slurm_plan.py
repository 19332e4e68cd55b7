"""The pieces of `rlfleet slurm` that need no Slurm: the plan and its refusals, the job
scripts, the keeper's arithmetic, the rendezvous file and the Slurm placement a worker
reports. The cluster itself is `tests/slurm/`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlfleet.shared.infra.resources import slurm_placement
from rlfleet.slurm import rendezvous
from rlfleet.slurm.commands import Job
from rlfleet.slurm.keeper import clean_env, reconcile
from rlfleet.slurm.plan import SlurmPlan, load_plan
from rlfleet.slurm.rendezvous import Rendezvous
from rlfleet.slurm.scripts import render
from rlfleet.status import slurm_cell

REPO_CONFIG = "configs/cartpole-dqn.yaml"


def plan(tmp_path, **kw) -> SlurmPlan:
    fields = dict(tag="rlfleet-cp-abc123", run_dir=str(tmp_path), config=str(tmp_path / "c.yaml"),
                  storage=str(tmp_path / "storage"), collectors=2, learners=1,
                  python=["/opt/venv/bin/python"])
    return SlurmPlan(**{**fields, **kw})


def submit(*args: str, cwd) -> subprocess.CompletedProcess:
    from integration.helpers import REPO

    return subprocess.run([sys.executable, "-m", "rlfleet", "slurm", "submit", "--config",
                           str(REPO / REPO_CONFIG), "--dry-run", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_each_role_script_asks_for_its_resources_and_execs_the_role(tmp_path):
    p = plan(tmp_path, learner_gpus=2, partition="cpu", learner_partition="gpu", time="1:00:00",
             signal_s=90, sbatch_args=["--qos=long"])
    learner = render(p, "learner")
    for line in ("#SBATCH --job-name=rlfleet-cp-abc123-learner", "#SBATCH --gres=gpu:2",
                 "#SBATCH --partition=gpu", "#SBATCH --time=1:00:00", "#SBATCH --requeue",
                 "#SBATCH --signal=B:USR1@90", "#SBATCH --cpus-per-task=2",
                 "#SBATCH --qos=long"):
        assert line in learner, (line, learner)
    assert learner.rstrip().endswith(f"exec /opt/venv/bin/python -m rlfleet slurm job learner "
                                     f"--run-dir {tmp_path}")
    collector = render(p, "collector")
    assert "#SBATCH --partition=cpu" in collector and "gres" not in collector
    # every #SBATCH line comes before the first command, or sbatch ignores it
    lines = collector.splitlines()
    first_command = next(i for i, ln in enumerate(lines) if ln.startswith(("exec", "export")))
    assert all(i < first_command for i, ln in enumerate(lines) if ln.startswith("#SBATCH"))
    assert "--time" not in render(p, "coordinator")  # --coordinator-time, not --time


def job(job_id: str, role: str, state: str = "RUNNING") -> Job:
    return Job(job_id, f"rlfleet-cp-abc123-{role}", state, "n1", "None")


def test_the_keeper_submits_what_is_missing_and_cancels_pending_then_newest(tmp_path):
    p = plan(tmp_path)
    queue = [job("10", "learner"), job("11", "collector"), job("12", "collector"),
             job("13", "collector", "PENDING"), job("14", "collector"),
             job("9", "collector", "FAILED")]  # left the run: counts for nothing
    actions = reconcile(p, {"learner": 1, "collector": 2}, queue, set())
    assert actions.submit == {} and actions.cancel == ["13", "14"]
    # what is being cancelled is neither counted nor cancelled again
    actions = reconcile(p, {"learner": 1, "collector": 2}, queue, {"13", "14"})
    assert actions.submit == {} and actions.cancel == []
    # a requeued (pending) learner is waited for, not replaced; two collectors are missing
    queue = [job("10", "learner", "PENDING"), job("11", "collector")]
    actions = reconcile(p, {"learner": 1, "collector": 3}, queue, set())
    assert actions.submit == {"collector": 2} and actions.cancel == []


def test_the_rendezvous_is_written_whole_and_read_back(tmp_path):
    (tmp_path / "slurm").mkdir()
    assert rendezvous.read(tmp_path) is None
    rv = Rendezvous(url="http://10.0.0.5:41234", job_id="77", node="n2", storage="/s",
                    started_at=1.0)
    rendezvous.write(tmp_path, rv)
    assert rendezvous.read(tmp_path) == rv
    assert list((tmp_path / "slurm").iterdir()) == [rendezvous.path(tmp_path)]  # no .tmp
    assert rendezvous.wait(tmp_path, 1.0) == rv
    rendezvous.write(tmp_path, rv.model_copy(update={"ended": True}))
    with pytest.raises(TimeoutError):  # an ended run's coordinator is not waited for
        rendezvous.wait(tmp_path, 0.5)


def test_a_worker_reports_its_job_and_node_and_status_shows_them():
    env = {"SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "n2", "SLURM_RESTART_COUNT": "1"}
    placed = slurm_placement(env)
    assert placed is not None and (placed.job_id, placed.node, placed.restart_count) == \
        ("4242", "n2", 1)
    assert slurm_placement({}) is None
    assert slurm_placement({"SLURM_JOB_ID": "not a job"}) is None  # logged, not fatal
    assert slurm_cell({"slurm": placed.model_dump()}) == "job 4242 on n2, requeued 1x"
    assert slurm_cell({"hostname": "h"}) == "-"


def test_a_job_submitting_jobs_hands_on_none_of_its_own_slurm_variables(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    monkeypatch.setenv("SBATCH_PARTITION", "x")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    env = clean_env()
    assert "SLURM_JOB_ID" not in env and "SLURM_CPUS_PER_TASK" not in env
    assert "SBATCH_PARTITION" not in env and env["SLURM_CONF"] == "/etc/slurm/slurm.conf"


def test_submit_writes_the_run_and_refuses_bad_options_naming_them(tmp_path):
    done = submit("--run-dir", str(tmp_path / "run"), "--collectors", "3", "--signal-s", "60",
                  cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    p = load_plan(tmp_path / "run")
    assert p.collectors == 3 and p.signal_s == 60 and p.tag.startswith("rlfleet-run-")
    assert (tmp_path / "run" / "config.yaml").is_file()
    for role in ("coordinator", "learner", "collector"):
        assert (tmp_path / "run" / "slurm" / f"{role}.sbatch").is_file()
    for args, named in ((["--time", "soon"], "--time"), (["--mem", "4Q"], "--mem"),
                        (["learner.device=cuda"], "--learner-gpus"),
                        (["algo.lr=-1"], "algo.lr")):
        done = submit("--run-dir", str(tmp_path / "bad"), *args, cwd=tmp_path)
        assert done.returncode == 2 and named in done.stderr, (args, done.stderr)
