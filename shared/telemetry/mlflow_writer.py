"""MLflow as a destination of a run's records (the `mlflow` extra), named in the config as a
writer:

    logging:
      writers:
        - path: rlfleet.shared.telemetry.mlflow_writer:MLflowWriter
          params: {tracking_uri: "sqlite:///runs/mlflow.db", experiment: cartpole}

Each record's scalars become MLflow metrics at the record's env step (MLflow's metric names
allow `/`); the run's config becomes its flattened parameters, the run's name its run name.
A resumed run continues the MLflow run of the same name in the same experiment. Recent
MLflow refuses its plain file store, so a local store is a SQLite URI (or a tracking server's
URL); without `tracking_uri` MLflow's own default (`MLFLOW_TRACKING_URI`) is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

MAX_PARAMS = 100  # MLflow logs at most 100 parameters per call
PARAM_VALUE_CHARS = 6000  # and refuses longer values


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow parameters: dotted keys, string values."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = str(value)[:PARAM_VALUE_CHARS]
    return out


class MLflowWriter:
    def __init__(self, run_dir: Path, run_name: str, config: dict, resume: bool,
                 tracking_uri: str | None = None, experiment: str | None = None) -> None:
        import mlflow  # the mlflow extra: only where this writer is configured
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        name = experiment or run_name
        found = self.client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found else self.client.create_experiment(name)
        run = None
        if resume:  # the same MLflow run goes on
            runs = self.client.search_runs([experiment_id],
                                           f"attributes.run_name = '{run_name}'",
                                           max_results=1)
            run = runs[0] if runs else None
        if run is None:
            run = self.client.create_run(experiment_id, run_name=run_name,
                                         tags={"rlfleet.run_dir": str(run_dir)})
            params = flatten(config)
            items = [mlflow.entities.Param(k, v) for k, v in params.items()]
            for start in range(0, len(items), MAX_PARAMS):
                self.client.log_batch(run.info.run_id, params=items[start:start + MAX_PARAMS])
        self.run_id = run.info.run_id
        self._metric = mlflow.entities.Metric

    def write(self, scope: str, step: int, wall_time: float,
              scalars: Mapping[str, float]) -> None:
        ms = int(wall_time * 1000)
        metrics = [self._metric(key, float(value), ms, int(step))
                   for key, value in scalars.items()]
        for start in range(0, len(metrics), 1000):  # MLflow's batch limit
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def flush(self) -> None:
        pass  # every write is sent at once

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
