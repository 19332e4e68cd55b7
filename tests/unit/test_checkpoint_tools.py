"""Checkpoints as tools: the mirror directory (`checkpoint.dir`), the listing of a run's
checkpoints (`rlfleet checkpoints`), a checkpoint's policy in use (`--checkpoint N`),
`checkpoint.every_train_iterations: 0` and what `rlfleet resume` says it continues from.
Real storage, real policies and a real run directory's config; no run is started."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rlfleet.checkpoints_cli import (
    checkpoint_policy,
    list_checkpoints,
    main,
    resume_point,
)
from rlfleet.learner.output.checkpoints import HOOKS_META, CheckpointStore, read_index
from rlfleet.local.plan import absolute_paths
from rlfleet.shared.algos.registry import make_policy
from rlfleet.shared.contract.codec import decode_weights, read_metadata
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.envs.make import run_spec
from rlfleet.shared.infra.storage import DirectoryStorage
from rlfleet.shared.run.config import dump_config, parse_config

from .helpers import make_config
from .test_learner_parts import checkpointing, make_training


def _store(storage, mirror: Path | None, keep_last: int = 2) -> CheckpointStore:
    return CheckpointStore(storage, "ckpt", keep_last, {"run": "r1", "algo": "dqn",
                                                        "owner": "team-a"}, mirror)


def _run_dir(tmp_path: Path, storage: str | None = None, name: str = "run",
             **checkpoint: object) -> tuple[Path, object]:
    """A run directory as `rlfleet up` leaves it: config.yaml (paths made absolute) naming
    its storage (default: its storage directory); its config."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    data = make_config(checkpoint=dict(checkpoint))
    data.update(name=name, storage=storage or str(run_dir / "storage"))
    data = absolute_paths(parse_config(data).model_dump(mode="json"), run_dir)
    (run_dir / "config.yaml").write_text(dump_config(data))
    return run_dir, parse_config(data)


# -- the mirror directory --------------------------------------------------------------------

def test_every_checkpoint_is_mirrored_as_a_file_and_pruned_with_storage(tmp_path):
    storage = DirectoryStorage(tmp_path / "storage")
    mirror = tmp_path / "files"
    store = _store(storage, mirror)
    policy = make_policy(parse_config(make_config()).algo,
                         run_spec(parse_config(make_config())), 0)
    for it, version in [(100, 4), (200, 8), (300, 12)]:
        store.save(policy.state_dict(), it, version)
    files = sorted(p.name for p in mirror.iterdir())
    assert files == ["ckpt-000000000200.safetensors", "ckpt-000000000300.safetensors"]
    for name in files:  # the same bytes as storage's copy, metadata included
        blob = (mirror / name).read_bytes()
        assert blob == storage.get_blob(name.removesuffix(".safetensors"))
    meta = read_metadata((mirror / files[-1]).read_bytes())
    assert meta["train_iterations"] == "300" and meta["policy_version"] == "12"
    assert meta["run"] == "r1" and meta["owner"] == "team-a"
    # the best is kept in both places while newer ones are pruned
    store.mark_best(9)
    store.save(policy.state_dict(), 400, 16)
    store.save(policy.state_dict(), 500, 20)
    assert sorted(p.name for p in mirror.iterdir()) == [
        "ckpt-000000000200.safetensors", "ckpt-000000000400.safetensors",
        "ckpt-000000000500.safetensors"]
    assert not list(mirror.glob(".*"))  # no temporary file left behind
    index = read_index(storage, "ckpt")
    assert [e.train_iterations for e in index.entries] == [200, 400, 500]
    assert index.best == "ckpt-000000000200"


def test_a_mirror_that_cannot_be_written_leaves_storage_s_checkpoint(tmp_path, caplog):
    storage = DirectoryStorage(tmp_path / "storage")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = _store(storage, blocker / "sub")
    store.save({"w": torch.ones(2)}, 10, 1)
    assert storage.get_blob("ckpt-000000000010") is not None
    assert "not written" in caplog.text


def test_a_relative_checkpoint_dir_is_the_run_directory_s(tmp_path):
    run_dir, cfg = _run_dir(tmp_path, dir="checkpoints")
    assert cfg.checkpoint.dir == str(run_dir / "checkpoints")
    _, cfg2 = _run_dir(tmp_path / "b", dir=str(tmp_path / "abs"))
    assert cfg2.checkpoint.dir == str(tmp_path / "abs")


# -- every_train_iterations: 0 ---------------------------------------------------------------

def test_zero_turns_periodic_checkpoints_off_but_not_the_final_one(tmp_path):
    with pytest.raises(ConfigError, match="checkpoint.every_train_iterations"):
        parse_config(make_config(checkpoint={"every_train_iterations": -1}))
    t = make_training(tmp_path, every=0)
    checkpointing(t)
    for it in (1, 10, 10_000):
        t.policy.train_iterations = it
        t.hooks.after_round()
    assert t.checkpoints.entries == []
    t.hooks.after_run()  # the end of training
    assert [e.train_iterations for e in t.checkpoints.entries] == [10_000]


# -- the listing and --checkpoint N ----------------------------------------------------------

