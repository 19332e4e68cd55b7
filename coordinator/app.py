"""The coordinator's app factory: gunicorn and the pytest client build the very same app."""

from __future__ import annotations

from pathlib import Path

from flask import Flask

from coordinator.prometheus import install_metrics
from coordinator.routes import bp
from coordinator.service import Coordinator
from shared.config import RunConfig
from shared.webapp import install_error_handlers


def create_app(cfg: RunConfig, storage_url: str, run_dir: str | Path | None = None,
               start: bool = True, resume: bool = False) -> Flask:
    app = Flask("rlfleet.coordinator")
    install_error_handlers(app)
    coordinator = Coordinator(cfg, storage_url, run_dir, resume=resume)
    app.extensions["rlfleet"] = coordinator
    app.register_blueprint(bp)
    install_metrics(app, coordinator)
    if start:
        coordinator.start()
    return app
