"""`rlfleet plot RUN_DIR`: a run's learning curves and where its iterations' time goes, as one PNG.

`rlfleet plot RUN_DIR RUN_DIR ... --out PNG` compares runs instead: their evaluation and
collect returns against env steps on shared axes, one colour per config (`plot_runs`).

Three panels from `<run_dir>/metrics.jsonl`: returns against env steps (sample efficiency),
the same returns against wall time (what distribution buys), and, per worker role, a stacked
bar of its mean timers (what to optimise next). A self-play run adds its league
(`services/plot_league.py`): ratings over time, the payoff heatmap, and evaluation win and
loss rates per opponent. Whatever a run did not log is left out.
Matplotlib is driven through `Figure` directly with the Agg canvas: no display, no pyplot
global state, so it is safe in a server thread.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rlfleet.plot_league import (
    has_win_rates,
    load_league,
    payoff_panel,
    ratings_panel,
    win_rate_panel,
)
from rlfleet.shared.telemetry.rundata import RunData, load_run

log = logging.getLogger("rlfleet.plot")

# (mean key, band low key or std key, band high key or None, line style) per curve.
CURVES = (
    ("eval/deterministic/return_mean", "eval/deterministic/return_std", None, "o-"),
    ("eval/stochastic/return_mean", None, None, "s--"),
    ("collect/return_mean", "collect/return_min", "collect/return_max", "-"),
)
TIMER_GROUPS = ("learner", "collector")
_TIMER_KEY = re.compile(r"^timers/(?P<group>[^/]+)/(?P<name>.+?)_(?P<unit>ms|us|s)(?:_mean)?$")
_TO_MS = {"ms": 1.0, "us": 1e-3, "s": 1e3}


@dataclass
class PlotResult:
    path: Path
    series: list[str] = field(default_factory=list)  # labels of every line and bar drawn


def stop_value(run_dir: Path) -> float | None:
    """`eval.stop_value` from the run's config.yaml, if it has one."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    try:
        value = ((yaml.safe_load(path.read_text()) or {}).get("eval") or {}).get("stop_value")
        return float(value) if value is not None else None
    except (yaml.YAMLError, AttributeError, TypeError, ValueError) as err:
        log.warning("%s: cannot read eval.stop_value (%s); plotting without it", path, err)
        return None


def timer_means(run: RunData) -> dict[str, dict[str, float]]:
    """Per role in TIMER_GROUPS, each timer's mean over the run in ms, keyed by metric key."""
    groups: dict[str, dict[str, float]] = {}
    keys = run.keys()
    for key in keys:
        m = _TIMER_KEY.match(key)
        if m is None or m["group"] not in TIMER_GROUPS:
            continue
        values = run.series(key)[1]
        if values.size:
            groups.setdefault(m["group"], {})[key] = float(np.mean(values)) * _TO_MS[m["unit"]]
    return {g: groups[g] for g in TIMER_GROUPS if g in groups}


def _curves(ax: Axes, run: RunData, x_of: str, t0: float, minutes: bool,
            stop: float | None) -> list[str]:
    labels = []
    for key, lo_key, hi_key, style in CURVES:
        if key not in run:
            continue
        steps, values, walls = run.series(key)
        x = steps if x_of == "step" else (walls - t0) / (60.0 if minutes else 1.0)
        (line,) = ax.plot(x, values, style, label=key, markersize=3, linewidth=1.5)
        if lo_key is not None and lo_key in run:
            lo = _aligned(run, lo_key, steps)
            if hi_key is None:  # a std: mean +- std
                lo, hi = values - lo, values + lo
            else:
                hi = _aligned(run, hi_key, steps)
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
        labels.append(key)
    if labels and stop is not None:
        label = f"stop value {stop:g}"
        ax.axhline(stop, color="0.3", linestyle="--", linewidth=1, label=label)
        labels.append(label)
    return labels


def _aligned(run: RunData, key: str, steps: np.ndarray) -> np.ndarray:
    """`key`'s values at `steps` (NaN where it has none), for a band around another key."""
    k_steps, k_values, _ = run.series(key)
    out = np.full(steps.shape, np.nan)
    idx = np.searchsorted(k_steps, steps)
    ok = idx < k_steps.size
    ok[ok] = k_steps[idx[ok]] == steps[ok]
    out[ok] = k_values[idx[ok]]
    return out


def _timers(ax: Axes, groups: dict[str, dict[str, float]]) -> list[str]:
    labels: list[str] = []
    palette = colormaps["tab20"]
    for row, timers in enumerate(groups.values()):
        left = 0.0
        for key, ms in sorted(timers.items(), key=lambda kv: -kv[1]):
            bar = ax.barh(row, ms, left=left, height=0.6, label=key,
                          color=palette(len(labels) % 20), edgecolor="white")
            if ms > 0.06 * sum(timers.values()):
                ax.bar_label(bar, labels=[f"{ms:.3g}"], label_type="center", fontsize=8)
            left += ms
            labels.append(key)
        ax.text(left, row, f"  {left:.3g} ms", va="center", fontsize=9)
    totals = [sum(t.values()) for t in groups.values()]
    ax.set_xlim(0, max(max(totals), 1e-9) * 1.12)  # room for the totals' text
    ax.set_yticks(range(len(groups)), list(groups))
    ax.invert_yaxis()
    ax.set_xlabel("mean time per iteration (ms)")
    ax.set_title("where each iteration's time goes")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return labels


