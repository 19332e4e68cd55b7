"""Checkpoints as tools, through the command line, on one short real DQN run on CartPole:
`checkpoint.dir` mirrors every kept checkpoint as a file, `rlfleet checkpoints` lists them
with the metadata read back from each one, `--checkpoint N` plays, exports and serves that
checkpoint's policy (an unknown N is a usage error), and a resume with
`checkpoint.every_train_iterations=0` says what it continues from and saves only its final
checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.shared.contract.codec import read_metadata

from .helpers import REPO, marked_env, small_config

EVERY = 150  # train iterations between checkpoints of the first run


def _cli(*args: str) -> subprocess.CompletedProcess:
    """`rlfleet ARGS`, its tables 200 columns wide (no line is wrapped)."""
    return subprocess.run([sys.executable, "-m", "rlfleet", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=240,
                          env={**marked_env("ckpt-cli"), "COLUMNS": "200"})


def _listed(run_dir: Path) -> dict:
    done = _cli("checkpoints", str(run_dir), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_checkpoints_listed_mirrored_and_used_by_number(launch, tmp_path):
    config = small_config(
        tmp_path / "ckpt.yaml",
        checkpoint={"every_train_iterations": EVERY, "keep_last": 2, "dir": "ckpt-files",
                    "metadata": {"owner": "ckpt-test"}},
        stop={"max_env_steps": 4000, "max_wall_s": 90})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir),
                "--quiet")
    code = up.wait(timeout=180)
    assert code in (0, 3), f"exit code {code}:\n{up.stderr[-3000:]}"

    # -- the listing, with each checkpoint's metadata read back -----------------------------
    listed = _listed(run_dir)
    ckpts = listed["checkpoints"]
    iterations = [c["train_iterations"] for c in ckpts]
    assert len(ckpts) >= 2 and iterations == sorted(iterations), listed
    final = json.loads((run_dir / "summary.json").read_text())["train_iterations"]
    assert iterations[-1] == final  # the final checkpoint, at the end of training
    assert sum(c["best"] for c in ckpts) <= 1
    assert listed["best"] in (None, *iterations)
    for c in ckpts:
        assert c["metadata"] == {"run": "run", "algo": "dqn", "owner": "ckpt-test"}
        assert c["size_bytes"] > 0 and c["policy_version"] >= 0 and c["saved_at"] > 0
    # the mirror: relative to the run directory, one file per kept checkpoint, same bytes
    files = run_dir / "ckpt-files"
    assert sorted(p.name for p in files.iterdir()) == [f"{c['name']}.safetensors"
                                                       for c in ckpts]
    for c in ckpts:
        assert c["file"] == str(files / f"{c['name']}.safetensors")
        assert (files / f"{c['name']}.safetensors").read_bytes() == \
            (run_dir / "storage" / "blobs" / c["name"]).read_bytes()
        meta = read_metadata((files / f"{c['name']}.safetensors").read_bytes())
        assert meta["train_iterations"] == str(c["train_iterations"])
        assert meta["policy_version"] == str(c["policy_version"])
    table = _cli("checkpoints", str(run_dir))
    assert table.returncode == 0 and "owner=ckpt-test" in table.stdout, table.stdout

    # -- --checkpoint N ----------------------------------------------------------------------
    first = ckpts[0]
    n = first["train_iterations"]
    played = _cli("play", str(run_dir), "--episodes", "2", "--checkpoint", str(n))
    assert played.returncode == 0, played.stderr[-3000:]
    assert (f"policy version {first['policy_version']} (checkpoint at train iteration {n})"
            in played.stdout), played.stdout
    unknown = _cli("play", str(run_dir), "--checkpoint", "7")
    assert unknown.returncode == 2
    assert "--checkpoint=7" in unknown.stderr
    assert ", ".join(map(str, iterations)) in unknown.stderr, unknown.stderr

    pytest.importorskip("minari", reason="the datasets extra")
    exported = _cli("export", str(run_dir), "--out", str(tmp_path / "minari"), "--episodes",
                    "2", "--checkpoint", str(n))
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert f"checkpoint at train iteration {n}" in exported.stdout, exported.stdout
    bad = _cli("export", str(run_dir), "--out", str(tmp_path / "m2"), "--checkpoint", "7")
    assert bad.returncode == 2 and "--checkpoint=7" in bad.stderr

    from rlfleet.policy_server import PolicyService

    served = PolicyService(run_dir, checkpoint=n)
    assert served.version == first["policy_version"] and served.reload_s == 0

    # -- resume with every_train_iterations=0: only the final checkpoint is added ------------
    resumed = subprocess.run(
        [sys.executable, "-m", "rlfleet", "resume", str(run_dir), "--quiet",
         "--max-env-steps", "6000", "checkpoint.every_train_iterations=0"], cwd=REPO,
        capture_output=True, text=True, timeout=180, env=marked_env(up.marker))
    assert resumed.returncode in (0, 3), resumed.stderr[-3000:]
    assert (f"from checkpoint {ckpts[-1]['name']} (train iteration {final}, policy version "
            f"{ckpts[-1]['policy_version']}" in resumed.stdout), resumed.stdout[:2000]
    after = _listed(run_dir)["checkpoints"]
    new = [c["train_iterations"] for c in after if c["train_iterations"] > final]
    end = json.loads((run_dir / "summary.json").read_text())["train_iterations"]
    assert end - final > EVERY  # periodic checkpoints would have been saved
    assert new == [end]
    assert sorted(p.name for p in files.iterdir()) == [f"{c['name']}.safetensors"
                                                       for c in after]
