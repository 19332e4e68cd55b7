"""R2D2 end to end on a partially observable env: `rlfleet up` with
`configs/cartpolenovel-r2d2.yaml` solves CartPole with its velocities hidden (evaluation >=
475), learning from a prioritized `sequence` buffer whose chunks carry the collectors'
recurrent state; the kept policy plays whole episodes with its memory reset between them, and
`rlfleet serve-policy`, whose requests are stateless, refuses it.

That DQN, which sees one observation at a time, does not solve the env over the same env
steps is `bench/pomdp.py`'s figure (its short run is in tests/integration/test_benches.py;
bench/RESULTS.md has the full one): a second run here would cost CI's minutes twice."""

from __future__ import annotations

import json

import pytest

from rlfleet.play import play_run
from rlfleet.policy_server import PolicyService
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.telemetry.rundata import load_run

from .helpers import config_from


def test_r2d2_solves_cartpole_without_velocities(launch, tmp_path):
    # It solves in 85k-150k env steps (80-170 s here); the budget leaves room for a slow seed.
    config = config_from(tmp_path, "cartpolenovel-r2d2.yaml",
                         stop={"max_env_steps": 250_000, "max_wall_s": 480})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "2", "--run-dir", str(run_dir),
                "--quiet")
    code = up.wait(timeout=540)
    assert code == 0, f"exit code {code}:\n{up.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["solved"] is True and summary["eval_return"] >= 475, summary

    run = load_run(run_dir)
    # sequences of 16 rows, prioritized: updates came back, and episode ends padded some
    for key in ("buffer/replay/sequences", "buffer/replay/padded_sequences",
                "buffer/replay/priority_updates"):
        _, values, _ = run.series(key)
        assert values[-1] > 0, key
    _, valid, _ = run.series("train/valid_fraction")
    assert 0.5 < valid[-1] <= 1.0  # rows after an episode's end are masked, most are not

    played = play_run(run_dir, episodes=3)
    assert len(played.returns) == 3 and min(played.lengths) > 100, played.returns
    # /act requests are stateless: a policy that needs an episode's memory is refused
    with pytest.raises(ConfigError, match="algo.name='r2d2': a recurrent policy"):
        PolicyService(run_dir)
    up.assert_no_orphans()
