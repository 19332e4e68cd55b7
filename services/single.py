"""The single-process runner: the same rollout, buffers, batching and policy code as the
cluster, wired by plain function calls. It is the baseline of `bench/time_to_solve.py` (their
ratio is the cost of distribution) and a quick way to try hyperparameters.

As in the cluster, one policy object acts and another learns; the actor adopts the learner's
weights whenever the learner would publish a version.
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
from learner.feedback import PriorityFeedback
from learner.rollouts import concat_chunks
from shared.algos.base import Policy, make_policy
from shared.config import RunConfig
from shared.envs import env_spec, make_vector_env
from shared.schemas import ChunkMeta, Consumed, SampleRequest


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
    solved_s: float | None = None
    solved_env_steps: int | None = None


class _Trainer:
    """Everything between the rollout and the actor's weights, for one algorithm family."""

    def __init__(self, cfg: RunConfig, replay: Replay, actor: Policy, learner: Policy,
                 chunks: dict[str, dict[str, np.ndarray]]) -> None:
        self.cfg, self.replay, self.actor, self.learner = cfg, replay, actor, learner
        self.chunks = chunks
        self.version = 0
        self.request = SampleRequest(worker_id="single", batch_size=cfg.algo.batch_size,
                                     num_batches=cfg.learner.batches_per_request)
        self.plan = replay.plan(self.request)
        # The learner's arena, fed from memory instead of storage: the same batching code.
        self.arena = ChunkArena(lambda ids: [chunks[c] for c in ids], cfg.learner.chunk_cache)
        self.pending: list[str] = []
        self.queue = cfg.learner.mix[0].buffer

    def publish(self) -> None:
        self.version += 1
        self.actor.load_policy(self.version, self.learner.policy_state())

    def train(self) -> None:
        """Train as much as the buffers allow, exactly as the cluster's learner would."""
        if self.learner.on_policy:
            self._train_on_policy()
        else:
            self._train_off_policy()

    def _train_off_policy(self) -> None:
        replay, learner = self.replay, self.learner
        while (grant := replay.grantable(self.plan, self.request.num_batches)) > 0:
            chunk_ids, parts, _ = replay.sample(self.plan, grant, learner.train_iterations,
                                                self.version)
            offsets = self.arena.offsets(chunk_ids)  # may (re)allocate columns: call first
            batches = assemble_from(self.arena.columns, offsets, parts, grant)
            feedback = PriorityFeedback()
            for batch in batches:
                out = learner.learn(batch.data, batch.weights)
                if batch.item_refs and out.priorities is not None:
                    feedback.add(batch, out.priorities)
                if learner.train_iterations % self.cfg.learner.publish_every == 0:
                    self.publish()
            replay.update_priorities(feedback.take())

    def _train_on_policy(self) -> None:
        replay, learner = self.replay, self.learner
        while replay.grantable(self.plan, 64) > 0:
            chunk_ids, _, dead = replay.sample(self.plan, 64, learner.train_iterations,
                                               self.version)
            for gone in dead:
                self.chunks.pop(gone, None)
            self.pending += chunk_ids
        rows = sum(len(self.chunks[c]["reward"]) for c in self.pending)
        if rows < self.cfg.algo.rollout_size:
            return
        learner.learn(concat_chunks([self.chunks[c] for c in self.pending]))
        self.publish()
        dead = replay.consume([Consumed(buffer=self.queue, chunk_ids=self.pending)])
        for gone in dead:
            self.chunks.pop(gone, None)
        self.pending = []


def run_single(cfg: RunConfig, progress=None) -> SingleResult:
    torch.set_num_threads(1)
    start = time.monotonic()
    spec = env_spec(cfg.env)
    envs = make_vector_env(cfg.env, cfg.env.num_envs, cfg.seed)
    eval_envs = make_vector_env(cfg.env, cfg.eval.num_envs, cfg.seed + 10_000)
    actor = make_policy(cfg.algo, spec, cfg.seed)
    learner = make_policy(cfg.algo, spec, cfg.seed)
    replay = Replay(cfg)  # the coordinator's buffers and rate limiters, called directly
    c = cfg.collector
    rollout = Rollout(envs, actor, c.chunk_size, c.mode, c.episodes_per_chunk)
    chunks: dict[str, dict[str, np.ndarray]] = {}
    trainer = _Trainer(cfg, replay, actor, learner, chunks)
    actor.load_policy(0, learner.policy_state())
    every = cfg.eval.every_env_steps or 0
    every_it = cfg.eval.every_train_iterations or 0
    next_eval, next_eval_it = every, every_it
    eval_return: float | None = None
    solved = False
    t195 = s195 = t_solved = s_solved = None
    while True:
        chunk = rollout.collect(rollout.env_steps)
        chunk_id = uuid.uuid4().hex
        chunks[chunk_id] = chunk.arrays
        _, dead = replay.insert([ChunkMeta(
            chunk_id=chunk_id, length=chunk.length, policy_version=chunk.policy_version,
            segments=chunk.segments)], learner.train_iterations)
        for gone in dead:
            chunks.pop(gone, None)
        trainer.train()
        steps = rollout.env_steps
        if (every and steps >= next_eval) or (every_it and learner.train_iterations
                                                >= next_eval_it):
            next_eval, next_eval_it = steps + every, learner.train_iterations + every_it
            returns, _ = evaluate(eval_envs, actor, cfg.eval.episodes, cfg.seed + steps)
            eval_return = float(np.mean(returns))
            if progress:
                progress(steps, learner.train_iterations, eval_return, time.monotonic() - start)
            if t195 is None and eval_return >= 195:
                t195, s195 = time.monotonic() - start, steps
            if cfg.eval.stop_value is not None and eval_return >= cfg.eval.stop_value:
                solved = True
                t_solved, s_solved = time.monotonic() - start, steps
                break
        if cfg.stop.max_env_steps and steps >= cfg.stop.max_env_steps:
            break
        if cfg.stop.max_wall_s and time.monotonic() - start >= cfg.stop.max_wall_s:
            break
    envs.close()
    eval_envs.close()
    return SingleResult(solved, t195, s195, eval_return, rollout.env_steps,
                        learner.train_iterations, trainer.version, time.monotonic() - start,
                        t_solved, s_solved)


if __name__ == "__main__":  # quick manual runs: python -m services.single CONFIG [SEED]
    import sys

    from shared.config import load_config

    cfg = load_config(sys.argv[1])
    if len(sys.argv) > 2:
        cfg = cfg.with_overrides(seed=int(sys.argv[2]))
    res = run_single(cfg, progress=lambda s, i, r, t: print(f"{t:6.1f}s steps={s} it={i} "
                                                           f"eval={r:.1f}", flush=True))
    print(asdict(res))
