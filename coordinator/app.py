"""The coordinator's app factory: `rlfleet coordinator` and the pytest client build the very
same app."""

from __future__ import annotations

import logging
from pathlib import Path

from flask import Flask

from rlfleet.coordinator.dashboard import install_dashboard
from rlfleet.coordinator.prometheus import install_metrics
from rlfleet.coordinator.routes import bp
from rlfleet.coordinator.service import Coordinator
from rlfleet.shared.infra.auth import TOKEN_ENV, TOKEN_FILE_ENV, install_token_guard, load_token
from rlfleet.shared.infra.webapp import install_error_handlers
from rlfleet.shared.run.config import RunConfig

log = logging.getLogger("rlfleet.coordinator")


def create_app(cfg: RunConfig, storage_url: str, run_dir: str | Path | None = None,
               start: bool = True, resume: bool = False) -> Flask:
    app = Flask("rlfleet.coordinator")
    install_error_handlers(app)
    coordinator = Coordinator(cfg, storage_url, run_dir, resume=resume)
    app.extensions["rlfleet"] = coordinator
    app.register_blueprint(bp)
    static = install_dashboard(app)
    # first: its timer also sees the requests refused below
    install_metrics(app, coordinator.readout)
    if not install_token_guard(app, load_token(), static=static):
        log.warning("no API token (%s or %s): every endpoint is open to anyone who can reach "
                    "this port", TOKEN_ENV, TOKEN_FILE_ENV)
    if start:
        coordinator.start()
    return app
