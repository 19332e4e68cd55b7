"""Prometheus `/metrics` for the coordinator: HTTP traffic per endpoint and the run's state.

Every app gets a `CollectorRegistry` of its own (never the global default one), so several
apps in one process (the tests, a pytest client next to a server) do not clash over names.
HTTP metrics are kept by request hooks; the run's state is read from the coordinator's
`Readout` only when Prometheus scrapes, by a custom collector, so requests pay nothing for it.

One process serves the coordinator (see `services/serve.py`), so the
in-process registry sees every request; more worker processes would need prometheus_client's
multiprocess mode.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from flask import Flask, Response, g, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from rlfleet.coordinator.readout import Readout
from rlfleet.shared.contract.wire.base import Role
from rlfleet.shared.contract.wire.membership import WorkerResources

EXTENSION = "rlfleet.prometheus"  # app.extensions key of the app's registry
UNMATCHED = "<unmatched>"  # the endpoint label of a path no route matches (404, 405)
# From a cached GET (under a millisecond) to long polls (`/sample` and `/permits/collect`
# may wait).
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0)
# Werkzeug passes any method token through; anything else is one label value, not many.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_START = "_rlfleet_prometheus_start"  # attribute of `flask.g`


class CoordinatorCollector:
    """The run's state, read at scrape time: one `Readout.scrape()`, a few numbers copied
    under the state's lock, formatted here."""

    def __init__(self, readout: Readout) -> None:
        self.readout = readout

    def collect(self) -> Iterator[Metric]:
        s = self.readout.scrape()

        alive = GaugeMetricFamily("rlfleet_workers_alive", "Workers alive, by role.",
                                  labels=["role"])
        for role, n in s.workers_alive.items():
            alive.add_metric([role.value], n)
        yield alive
        yield from self._worker_resources(s.resources)

        size = GaugeMetricFamily("rlfleet_buffer_size", "Items held per named buffer "
                                 "(queue buffers: transitions queued).", labels=["buffer"])
        for name, n in s.buffer_sizes.items():
            size.add_metric([name], n)
        yield size
        yield GaugeMetricFamily("rlfleet_buffer_chunks",
                                "Chunks some buffer refers to.", value=s.buffer_chunks)

        yield CounterMetricFamily("rlfleet_env_steps_total",
                                  "Env steps in accepted chunks.", value=s.env_steps)
        yield CounterMetricFamily("rlfleet_train_iterations_total",
                                  "Train iterations the learner reported.",
                                  value=s.train_iterations)
        yield GaugeMetricFamily("rlfleet_policy_version",
                                "Latest policy version published (-1: none yet).",
                                value=s.policy_version)
        yield CounterMetricFamily("rlfleet_chunks_accepted_total",
                                  "Chunks accepted (duplicates are not counted).",
                                  value=s.chunks_accepted)
        yield CounterMetricFamily("rlfleet_episodes_total",
                                  "Episodes finished in accepted chunks.", value=s.episodes)
        gone = CounterMetricFamily("rlfleet_chunks_released_total",
                                   "Acknowledged chunks no buffer holds any more, by reason "
                                   "(evicted, consumed, dropped/<why>): the ledger.",
                                   labels=["reason"])
        for reason, n in sorted(s.released.items()):
            gone.add_metric([reason], n)
        yield gone
        yield CounterMetricFamily("rlfleet_chunks_orphaned_total",
                                  "Chunks written but never announced, deleted by GC.",
                                  value=s.orphans_deleted)

        latest = s.latest_evaluation
        if latest is not None:  # absent, not 0, before the first evaluation
            ev = GaugeMetricFamily("rlfleet_eval_return_mean",
                                   "Mean return of the latest evaluation, by mode.",
                                   labels=["mode"])
            for mode in ("deterministic", "stochastic"):
                summary = getattr(latest, mode)
                if summary is not None:
                    ev.add_metric([mode], summary.return_mean)
            yield ev
            summaries = {mode: getattr(latest, mode) for mode in ("deterministic", "stochastic")}
            rates = {mode: summary.success_rate for mode, summary in summaries.items()
                     if summary is not None and summary.success_rate is not None}
            if rates:  # goal-conditioned envs only: absent, not 0, for the others
                success = GaugeMetricFamily("rlfleet_eval_success_rate",
                                            "Share of the latest evaluation's episodes that "
                                            "reached their goal, by mode.", labels=["mode"])
                for mode, rate in rates.items():
                    success.add_metric([mode], rate)
                yield success

        yield from self._learner_group(s.learner_group)
        yield GaugeMetricFamily("rlfleet_run_solved",
                                "1 once an evaluation reached the stop value.",
                                value=int(s.solved))
        yield GaugeMetricFamily("rlfleet_run_stopped", "1 once the run is stopping.",
                                value=int(s.stopped))

    @staticmethod
    def _worker_resources(workers: list[tuple[str, Role, WorkerResources]]
                          ) -> Iterator[Metric]:
        """What each alive worker reported having when it registered (none: it reported
        nothing)."""
        worker = ["worker_id", "role", "hostname"]
        cores = GaugeMetricFamily("rlfleet_worker_cpu_cores", "CPU cores a worker may run "
                                  "on (its CPU affinity).", labels=worker)
        memory = GaugeMetricFamily("rlfleet_worker_memory_bytes", "Total memory of a "
                                   "worker's machine.", labels=worker)
        gpus = GaugeMetricFamily("rlfleet_worker_gpus", "GPUs a worker can use.",
                                 labels=worker)
        gpu_memory = GaugeMetricFamily("rlfleet_worker_gpu_memory_bytes", "Total memory of "
                                       "each GPU a worker can use.",
                                       labels=[*worker, "gpu", "name"])
        for worker_id, role, res in workers:
            labels = [worker_id, role.value, res.hostname]
            cores.add_metric(labels, res.cpu_cores)
            memory.add_metric(labels, res.memory_bytes)
            gpus.add_metric(labels, len(res.gpus))
            for gpu in res.gpus:
                gpu_memory.add_metric([*labels, str(gpu.index), gpu.name], gpu.memory_bytes)
        yield from (cores, memory, gpus, gpu_memory)

    @staticmethod
    def _learner_group(group: dict[str, Any]) -> Iterator[Metric]:
        yield GaugeMetricFamily("rlfleet_learner_group_generation",
                                "Generation of the learner group (one per re-formation).",
                                value=group["generation"])
        yield GaugeMetricFamily("rlfleet_learner_group_world_size",
                                "Learners training as one data-parallel group.",
                                value=group["world_size"])
        reforms = CounterMetricFamily("rlfleet_learner_group_reformations_total",
                                      "Re-formations of the learner group, by reason.",
                                      labels=["reason"])
        for reason, n in sorted(group["reformations_by_reason"].items()):
            reforms.add_metric([reason], n)
        yield reforms
        rate = GaugeMetricFamily("rlfleet_learner_updates_per_second",
                                 "Train iterations per second, by rank of the learner group.",
                                 labels=["rank", "worker_id"])
        allreduce = GaugeMetricFamily("rlfleet_learner_allreduce_ms",
                                      "Milliseconds per train iteration in all-reduces, by "
                                      "rank.", labels=["rank", "worker_id"])
        for r in group["ranks"]:
            labels = [str(r["rank"]), r["worker_id"]]
            rate.add_metric(labels, r["updates_per_s"])
            allreduce.add_metric(labels, r["allreduce_ms"])
        yield rate
        yield allreduce


