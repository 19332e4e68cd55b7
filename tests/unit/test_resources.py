"""What a worker has (`shared/infra/resources.py`), reported when it registers: the probe on
this machine, the `RLFLEET_FAKE_GPUS` hook and a CUDA that fails to answer; the coordinator
showing it (`/api/v1/workers`, `/status`, Prometheus, `rlfleet status`) and refusing a
worker without the GPU its role's `device` asks for, naming the field, the worker and its
host; and a worker so refused failing at once, its process ending with exit 1, not
registering again and again.

The coordinator is its real app built in this process (`create_app(..., start=False)`: no
scheduler or commander threads), through Flask's test client or served on loopback where a
real HTTP client must reach it."""

from __future__ import annotations

import io
import json
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from prometheus_client.parser import text_string_to_metric_families
from werkzeug.serving import make_server

from rlfleet.coordinator.app import create_app
from rlfleet.serve import InProcessServer
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.wire.base import Role
from rlfleet.shared.contract.wire.status import Status
from rlfleet.shared.contract.wire.tasks import TaskAccepted, TaskEnvelope
from rlfleet.shared.infra import resources
from rlfleet.shared.infra.auth import TOKEN_ENV, TOKEN_FILE_ENV
from rlfleet.shared.infra.crash import CRASH_FILE_ENV
from rlfleet.shared.infra.resources import (
    FAKE_GPUS_ENV,
    cuda_gpus,
    parse_fake_gpus,
    probe_resources,
)
from rlfleet.shared.run.config import parse_config
from rlfleet.shared.worker import WorkerService, create_worker_app
from rlfleet.status import print_status

from .helpers import free_port, make_config

