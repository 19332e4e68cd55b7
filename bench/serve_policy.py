"""Latency and throughput of `rlfleet serve-policy`, beside the policy's own forward pass.

A trained policy answers `POST /act` over keep-alive HTTP (one connection, one request at a
time, as a client stepping its env would ask): latency p50 and p99 per request, and actions
per second, at batch 1 and batch 64. Beside them, the ceiling measured in the same run: the
same policy's forward pass in this process (`rlfleet.play.policy_actions`, what the server
calls for each request), no HTTP, JSON or validation, so the difference is what serving over
HTTP costs. Bodies are encoded before the clock starts (the client's JSON encoding is not the
server's cost); the server is started with a token, as a deployment would run it.

    python -m bench.serve_policy [--run-dir RUN] [--seconds 5] [--threads 4] [--short]

Without `--run-dir`, a run is made first: CartPole PPO through `rlfleet up` for 6,000 env steps
(a policy that plays; the network, an MLP (64, 64), is what a solved one has). Progress goes
to stderr; stdout carries the table and, as its last line, one JSON object: `act_p50_ms`,
`act_p99_ms`, `actions_per_s` (batch 1), the same with `_64` (batch 64), and the in-process
ceilings `inprocess_p50_ms`, `inprocess_p99_ms`, `inprocess_actions_per_s` (and `_64`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from rich.table import Table

from bench.common import (
    REPO_ROOT,
    CpuWindow,
    die_with_parent,
    fmt,
    log,
    parse_args,
    report,
    rounded,
    run_main,
    stop_process,
    up_command,
    wait_healthy,
    write_yaml,
)

BATCHES = (1, 64)
WARMUP_S = 1.0
FIGURES = ("act_p50_ms", "act_p99_ms", "actions_per_s", "act_p50_ms_64", "act_p99_ms_64",
           "actions_per_s_64", "inprocess_p50_ms", "inprocess_p99_ms",
           "inprocess_actions_per_s", "inprocess_p50_ms_64", "inprocess_p99_ms_64",
           "inprocess_actions_per_s_64")
# A policy from one evaluation in (it need not play well to be served), timed in half-seconds.
SHORT = {"env_steps": 2_000, "seconds": 0.5, "warmup_s": 0.2}


def make_run(tmp: Path, env_steps: int = 6000) -> Path:
    """A short CartPole PPO run with a best policy. Its one evaluation is due after
    `env_steps` and any return solves it, so the run ends when that evaluation reports and
    has kept its policy: a step budget could end the run while the evaluation was still out."""
    data = yaml.safe_load((REPO_ROOT / "configs" / "cartpole-ppo.yaml").read_text())
    data["eval"].update(start_env_steps=env_steps, every_env_steps=env_steps, episodes=4,
                        num_envs=4, stop_value=0.0)
    data["stop"] = {"max_wall_s": 240}
    config = write_yaml(tmp / "cartpole-ppo.yaml", data)
    run_dir = tmp / "run"
    done = subprocess.run(up_command(config, run_dir, 1), cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300, preexec_fn=die_with_parent)
    if done.returncode not in (0, 3) or not (run_dir / "best_policy.safetensors").is_file():
        raise RuntimeError(f"rlfleet up failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return run_dir


def observations(env_id: str, n: int, seed: int = 0) -> np.ndarray:
    """Observations met on a random walk through the env."""
    import gymnasium as gym

    env = gym.make(env_id)
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    out = []
    for _ in range(n):
        out.append(obs)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return np.stack(out)


def percentiles(seconds: list[float]) -> tuple[float, float]:
    ms = np.asarray(seconds) * 1000.0
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def timed(call, seconds: float, warmup_s: float = WARMUP_S) -> tuple[list[float], float]:
    """Call `call(i)` for `seconds` after a warm-up: each call's latency, and the wall time."""
    i = 0
    deadline = time.perf_counter() + warmup_s
    while time.perf_counter() < deadline:
        call(i)
        i += 1
    latencies: list[float] = []
    start = time.perf_counter()
    while (now := time.perf_counter()) - start < seconds:
        call(i)
        latencies.append(time.perf_counter() - now)
        i += 1
    return latencies, time.perf_counter() - start