def _saved_run(tmp_path: Path):
    run_dir, cfg = _run_dir(tmp_path, dir="ckpts", keep_last=2, metadata={"owner": "team-a"})
    storage = DirectoryStorage(cfg.storage)
    store = CheckpointStore(storage, cfg.checkpoint.prefix, cfg.checkpoint.keep_last,
                            {**cfg.checkpoint.metadata, "run": cfg.name,
                             "algo": cfg.algo.name}, cfg.checkpoint.dir)
    policies = {}
    for it, version in [(100, 3), (200, 6), (300, 9)]:
        policy = make_policy(cfg.algo, run_spec(cfg), seed=it)  # other weights each time
        policy.train_iterations = it
        # the learner's hooks' states ride along: the learner's own, not listed as metadata
        store.save(policy.state_dict(), it, version, {HOOKS_META: '{"obs_stats": {}}'})
        policies[it] = policy
        if it == 200:
            store.mark_best(7)
    return run_dir, cfg, policies


def test_the_listing_reads_each_checkpoint_s_metadata_back(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the table's width
    run_dir, cfg, _ = _saved_run(tmp_path)
    listed = list_checkpoints(run_dir)
    assert listed.iterations == [200, 300]  # 100 was pruned
    best, last = listed.checkpoints
    assert best.best and not last.best
    assert (best.policy_version, last.policy_version) == (6, 9)
    assert best.metadata == {"run": "run", "algo": "dqn", "owner": "team-a"}
    blob = DirectoryStorage(cfg.storage).get_blob(last.name)
    assert last.size_bytes == len(blob) > 0
    assert last.file == str(run_dir / "ckpts" / "ckpt-000000000300.safetensors")
    assert last.saved_at == pytest.approx(float(read_metadata(blob)["saved_at"]), abs=1e-3)
    assert HOOKS_META in read_metadata(blob)  # kept in the file, left out of the listing

    assert main(str(run_dir), as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["best"] == 200 and out["prefix"] == "ckpt"
    assert [c["train_iterations"] for c in out["checkpoints"]] == [200, 300]
    assert out["checkpoints"][0]["metadata"]["owner"] == "team-a"
    assert out["checkpoints"][1]["size_bytes"] == len(blob)

    assert main(str(run_dir), as_json=False) == 0
    table = capsys.readouterr().out
    assert "owner=team-a" in table and "yes" in table and "300" in table
    assert f"files in {run_dir / 'ckpts'}" in table


def test_a_run_without_checkpoints_lists_none_and_resumes_from_the_start(tmp_path, capsys):
    run_dir, _ = _run_dir(tmp_path)
    assert list_checkpoints(run_dir).checkpoints == []
    assert not (run_dir / "storage").exists()  # listing created no storage
    assert resume_point(run_dir) == "no checkpoint: from the start of training"
    with pytest.raises(ConfigError, match=r"--checkpoint=5: .* it has no checkpoints"):
        checkpoint_policy(parse_config(make_config()), run_dir, 5)
    with pytest.raises(ConfigError, match="not a run directory"):
        list_checkpoints(tmp_path)


def test_resume_names_the_newest_checkpoint(tmp_path):
    run_dir, _, _ = _saved_run(tmp_path)
    assert resume_point(run_dir).startswith(
        "from checkpoint ckpt-000000000300 (train iteration 300, policy version 9")


def test_checkpoint_n_acts_with_that_checkpoint_s_weights(tmp_path):
    run_dir, cfg, policies = _saved_run(tmp_path)
    policy, version = checkpoint_policy(cfg, run_dir, 200)
    assert version == 6 == policy.version
    want = policies[200].policy_state()
    for key, value in policy.policy_state().items():
        torch.testing.assert_close(value, want[key], msg=key)
    obs = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    np.testing.assert_array_equal(policy.act_eval(obs, True), policies[200].act_eval(obs, True))
    state, _ = decode_weights((run_dir / "ckpts" / "ckpt-000000000300.safetensors")
                              .read_bytes())
    assert int(state["train_iterations"]) == 300

    with pytest.raises(ConfigError) as err:
        checkpoint_policy(cfg, run_dir, 100)  # pruned
    assert "--checkpoint=100" in str(err.value)
    assert "train iterations 200, 300" in str(err.value)


def test_a_run_in_redis_is_listed_and_played_from_there(tmp_path, redis_storage, redis_url):
    run_dir, cfg = _run_dir(tmp_path, storage=redis_url, name=redis_storage.namespace)
    store = CheckpointStore(redis_storage, "ckpt", 3, {"run": cfg.name, "algo": "dqn"})
    policy = make_policy(cfg.algo, run_spec(cfg), seed=5)
    store.save(policy.state_dict(), 40, 2)
    listed = list_checkpoints(run_dir)
    assert listed.storage == redis_url and listed.iterations == [40]
    assert listed.checkpoints[0].metadata == {"run": cfg.name, "algo": "dqn"}
    assert listed.checkpoints[0].file is None
    again, version = checkpoint_policy(cfg, run_dir, 40)
    assert version == 2
    for key, value in again.policy_state().items():
        torch.testing.assert_close(value, policy.policy_state()[key], msg=key)


def test_export_checkpoint_n_goes_with_the_policy_source_only(tmp_path):
    from rlfleet.export import export_run

    run_dir, _, _ = _saved_run(tmp_path)
    with pytest.raises(ConfigError, match="--checkpoint=200 .* --source policy, not --source "
                                          "snapshot"):
        export_run(run_dir, tmp_path / "out", source="snapshot", checkpoint=200)
    with pytest.raises(ConfigError, match=r"--checkpoint=7: .* train iterations 200, 300"):
        export_run(run_dir, tmp_path / "out", checkpoint=7)
    assert not (tmp_path / "out").exists()  # refused before any work
