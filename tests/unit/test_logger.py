"""The run logger against real files: its JSONL, TensorBoard's own event reader, and an
offline W&B run; a broken or absent wandb package must cost only the W&B writer."""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlfleet.learner.observe.histograms import histogram
from rlfleet.shared.contract.config import LoggingConfig, ScopeConfig, WandbConfig
from rlfleet.shared.telemetry.logger import RunLogger

from .helpers import wait_for

SCOPE_LOGGER = "rlfleet.logger"


def make_cfg(tensorboard: bool = False, wandb: WandbConfig | None = None,
             **scopes: ScopeConfig) -> LoggingConfig:
    return LoggingConfig(scopes=scopes, tensorboard=tensorboard, wandb=wandb or WandbConfig())


def read_jsonl(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def steps_of(records: list[dict], scope: str) -> list[int]:
    return [r["step"] for r in records if r["scope"] == scope]


def tb_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == SCOPE_LOGGER and r.levelno == logging.WARNING and text in r.getMessage()]


# -- intervals ----------------------------------------------------------------------------------


def test_each_scope_honours_its_own_interval(tmp_path: Path) -> None:
    cfg = make_cfg(train=ScopeConfig(every_env_steps=10), collect=ScopeConfig(every_env_steps=25),
                   eval=ScopeConfig(every_env_steps=0), info=ScopeConfig(every_env_steps=100))
    written: dict[str, list[int]] = {}
    with RunLogger(tmp_path, cfg, "intervals") as logger:
        for step in range(0, 200, 3):
            for scope in ("train", "collect", "eval", "update", "info"):
                if logger.log(scope, step, {f"{scope}/x": step}):
                    written.setdefault(scope, []).append(step)
    everything = list(range(0, 200, 3))
    expected = {"train": list(range(0, 200, 12)),    # first step at least 10 after the last
                "collect": list(range(0, 200, 27)),
                "eval": everything,                 # interval 0: every call
                "update": everything,               # not configured: ScopeConfig() defaults
                "info": [0, 102]}
    assert written == expected
    records = read_jsonl(tmp_path)
    assert {scope: steps_of(records, scope) for scope in expected} == expected


def test_scopes_are_independent_and_force_and_order(tmp_path: Path) -> None:
    cfg = make_cfg(train=ScopeConfig(every_env_steps=10), eval=ScopeConfig(every_env_steps=10))
    with RunLogger(tmp_path, cfg, "force") as logger:
        assert logger.log("train", 0, {"train/a": 1})
        assert logger.log("eval", 4, {"eval/a": 1})        # train's last step is irrelevant
        assert not logger.log("train", 5, {"train/a": 2})
        assert logger.log("train", 5, {"train/a": 3}, force=True)
        assert not logger.log("train", 5, {"train/a": 4}, force=True)   # not increasing
        assert not logger.log("train", 3, {"train/a": 5}, force=True)   # going back
        assert not logger.log("train", 14, {"train/a": 6})              # 14 - 5 < 10
        assert logger.log("train", 15, {"train/a": 7})
        assert not logger.log("eval", 13, {"eval/a": 2})
        assert logger.log("eval", 14, {"eval/a": 3})
        assert logger.last_step("train") == 15
    records = read_jsonl(tmp_path)
    assert [(r["scope"], r["step"]) for r in records] == [
        ("train", 0), ("eval", 4), ("train", 5), ("train", 15), ("eval", 14)]
    assert [r.get("train/a") for r in records if r["scope"] == "train"] == [1.0, 3.0, 7.0]


def test_unknown_scope_is_an_error_naming_it(tmp_path: Path) -> None:
    with RunLogger(tmp_path, make_cfg(), "scopes") as logger, \
            pytest.raises(ValueError, match="'trian'"):
        logger.log("trian", 0, {"train/loss": 1.0})


# -- JSONL and values ----------------------------------------------------------------------------


