"""MuJoCo end to end: `configs/invertedpendulum-ppo.yaml` through `rlfleet up` (coordinator,
learner, two collectors as local processes) balances the pendulum for the whole 1000 steps.
Observations are normalised by statistics the learner merges from both collectors' counts
and publishes with the weights: the published versions carry them, and the chunks hold the
normalised observations the policy acted on."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("mujoco", reason="the mujoco extra: pip install -e '.[mujoco]'")

from rlfleet.shared.contract.codec import decode_arrays, decode_weights  # noqa: E402
from rlfleet.shared.infra.storage import DirectoryStorage  # noqa: E402

from .helpers import REPO  # noqa: E402


def test_invertedpendulum_ppo_reaches_1000_through_the_cluster(launch, tmp_path):
    run_dir = tmp_path / "run"
    up = launch("--config", str(REPO / "configs" / "invertedpendulum-ppo.yaml"),
                "--collectors", "2", "--run-dir", str(run_dir), "--quiet")
    code = up.wait(timeout=900)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert code == 0, (code, summary, up.stderr[-3000:])
    assert summary["solved"] and summary["eval_return"] >= 1000

    storage = DirectoryStorage(run_dir / "storage")
    latest = storage.get_weights()
    assert latest is not None
    weights, _ = decode_weights(latest[1])
    count = float(weights["obs_norm.count"])
    assert count >= summary["env_steps"] * 0.5  # both collectors' counts, merged
    assert (weights["obs_norm.var"] > 0).all()
    moments = 0
    for blob in storage.get_chunks(storage.list_chunks()[:20]):
        arrays, meta = decode_arrays(blob)
        obs = arrays["obs"]
        assert np.abs(obs).max() <= 10.0 + 1e-6  # clipped, normalised observations
        moments += "obs_moments" in meta
    assert moments
