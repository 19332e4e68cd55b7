"""The Nature CNN learning on a GPU: in one process (the ceiling) against the same learner in a
cluster, fed from storage through its data process; and the same updates on the CPU.

Cases: DQN at batch 32 and at batch 256 (configs/pong-dqn.yaml's network and settings), and
PPO-Atari at minibatch 256 (configs/pong-ppo.yaml's network, 4 epochs over 1,024-row
rollouts: 16 updates a rollout).

(a) Ceiling, per case: the policy on the device (`learner.device: auto`, fp32) learning in
    this process from batches already on the device, cycled; updates/s over `--seconds`
    after a warm-up, the device synchronised at both ends.
(b) CPU: the same loop on the CPU, with as many torch threads as this process may use.
(c) Cluster, DQN cases: a coordinator (`LocalCluster`) with a replay buffer prefilled, as a
    collector would fill it (`bench.common.prefill`), with `--transitions` frame-stacked
    84x84 transitions made up here (each frame stored once, as collectors store Atari
    frames; no emulator is needed to make them, the learner only reads the env's spaces).
    One `rlfleet learner` process trains on what the coordinator samples; updates/s are the
    coordinator's train-iteration counter over `--seconds` after `--warmup`.
    `learner_utilisation_gpu` is (c) / (a). The learner's `/status` gives the GPU's own
    shares of its time (CUDA events around each update, `learner/feed/staging.py`): busy in
    updates, and waiting between them for data (`gpu_wait_fraction`). The on-policy PPO case
    is measured in-process only here; a PPO cluster's figures come from a `rlfleet up` run
    with collectors.

On a machine without CUDA, every figure is measured on the CPU (the cluster's learner too)
and the table says that no GPU was found; the GPU's shares are then the CPU learner's own
(its training thread waiting for batches, or learning), and device/CPU is 1.
Goals: `learner_utilisation_gpu` >= 0.9, `gpu_wait_fraction` <= 0.05.

    python -m bench.gpu [--seconds 20] [--warmup 8] [--transitions 30000] [--short]

The last line of stdout is one JSON object: `device`, `learner_utilisation_gpu` and
`gpu_wait_fraction` (the DQN batch-32 case), and per case its updates/s on the device, on the
CPU and in the cluster.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from rich.table import Table

from bench.common import (
    REPO_ROOT,
    clear_storage,
    coordinator_up,
    fmt,
    free_running_data,
    log,
    parse_args,
    prefill,
    ratio,
    report,
    rounded,
    run_main,
    wait_for,
    worker_status,
    write_yaml,
)
from rlfleet.local.launcher import LocalCluster
from rlfleet.shared.algos.device import resolve_device
from rlfleet.shared.algos.dqn import DQN
from rlfleet.shared.algos.ppo import PPO
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.run.config import load_config, parse_config

PONG = EnvSpec(obs_shape=(4, 84, 84), n_actions=6)
STACK, FRAME = 4, (84, 84)
CHUNK_ROWS = 1_000
PPO_ROLLOUT = 1_024
CASES = ("dqn-32", "dqn-256", "ppo-256")
GOALS = {"learner_utilisation_gpu": 0.9, "gpu_wait_fraction": 0.05}
FIGURES = ("device", "learner_utilisation_gpu", "gpu_wait_fraction", "gpu_busy_fraction",
           "cases")
SHORT = {"seconds": 1.0, "warmup": 1.0, "transitions": 1_000, "cpu_seconds": 0.5,
         "cluster_batches": "32"}


# -- made-up Atari transitions ---------------------------------------------------------------

def packed_chunk(rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One collector chunk of a frame-stacked run, each frame once (`shared/contract/
    frames.py`): row t's obs is frames t..t+3, its next_obs frames t+1..t+4."""
    frames = rng.integers(0, 256, (rows + STACK, *FRAME), dtype=np.uint8)
    index = (np.arange(rows)[:, None] + np.arange(STACK)[None, :]).astype(np.int32)
    terminated = rng.random(rows) < 0.001
    cut = terminated.copy()
    cut[-1] = True
    # a row column first: `prefill` takes a chunk's length from its first array
    return {"action": rng.integers(0, PONG.n_actions, rows, dtype=np.int64),
            "frames": frames, "obs_frames": index, "next_obs_frames": index + 1,
            "reward": rng.choice(np.array([-1.0, 0.0, 1.0], np.float32), rows),
            "terminated": terminated, "truncated": np.zeros(rows, bool), "cut": cut}