def test_jsonl_format_and_each_line_flushed_when_written(tmp_path: Path) -> None:
    logger = RunLogger(tmp_path, make_cfg(), "jsonl")
    before = time.time()
    logger.log("train", 7, {"train/loss": 0.5, "counters/env_steps": 7})
    logger.log("eval", 7, {"eval/deterministic/return_mean": 21})
    # still open: what a SIGKILL would leave behind
    text = (tmp_path / "metrics.jsonl").read_text()
    logger.close()
    logger.close()  # idempotent
    lines = text.split("\n")
    assert lines[-1] == "" and len(lines) == 3
    first, second = (json.loads(line) for line in lines[:2])
    assert list(first)[:3] == ["scope", "step", "wall_time"]
    assert first == {"scope": "train", "step": 7, "wall_time": first["wall_time"],
                     "train/loss": 0.5, "counters/env_steps": 7.0}
    assert isinstance(first["step"], int) and isinstance(first["counters/env_steps"], float)
    assert isinstance(first["wall_time"], float)
    assert before <= first["wall_time"] <= second["wall_time"] <= time.time()
    assert second == {"scope": "eval", "step": 7, "wall_time": second["wall_time"],
                      "eval/deterministic/return_mean": 21.0}
    assert not logger.log("train", 100, {"train/loss": 1.0})   # closed: nothing is written


def test_numbers_of_every_kind_become_floats(tmp_path: Path) -> None:
    values = {"train/bool": True, "train/int": 3, "train/float": 0.25,
              "train/np_f32": np.float32(1.5), "train/np_i64": np.int64(-4),
              "train/np_bool": np.bool_(False), "train/np_0d": np.array(2.5),
              "train/torch_0d": torch.tensor(6.0), "train/torch_int": torch.tensor(7)}
    with RunLogger(tmp_path, make_cfg(), "numbers") as logger:
        logger.log("train", 0, values)
    (record,) = read_jsonl(tmp_path)
    assert {k: v for k, v in record.items() if k.startswith("train/")} == {
        "train/bool": 1.0, "train/int": 3.0, "train/float": 0.25, "train/np_f32": 1.5,
        "train/np_i64": -4.0, "train/np_bool": 0.0, "train/np_0d": 2.5, "train/torch_0d": 6.0,
        "train/torch_int": 7.0}


def test_arrays_are_dropped_or_reduced_per_scope(tmp_path: Path) -> None:
    cfg = make_cfg(train=ScopeConfig(arrays="drop"), collect=ScopeConfig(arrays="minmeanmax"))
    arrays = {"list": [1, 2, 6], "tuple": (4.0, 2.0), "np": np.array([[1.0, 3.0], [5.0, 7.0]]),
              "torch": torch.tensor([2.0, 4.0]), "one": [9.0], "empty": np.array([])}
    with RunLogger(tmp_path, cfg, "arrays") as logger:
        logger.log("train", 0, {"train/kept": 1.0, **{f"train/{k}": v for k, v in arrays.items()}})
        logger.log("collect", 0, {f"collect/{k}": v for k, v in arrays.items()})
    train, collect = read_jsonl(tmp_path)
    assert set(train) == {"scope", "step", "wall_time", "train/kept"}
    reduced = {k: v for k, v in collect.items() if k.startswith("collect/")}
    assert reduced == {
        "collect/list_min": 1.0, "collect/list_mean": 3.0, "collect/list_max": 6.0,
        "collect/tuple_min": 2.0, "collect/tuple_mean": 3.0, "collect/tuple_max": 4.0,
        "collect/np_min": 1.0, "collect/np_mean": 4.0, "collect/np_max": 7.0,
        "collect/torch_min": 2.0, "collect/torch_mean": 3.0, "collect/torch_max": 4.0,
        # a 1-element array is still an array: a key's name never depends on a count
        "collect/one_min": 9.0, "collect/one_mean": 9.0, "collect/one_max": 9.0}


def test_non_numeric_and_non_finite_values_are_dropped_with_one_warning_per_key(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=SCOPE_LOGGER)
    bad = {"train/name": "dqn", "train/none": None, "train/dict": {"a": 1},
           "train/object": object(), "train/words": ["a", "b"], "train/nan": float("nan"),
           "train/inf": np.float32("inf"), "train/torch_nan": torch.tensor(math.nan)}
    with RunLogger(tmp_path, make_cfg(train=ScopeConfig()), "bad") as logger:
        for step in range(3):
            assert logger.log("train", step, {"train/loss": step, **bad})
        logger.log("eval", 0, {"train/name": "again, from another scope", "eval/x": 1})
    assert [r["train/loss"] for r in read_jsonl(tmp_path) if r["scope"] == "train"] == [0, 1, 2]
    assert all(set(r) <= {"scope", "step", "wall_time", "train/loss", "eval/x"}
               for r in read_jsonl(tmp_path))
    for key in bad:
        assert len(warnings_about(caplog, repr(key))) == 1, key
    assert len(warnings_about(caplog, "")) == len(bad)


# -- TensorBoard --------------------------------------------------------------------------------