def _instrument_requests(app: Flask, registry: CollectorRegistry) -> None:
    """Count and time every request by its URL rule template, never its raw path, so the
    number of series stays bounded whatever ids clients send."""
    requests_total = Counter(
        "rlfleet_http_requests_total", "HTTP requests answered.",
        ["method", "endpoint", "status"], registry=registry)
    duration = Histogram(
        "rlfleet_http_request_duration_seconds", "Time to build the response.",
        ["method", "endpoint"], buckets=LATENCY_BUCKETS, registry=registry)

    @app.before_request
    def _start() -> None:
        setattr(g, _START, time.perf_counter())

    @app.after_request
    def _record(response: Response) -> Response:
        # Runs on error handlers' answers too (404s from routing, 400s from validation).
        start = getattr(g, _START, None)
        rule = request.url_rule
        endpoint = rule.rule if rule is not None else UNMATCHED
        method = request.method if request.method in _METHODS else "other"
        requests_total.labels(method, endpoint, str(response.status_code)).inc()
        if start is not None:
            duration.labels(method, endpoint).observe(time.perf_counter() - start)
        return response


def install_metrics(app: Flask, readout: Readout) -> CollectorRegistry:
    """Instrument `app`, register the run-state collector and serve `GET /metrics` at the
    root (where Prometheus looks by default). Returns the app's registry, which is also kept
    in `app.extensions["rlfleet.prometheus"]`."""
    registry = CollectorRegistry()
    _instrument_requests(app, registry)
    registry.register(CoordinatorCollector(readout))

    def metrics() -> Response:
        return Response(generate_latest(registry), mimetype=None,
                        content_type=CONTENT_TYPE_LATEST)

    app.add_url_rule("/metrics", "metrics", metrics, methods=["GET"])
    app.extensions[EXTENSION] = registry
    return registry