def chunks(transitions: int, seed: int) -> Iterator[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    for start in range(0, transitions, CHUNK_ROWS):
        yield packed_chunk(min(CHUNK_ROWS, transitions - start), rng)


def dqn_batches(batch: int, device: torch.device, count: int = 4
                ) -> list[dict[str, torch.Tensor]]:
    rng = np.random.default_rng(batch)
    out = []
    for _ in range(count):
        obs = rng.integers(0, 256, (batch, STACK + 1, *FRAME), dtype=np.uint8)
        out.append({"obs": torch.from_numpy(obs[:, :-1].copy()).to(device),
                    "next_obs": torch.from_numpy(obs[:, 1:].copy()).to(device),
                    "action": torch.from_numpy(rng.integers(0, 6, batch)).to(device),
                    "reward": torch.from_numpy(rng.random(batch, dtype=np.float32)).to(device),
                    "terminated": torch.from_numpy(rng.random(batch) < 0.01).to(device)})
    return out


def ppo_rollout(device: torch.device) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(7)
    n = PPO_ROLLOUT
    cut = np.zeros(n, bool)
    cut[127::128] = True
    cols = {"obs": rng.integers(0, 256, (n, STACK, *FRAME), dtype=np.uint8),
            "action": rng.integers(0, 6, n), "reward": rng.random(n, dtype=np.float32),
            "terminated": np.zeros(n, bool), "cut": cut,
            "log_prob": np.full(n, -1.79, np.float32), "value": np.zeros(n, np.float32),
            "bootstrap_value": np.where(cut, 0.1, 0.0).astype(np.float32)}
    return {k: torch.from_numpy(v).to(device) for k, v in cols.items()}


# -- (a), (b): one process ---------------------------------------------------------------------

def configs() -> tuple[dict, dict]:
    dqn = load_config(REPO_ROOT / "configs" / "pong-dqn.yaml").algo
    ppo = load_config(REPO_ROOT / "configs" / "pong-ppo.yaml").algo
    return dqn, ppo


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def in_process(case: str, device: torch.device, seconds: float) -> float:
    """Updates/s of `case` learning in this process on `device`, data already there."""
    dqn_cfg, ppo_cfg = configs()
    algo, batch = case.split("-")
    if algo == "dqn":
        policy = DQN(dqn_cfg.model_copy(update={"batch_size": int(batch)}), PONG, seed=0)
        policy.to(device)
        batches = dqn_batches(int(batch), device)

        def step() -> None:
            policy.learn(next(cycle))
        cycle = itertools.cycle(batches)
    else:
        policy = PPO(ppo_cfg.model_copy(update={"batch_size": int(batch), "epochs": 4}),
                     PONG, seed=0)
        policy.to(device)
        rollout = ppo_rollout(device)

        def step() -> None:
            policy.learn(rollout)
    for _ in range(2):  # warm-up: cuDNN picks its kernels, the allocator fills
        step()
    sync(device)
    start = policy.train_iterations
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
    sync(device)
    return (policy.train_iterations - start) / (time.perf_counter() - t0)


# -- (c): the cluster --------------------------------------------------------------------------

def cluster_config(work: Path, batch: int, transitions: int, storage: str) -> Path:
    data = free_running_data(REPO_ROOT / "configs" / "pong-dqn.yaml",
                             f"bench-gpu-{os.getpid()}-{batch}", storage, epsilon=0.05)
    data["algo"]["batch_size"] = batch
    data["learner"].update(device="auto", batches_per_request=16 if batch >= 256 else 32,
                           torch_threads=min(4, os.cpu_count() or 1))
    for buffer in data["buffers"].values():
        buffer["capacity"] = max(int(buffer["capacity"]), transitions)
        buffer["rate_limit"]["min_size"] = min(1_000, transitions)
    data["checkpoint"]["every_train_iterations"] = 10**12
    return write_yaml(work / f"config-{batch}.yaml", parse_config(data, "bench"))


def in_cluster(work: Path, batch: int, args: argparse.Namespace) -> dict:
    storage = str(work / f"storage-{batch}")
    config = cluster_config(work, batch, args.transitions, storage)
    name = load_config(config).name
    try:
        with coordinator_up(LocalCluster(config, work / f"run-{batch}", storage)) as run:
            log(f"batch {batch}: prefilling {args.transitions:,} made-up Pong transitions...")
            prefill(run.coordinator.url, storage, name, chunks(args.transitions, batch))
            learner = run.cluster.add_learner()

            def trained() -> bool:
                if learner.proc.poll() is not None:
                    raise RuntimeError(f"the learner did not train: {learner.tail(12)}")
                return run.counter("train_iterations") > 0

            wait_for(trained, 180, "train iteration")
            time.sleep(args.warmup)
            i0, t0 = run.counter("train_iterations"), time.perf_counter()
            before = worker_status(learner).get("timers") or {}
            time.sleep(args.seconds)
            # The learner's timers move when it reports; on a crowded machine a short window
            # can end before they have: wait for them to (10 s at most), not a null figure.
            late = time.monotonic() + 10
            while True:
                i1, t1 = run.counter("train_iterations"), time.perf_counter()
                status = worker_status(learner)
                after = status.get("timers") or {}
                if after != before or time.monotonic() > late:
                    break
                time.sleep(0.5)
            device = status.get("device") or {}
            waited, learned = (after.get(k, 0.0) - before.get(k, 0.0)
                               for k in ("wait_s", "update_s"))
            return {"updates_per_s": (i1 - i0) / (t1 - t0), "device": device.get("device"),
                    "gpu_wait_fraction": device.get("gpu_wait_fraction"),
                    "gpu_busy_fraction": device.get("gpu_busy_fraction"),
                    # the training thread's share of the window spent waiting for batches
                    "wait_share": ratio(waited, waited + learned),
                    "staging": device.get("staging")}
    finally:
        clear_storage(storage, name)


# -- report --------------------------------------------------------------------------------------

def table(device: torch.device, label: str, rows: dict[str, dict]) -> Table:
    t = Table(title=f"Nature CNN updates/s on {label}")
    for col in ("case", "in-process (ceiling)", "cluster", "utilisation", "GPU wait",
                "GPU busy", "CPU", "device / CPU"):
        t.add_column(col, justify="right" if col != "case" else "left")
    for case, r in rows.items():
        t.add_row(case, fmt(r["ceiling"], ",.1f"), fmt(r.get("cluster"), ",.1f"),
                  fmt(r.get("utilisation"), ".3f", f" (>= {GOALS['learner_utilisation_gpu']})"
                      if r.get("utilisation") is not None else ""),
                  fmt(r.get("gpu_wait_fraction"), ".3f"), fmt(r.get("gpu_busy_fraction"),
                                                              ".3f"),
                  fmt(r["cpu"], ",.1f"), fmt(r.get("speedup"), ".1f", "x"))
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--cpu-seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--transitions", type=int, default=30_000)
    parser.add_argument("--cluster-batches", default="32,256",
                        help="DQN batch sizes measured in a cluster (comma-separated)")
    args = parse_args(parser, argv, SHORT)
    device = resolve_device("auto")
    gpu = device.type == "cuda"
    label = (f"{torch.cuda.get_device_name(device)} ({device})" if gpu
             else "the CPU: no GPU was found")
    log(f"device: {label}; torch {torch.__version__}")
    if gpu:  # as a learner runs: TF32 where torch allows it by default
        torch.backends.cudnn.benchmark = True
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    rows: dict[str, dict] = {}
    for case in CASES:
        torch.set_num_threads(threads)
        cpu = in_process(case, torch.device("cpu"), args.cpu_seconds)
        ceiling = in_process(case, device, args.seconds) if gpu else cpu
        rows[case] = {"ceiling": ceiling, "cpu": cpu, "speedup": ratio(ceiling, cpu)}
        log(f"{case}: {ceiling:,.1f} updates/s on {device}, {cpu:,.1f} on the CPU "
            f"({threads} threads)")
    work = Path(tempfile.mkdtemp(prefix="rlfleet-gpu-"))
    try:
        for batch in (int(b) for b in args.cluster_batches.split(",")):
            case = f"dqn-{batch}"
            got = in_cluster(work, batch, args)
            r = rows[case]
            wait, busy = got["gpu_wait_fraction"], got["gpu_busy_fraction"]
            if not gpu and got["wait_share"] is not None:  # the CPU is the learner's device
                wait, busy = got["wait_share"], 1.0 - got["wait_share"]
            r.update(cluster=got["updates_per_s"], utilisation=ratio(got["updates_per_s"],
                                                                     r["ceiling"]),
                     gpu_wait_fraction=wait, gpu_busy_fraction=busy,
                     learner_device=got["device"], staging=got["staging"],
                     wait_share=got["wait_share"])
            log(f"{case} in a cluster: {got['updates_per_s']:,.1f} updates/s on "
                f"{got['device']}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    head = rows["dqn-32"]
    report({"device": label, "learner_utilisation_gpu": rounded(head.get("utilisation")),
            "gpu_wait_fraction": rounded(head.get("gpu_wait_fraction")),
            "gpu_busy_fraction": rounded(head.get("gpu_busy_fraction")),
            "cases": {case: {k: (rounded(v, 3) if isinstance(v, float) else v)
                             for k, v in r.items() if k != "staging"}
                      for case, r in rows.items()},
            "goals": GOALS, "torch": torch.__version__}, table(device, label, rows))
    return 0


if __name__ == "__main__":
    run_main(main)