def over_http(port: int, token: str, bodies: list[bytes], seconds: float,
              warmup_s: float = WARMUP_S) -> tuple[list[float], float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}

    def call(i: int) -> None:
        conn.request("POST", "/act", body=bodies[i % len(bodies)], headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"POST /act answered {resp.status}: {data[:500]!r}")

    try:
        return timed(call, seconds, warmup_s)
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run-dir", default=None, help="a run with best_policy.safetensors "
                    "(default: make one, CartPole PPO)")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per figure")
    ap.add_argument("--threads", type=int, default=4, help="the server's HTTP threads")
    ap.add_argument("--env-steps", type=int, default=6000,
                    help="the training run's budget, without --run-dir")
    ap.add_argument("--warmup-s", type=float, default=WARMUP_S,
                    help="seconds of calls before each figure's are timed")
    args = parse_args(ap, argv, SHORT)

    from rlfleet.cli import free_port
    from rlfleet.play import policy_actions, trained_policy

    with tempfile.TemporaryDirectory(prefix="rlfleet-serve-policy-") as tmp_s:
        tmp = Path(tmp_s)
        if args.run_dir:
            run_dir = Path(args.run_dir)
        else:
            log(f"training a policy to serve: CartPole PPO, {args.env_steps:,} env steps...")
            run_dir = make_run(tmp, args.env_steps)
        cfg, policy, version = trained_policy(run_dir)
        obs = observations(cfg.env.id, 64 * 8).astype(np.float32)
        batches = {b: [obs[k * b:(k + 1) * b] for k in range(8)] for b in BATCHES}

        token, port = secrets.token_hex(16), free_port()
        log(f"serving {run_dir} (policy version {version}) on port {port}...")
        with open(tmp / "server.log", "wb") as server_log:
            server = subprocess.Popen(
                [sys.executable, "-m", "rlfleet", "serve-policy", str(run_dir), "--port",
                 str(port), "--threads", str(args.threads)],
                cwd=REPO_ROOT, env={**os.environ, "RLFLEET_TOKEN": token},
                stdout=subprocess.DEVNULL, stderr=server_log, preexec_fn=die_with_parent)
        figures: dict[int, dict[str, float]] = {}
        cpu: dict[int, CpuWindow] = {}
        try:
            wait_healthy(server, f"http://127.0.0.1:{port}", "rlfleet serve-policy",
                         log_path=tmp / "server.log")
            for b in BATCHES:
                bodies = [json.dumps({"obs": x.tolist()}).encode() for x in batches[b]]
                log(f"batch {b}: {args.seconds:g} s over HTTP...")
                window = CpuWindow({"server": server.pid}).start(time.perf_counter())
                lat, wall = over_http(port, token, bodies, args.seconds, args.warmup_s)
                cpu[b] = window.stop(time.perf_counter())
                log(f"  {cpu[b].describe()}")
                log(f"batch {b}: {args.seconds:g} s in process...")
                local, local_wall = timed(
                    lambda i, b=b: policy_actions(policy, batches[b][i % 8], True),
                    args.seconds, args.warmup_s)
                p50, p99 = percentiles(lat)
                l50, l99 = percentiles(local)
                figures[b] = {"p50": p50, "p99": p99, "per_s": b * len(lat) / wall,
                              "requests_per_s": len(lat) / wall, "in_p50": l50,
                              "in_p99": l99, "in_per_s": b * len(local) / local_wall}
        finally:
            code = stop_process(server)
        if code != 0:
            log(f"[red]rlfleet serve-policy exited with {code}[/]:\n"
                f"{(tmp / 'server.log').read_text()[-2000:]}")

    table = Table(title=f"POST /act: {cfg.algo.name} policy on {cfg.env.id}, one keep-alive "
                  "connection", caption=(
                      "in process: the same policy's forward pass in this process, no HTTP "
                      "(the ceiling); HTTP cost: p50 over HTTP minus p50 in process"))
    for col in ("batch", "p50 ms", "p99 ms", "actions/s", "requests/s", "in process p50 ms",
                "in process p99 ms", "in process actions/s", "HTTP cost ms", "server cores",
                "other processes' cores"):
        table.add_column(col, justify="right")
    for b, f in figures.items():
        table.add_row(str(b), fmt(f["p50"], ".3f"), fmt(f["p99"], ".3f"),
                      fmt(f["per_s"], ",.0f"), fmt(f["requests_per_s"], ",.0f"),
                      fmt(f["in_p50"], ".3f"), fmt(f["in_p99"], ".3f"),
                      fmt(f["in_per_s"], ",.0f"), fmt(f["p50"] - f["in_p50"], ".3f"),
                      fmt(cpu[b].cores("server"), ".2f"), fmt(cpu[b].others_cores(), ".2f"))
    out: dict = {}
    for b, f in figures.items():
        tail = "" if b == 1 else f"_{b}"
        out.update({f"act_p50_ms{tail}": rounded(f["p50"]), f"act_p99_ms{tail}": rounded(f["p99"]),
                    f"actions_per_s{tail}": rounded(f["per_s"], 0)})
    for b, f in figures.items():
        tail = "" if b == 1 else f"_{b}"
        out.update({f"inprocess_p50_ms{tail}": rounded(f["in_p50"], 4),
                    f"inprocess_p99_ms{tail}": rounded(f["in_p99"], 4),
                    f"inprocess_actions_per_s{tail}": rounded(f["in_per_s"], 0)})
    for b in figures:  # a busy machine shows here: the figures above are then lower
        tail = "" if b == 1 else f"_{b}"
        out[f"server_cores{tail}"] = rounded(cpu[b].cores("server"), 2)
        out[f"others_cores{tail}"] = rounded(cpu[b].others_cores(), 2)
    out.update({"env": cfg.env.id, "algo": cfg.algo.name, "policy_version": version,
                "threads": args.threads, "seconds": args.seconds,
                "server_exit_code": code})
    report(out, table)
    return 0


if __name__ == "__main__":
    run_main(main)
