"""Ape-X exploration and a bf16 learner end to end, in one run (CI's minutes are few): `rlfleet
up` with `configs/cartpole-dqn-apex.yaml`, 4 collectors and `learner.precision=bf16` solves
CartPole on the CPU, each collector acting with its own slot's fixed epsilon,
`0.4 ** (1 + 7 i / 3)` for slots i = 0..3, shown in each collector's heartbeat status; what the
bf16 learner leaves (published versions, checkpoints) is fp32 that an fp32 learner loads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

from rlfleet.learner.output.checkpoints import CheckpointStore
from rlfleet.shared.algos.dqn import DQN
from rlfleet.shared.contract.codec import decode_weights
from rlfleet.shared.contract.config import apex_epsilon
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.envs.make import run_spec
from rlfleet.shared.infra.storage import open_storage
from rlfleet.shared.run.config import load_config

from .helpers import config_from, free_port, wait_for

SLOTS = 4
EPSILONS = sorted(apex_epsilon(i, SLOTS, 0.4, 7.0) for i in range(SLOTS))


def _collector_epsilons(url: str) -> dict[str, float]:
    workers = requests.get(f"{url}{API}/workers", timeout=5).json()["workers"]
    return {w["worker_id"]: w["status"]["epsilon"] for w in workers
            if w["role"] == "collector" and "epsilon" in w["status"]}


def test_cartpole_dqn_with_ape_x_epsilons_and_a_bf16_learner_solves_on_4_collectors(
        launch, tmp_path):
    config = config_from(tmp_path, "cartpole-dqn-apex.yaml", stop={"max_wall_s": 240})
    run_dir = tmp_path / "run"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    up = launch("--config", str(config), "--collectors", str(SLOTS), "--run-dir",
                str(run_dir), "--port", str(port), "--quiet", "learner.precision=bf16")

    # While it runs: every collector's heartbeat carries its epsilon, the 4 of the formula.
    def four() -> dict[str, float] | None:
        assert up.proc.poll() is None, f"rlfleet up ended early:\n{up.stderr[-3000:]}"
        seen = _collector_epsilons(url)
        return seen if len(seen) == SLOTS else None

    shown = wait_for(four, 120, "4 collectors' epsilons in GET /workers")
    assert sorted(shown.values()) == pytest.approx(EPSILONS, rel=1e-9), shown

    code = up.wait(timeout=300)
    assert code == 0, f"exit code {code}:\n{up.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["solved"] is True and summary["eval_return"] >= 475
    assert summary["collectors"] == SLOTS

    # Each collector acted with the epsilon of the slot its task brought, all 4 distinct.
    acted = {}
    for log in sorted((run_dir / "logs").glob("collector-*.log")):
        lines = [ln for ln in log.read_text().splitlines() if "acting with the fixed epsilon" in ln]
        assert len(lines) == 1, (log.name, lines)  # set once: it never changed
        slot = int(lines[0].split("Ape-X slot ")[1].split(":")[0])
        acted[slot] = float(lines[0].rsplit(" ", 1)[1])
    assert sorted(acted) == list(range(SLOTS)), acted
    for slot, eps in acted.items():
        assert eps == pytest.approx(apex_epsilon(slot, SLOTS, 0.4, 7.0), rel=1e-5)
    assert_bf16_left_fp32(run_dir, summary)
    up.assert_no_orphans()


def assert_bf16_left_fp32(run_dir: Path, summary: dict) -> None:
    """The learner trained under bf16 autocast; its best policy, checkpoint and last version
    are fp32, and an fp32 DQN continued from the checkpoint acts as the last version."""
    cfg = load_config(run_dir / "config.yaml")
    assert cfg.learner.precision == "bf16"
    log = (run_dir / "logs" / "learner.log").read_text()
    assert "learning on the CPU in bf16 (autocast)" in log
    best, _ = decode_weights(Path(summary["best_policy"]).read_bytes())
    assert {t.dtype for t in best.values()} == {torch.float32}
    storage = open_storage(cfg.storage, cfg.name)
    try:
        ckpt = CheckpointStore(storage, cfg.checkpoint.prefix).latest()
        latest = storage.get_weights()
    finally:
        storage.close()
    assert ckpt is not None and latest is not None
    state, _ = ckpt
    assert all(v.dtype == torch.float32 for k, v in state.items() if k.startswith("q."))
    fp32 = DQN(cfg.algo, run_spec(cfg), seed=0)
    fp32.load_state_dict(state)
    assert fp32.precision.name == "fp32"
    published = DQN(cfg.algo, run_spec(cfg), seed=1)
    published.load_policy(latest[0], decode_weights(latest[1])[0])
    obs = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    assert np.array_equal(fp32.act_eval(obs), published.act_eval(obs))
