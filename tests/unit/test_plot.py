"""Reading a run back (`load_run`) and drawing it (`plot_run`), from runs the real logger
wrote into tmp_path."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlfleet.plot import plot_run
from rlfleet.shared.contract.config import SCOPES, LoggingConfig, ScopeConfig
from rlfleet.shared.telemetry.logger import RunLogger
from rlfleet.shared.telemetry.rundata import load_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def logger_for(run_dir: Path) -> RunLogger:
    cfg = LoggingConfig(scopes={s: ScopeConfig() for s in SCOPES}, tensorboard=False)
    return RunLogger(run_dir, cfg, run_dir.name)


def synthetic_run(run_dir: Path, evals: bool = True, timers: bool = True) -> None:
    """Returns rising towards 500 over 50k env steps, evaluations every 10k, and timers."""
    with logger_for(run_dir) as logger:
        for i in range(1, 51):
            step, ret = i * 1000, 500 * (1 - np.exp(-i / 15))
            logger.log("collect", step, {"collect/return_mean": 0.8 * ret,
                                         "collect/return_min": 0.5 * ret,
                                         "collect/return_max": ret})
            train = {"train/loss": 1 / i}
            if timers:
                train |= {"timers/learner/sample_wait_ms": 2.0, "timers/learner/update_ms": 5.0,
                          "timers/collector/env_step_ms": 3.0, "timers/collector/act_ms": 1.0}
            logger.log("train", step, train)
            if evals and i % 10 == 0:
                logger.log("eval", step, {"eval/deterministic/return_mean": ret,
                                          "eval/deterministic/return_std": 10.0,
                                          "eval/stochastic/return_mean": 0.9 * ret})


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 20_000   # a drawn figure, not an empty canvas


# -- load_run -------------------------------------------------------------------------------------


def test_load_run_round_trip(tmp_path: Path) -> None:
    with logger_for(tmp_path) as logger:
        logger.log("train", 10, {"train/loss": 1.0, "train/q": 5.0})
        logger.log("train", 20, {"train/loss": 0.5})            # no train/q: NaN there
        logger.log("eval", 15, {"eval/deterministic/return_mean": 9.0, "shared/key": 1.0})
        logger.log("info", 12, {"shared/key": 2.0})
    run = load_run(str(tmp_path))
    assert set(run.scopes) == {"train", "eval", "info"}
    train = run.scopes["train"]
    assert set(train) == {"step", "wall_time", "train/loss", "train/q"}
    np.testing.assert_array_equal(train["step"], [10, 20])
    np.testing.assert_array_equal(train["train/loss"], [1.0, 0.5])
    assert train["train/q"][0] == 5.0 and np.isnan(train["train/q"][1])
    assert all(arr.dtype == np.float64 for arr in train.values())
    assert run.keys() == ["eval/deterministic/return_mean", "shared/key", "train/loss", "train/q"]

    steps, values, walls = run.series("train/q")
    np.testing.assert_array_equal(steps, [10])
    np.testing.assert_array_equal(values, [5.0])
    assert walls[0] == train["wall_time"][0]
    steps, values, _ = run.series("shared/key")   # from two scopes, ordered by step
    np.testing.assert_array_equal(steps, [12, 15])
    np.testing.assert_array_equal(values, [2.0, 1.0])
    with pytest.raises(KeyError, match="train/typo"):
        run.series("train/typo")


def test_load_run_skips_a_truncated_last_line(tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    with logger_for(tmp_path) as logger:
        logger.log("train", 1, {"train/loss": 1.0})
        logger.log("train", 2, {"train/loss": 2.0})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"scope": "train", "step": 3, "train/lo')
    caplog.set_level(logging.WARNING, logger="rlfleet.rundata")
    run = load_run(tmp_path)
    np.testing.assert_array_equal(run.scopes["train"]["step"], [1, 2])
    assert [r.getMessage() for r in caplog.records if "truncated last line" in r.getMessage()]


def test_load_run_without_metrics_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "metrics.jsonl")):
        load_run(tmp_path)


# -- plot_run -------------------------------------------------------------------------------------


def test_plot_run_draws_curves_timers_and_the_stop_value(tmp_path: Path) -> None:
    synthetic_run(tmp_path)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"eval": {"stop_value": 475.0}}))
    result = plot_run(tmp_path)
    assert result.path == tmp_path / "curves.png"
    assert_png(result.path)
    assert result.series == [
        "eval/deterministic/return_mean", "eval/stochastic/return_mean", "collect/return_mean",
        "stop value 475",
        "timers/learner/update_ms", "timers/learner/sample_wait_ms",      # largest first
        "timers/collector/env_step_ms", "timers/collector/act_ms"]


def test_plot_run_with_only_collect_data(tmp_path: Path) -> None:
    synthetic_run(tmp_path, evals=False, timers=False)
    out = tmp_path / "figures" / "run.png"
    result = plot_run(tmp_path, out)
    assert result.path == out
    assert_png(out)
    assert result.series == ["collect/return_mean"]


def test_plot_run_with_nothing_to_plot_names_the_run(tmp_path: Path) -> None:
    with logger_for(tmp_path) as logger:
        logger.log("train", 1, {"train/loss": 1.0})
    with pytest.raises(ValueError, match=str(tmp_path)):
        plot_run(tmp_path)
    assert not (tmp_path / "curves.png").exists()
