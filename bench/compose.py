"""Time to solve CartPole through `docker compose`, beside `rlfleet up`, in the same run.

For each seed: the compose stack (Redis, coordinator, learner, N collectors as containers, the
image built first) runs the same config as `bench.time_to_solve` until the coordinator's
evaluation reaches the stop value; then `rlfleet up` runs it as local processes, on Redis
too (the stack's storage), with the same seed and collectors. Both times are the
coordinator's clock from its start to the solving evaluation, so the containers' start-up
(image already built) is left out of both alike; `compose up -> solved` is the user's wait.

    python -m bench.compose [--algo dqn|ppo] [--seeds 0 1] [--collectors 2] [--cached]
                            [--stop-value R] [--short]

`image_build_s` is a `docker build --no-cache` of services/Dockerfile (with `--cached`, the
ordinary build: seconds when nothing changed). The Docker engine is found or started as in
the compose test (`bench.compose_stack`). The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import tempfile
import time
from pathlib import Path

import yaml
from rich.table import Table

from bench.common import fmt, log, median, parse_args, ratio, report, rounded, run_main
from bench.compose_stack import Stack, build_image, ensure_engine
from bench.time_to_solve import CONFIGS, EASY_TARGET, adjusted_config, run_cluster

FIGURES = ("compose_solve_s", "local_solve_s", "ratio", "image_build_s",
           "compose_ms_per_env_step", "local_ms_per_env_step")
# One seed, one collector, the ordinary (cached) build, and solved at 195, as
# `bench.time_to_solve`'s short run.
SHORT = {"seeds": [0], "collectors": 1, "cached": True, "stop_value": EASY_TARGET}


def run_compose(env: dict[str, str], config: Path, seed: int, collectors: int,
                work: Path) -> dict:
    """One stack from `up` to solved (or its stop limit), then `down -v`."""
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o755)
    (work / "run.yaml").write_text(config.read_text())
    (work / "run.yaml").chmod(0o644)
    override = work / "compose.bench.yml"
    override.write_text(yaml.safe_dump({"services": {"coordinator": {
        "environment": {"RLFLEET_CONFIG": "/bench/run.yaml", "RLFLEET_SEED": str(seed),
                        "RLFLEET_RUN_DIR": "/runs/bench"},
        "volumes": [f"{work}:/bench:ro"]}}}))
    port = 18000 + os.getpid() % 1000
    stack = Stack(f"rlfleet-bench-{os.getpid()}-{seed}", env, secrets.token_hex(16), port,
                  overrides=[override])
    t0 = time.monotonic()
    try:
        stack.up("--scale", f"collector={collectors}")
        deadline = t0 + 1200
        status: dict = {}
        while time.monotonic() < deadline:
            try:
                status = stack.status()
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(1)
                continue
            if status["run"]["state"] == "stopped":
                break
            time.sleep(1)
        wall = time.monotonic() - t0
        run = status.get("run", {})
        return {"solved": bool(run.get("solved")), "run_s": run.get("wall_seconds"),
                "wall_s": wall, "env_steps": status.get("counters", {}).get("env_steps")}
    finally:
        stack.down()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--algo", choices=sorted(CONFIGS), default="dqn")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--collectors", type=int, default=2)
    p.add_argument("--cached", action="store_true", help="time an ordinary (cached) build")
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0",
                   help="storage of the local runs (the stack has its own Redis)")
    p.add_argument("--stop-value", type=float, default=None,
                   help="the evaluation return that counts as solved (default: the config's)")
    args = parse_args(p, argv, SHORT)

    config = CONFIGS[args.algo]
    env, started = ensure_engine()
    work = Path(tempfile.mkdtemp(prefix="rlfleet-compose-bench-"))
    if args.stop_value is not None:
        config = adjusted_config(config, work, stop_value=args.stop_value)
    try:
        log("building the image" + (" (cached)" if args.cached else " (--no-cache)") + "...")
        build_s = build_image(env, cached=args.cached)
        log(f"image built in {build_s:.1f} s")
        rows = []
        for seed in args.seeds:
            log(f"seed {seed}: compose ({args.collectors} collectors)...")
            c = run_compose(env, config, seed, args.collectors, work / f"compose-{seed}")
            log(f"seed {seed}: compose solved={c['solved']} in {fmt(c['run_s'], '.1f', ' s')} "
                f"(up -> stopped {c['wall_s']:.1f} s)")
            log(f"seed {seed}: rlfleet up...")
            local = run_cluster(config, seed, args.collectors, work / f"local-{seed}",
                                args.redis)
            log(f"seed {seed}: local {local.outcome} in {fmt(local.run_s, '.1f', ' s')}")
            rows.append((seed, c, local))
    finally:
        if started is not None:
            subprocess.run(["bash", str(started), "stop"], capture_output=True)

    compose_s = median(c["run_s"] if c["solved"] else None for _, c, _ in rows)
    local_s = median(lo.run_s for _, _, lo in rows)
    t = Table(title=f"time to solve CartPole ({args.algo}, {args.collectors} collectors): "
              "compose vs rlfleet up", caption="coordinator start -> solving evaluation; "
              "compose wall: `compose up` -> run stopped (containers' start-up included)")
    for name in ("seed", "compose", "compose wall", "rlfleet up", "ratio", "compose steps",
                 "local steps"):
        t.add_column(name, justify="right")
    for seed, c, lo in rows:
        t.add_row(str(seed), fmt(c["run_s"] if c["solved"] else None, ".1f", " s"),
                  fmt(c["wall_s"], ".1f", " s"), fmt(lo.run_s, ".1f", " s"),
                  fmt(ratio(c["run_s"] if c["solved"] else None, lo.run_s), ".2f", "x"),
                  fmt(c["env_steps"], ","), fmt(lo.env_steps, ","))
    t.add_section()
    t.add_row("median", fmt(compose_s, ".1f", " s"), "", fmt(local_s, ".1f", " s"),
              fmt(ratio(compose_s, local_s), ".2f", "x"), "", "", style="bold")
    # Seeds solve after very different numbers of env steps (asynchrony is not seeded): time
    # per env step compares the two ways of running more steadily than time to solve.
    compose_ms = median(1000 * c["run_s"] / c["env_steps"] for _, c, _ in rows
                        if c["solved"] and c["env_steps"])
    local_ms = median(1000 * lo.run_s / lo.env_steps for _, _, lo in rows
                      if lo.solved and lo.env_steps)
    log(f"time per env step: compose {fmt(compose_ms, '.3f', ' ms')}, rlfleet up "
        f"{fmt(local_ms, '.3f', ' ms')}")
    report({"compose_solve_s": rounded(compose_s), "local_solve_s": rounded(local_s),
            "ratio": rounded(ratio(compose_s, local_s)), "image_build_s": rounded(build_s),
            "compose_ms_per_env_step": rounded(compose_ms, 4),
            "local_ms_per_env_step": rounded(local_ms, 4),
            "image_build_cached": args.cached, "algo": args.algo,
            "collectors": args.collectors, "seeds": args.seeds,
            "per_seed": [{"seed": s, "compose_solve_s": rounded(c["run_s"]),
                          "compose_wall_s": rounded(c["wall_s"]),
                          "compose_solved": c["solved"], "local_solve_s": rounded(lo.run_s),
                          "local_solved": lo.solved}
                         for s, c, lo in rows]}, t)
    return 0


if __name__ == "__main__":
    run_main(main)
