"""The dashboard in a real browser (Debian's chromium, driven by Playwright) against a live,
token-guarded `rlfleet up` cluster training CartPole:

- without the token, and with a wrong one, the page shows the login prompt and no data;
- with the token it shows the run (its collector's epsilon among the workers), and its
  curves gain points as the run goes on;
- Pause stops collection (env steps stand still in `/status`), Resume starts it again;
- Scale records the collectors wanted; Stop ends the run, and `rlfleet up` exits.

A screenshot of the live page is saved under the test's tmp dir.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import pytest
import requests

from rlfleet.shared.contract.wire.base import API

from .helpers import free_port, small_config, wait_for

sync_api = pytest.importorskip("playwright.sync_api",
                               reason="playwright is not installed (make test installs it)")
CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                "(make test installs it: .ci/ensure-chromium)")

TOKEN = "dashboard-test-token"
USERLAND = Path(__file__).resolve().parents[1] / "userland"  # my_rl: a user's own policy
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def _status(url: str) -> dict:
    r = requests.get(f"{url}{API}/status", headers=HEADERS, timeout=5)
    r.raise_for_status()
    return r.json()


def _points(page, chart: str) -> int:
    return int(page.get_attribute(f"#chart-{chart}", "data-points") or 0)


def _env_steps_still(url: str, window_s: float = 2.5) -> bool:
    """True once env steps stood still for `window_s` (chunks in flight at the pause have
    landed); polled by `wait_for`."""
    before = _status(url)["counters"]["env_steps"]
    time.sleep(window_s)  # a window to watch, not a wait for something to happen
    return _status(url)["counters"]["env_steps"] == before


def _epsilon_shown(page, worker: str) -> float:
    """The `eps` cell of a worker's row in the workers table (raises while it shows none)."""
    text = page.evaluate("""([worker]) => {
      const heads = [...document.querySelectorAll('#workers thead th')].map((th) => th.textContent);
      const row = [...document.querySelectorAll('#workers tbody tr')]
        .find((tr) => tr.children[0].textContent === worker);
      return row ? row.children[heads.indexOf('eps')].textContent : null;
    }""", [worker])
    return float(text)


def test_the_dashboard_watches_and_steers_a_live_run(launch, tmp_path: Path):
    # No stop value: the run goes on until the page stops it (or the wall-clock budget).
    # The user's DQN reports a NaN metric every third update: the page says so.
    config = small_config(tmp_path / "dash.yaml",
                          algo={"policy": "my_rl:NaNMetricDQN"},
                          eval={"every_env_steps": 1500, "episodes": 2, "num_envs": 2},
                          stop={"max_env_steps": 5_000_000, "max_wall_s": 240},
                          logging={"tensorboard": False,
                                   "scopes": {"collect": {"every_env_steps": 200},
                                              "train": {"every_env_steps": 200}}})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir),
                "--quiet", "--port", str(port),
                env={"RLFLEET_TOKEN": TOKEN, "PYTHONPATH": str(USERLAND)})

    def answering() -> bool:
        try:
            return requests.get(f"{url}/health", timeout=2).ok
        except requests.ConnectionError:
            return False

    wait_for(answering, 60, "the coordinator to answer")
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.on("dialog", lambda dialog: dialog.accept())  # the Stop button's confirm()

            # No token yet: the prompt, and nothing of the run.
            page.goto(f"{url}/")
            page.wait_for_selector("#login:not([hidden])", timeout=15_000)
            assert page.is_hidden("#board")
            assert page.text_content("#run-name") == ""

            # A wrong token: refused, the prompt again, still no data.
            page.fill("#token-input", "not-the-token")
            page.click("#login-submit")
            page.wait_for_selector("#login-error:has-text('refused')", timeout=15_000)
            assert page.is_visible("#login") and page.is_hidden("#board")
            assert page.locator("#workers tr").count() == 0
            assert page.evaluate("() => sessionStorage.getItem('rlfleet.token')") == \
                "not-the-token"

            # The right token: the board, the run and its workers.
            page.fill("#token-input", TOKEN)
            page.click("#login-submit")
            page.wait_for_selector("#board:not([hidden])", timeout=15_000)
            assert page.is_hidden("#login")
            page.wait_for_selector("body[data-state='running']", timeout=30_000)
            wait_for(lambda: page.locator("#workers tbody tr").count() >= 2, 60,
                     "two workers in the table")
            workers = page.text_content("#workers")
            assert "collector-1" in workers and "learner" in workers
            # What each worker reported having when it registered: this machine, no GPU.
            header = page.text_content("#workers thead")
            assert all(h in header for h in ("host", "cpus", "memory", "GPUs")), header
            assert socket.gethostname() in workers and "GiB" in workers, workers
            # The epsilon the collector explores with, from its heartbeat (DQN's decay here).
            wait_for(lambda: 0 < _epsilon_shown(page, "collector-1") <= 1, 60,
                     "the collector's epsilon in the workers table")
            assert "replay" in page.text_content("#buffers")

            # The curves gain points as the run goes on.
            wait_for(lambda: _points(page, "returns") > 0, 90, "a first point on the returns")
            first = {c: _points(page, c) for c in ("returns", "rates", "train")}
            wait_for(lambda: all(_points(page, c) > first[c] for c in first), 90,
                     f"more points on every curve than {first}")
            wait_for(lambda: "±" in page.text_content("#evaluations"), 90,
                     "an evaluation in its table")
            # What went wrong quietly, above the cards: the policy's NaN metric.
            page.wait_for_selector("#alerts p[data-kind='nonfinite_metrics']", timeout=30_000)
            assert "wobble" in page.text_content("#alerts")
            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)

            # Pause: collection stops in /status; Resume: it starts again.
            page.click("#pause")
            page.wait_for_selector("body[data-state='paused']", timeout=15_000)
            assert _status(url)["run"]["paused"] is True
            wait_for(lambda: _env_steps_still(url), 60, "env steps to stand still")
            assert page.is_disabled("#pause") and page.is_enabled("#resume")
            paused_at = _status(url)["counters"]["env_steps"]
            page.click("#resume")
            page.wait_for_selector("body[data-state='running']", timeout=15_000)
            wait_for(lambda: _status(url)["counters"]["env_steps"] > paused_at + 500, 60,
                     "collection to go on after resume")

            # Scale: the coordinator records the collectors wanted (the launcher starts them).
            page.fill("#scale-collectors", "2")
            page.click("#scale")
            wait_for(lambda: _status(url)["run"]["collectors_desired"] == 2, 15,
                     "collectors_desired == 2")
            page.wait_for_selector("#control-message:has-text('scale')", timeout=15_000)

            # Stop: the run ends.
            page.click("#stop")
            page.wait_for_selector("body[data-state='stopped']", timeout=30_000)
        finally:
            browser.close()
    code = up.wait(timeout=120)
    assert code in (0, 3), f"exit code {code}:\n{up.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "stopped by request"
    assert f"dashboard: {url}/" in up.stderr
    assert errors == [], f"the page raised: {errors}"
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    up.assert_no_orphans()