def test_tensorboard_event_files_hold_the_logged_values_and_steps(tmp_path: Path) -> None:
    cfg = make_cfg(tensorboard=True, train=ScopeConfig(every_env_steps=100))
    with RunLogger(tmp_path, cfg, "tb") as logger:
        for step in range(0, 500, 50):
            logger.log("train", step, {"train/loss": step / 1000, "timers/learner/update_ms": 3})
        logger.log("eval", 250, {"eval/deterministic/return_mean": 42.5})
    loss = tb_scalars(tmp_path, "train/loss")
    assert [s for s, _ in loss] == [0, 100, 200, 300, 400]
    assert [v for _, v in loss] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    assert tb_scalars(tmp_path, "eval/deterministic/return_mean") == [(250, 42.5)]
    assert [s for s, _ in tb_scalars(tmp_path, "timers/learner/update_ms")] == [
        0, 100, 200, 300, 400]


# -- resume -------------------------------------------------------------------------------------


def _next_second() -> None:
    """TensorBoard reads event files in name order, and a name starts with the unix second:
    a resumed writer must not share the crashed one's second (as real restarts never do)."""
    now = int(time.time())
    while int(time.time()) == now:
        time.sleep(0.02)


def test_resume_keeps_records_up_to_the_snapshot_and_purges_tensorboard(tmp_path: Path) -> None:
    cfg = make_cfg(tensorboard=True, train=ScopeConfig(every_env_steps=10),
                   eval=ScopeConfig(every_env_steps=0))
    with RunLogger(tmp_path, cfg, "resume") as logger:
        for step in range(0, 101, 10):
            logger.log("train", step, {"train/loss": 1.0})
            if step % 20 == 0:
                logger.log("eval", step, {"eval/deterministic/return_mean": 1.0})
    with (tmp_path / "metrics.jsonl").open("a") as f:   # a SIGKILL in the middle of a line
        f.write('{"scope": "train", "step": 110, "wall_ti')
    _next_second()

    with RunLogger(tmp_path, cfg, "resume", resume_step=55) as logger:
        assert logger.last_step("train") == 50 and logger.last_step("eval") == 40
        assert read_jsonl(tmp_path)[-1]["step"] <= 55   # rewritten before anything new
        assert not logger.log("train", 55, {"train/loss": 2.0})   # 55 - 50 < 10
        for step in range(60, 91, 10):
            assert logger.log("train", step, {"train/loss": 2.0})
        assert not logger.log("eval", 40, {"eval/deterministic/return_mean": 2.0})
        assert logger.log("eval", 41, {"eval/deterministic/return_mean": 2.0})
    records = read_jsonl(tmp_path)
    assert steps_of(records, "train") == list(range(0, 91, 10))
    assert steps_of(records, "eval") == [0, 20, 40, 41]
    assert [r["train/loss"] for r in records if r["scope"] == "train"] == [1.0] * 6 + [2.0] * 4

    loss = tb_scalars(tmp_path, "train/loss")
    assert [s for s, _ in loss] == list(range(0, 91, 10))   # no step twice: 60..100 purged
    assert [v for _, v in loss] == [1.0] * 6 + [2.0] * 4
    assert [s for s, _ in tb_scalars(tmp_path, "eval/deterministic/return_mean")] == [
        0, 20, 40, 41]
    assert not (tmp_path / "metrics.jsonl.tmp").exists()


def test_without_resume_a_run_starts_fresh(tmp_path: Path) -> None:
    cfg = make_cfg(tensorboard=True)
    with RunLogger(tmp_path, cfg, "fresh") as logger:
        logger.log("train", 500, {"train/loss": 1.0})
    with RunLogger(tmp_path, cfg, "fresh") as logger:
        assert logger.log("train", 10, {"train/loss": 2.0})
    assert [(r["step"], r["train/loss"]) for r in read_jsonl(tmp_path)] == [(10, 2.0)]
    assert tb_scalars(tmp_path, "train/loss") == [(10, 2.0)]


# -- Weights & Biases -----------------------------------------------------------------------------


