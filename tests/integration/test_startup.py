"""How `rlfleet up` starts and what its processes hold: one process per role, never torch in
the coordinator, one torch import for the learner and the collectors (the launcher's, which
they are forked after), and the first chunk placed on the launcher's clock in summary.json
(`first_chunk_s_from_launch`, `startup_s`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .helpers import proc_cmdline, proc_ppid, role_of, small_config, wait_for

MAX_ENV_STEPS = 6_000


def maps_torch(pid: int) -> bool:
    try:
        return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def test_one_process_per_role_and_one_torch_import_where_it_acts_or_learns(launch,
                                                                             tmp_path: Path):
    config = small_config(tmp_path / "small.yaml",
                          stop={"max_env_steps": MAX_ENV_STEPS, "max_wall_s": 150})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "2", "--run-dir", str(run_dir),
                "--quiet")

    def training() -> dict[int, str] | None:
        assert up.proc.poll() is None, "rlfleet up ended before training"
        roles = {pid: role_of(pid) for pid in up.descendants()}
        roles = {pid: role for pid, role in roles.items() if role}
        learner = [p for p, r in roles.items() if r == "learner"]
        # training: every role is up and the learner has loaded torch
        if sorted(roles.values()) == ["collector", "collector", "coordinator",
                                      "learner"] and learner and maps_torch(learner[0]):
            return roles
        return None

    roles = wait_for(training, 120, "the cluster to train")
    by_role: dict[str, list[int]] = {}
    for pid, role in roles.items():
        by_role.setdefault(role, []).append(pid)
    # Every role is one process, a child of the launcher (the learner's data process, a
    # child of the learner, is no role of its own).
    for role in ("coordinator", "learner", "collector"):
        for pid in by_role[role]:
            assert proc_ppid(pid) == up.proc.pid, f"{role} {pid} is not the launcher's child"
            # In the launcher's session (Linux's autogroup scheduling shares the CPU equally
            # among sessions whatever their niceness), in a process group of its own (a
            # terminal's Ctrl-C reaches the launcher alone).
            assert os.getsid(pid) == os.getsid(up.proc.pid), f"{role} {pid}: own session"
            assert os.getpgid(pid) == pid, f"{role} {pid} shares a process group"
    [coordinator] = by_role["coordinator"]
    assert not maps_torch(coordinator), "the coordinator imported torch"
    # The launcher imported torch once, after forking the coordinator, and forked the
    # learner and the collectors from it: they begin with it loaded (a forked child is titled
    # `rlfleet <role>`, an exec'd one `python -m rlfleet <role>`).
    assert maps_torch(up.proc.pid), "the launcher left torch to each worker"
    for pid in by_role["learner"] + by_role["collector"]:
        assert proc_cmdline(pid).startswith("rlfleet "), f"{pid} was not forked"
        assert maps_torch(pid)

    code = up.wait(timeout=180)
    assert code in (0, 3), f"exit code {code}:\n{up.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    from_launch, from_coordinator = (summary["first_chunk_s_from_launch"],
                                     summary["first_chunk_seconds"])
    assert from_launch is not None and from_coordinator is not None, summary
    # The launcher starts before the coordinator, which starts before the first chunk.
    assert from_launch >= from_coordinator > 0
    assert from_launch <= summary["wall_seconds"]
    # Where start-up time went, each from the launch. (The launcher sees the coordinator
    # answer when its polling does, which on a loaded machine may be after the first chunk.)
    startup = summary["startup_s"]
    assert 0 < startup["config_checked"] < min(startup["coordinator_answered"], from_launch)
    assert startup["first_chunk"] == from_launch
    up.assert_no_orphans()