H100 = "NVIDIA H100 80GB HBM3"
H100_BYTES = 80 * 2**30
API = "/api/v1"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No token guards the apps built here, and no fake GPUs unless a test sets them."""
    for name in (TOKEN_ENV, TOKEN_FILE_ENV, FAKE_GPUS_ENV, CRASH_FILE_ENV):
        monkeypatch.delenv(name, raising=False)


# -- the probe ----------------------------------------------------------------------------

def test_the_probe_reports_this_machine():
    res = probe_resources()
    assert res.hostname == socket.gethostname()
    assert res.cpu_cores == len(os.sched_getaffinity(0)) >= 1
    meminfo = Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0]
    assert res.memory_bytes == int(meminfo) * 1024 > 0
    if not resources.gpu_driver_present():  # the CI machines: no GPU, and no torch asked
        assert res.gpus == []
        assert probe_resources(lambda: pytest.fail("CUDA asked without a driver")).gpus == []


def test_fake_gpus_replace_the_probe(monkeypatch: pytest.MonkeyPatch):
    two = f"{H100}:{H100_BYTES}, {H100}:{H100_BYTES}"
    assert [(g.index, g.name, g.memory_bytes) for g in parse_fake_gpus(two)] == \
        [(0, H100, H100_BYTES), (1, H100, H100_BYTES)]
    assert parse_fake_gpus("0") == parse_fake_gpus("") == parse_fake_gpus(" ") == []
    assert parse_fake_gpus("a:b:1024")[0].name == "a:b"  # the last colon splits
    for bad in ("H100", "H100:lots", ":1024", "H100:-1"):
        with pytest.raises(ConfigError, match=FAKE_GPUS_ENV):
            parse_fake_gpus(bad)
    monkeypatch.setenv(FAKE_GPUS_ENV, two)
    assert len(probe_resources(lambda: pytest.fail("CUDA asked despite the fakes")).gpus) == 2
    monkeypatch.setenv(FAKE_GPUS_ENV, "0")
    assert probe_resources().gpus == []


class FakeCuda:
    """`torch.cuda` as the probe asks it: `fail` makes it raise where a broken install
    would."""

    def __init__(self, names: list[str], fail: str | None = None) -> None:
        self.names, self.fail = names, fail

    def is_available(self) -> bool:
        if self.fail == "is_available":
            raise RuntimeError("CUDA driver initialization failed")
        return bool(self.names)

    def device_count(self) -> int:
        return len(self.names)

    def get_device_properties(self, device: int) -> Any:
        if self.fail == "properties":
            raise AssertionError("Torch not compiled with CUDA enabled")
        return type("Props", (), {"name": self.names[device], "total_memory": H100_BYTES})


def test_cuda_is_asked_where_a_driver_is_and_a_failure_is_no_gpus(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture):
    gpus = cuda_gpus(FakeCuda([H100, "NVIDIA A100"]))
    assert [(g.index, g.name, g.memory_bytes) for g in gpus] == \
        [(0, H100, H100_BYTES), (1, "NVIDIA A100", H100_BYTES)]
    assert cuda_gpus(FakeCuda([])) == []
    for where in ("is_available", "properties"):
        caplog.clear()
        assert cuda_gpus(FakeCuda([H100], fail=where)) == []
        assert "could not probe CUDA devices" in caplog.text
    # A driver present: the caller's torch.cuda is asked; one that cannot load is no GPUs.
    monkeypatch.setattr(resources, "GPU_DRIVER_PATHS", (str(tmp_path),))
    assert [g.name for g in probe_resources(lambda: FakeCuda([H100])).gpus] == [H100]
    assert probe_resources(lambda: None).gpus == []  # no torch

    def broken():
        raise OSError("libcudart.so: cannot open shared object file")

    caplog.clear()
    assert probe_resources(broken).gpus == []
    assert "could not load CUDA" in caplog.text


# -- the coordinator ------------------------------------------------------------------------

@contextmanager
def coordinator_app(tmp_path: Path, **overrides: dict) -> Iterator[Flask]:
    app = create_app(parse_config(make_config(**overrides)), str(tmp_path / "storage"),
                     tmp_path / "run", start=False)
    try:
        yield app
    finally:
        app.extensions["rlfleet"].close()


def resources_json(gpus: int = 0, host: str = "node-7") -> dict:
    return {"hostname": host, "cpu_cores": 16, "memory_bytes": 64 * 2**30,
            "gpus": [{"index": i, "name": H100, "memory_bytes": H100_BYTES}
                     for i in range(gpus)]}


def register(client, role: str, worker_id: str | None = None, res: dict | None = None):
    body: dict[str, Any] = {"role": role, "url": "http://127.0.0.1:9"}
    if worker_id is not None:
        body["worker_id"] = worker_id
    if res is not None:
        body["resources"] = res
    return client.post(f"{API}/workers", json=body)


def test_the_coordinator_shows_what_each_worker_has(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch):
    with coordinator_app(tmp_path) as app:
        client = app.test_client()
        gpu_res, cpu_res = resources_json(gpus=2, host="gpu-node"), resources_json()
        assert register(client, "learner", "learner-a", gpu_res).status_code == 200
        assert register(client, "collector", "col-1", cpu_res).status_code == 200
        assert register(client, "collector", "col-old").status_code == 200  # reports nothing

        workers = {w["worker_id"]: w for w in client.get(f"{API}/workers").json["workers"]}
        # as reported, with `slurm` null: neither runs under Slurm
        assert workers["learner-a"]["resources"] == {**gpu_res, "slurm": None}
        assert workers["col-1"]["resources"] == {**cpu_res, "slurm": None}
        assert workers["col-old"]["resources"] is None
        assert client.get(f"{API}/workers/learner-a").json["resources"] == \
            {**gpu_res, "slurm": None}
        status = Status.model_validate(client.get(f"{API}/status").json)
        assert {w.worker_id: w.resources.hostname if w.resources else None
                for w in status.workers} == {"learner-a": "gpu-node", "col-1": "node-7",
                                             "col-old": None}
        # Registering again (a restart, elsewhere) replaces what the worker has.
        register(client, "collector", "col-1", resources_json(host="node-8"))
        assert client.get(f"{API}/workers/col-1").json["resources"]["hostname"] == "node-8"

        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(
                       client.get("/metrics").get_data(as_text=True))
                   for s in family.samples if s.name.startswith("rlfleet_worker_")}
        learner = (("hostname", "gpu-node"), ("role", "learner"), ("worker_id", "learner-a"))
        assert samples[("rlfleet_worker_cpu_cores", learner)] == 16
        assert samples[("rlfleet_worker_memory_bytes", learner)] == 64 * 2**30
        assert samples[("rlfleet_worker_gpus", learner)] == 2
        for gpu in ("0", "1"):
            key = tuple(sorted((*learner, ("gpu", gpu), ("name", H100))))
            assert samples[("rlfleet_worker_gpu_memory_bytes", key)] == H100_BYTES
        col = (("hostname", "node-8"), ("role", "collector"), ("worker_id", "col-1"))
        assert samples[("rlfleet_worker_gpus", col)] == 0
        assert not [k for k in samples if ("worker_id", "col-old") in k[1]]

        # `rlfleet status`, against the app served on loopback.
        server = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        monkeypatch.setenv("COLUMNS", "200")
        try:
            out = _printed(lambda: print_status(f"http://127.0.0.1:{server.server_port}"))
        finally:
            server.shutdown()
        for expected in ("host", "cpus", "mem", "GPUs", "gpu-node", "64.0 GiB",
                         f"2x {H100} (80 GiB)", "node-8"):
            assert expected in out, (expected, out)


def _printed(fn) -> str:
    """What `fn` printed through rich, whose console writes to `sys.stdout` as it is then."""
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert fn() == 0
    return buf.getvalue()


@pytest.mark.parametrize("device,gpus,refused", [
    ("cuda", 0, "no CUDA device"),
    ("cuda", 1, None),
    ("cuda:1", 1, "only 1 CUDA device (cuda:0)"),
    ("cuda:1", 2, None),
    ("auto", 0, None),
    ("cpu", 0, None),
])
def test_a_learner_without_the_gpu_the_config_asks_for_is_refused(
        tmp_path: Path, device: str, gpus: int, refused: str | None):
    with coordinator_app(tmp_path, learner={"device": device}) as app:
        client = app.test_client()
        r = register(client, "learner", "learner-a", resources_json(gpus=gpus))
        if refused is None:
            assert r.status_code == 200, r.json
            return
        assert r.status_code == 409 and r.json["field"] == "learner.device", r.json
        error = r.json["error"]
        assert f"learner.device='{device}'" in error and refused in error
        assert "learner learner-a on host node-7" in error
        assert client.get(f"{API}/workers").json["workers"] == []  # nothing registered
        # Without an id the worker is named by its URL; without resources it is not checked.
        r = register(client, "learner", None, resources_json(gpus=gpus))
        assert r.status_code == 409 and "learner at http://127.0.0.1:9 on host" in r.json["error"]
        assert register(client, "learner", "learner-b").status_code == 200
        # Collectors answer to collector.device (cpu), not to learner.device.
        assert register(client, "collector", "col-1", resources_json()).status_code == 200


def test_a_collector_without_the_gpu_the_config_asks_for_is_refused(tmp_path: Path):
    with coordinator_app(tmp_path, collector={"device": "cuda"}) as app:
        client = app.test_client()
        r = register(client, "collector", "col-1", resources_json(host="cpu-box"))
        assert r.status_code == 409 and r.json["field"] == "collector.device"
        assert "collector.device='cuda' but collector col-1 on host cpu-box has no CUDA " \
               "device" in r.json["error"]
        assert register(client, "collector", "col-2", resources_json(gpus=1)).status_code == 200
        assert register(client, "learner", "learner-a", resources_json()).status_code == 200


# -- the refused worker ---------------------------------------------------------------------

class Idle(WorkerService):
    """A learner role that does nothing but register."""

    role = Role.LEARNER

    def accept(self, envelope: TaskEnvelope) -> TaskAccepted:
        return TaskAccepted(task_id=envelope.task.task_id, accepted=True)

    def status(self) -> dict[str, Any]:
        return {}


def test_a_refused_worker_fails_at_once_and_its_process_exits_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    """The worker's own probe (no GPU here: `RLFLEET_FAKE_GPUS=0` says so on a GPU machine
    too) against a config asking for CUDA: one registration, refused; the service fails
    with the coordinator's reason, recorded for the supervisor, and its server's `run` (the
    process's exit code) returns 1."""
    monkeypatch.setenv(FAKE_GPUS_ENV, "0")
    crash = tmp_path / "crash.json"
    monkeypatch.setenv(CRASH_FILE_ENV, str(crash))
    with coordinator_app(tmp_path, learner={"device": "cuda"}) as app:
        coordinator = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=coordinator.serve_forever, daemon=True).start()
        port = free_port()
        service = Idle(f"http://127.0.0.1:{coordinator.server_port}",
                       f"http://127.0.0.1:{port}", worker_id="learner-gpu")
        server = InProcessServer(create_worker_app(service), "127.0.0.1", port)
        codes: list[int] = []
        runner = threading.Thread(target=lambda: codes.append(server.run(install_signals=False)),
                                  daemon=True)
        try:
            runner.start()
            runner.join(timeout=30)
        finally:
            server.request_stop()
            runner.join(timeout=30)
            coordinator.shutdown()
        metrics = app.test_client().get("/metrics").get_data(as_text=True)
    assert codes == [1]
    assert service.agent.refusal is not None and service.agent.info is None
    assert not service.agent._thread.is_alive()
    reason = "learner.device='cuda' but learner learner-gpu on host"
    assert reason in str(service.agent.refusal)
    assert reason in caplog.text and "stopping after a fatal error in registration" in caplog.text
    record = json.loads(crash.read_text())
    assert record["where"] == "registration" and reason in record["error"]
    attempts = [s.value for f in text_string_to_metric_families(metrics) for s in f.samples
                if s.name == "rlfleet_http_requests_total"
                and s.labels["endpoint"] == f"{API}/workers" and s.labels["method"] == "POST"]
    assert attempts == [1]  # refused once, never tried again
    with pytest.raises(type(service.agent.refusal)):
        service.agent.wait_registered(timeout=0)