def plot_run(run_dir: Path, out: Path | None = None) -> PlotResult:
    """Draw the run in `run_dir` into `out` (default `<run_dir>/curves.png`)."""
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    out = Path(out) if out is not None else run_dir / "curves.png"
    has_curves = any(key in run for key, *_ in CURVES)
    groups = timer_means(run)
    league = load_league(run_dir)
    win_rates = has_win_rates(run)
    if not has_curves and not groups and league is None:
        raise ValueError(f"nothing to plot in {run_dir}: no returns "
                         f"({', '.join(k for k, *_ in CURVES)}) and no timers/learner/* or "
                         "timers/collector/* metrics")

    heights = (([4.5] if has_curves else []) + ([4.5] if win_rates else [])
               + ([5.0] if league is not None else [])
               + ([1.2 + 0.6 * len(groups)] if groups else []))
    rows = len(heights)
    fig = Figure(figsize=(13, 0.6 + sum(heights)), dpi=110)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(rows, 2, height_ratios=heights)
    fig.suptitle(f"run {run_dir.name}", fontsize=13)
    result = PlotResult(path=out)
    if has_curves:
        walls = np.concatenate([cols["wall_time"] for cols in run.scopes.values()])
        t0 = float(np.nanmin(walls))
        minutes = float(np.nanmax(walls)) - t0 > 600
        stop = stop_value(run_dir)
        by_step, by_time = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
        labels = _curves(by_step, run, "step", t0, minutes, stop)
        _curves(by_time, run, "wall", t0, minutes, stop)
        by_step.set(title="return against env steps", xlabel="env steps", ylabel="return")
        by_time.set(title="return against wall time",
                    xlabel=f"wall time ({'min' if minutes else 's'})", ylabel="return")
        for ax in (by_step, by_time):
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8, loc="best")
        result.series += labels
    row = 1 if has_curves else 0
    if win_rates:
        result.series += win_rate_panel(fig.add_subplot(grid[row, :]), run)
        row += 1
    if league is not None:
        result.series += ratings_panel(fig.add_subplot(grid[row, 0]), league)
        result.series += payoff_panel(fig.add_subplot(grid[row, 1]), league)
    if groups:
        result.series += _timers(fig.add_subplot(grid[rows - 1, :]), groups)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return result


def _config_group(run_dir: Path) -> str:
    """What a run's config.yaml says besides its name, seed, storage and stop rule: runs that
    agree on it (one config's seeds) share a colour in a comparison."""
    try:
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return run_dir.name
    if not isinstance(cfg, dict):
        return run_dir.name
    rest = {k: v for k, v in cfg.items() if k not in ("name", "seed", "storage", "stop")}
    return json.dumps(rest, sort_keys=True, default=str)


COMPARED = (("eval/deterministic/return_mean", "evaluation return (deterministic)"),
            ("collect/return_mean", "collect return (mean of episodes)"))


def plot_runs(run_dirs: list[Path], out: Path) -> PlotResult:
    """Several runs on shared axes, against env steps: the deterministic evaluation return
    (left) and the collect return (right), one line per run labelled by its directory; runs
    of the same config (seeds aside) share a colour, so a config's seeds read as one bundle
    beside another's."""
    runs = [(Path(d), load_run(Path(d))) for d in run_dirs]
    fig = Figure(figsize=(13, 5.1), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    palette = colormaps["tab10"]
    colours: dict[str, object] = {}
    result = PlotResult(path=Path(out))
    stops = {stop_value(d) for d, _ in runs}
    for run_dir, run in runs:
        label = run_dir.name
        colour = colours.setdefault(_config_group(run_dir), palette(len(colours) % 10))
        drawn = False
        for ax, (key, _) in zip(axes, COMPARED, strict=True):
            if key not in run:
                continue
            steps, values, _ = run.series(key)
            ax.plot(steps, values, "o-" if key.startswith("eval/") else "-", color=colour,
                    label=label, markersize=3, linewidth=1.3, alpha=0.85)
            drawn = True
        if drawn:
            result.series.append(label)
    if not result.series:
        raise ValueError("nothing to plot: none of the runs logged "
                         + " or ".join(k for k, _ in COMPARED))
    stop = next(iter(stops)) if len(stops) == 1 else None  # one line only if all agree
    for ax, (_, title) in zip(axes, COMPARED, strict=True):
        if stop is not None:
            ax.axhline(stop, color="0.3", linestyle="--", linewidth=1,
                       label=f"stop value {stop:g}")
        ax.set(title=f"{title} against env steps", xlabel="env steps", ylabel="return")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"{len(result.series)} runs of {len(colours)} configs", fontsize=12)
    fig.tight_layout()
    result.path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(result.path, dpi=110)
    return result


def plot(run_dirs: list[Path], out: Path | None = None) -> PlotResult:
    """One run: `plot_run`. Several: `plot_runs`, which needs `out`."""
    if len(run_dirs) == 1:
        return plot_run(run_dirs[0], out)
    if out is None:
        raise ValueError("comparing several runs needs --out PNG")
    return plot_runs(run_dirs, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rlfleet plot", description=__doc__.split("\n")[0])
    p.add_argument("run_dir", type=Path, nargs="+", help="one run; several: compared")
    p.add_argument("--out", type=Path, default=None, help="default: <run_dir>/curves.png")
    args = p.parse_args(argv)
    try:
        result = plot(args.run_dir, args.out)
    except (FileNotFoundError, ValueError) as err:
        print(f"rlfleet plot: {err}", file=sys.stderr)
        return 1
    print(result.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
