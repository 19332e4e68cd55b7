"""`docker compose config` on the repository's compose file, with the engine the compose suite
uses (`docker_env`), so the check runs wherever the suite does instead of skipping when the
compose plugin is not on the bare PATH."""

from __future__ import annotations

import subprocess

from integration.helpers import REPO

COMPOSE_FILE = REPO / "docker-compose.yml"


def test_compose_config_with_the_compose_tool(docker_env):
    env = {**docker_env, "RLFLEET_TOKEN": "test-token"}
    done = subprocess.run(["docker", "compose", "-f", str(COMPOSE_FILE), "config", "-q"],
                          env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    env.pop("RLFLEET_TOKEN")
    done = subprocess.run(["docker", "compose", "-f", str(COMPOSE_FILE), "config", "-q"],
                          env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode != 0 and "RLFLEET_TOKEN" in done.stderr, \
        "compose must refuse to start without RLFLEET_TOKEN"
