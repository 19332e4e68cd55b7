"""The single-process runner: the same rollout, buffer, batching and DQN code as the cluster,
wired by plain function calls. It is the baseline of `bench/time_to_solve.py` (their ratio is
the cost of distribution) and a quick way to try hyperparameters.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass

import numpy as np
import torch

from collector.rollout import Rollout, evaluate
from coordinator.replay import Replay
from learner.arena import ChunkArena
from learner.batching import assemble_from
from learner.dqn import DQNLearner
from learner.feedback import PriorityFeedback
from shared.config import RunConfig
from shared.envs import env_spec, make_vector_env
from shared.policies import DQNPolicy, linear_epsilon
from shared.schemas import ChunkMeta, SampleRequest


@dataclass
class SingleResult:
    solved: bool
    solved_195_s: float | None
    solved_195_env_steps: int | None
    eval_return: float | None
    env_steps: int
    train_iterations: int
    policy_version: int
    wall_seconds: float


def run_single(cfg: RunConfig, progress=None) -> SingleResult:
    torch.set_num_threads(1)
    start = time.monotonic()
    algo, spec = cfg.algo, env_spec(cfg.env)
    envs = make_vector_env(cfg.env, cfg.env.num_envs, cfg.seed)
    eval_envs = make_vector_env(cfg.env, cfg.eval.num_envs, cfg.seed + 10_000)
    policy = DQNPolicy(spec, algo.hidden_sizes, seed=cfg.seed)
    learner = DQNLearner(algo, spec, seed=cfg.seed)
    replay = Replay(cfg)  # the coordinator's buffers and rate limiters, called directly
    rollout = Rollout(envs, policy, cfg.collector.chunk_size)
    chunks: dict[str, dict[str, np.ndarray]] = {}
    request = SampleRequest(worker_id="single", batch_size=algo.batch_size,
                            num_batches=cfg.learner.batches_per_request)
    plan = replay.plan(request)
    # The learner's arena, fed from memory instead of storage: the same batching code.
    arena = ChunkArena(lambda ids: [chunks[c] for c in ids], cfg.learner.chunk_cache)
    version = 0
    policy.load(version, learner.policy_state())
    next_eval = cfg.eval.every_env_steps
    eval_return: float | None = None
    solved = False
    t195: float | None = None
    s195: int | None = None
    while True:
        eps = linear_epsilon(rollout.env_steps, algo.eps_start, algo.eps_end, algo.eps_decay_steps)
        chunk = rollout.collect(eps)
        chunk_id = uuid.uuid4().hex
        chunks[chunk_id] = chunk.arrays
        _, dead = replay.insert([ChunkMeta(
            chunk_id=chunk_id, length=chunk.length, policy_version=chunk.policy_version,
            segments=chunk.segments)], learner.train_iterations)
        for gone in dead:
            chunks.pop(gone, None)
        # Train as much as the rate limiter allows, exactly as the cluster's learner would.
        while (grant := replay.grantable(plan, request.num_batches)) > 0:
            chunk_ids, parts, _ = replay.sample(plan, grant, learner.train_iterations, version)
            offsets = arena.offsets(chunk_ids)  # may (re)allocate arena.columns: call first
            batches = assemble_from(arena.columns, offsets, parts, grant)
            feedback = PriorityFeedback()
            for batch in batches:
                result = learner.update(batch.data, batch.weights)
                if batch.item_refs:
                    feedback.add(batch, result.td_abs)
                if learner.train_iterations % cfg.learner.publish_every == 0:
                    version += 1
                    policy.load(version, learner.policy_state())
            replay.update_priorities(feedback.take())
        steps = rollout.env_steps
        if steps >= next_eval:
            next_eval += cfg.eval.every_env_steps
            returns, _ = evaluate(eval_envs, policy, cfg.eval.episodes, cfg.seed + steps)
            eval_return = float(np.mean(returns))
            if progress:
                progress(steps, learner.train_iterations, eval_return, time.monotonic() - start)
            if t195 is None and eval_return >= 195:
                t195, s195 = time.monotonic() - start, steps
            if cfg.eval.stop_value is not None and eval_return >= cfg.eval.stop_value:
                solved = True
                break
        if cfg.stop.max_env_steps and steps >= cfg.stop.max_env_steps:
            break
        if cfg.stop.max_wall_s and time.monotonic() - start >= cfg.stop.max_wall_s:
            break
    envs.close()
    eval_envs.close()
    return SingleResult(solved, t195, s195, eval_return, rollout.env_steps,
                        learner.train_iterations, version, time.monotonic() - start)


if __name__ == "__main__":  # quick manual runs: python -m services.single CONFIG [SEED]
    import sys

    from shared.config import load_config

    cfg = load_config(sys.argv[1])
    if len(sys.argv) > 2:
        cfg = cfg.with_overrides(seed=int(sys.argv[2]))
    res = run_single(cfg, progress=lambda s, i, r, t: print(f"{t:6.1f}s steps={s} it={i} "
                                                           f"eval={r:.1f}", flush=True))
    print(asdict(res))
