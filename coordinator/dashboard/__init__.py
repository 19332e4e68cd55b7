"""The dashboard: one page at `GET /` on the coordinator, to watch a run and steer it.

Static files only (HTML, one script, one stylesheet, uPlot vendored with its licence): no
build step, and nothing of the run is in them. The page reads the same JSON API every other
client uses (`/api/v1/status`, `/api/v1/records` for the curves) and sends the same token,
which it asks for once and keeps in the browser's session storage. So the page and its
scripts are the only paths the token guard lets through (`STATIC_PATHS`); every figure and
every button goes through the guard like any other request.
"""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Flask, Response, send_from_directory

STATIC_DIR = Path(__file__).with_name("static")
PREFIX = "/dashboard/"
STATIC_PATHS = ("/", PREFIX)  # what the token guard serves without a token (GET, HEAD)

# The page runs only its own scripts and talks only to its own origin; no site may frame it
# (its buttons steer the run: no clickjacking). uPlot sizes its elements with inline styles.
HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; connect-src 'self'; "
                                "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                                "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # A new rlfleet serves new files under the same names: the browser checks each time
    # (an unchanged file is a 304).
    "Cache-Control": "no-cache",
}

bp = Blueprint("dashboard", __name__)


def _static(filename: str) -> Response:
    resp = send_from_directory(STATIC_DIR, filename, max_age=0)
    resp.headers.update(HEADERS)
    return resp


@bp.get("/")
def index() -> Response:
    return _static("index.html")


@bp.get(f"{PREFIX}<path:filename>")
def asset(filename: str) -> Response:
    """A file of the page (send_from_directory refuses paths that leave the directory)."""
    return _static(filename)


def install_dashboard(app: Flask) -> tuple[str, ...]:
    """Serve the page on `app`; returns the paths the token guard must let through."""
    app.register_blueprint(bp)
    return STATIC_PATHS