def test_wandb_offline_writes_its_run_under_the_run_dir(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    cfg = make_cfg(wandb=WandbConfig(enabled=True, mode="offline"))
    with RunLogger(tmp_path, cfg, "wandb run/1", config={"algo": {"lr": 1e-3}}) as logger:
        for step in range(5):
            logger.log("train", step * 1000, {"train/loss": 777000 + step})
        logger.log("eval", 2000, {"eval/deterministic/return_mean": 424242})  # an older step
        logger.histograms(4000, {"actions": histogram([0, 1, 1, 1], bins=2)})
        assert logger._writers[-1]._run is not None  # the histogram did not turn W&B off
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    # wandb-core, a process of its own, writes the records, and may have written only the
    # file's header when finish() returns: wait for it, bounded.
    def records() -> bytes | None:
        data = next(run.glob("*.wandb")).read_bytes()
        return data if b"777004" in data and b"424242" in data else None

    data = wait_for(records, timeout_s=20, interval_s=0.2, what="the offline run's records")
    assert b"777004" in data and b"424242" in data
    run_id = (tmp_path / "wandb-run-id").read_text().strip()
    assert run_id.startswith("wandb-run-1-") and run.name.endswith(run_id)
    assert len(read_jsonl(tmp_path)) == 6


BROKEN_INIT = """
class Settings:
    def __init__(self, **kwargs):
        pass

def init(**kwargs):
    raise RuntimeError("wandb is broken")
"""

BROKEN_LOG = BROKEN_INIT.replace('raise RuntimeError("wandb is broken")', "return Run()") + """
class Run:
    def define_metric(self, *args, **kwargs):
        pass

    def log(self, data):
        raise RuntimeError("wandb is broken")

    def finish(self, exit_code=0):
        pass
"""


def _log_a_few(tmp_path: Path) -> None:
    cfg = make_cfg(wandb=WandbConfig(enabled=True, mode="offline"))
    with RunLogger(tmp_path, cfg, "broken") as logger:
        for step in range(3):
            assert logger.log("train", step, {"train/loss": float(step)})
    assert steps_of(read_jsonl(tmp_path), "train") == [0, 1, 2]


@pytest.mark.parametrize("source", [BROKEN_INIT, BROKEN_LOG], ids=["init-raises", "log-raises"])
def test_a_broken_wandb_never_fails_the_run(tmp_path: Path, source: str,
                                            monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    fake = tmp_path / "site"
    (fake / "wandb").mkdir(parents=True)
    (fake / "wandb" / "__init__.py").write_text(source)
    monkeypatch.syspath_prepend(str(fake))
    # setitem first records whether wandb was imported, so teardown removes the fake either way
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    caplog.set_level(logging.WARNING, logger=SCOPE_LOGGER)
    _log_a_few(tmp_path / "run")
    assert sys.modules["wandb"].__file__.startswith(str(fake))
    (warning,) = warnings_about(caplog, "wandb")
    assert "RuntimeError" in warning and "wandb is broken" in warning


def test_an_absent_wandb_never_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)   # `import wandb` raises ImportError
    caplog.set_level(logging.WARNING, logger=SCOPE_LOGGER)
    _log_a_few(tmp_path)
    (warning,) = warnings_about(caplog, "wandb")
    assert "cannot import wandb" in warning and "ModuleNotFoundError" in warning


def test_records_logged_while_tensorboard_opens_all_arrive_in_order(tmp_path: Path) -> None:
    """TensorBoard opens on a thread of its own (the coordinator's start does not wait for
    its import): what is logged at once is kept and written first, after the purge event."""
    cfg = make_cfg(tensorboard=True, train=ScopeConfig(every_env_steps=0))
    with RunLogger(tmp_path, cfg, "early") as logger:
        for step in range(200):
            logger.log("train", step, {"train/loss": step / 10})
    assert tb_scalars(tmp_path, "train/loss") == [(s, pytest.approx(s / 10)) for s in range(200)]
    _next_second()
    with RunLogger(tmp_path, cfg, "early", resume_step=99) as logger:
        for step in range(100, 150):
            logger.log("train", step, {"train/loss": -1.0})
    loss = tb_scalars(tmp_path, "train/loss")
    assert [s for s, _ in loss] == list(range(150))   # 100..199 of the first run purged
    assert [v for _, v in loss][100:] == [-1.0] * 50


def test_tensorboard_that_cannot_open_costs_only_tensorboard(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "tb").write_text("a file where the event directory should be")
    cfg = make_cfg(tensorboard=True, train=ScopeConfig(every_env_steps=0))
    with caplog.at_level(logging.ERROR, logger=SCOPE_LOGGER), \
            RunLogger(tmp_path, cfg, "no-tb") as logger:
        for step in range(5):
            assert logger.log("train", step, {"train/loss": 1.0})
    assert steps_of(read_jsonl(tmp_path), "train") == list(range(5))
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "TensorBoard is off" in errors[0] and "tb" in errors[0]
