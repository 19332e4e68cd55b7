"""A curriculum inside one run, through `rlfleet up`: configs/corridor-curriculum.yaml's
commander moves the collectors and the evaluations from a corridor of 4 cells to 8 to 16 as
evaluations succeed, and the run ends solved when one reaches the end of the longest, with the
policy that walked it as the run's best."""

from __future__ import annotations

import json
import time

from .helpers import REPO, metric_records


def test_the_corridor_curriculum_walks_its_longest_corridor(launch, tmp_path):
    run_dir = tmp_path / "run"
    started = time.monotonic()
    up = launch("--config", str(REPO / "configs" / "corridor-curriculum.yaml"),
                "--collectors", "1", "--run-dir", str(run_dir), "--quiet")
    code = up.wait(timeout=180)
    took = time.monotonic() - started
    summary = json.loads((run_dir / "summary.json").read_text())
    assert code == 0, f"exit code {code} after {took:.0f}s: {summary}\n{up.stderr[-3000:]}"
    assert summary["solved"] is True, summary
    print(f"corridor curriculum solved in {took:.1f}s, {summary['env_steps']} env steps")

    # evaluations walked the corridors in order, each the one the commander was at
    evaluations = json.loads((run_dir / "evaluations.json").read_text())
    walked = [e["deterministic"]["info"]["corridor_length"] for e in evaluations]
    assert walked == sorted(walked) and set(walked) == {4.0, 8.0, 16.0}, walked
    # ... and the commander's figures are logged (`commander/...`, in the info scope)
    assert any(r["scope"] == "info" and "commander/length" in r
               for r in metric_records(run_dir))

    # the collector made its envs again for each new corridor, in order
    log = (run_dir / "logs" / "collector-1.log").read_text()
    assert log.index("{'length': 8}") < log.index("{'length': 16}"), log[-3000:]
    # the last evaluation walked the 16 cells in 15 steps, every episode
    last = evaluations[-1]
    assert last["success_rate"] == 1.0 and last["length_mean"] == 15.0, last
    # the run's best policy walked the longest corridor (the commander's `score`), though
    # the shorter corridors paid more per episode
    best = [e for e in evaluations if e["policy_version"] == summary["best_policy_version"]]
    assert best and best[-1]["deterministic"]["info"]["corridor_length"] == 16.0, best
    assert max(e["return_mean"] for e in evaluations) > best[-1]["return_mean"]
    up.assert_no_orphans()
