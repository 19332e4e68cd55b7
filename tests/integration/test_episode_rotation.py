"""`logging.episodes_max_mb` through `rlfleet up`: a run's episode table rotates into
time-named parts, stays within its limit by dropping its oldest rows, and `load_run` reads
every part that is left, oldest first, then the current file."""

from __future__ import annotations

import json
from pathlib import Path

from rlfleet.shared.telemetry.rotating import MB, table_files
from rlfleet.shared.telemetry.rundata import EPISODES_NAME, load_run

from .helpers import small_config

LIMIT_MB = 0.01


def test_a_runs_episode_table_stays_within_its_limit(launch, tmp_path: Path):
    config = small_config(tmp_path / "small.yaml", logging={"episodes_max_mb": LIMIT_MB},
                          stop={"max_env_steps": 6000})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir),
                "--quiet")
    code = up.wait(timeout=150)
    assert code == 3, f"exit code {code}:\n{up.stderr[-3000:]}"  # stopped, unsolved
    summary = json.loads((run_dir / "summary.json").read_text())

    files = table_files(run_dir, EPISODES_NAME)
    parts, current = files[:-1], files[-1]
    assert current.name == EPISODES_NAME and len(parts) >= 2, files
    sizes = [p.stat().st_size for p in files]
    # within the limit, give or take the one report's rows that crossed a rotation
    assert sum(sizes) <= 1.25 * LIMIT_MB * MB, sizes
    lines = [json.loads(line) for p in files for line in p.read_text().splitlines()]
    table = load_run(run_dir).episodes
    assert len(table) == len(lines) > len(current.read_text().splitlines())
    training = table[~table["evaluation"]]
    # the oldest episodes went, the newest are kept, in the order they were written
    assert 0 < len(training) < summary["episodes"]
    assert training["env_step"].is_monotonic_increasing
    assert training["env_step"].iloc[0] > 1000  # the first chunks' episodes are gone
    up.assert_no_orphans()
