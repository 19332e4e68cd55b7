"""`coordinator.worker_networks`: a worker registers only with a URL inside the allowed
networks, because the coordinator POSTs tasks to that URL."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from rlfleet.coordinator.admission import NotAdmitted, WorkerNetworks
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.run.config import parse_config

from .helpers import REPO, get, make_config, ok, post


def test_addresses_and_names_are_checked_against_every_network():
    any_address = WorkerNetworks([])
    any_address.check("http://169.254.169.254/")  # no networks: the local default
    nets = WorkerNetworks(["10.0.0.0/8", "127.0.0.1/32", "fd00::/8"])
    for url in ("http://10.2.3.4:8000", "https://127.0.0.1:1/x", "http://[fd00::5]:80",
                "http://[::ffff:10.0.0.9]:80"):
        nets.check(url)
    for url in ("http://169.254.169.254/latest", "http://11.0.0.1:80", "http://127.0.0.2:1",
                "http://[fe80::1]:80", "http://[::1]:80"):
        with pytest.raises(NotAdmitted, match="outside coordinator.worker_networks"):
            nets.check(url)
    # a name: every address it resolves to must be inside ("localhost": 127.0.0.1, maybe ::1)
    WorkerNetworks(["127.0.0.0/8", "::1/128"]).check("http://localhost:8000")
    with pytest.raises(NotAdmitted):
        WorkerNetworks(["10.0.0.0/8"]).check("http://localhost:8000")
    with pytest.raises(NotAdmitted, match="does not resolve"):
        nets.check("http://no-such-host.invalid:80")


def test_a_bad_network_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"worker_networks\[1\]='10.0.0.0/33'"):
        parse_config(make_config(coordinator={"worker_networks": ["10.0.0.0/8",
                                                                  "10.0.0.0/33"]}), "test")


def test_a_registration_from_outside_gets_a_403_naming_url(coordinator):
    c = coordinator(coordinator={"worker_networks": ["127.0.0.0/8"]})
    r = post(c, "/workers", {"role": "collector", "url": "http://169.254.169.254:80"})
    assert r.status_code == 403 and r.json()["field"] == "url"
    assert "169.254.169.254" in r.json()["error"]
    assert get(c, "/workers")["workers"] == []  # nothing registered
    w = ok(post(c, "/workers", {"role": "collector", "url": "http://127.0.0.1:9"}))
    assert [x["worker_id"] for x in get(c, "/workers")["workers"]] == [w["worker_id"]]


def test_the_coordinator_command_takes_networks_from_its_environment(tmp_path):
    """What compose and k8s set: RLFLEET_WORKER_NETWORKS replaces the config's list; a bad
    one stops the coordinator before it serves, naming the field."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(make_config()))
    out = subprocess.run([sys.executable, "-m", "rlfleet", "coordinator", "--config",
                          str(config), "--port", "0", "--run-dir", str(tmp_path / "run")],
                         cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={"RLFLEET_WORKER_NETWORKS": "10.0.0.0/8,not-a-cidr",
                              "PATH": "/usr/bin:/bin"})
    assert out.returncode != 0
    assert "worker_networks[1]='not-a-cidr'" in out.stderr, out.stderr[-2000:]
