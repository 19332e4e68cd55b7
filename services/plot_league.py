"""The league panels of `rlfleet plot` for a self-play run: ratings over the games played,
the payoff matrix as a heatmap, and evaluation win and loss rates per opponent.

The league comes from `<run_dir>/league.json`, which the coordinator writes every few
seconds and when the run ends (`GET /api/v1/league` is the same document); the win rates
from the run's `eval/vs_<opponent>/win|loss` scalars. A malformed league.json is a warning
and no league panels, never a failed plot.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes

from rlfleet.shared.telemetry.rundata import RunData

log = logging.getLogger("rlfleet.plot")

MAX_SNAPSHOT_LINES = 8  # the newest; more makes the ratings panel unreadable
_VS_WIN = re.compile(r"^eval/vs_(?P<opponent>[^/]+)/win$")


def load_league(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / "league.json"
    if not path.is_file():
        return None
    try:
        league = json.loads(path.read_text())
        league["players"], league["payoff"]["players"]  # noqa: B018 - the keys used
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("%s: not a league document (%s); plotting without the league", path, err)
        return None
    return league


def scores(payoff: dict[str, Any]) -> np.ndarray:
    """The row player's score against each column player, (win + draw / 2) / games; NaN
    where they never met."""
    win, draw, loss = (np.asarray(payoff[k], dtype=np.float64) for k in ("win", "draw", "loss"))
    games = win + draw + loss
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(games > 0, (win + 0.5 * draw) / games, np.nan)


def ratings_panel(ax: Axes, league: dict[str, Any]) -> list[str]:
    """mu against the league's game count, a band of +- sigma, one line per player: the main
    player, the bots and the newest snapshots."""
    history = league.get("ratings") or {}
    kinds = {p["name"]: p["kind"] for p in league["players"]}
    snapshots = sorted((p for p in league["players"] if p["kind"] == "snapshot"),
                       key=lambda p: p["policy_version"] or 0)
    shown = [n for n, k in kinds.items() if k != "snapshot"]
    shown += [p["name"] for p in snapshots[-MAX_SNAPSHOT_LINES:]]
    labels = []
    for name in shown:
        points = np.asarray(history.get(name) or [], dtype=np.float64)
        if points.ndim != 2 or len(points) == 0:
            continue
        games, mu, sigma = points[:, 0], points[:, 1], points[:, 2]
        style = {"main": "-", "bot": "--"}.get(kinds.get(name, ""), ":")
        (line,) = ax.plot(games, mu, style, linewidth=2 if name == "main" else 1.2,
                          label=name)
        ax.fill_between(games, mu - sigma, mu + sigma, color=line.get_color(), alpha=0.12,
                        linewidth=0)
        labels.append(f"rating {name}")
    ax.set(title="ratings (openskill mu, band +- sigma)", xlabel="league games", ylabel="mu")
    ax.grid(True, alpha=0.3)
    if labels:
        ax.legend(fontsize=7, loc="best")
    return labels


def payoff_panel(ax: Axes, league: dict[str, Any]) -> list[str]:
    """Each row player's score against each column player; blank where they never met,
    the games played written in each cell."""
    payoff = league["payoff"]
    names = payoff["players"]
    if not names:
        return []
    grid = scores(payoff)
    games = np.asarray(payoff["win"]) + np.asarray(payoff["draw"]) + np.asarray(payoff["loss"])
    cmap = colormaps["RdYlGn"].with_extremes(bad="0.9")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=1)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    if len(names) <= 14:
        for i in range(len(names)):
            for j in range(len(names)):
                if games[i, j]:
                    ax.text(j, i, f"{grid[i, j]:.2f}\n{int(games[i, j])}", ha="center",
                            va="center", fontsize=6)
    ax.set_title("payoff: row's score vs column (win + draw/2), games")
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    return ["payoff heatmap"]


def has_win_rates(run: RunData) -> bool:
    return any(_VS_WIN.match(key) for key in run.keys())  # noqa: SIM118 - RunData is no dict


def win_rate_panel(ax: Axes, run: RunData) -> list[str]:
    """Evaluation win rate (solid) and loss rate (dashed) against env steps, per opponent
    met in more than one evaluation (the bots, the first snapshot: the newest snapshots
    change every time)."""
    labels = []
    for key in sorted(run.keys()):
        m = _VS_WIN.match(key)
        if m is None:
            continue
        steps, wins, _ = run.series(key)
        if steps.size < 2:
            continue
        (line,) = ax.plot(steps, wins, "o-", markersize=3, label=f"vs {m['opponent']} win")
        labels.append(f"vs {m['opponent']} win")
        loss_key = f"eval/vs_{m['opponent']}/loss"
        if loss_key in run:
            l_steps, losses, _ = run.series(loss_key)
            ax.plot(l_steps, losses, "--", color=line.get_color(), linewidth=1,
                    label=f"vs {m['opponent']} loss")
            labels.append(f"vs {m['opponent']} loss")
    ax.set(title="evaluation games: win (solid) and loss (dashed) rates",
           xlabel="env steps", ylabel="rate", ylim=(-0.02, 1.02))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return labels
