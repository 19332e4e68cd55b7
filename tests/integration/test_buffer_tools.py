"""Buffers as tools, through `rlfleet up` as a user runs it: a live run's replay buffer saved
to a file (`rlfleet buffer save`), loaded into a second run (`rlfleet buffer load`), whose
learner then trains on those rows, and the buffer cleared over HTTP
(`POST /buffers/<name>/clear`)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import requests

from rlfleet.shared.contract.codec import decode_arrays
from rlfleet.shared.contract.wire.base import API

from .helpers import REPO, coordinator_url, small_config, wait_for

# No replay ratio: collectors run free, so the first run fills its buffer in seconds.
FREE_RATIO = {"rate_limit": {"min_size": 500, "samples_per_insert": None}}
# The second run's learner may not sample before its buffer holds 2,000 items: more than
# its collectors insert before collection is paused, fewer than the file brings.
LOAD_GATE = 2000


def _status(url: str) -> dict:
    resp = requests.get(f"{url}{API}/status", timeout=5)
    resp.raise_for_status()
    return resp.json()


def _post(url: str, path: str) -> dict:
    resp = requests.post(f"{url}{API}{path}", timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlfleet", "buffer", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_save_a_live_buffer_load_it_into_another_run_and_clear_it(launch, tmp_path: Path):
    # -- the first run: fill its buffer, save it live, stop
    first_dir = tmp_path / "first"
    config = small_config(tmp_path / "first.yaml", buffers={"replay": FREE_RATIO},
                          stop={"max_env_steps": 200_000, "max_wall_s": 90})
    first = launch("--config", str(config), "--collectors", "1", "--run-dir",
                   str(first_dir), "--quiet")
    url = wait_for(lambda: coordinator_url(first), 60, "the first coordinator's URL")
    wait_for(lambda: _status(url)["buffer"]["size"] >= 3000, 60, "3,000 items in replay")
    _post(url, "/run/pause")
    saved = tmp_path / "replay.safetensors"
    done = _cli("save", str(first_dir), "--buffer", "replay", "--out", str(saved),
                "--coordinator", url)
    assert done.returncode == 0, done.stderr
    _post(url, "/run/stop")
    assert first.wait(timeout=60) in (0, 3), first.stderr[-3000:]
    arrays, meta = decode_arrays(saved.read_bytes())
    rows = int(meta["rows"])
    assert rows >= 3000 and len(arrays["obs"]) == rows and arrays["obs"].shape[1] == 4
    assert meta["env_id"] == "CartPole-v1" and meta["buffer_kind"] == "uniform"

    # -- the second run: paused at once, below the learner's gate; the file fills it
    second_dir = tmp_path / "second"
    config = small_config(tmp_path / "second.yaml",
                          buffers={"replay": {"rate_limit": {
                              "min_size": LOAD_GATE, "samples_per_insert": None}}},
                          stop={"max_env_steps": 200_000, "max_wall_s": 90})
    second = launch("--config", str(config), "--collectors", "1", "--run-dir",
                    str(second_dir), "--quiet")
    url = wait_for(lambda: coordinator_url(second), 60, "the second coordinator's URL")
    wait_for(lambda: requests.get(f"{url}/health", timeout=2).ok, 30, "its /health")
    _post(url, "/run/pause")
    # a collector finishes the chunks at hand after the pause: wait until the size has not
    # changed for 3 s
    seen: list[tuple[float, int]] = []

    def settled() -> bool:
        now, size = time.monotonic(), _status(url)["buffers"]["replay"]["size"]
        if seen and seen[-1][1] != size:
            seen.clear()
        seen.append((now, size))
        return now - seen[0][0] >= 3.0

    wait_for(settled, 30, "the paused run's buffer to stop growing")
    before = _status(url)
    assert before["buffers"]["replay"]["size"] < LOAD_GATE, before["buffers"]
    assert before["buffers"]["replay"]["sampled_items"] == 0

    done = _cli("load", str(second_dir), "--buffer", "replay", "--in", str(saved),
                "--coordinator", url)
    assert done.returncode == 0, done.stderr
    after = _status(url)
    assert after["buffers"]["replay"]["size"] == before["buffers"]["replay"]["size"] + rows
    chunks = requests.get(f"{url}{API}/buffers/replay/chunks", timeout=5).json()["chunk_ids"]
    assert sum(c.startswith("loaded-") for c in chunks) == len(arrays["_chunk_lengths"])
    assert after["counters"]["env_steps"] == before["counters"]["env_steps"]
    assert after["ledger"]["balanced"], after["ledger"]
    # collection is paused: whatever the learner samples now comes from a buffer that only
    # passed its gate through the loaded rows
    wait_for(lambda: _status(url)["counters"]["train_iterations"] > 0, 60,
             "the learner training on the loaded rows")
    assert _status(url)["buffers"]["replay"]["sampled_items"] > 0

    # a file from another env is refused, naming the mismatch, and changes nothing
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.yaml").write_text((second_dir / "config.yaml").read_text().replace(
        "CartPole-v1", "Acrobot-v1"))
    done = _cli("load", str(other), "--buffer", "replay", "--in", str(saved),
                "--coordinator", url)
    assert done.returncode == 2 and "env_id" in done.stderr, done.stderr

    # -- clear the live buffer: empty, and it stays empty while collection is paused
    size = _status(url)["buffers"]["replay"]["size"]
    cleared = _post(url, "/buffers/replay/clear")
    assert cleared["name"] == "replay" and cleared["items"] == size and cleared["chunks"] > 0
    s = _status(url)
    assert s["buffers"]["replay"]["size"] == 0 and s["ledger"]["balanced"]
    _post(url, "/run/stop")
    assert second.wait(timeout=60) in (0, 3), second.stderr[-3000:]
    second.assert_no_orphans()
