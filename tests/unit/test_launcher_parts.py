"""The pieces `rlfleet up` wires, without a cluster: how a run's end becomes summary.json and
the exit code (`services/local/summary.py`, built as a Slurm run's is:
`services/run_summary.py`), the crash report on the console and the stop signals
(`services/local/supervisor.py`), the progress line (`services/local/progress.py`) and the
start-up figures (`services/local/startup.py`). The whole of `up` runs in
tests/integration/test_up.py."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from rlfleet.local.children import Child, ChildFailed
from rlfleet.local.forking import ForkedChild
from rlfleet.local.plan import Plan
from rlfleet.local.progress import progress_text
from rlfleet.local.startup import Startup
from rlfleet.local.summary import Ending, closing_line, summarise, write_summary
from rlfleet.local.supervisor import RestartsExhausted, SameCrash, StopSignals, crash_report
from rlfleet.run_summary import build_summary
from rlfleet.shared.infra.crash import write_crash
from rlfleet.shared.run.config import load_config

REPO = Path(__file__).resolve().parents[2]

# summary.json's keys, in the order tools and benchmarks have read them.
SUMMARY_KEYS = [
    "solved", "outcome", "error", "stop_reason", "eval_return", "eval_return_std",
    "eval_stochastic_return", "best_eval_return", "eval_success_rate",
    "best_eval_success_rate", "best_policy_version", "best_policy", "videos", "best_video",
    "stop_value", "env_steps", "train_iterations", "policy_version", "chunks_accepted",
    "episodes", "wall_seconds", "run_seconds", "first_chunk_seconds", "collectors", "learners",
    "learner_group", "restarts", "seed", "storage", "config", "algo", "train", "env", "crash",
    "first_chunk_s_from_launch", "startup_s", "alerts", "granted_batches",
]

STATUS = {
    "run": {"state": "stopped", "solved": True, "stop_reason": "stop_value=475 reached",
            "stop_value": 475.0, "wall_seconds": 12.5, "first_chunk_s": 1.5},
    "counters": {"env_steps": 20_480, "train_iterations": 900, "policy_version": 40,
                 "chunks_accepted": 80, "episodes": 300},
    "rates": {"env_steps_per_s": 1700.4},
    "workers": [{"role": "collector", "state": "alive"}, {"role": "collector", "state": "dead"},
                {"role": "learner", "state": "alive"}],
    "latest_evaluation": {"return_mean": 480.25, "return_std": 3.0},
    "best_evaluation": {"return_mean": 500.0, "policy_version": 38},
    "learner_group": {"world_size": 2, "generation": 3},
    "train": {"loss": 0.5},
}


def a_plan(run_dir: Path) -> Plan:
    config = load_config(REPO / "configs" / "cartpole-dqn.yaml")
    run_dir.mkdir(parents=True, exist_ok=True)
    return Plan(config=config, config_path=run_dir / "config.yaml", config_named="c.yaml",
                run_dir=run_dir, storage=str(run_dir / "storage"), collectors=2, learners=1,
                learners_given=None)


def an_exited_child(tmp_path: Path, name: str, code: int, error: Exception | None) -> Child:
    proc = ForkedChild(4321, [name])
    proc.returncode = code  # exited: nothing to wait for
    log = tmp_path / f"{name}.log"
    log.write_text("first\nlast [line]\n")
    if error is not None:
        write_crash(error, "collector", "collect", path=str(tmp_path / f"{name}.crash.json"))
    return Child(name, "collector", proc, log, 1234)


def test_a_solved_run_exits_0_and_its_summary_keeps_its_keys_and_their_order(tmp_path):
    plan = a_plan(tmp_path / "run")
    startup = Startup(first_chunk=True)
    startup.mark("config_checked")
    assert startup.first_chunk is not None
    startup.first_chunk.seconds = 2.34567
    ending = Ending.stopped(solved=True)
    assert (ending.outcome, ending.code, ending.error) == ("solved", 0, None)
    summary = summarise(STATUS, ending, 20.12345, plan, {"collector-1": 1}, startup)
    assert list(summary) == SUMMARY_KEYS
    assert summary["solved"] is True and summary["eval_return"] == 480.25
    assert summary["best_eval_return"] == 500.0 and summary["env_steps"] == 20_480
    assert summary["wall_seconds"] == 20.123 and summary["run_seconds"] == 12.5
    assert (summary["seed"], summary["algo"], summary["env"]) == (0, "dqn", "CartPole-v1")
    assert summary["config"] == "c.yaml" and summary["restarts"] == {"collector-1": 1}
    assert summary["best_policy"] is None and summary["videos"] == []
    assert summary["first_chunk_s_from_launch"] == 2.346
    assert list(summary["startup_s"]) == ["config_checked", "first_chunk"]
    assert summary["startup_s"]["first_chunk"] == 2.346

    path = write_summary(plan.run_dir, summary)
    assert path == plan.run_dir / "summary.json"
    assert list(json.loads(path.read_text())) == SUMMARY_KEYS
    assert closing_line(path, summary) == (f"summary: {path}: solved=True eval_return=480.2 "
                                           "env_steps=20480 wall_seconds=20.1")


def test_a_run_never_seen_running_still_leaves_a_summary(tmp_path):
    plan = a_plan(tmp_path / "run")
    summary = summarise(None, Ending.interrupted(), 1.0, plan, {}, Startup(first_chunk=False))
    assert (summary["outcome"], summary["error"]) == ("interrupted", "interrupted by signal")
    assert Ending.interrupted().code == 130 and Ending().code == 3
    assert summary["env_steps"] == 0 and summary["policy_version"] == -1
    assert summary["first_chunk_s_from_launch"] is None and summary["startup_s"] == {}
    assert "eval_return=- " in closing_line(tmp_path / "s.json", summary)


# A Slurm run's summary.json: the keys of `rlfleet up` it has, and its own.
SLURM_SUMMARY_KEYS = [
    "solved", "outcome", "stop_reason", "eval_return", "best_eval_return",
    "best_policy_version", "stop_value", "env_steps", "train_iterations", "policy_version",
    "chunks_accepted", "episodes", "run_seconds", "first_chunk_seconds",
    "first_chunk_s_from_submit", "solve_s_from_submit", "wall_seconds_from_submit",
    "collectors", "learners", "storage", "slurm", "train",
]


def test_a_slurm_run_is_summarised_by_the_same_builder_with_its_own_keys(tmp_path):
    from rlfleet.slurm.jobs import SUMMARY_KEYS as SLURM_KEYS

    slurm = {"first_chunk_s_from_submit": 9.5, "solve_s_from_submit": 20.5,
             "wall_seconds_from_submit": 30.0, "collectors": 3, "learners": 2,
             "storage": "redis://n1:6379/0", "slurm": {"tag": "t"}}
    summary = build_summary(SLURM_KEYS, STATUS, slurm)
    assert list(summary) == SLURM_SUMMARY_KEYS
    assert summary["outcome"] == "solved" and summary["collectors"] == 3
    local = summarise(STATUS, Ending.stopped(solved=True), 1.0, a_plan(tmp_path / "run"), {},
                      Startup(first_chunk=False))
    for key in set(SLURM_SUMMARY_KEYS) & set(SUMMARY_KEYS) - set(slurm):
        assert summary[key] == local[key], key
    # A value the launcher gives must have its key; a key must have a value.
    with pytest.raises(KeyError, match="wall_seconds"):
        build_summary(SLURM_KEYS, STATUS, {**slurm, "wall_seconds": 1.0})
    with pytest.raises(KeyError, match="slurm"):
        build_summary(SLURM_KEYS, STATUS, {k: v for k, v in slurm.items() if k != "slurm"})


def test_a_child_past_its_restarts_ends_the_run_with_its_error_and_log(tmp_path):
    child = an_exited_child(tmp_path, "collector-1", 1, ValueError("bad [obs]"))
    err = RestartsExhausted(child, 2)
    ending = Ending.crashed(err)
    assert (ending.outcome, ending.code) == ("crashed", 1)
    assert ending.error == ("collector-1 (pid 4321) exited with code 1 in collect: "
                            "ValueError: bad [obs] after 2 restarts")
    assert ending.crash is not None
    assert ending.crash["child"] == "collector-1" and ending.crash["exit_code"] == 1
    assert ending.crash["error"] == "ValueError: bad [obs]"
    # Markup in the error and the log is shown as text.
    assert crash_report(err, 2, _escape) == (
        f"[red]{_escape(ending.error)}[/] (--max-restarts 2); last lines of {child.log_path}:"
        f"\n{_escape('first')}\n{_escape('last [line]')}")
    same = SameCrash(child, 1, 3)
    assert "(--max-restarts" not in crash_report(same, 5, _escape)
    assert str(same).endswith(": the same error 3 times, giving up")


def test_a_child_that_failed_without_restarts_reports_only_its_error(tmp_path):
    killed = an_exited_child(tmp_path, "collector-2", -9, None)
    ending = Ending.crashed(RestartsExhausted(killed, 0))
    assert ending.crash is None and ending.error == "collector-2 (pid 4321) exited with code -9"
    err = ChildFailed("coordinator did not answer /health within 60.0s")
    assert Ending.crashed(err).crash is None
    assert crash_report(err, 10, _escape) == f"[red]{err}[/]"


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def test_stop_signals_only_ask_for_the_stop_until_restored():
    before = {sig: signal.getsignal(sig) for sig in StopSignals.SIGNALS}
    signals = StopSignals().install()
    try:
        assert not signals.received
        signal.raise_signal(signal.SIGHUP)
        assert signals.received
    finally:
        signals.restore()
    assert {sig: signal.getsignal(sig) for sig in StopSignals.SIGNALS} == before


def test_the_progress_line():
    line = progress_text(STATUS, 12.34)
    assert line.startswith("  12.3s  env steps    20,480     1,700/s  train it      900")
    assert "policy v40" in line and "eval  480.2" in line
    assert line.endswith("collectors 1  learners 2 (gen 3)")


def test_each_learner_gets_its_local_rank_across_restarts(tmp_path, monkeypatch):
    """`rlfleet up --learners N` on a machine with N GPUs: learner i starts with
    LOCAL_RANK=i (`learner.device: cuda` then means its own GPU), and keeps it when it is
    started again; collectors get none."""
    import rlfleet.local.supervisor as supervisor

    seen: list[tuple[str, str | None]] = []

    def fake_start(name, role, args, port, log_dir, env, **kwargs):
        seen.append((name, env.get("LOCAL_RANK")))
        return Child(name, role, None, tmp_path / f"{name}.log", port)

    monkeypatch.setattr(supervisor, "start_child", fake_start)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    cluster = supervisor.LocalCluster(tmp_path / "config.yaml", tmp_path, str(tmp_path / "s"))
    cluster.start_coordinator(wait=False, port=1)
    cluster.add_learner()
    cluster.add_learner()
    cluster.add_collector()
    cluster._launch("learner-2", "learner", [], 0)  # a restart of the second
    assert seen == [("coordinator", None), ("learner", "0"), ("learner-2", "1"),
                    ("collector-1", None),
                    ("learner-2", "1")]
