"""The single-process runner: the same rollout, buffers, batching and policy code as the
cluster, wired by plain function calls. It is the baseline of `bench/time_to_solve.py` and
`bench/selfplay.py` (their ratio is the cost of distribution) and a quick way to try
hyperparameters.

As in the cluster, one policy object acts and another learns; the actor adopts the learner's
weights whenever the learner would publish a version. A config with a `league:` plays its
game with the battle rollout against a league kept in this process (`_LocalLeague`): the
same PFSP draws, snapshot rule and evaluation as the coordinator's, snapshots kept in a
temporary directory.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from rlfleet.coordinator.evaluation import battle_rates
from rlfleet.learner.feed.rollouts import concat_chunks
from rlfleet.learner.output.feedback import PriorityFeedback
from rlfleet.shared.algos.base import Policy
from rlfleet.shared.algos.capabilities import EpsilonGreedy
from rlfleet.shared.algos.registry import make_policy
from rlfleet.shared.algos.reward_model import with_reward_model
from rlfleet.shared.batching.arena import ChunkArena
from rlfleet.shared.batching.batching import assemble_from
from rlfleet.shared.batching.rows import batch_fields
from rlfleet.shared.batching.transforms import BatchTransforms
from rlfleet.shared.contract.codec import encode_weights
from rlfleet.shared.contract.config import ConfigError, apex_epsilon
from rlfleet.shared.contract.frames import pack, packable
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.contract.wire.evaluation import BattleOutcome
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.contract.wire.sampling import Consumed, SampleRequest
from rlfleet.shared.envs.make import make_vector_env, run_spec
from rlfleet.shared.infra.storage import DirectoryStorage, snapshot_blob
from rlfleet.shared.league.league import MAIN, League
from rlfleet.shared.league.matchmaking import as_opponent, eval_opponents, solved_by
from rlfleet.shared.replay.replay import Replay
from rlfleet.shared.rollout.battle import BattleRollout, OpponentPool, battle_evaluate
from rlfleet.shared.rollout.rollout import Rollout, evaluate
from rlfleet.shared.run.config import RunConfig

log = logging.getLogger("rlfleet.single_process")


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
    games: int | None = None  # self-play: games played
    # envs that report info["is_success"]: the last evaluation's share of successes
    eval_success: float | None = None
    # env_steps, train_iterations, return (, success, stochastic_return)
    evaluations: list[dict] = field(default_factory=list)


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
        # n-step returns, hindsight relabelling, per-buffer rewards, as the learner does
        self.transforms = (None if learner.on_policy
                           else BatchTransforms.from_config(cfg, seed=cfg.seed * 1009))

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
            batches = assemble_from(self.arena.columns, offsets, parts, grant,
                                    batch_fields(self.arena.columns),
                                    transforms=self.transforms)
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


class _LocalLeague:
    """The coordinator's league in this process: whom the next game meets, the games
    recorded, snapshots of the learner's weights, and evaluations by win rate."""

    def __init__(self, cfg: RunConfig, spec: EnvSpec, storage_dir: str) -> None:
        assert cfg.league is not None
        self.cfg = cfg
        self.league = League(cfg.league)
        self.rng = np.random.default_rng(cfg.seed * 7 + 11)
        self.storage = DirectoryStorage(storage_dir)
        self.pool = OpponentPool(cfg, spec, self.storage, cfg.seed)
        self.stop_reason: str | None = None
        self.games = 0

    def rollout(self, actor: Policy) -> BattleRollout:
        c = self.cfg.collector
        return BattleRollout(self.cfg, actor, self.pool,
                             lambda: as_opponent(self.league.pick_opponent(self.rng)),
                             c.chunk_size, c.mode, c.episodes_per_chunk, self.cfg.seed)

    def record(self, chunk) -> None:
        for game in chunk.games:
            self.league.record_game(MAIN, game.opponent, game.outcome)
        self.games += len(chunk.games)

    def maybe_snapshot(self, version: int, learner: Policy) -> None:
        if self.league.snapshot_due(version):
            self.storage.put_blob(snapshot_blob(version), encode_weights(
                learner.policy_state(), {"policy_version": str(version)}))
            self.league.add_snapshot(version)

    def evaluate(self, actor: Policy, seed: int) -> float:
        """Mean result (+1, 0, -1) of the evaluation games; sets `stop_reason` when the
        config's `stop_when` rules are met."""
        s = self.cfg.league
        assert s is not None
        opponents = eval_opponents(self.league)
        tallies = battle_evaluate(self.cfg, actor, self.pool, opponents,
                                  self.cfg.eval.episodes, seed, self.cfg.eval.num_envs)
        rates = battle_rates([BattleOutcome(opponent=t.opponent, first=t.first, win=t.win,
                                            draw=t.draw, loss=t.loss) for t in tallies])
        self.stop_reason = solved_by(s, rates, self.league.first_snapshot)
        log.info("evaluation: %s", "; ".join(
            f"vs {k} {v['win']:.3f}/{v['draw']:.3f}/{v['loss']:.3f}"
            for k, v in rates.items() if "/" in k))
        returns = [r for t in tallies for r in t.returns]
        return float(np.mean(returns)) if returns else 0.0


def check_single(cfg: RunConfig) -> None:
    """Refuse the settings this process would silently leave out of training (a
    `ConfigError` naming the field: exit 2), and warn of those it only does not log (it
    writes no run log)."""
    refused = {"coordinator.commander": (cfg.coordinator.commander,
                                         "runs no commander (its tasks have no env settings)"),
               "learner.hooks": (cfg.learner.hooks, "runs no learner hooks")}
    for name, (value, why) in refused.items():
        if value:
            raise ConfigError(f"{name}: `rlfleet single` {why}; train this config with "
                              "`rlfleet up`")
    ignored = {"logging.batch_log": cfg.logging.batch_log,
               "logging.histograms": cfg.logging.histograms,
               "logging.writers": cfg.logging.writers}
    for name, value in ignored.items():
        if value:
            log.warning("%s: `rlfleet single` writes no run log; it is ignored here", name)


def run_single(cfg: RunConfig, progress=None, league_dir: str | None = None,
               should_stop: Callable[[], bool] | None = None,
               on_evaluation: Callable[[dict], None] | None = None) -> SingleResult:
    """`league_dir`: where a self-play run keeps its snapshots (a temporary directory if
    None). `should_stop` is asked after each chunk (a stop signal, the Python API's lifeline):
    true ends the run there, unsolved. `on_evaluation` gets each evaluation's record as it is
    made."""
    if cfg.league is not None and league_dir is None:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="rlfleet-single-league-") as tmp:
            return run_single(cfg, progress, tmp, should_stop, on_evaluation)
    if any(b.kind == "dataset" for b in cfg.buffers.values()) or cfg.eval.dataset:
        raise ConfigError("buffers: `rlfleet single` reads no datasets; run an offline "
                          "config with `rlfleet up --collectors 0`")
    check_single(cfg)
    torch.set_num_threads(cfg.learner.torch_threads)  # as the learner would learn
    start = time.monotonic()
    spec = run_spec(cfg)
    games = _LocalLeague(cfg, spec, league_dir) if league_dir is not None else None
    envs = make_vector_env(cfg.env, cfg.env.num_envs, cfg.seed) if games is None else None
    eval_envs = (make_vector_env(cfg.env, cfg.eval.num_envs, cfg.seed + 10_000)
                 if games is None else None)
    actor = make_policy(cfg.algo, spec, cfg.seed)
    c = cfg.collector
    if c.epsilon_schedule == "apex" and isinstance(actor, EpsilonGreedy):
        # one actor: the cluster's first collector, Ape-X slot 0
        actor.set_epsilon(apex_epsilon(0, c.apex_slots, c.apex_eps, c.apex_alpha))
    # algo.reward_model: as in the learner service, the learning side rewrites rewards
    learner = with_reward_model(make_policy(cfg.algo, spec, cfg.seed), cfg.algo, spec,
                                cfg.seed)
    replay = Replay(cfg)  # the coordinator's buffers and rate limiters, called directly
    rollout: Rollout | BattleRollout = (
        games.rollout(actor) if games is not None
        else Rollout(envs, actor, c.chunk_size, c.mode, c.episodes_per_chunk))
    chunks: dict[str, dict[str, np.ndarray]] = {}
    trainer = _Trainer(cfg, replay, actor, learner, chunks)
    actor.load_policy(0, learner.policy_state())
    every = cfg.eval.every_env_steps or 0
    every_it = cfg.eval.every_train_iterations or 0
    next_eval, next_eval_it = every, every_it
    eval_return: float | None = None
    eval_success: float | None = None
    evaluations: list[dict] = []
    solved = False
    t195 = s195 = t_solved = s_solved = None
    while True:
        chunk = rollout.collect(rollout.env_steps)
        if chunk.obs_moments is not None:  # algo.obs_norm, as the learner service merges
            learner.merge_obs_stats(chunk.obs_moments)
        chunk_id = uuid.uuid4().hex
        # stacked frames kept once, as collectors store them (a 100k Atari replay would
        # otherwise hold 8 frames a step)
        chunks[chunk_id] = pack(chunk.arrays) if packable(chunk.arrays) else chunk.arrays
        _, dead = replay.insert([ChunkMeta(
            chunk_id=chunk_id, length=chunk.length, policy_version=chunk.policy_version,
            segments=chunk.segments)], learner.train_iterations)
        for gone in dead:
            chunks.pop(gone, None)
        trainer.train()
        steps = rollout.env_steps
        if games is not None:
            games.record(chunk)
            games.maybe_snapshot(trainer.version, learner)
        if (every and steps >= next_eval) or (every_it and learner.train_iterations
                                                >= next_eval_it):
            next_eval, next_eval_it = steps + every, learner.train_iterations + every_it
            if games is not None:
                eval_return = games.evaluate(actor, cfg.seed + steps)
            else:  # success too, where the env reports `info["is_success"]`
                done = evaluate(eval_envs, actor, cfg.eval.episodes, cfg.seed + steps,
                                max_steps=cfg.eval.max_steps,
                                info_keys=tuple(cfg.eval.info_keys),
                                return_key=cfg.eval.episode_return_key)
                eval_return, eval_success = float(np.mean(done.returns)), done.success_rate
            extra = {} if eval_success is None else {"success": eval_success}
            if games is None:
                extra["truncated"] = sum(done.truncated)
                extra.update({f"info/{k}": float(np.mean(known)) for k, v in done.infos.items()
                              if (known := [x for x in v if x is not None])})
            if games is None and cfg.eval.stochastic:
                # the exploring policy's episodes from the same seed, as a collector runs
                # them for the coordinator: the same evaluation work on both sides
                explored = evaluate(eval_envs, actor, cfg.eval.episodes, cfg.seed + steps,
                                    deterministic=False, max_steps=cfg.eval.max_steps,
                                    return_key=cfg.eval.episode_return_key)
                extra["stochastic_return"] = float(np.mean(explored.returns))
            evaluations.append({"env_steps": steps, "train_iterations": learner.train_iterations,
                                "return": eval_return, **extra})
            if on_evaluation:
                on_evaluation(evaluations[-1])
            if progress:
                progress(steps, learner.train_iterations, eval_return, time.monotonic() - start)
            if t195 is None and eval_return >= 195:
                t195, s195 = time.monotonic() - start, steps
            if (games is not None and games.stop_reason) or (
                    cfg.eval.stop_value is not None and eval_return >= cfg.eval.stop_value):
                solved = True
                t_solved, s_solved = time.monotonic() - start, steps
                break
        if cfg.stop.max_env_steps and steps >= cfg.stop.max_env_steps:
            break
        if cfg.stop.max_wall_s and time.monotonic() - start >= cfg.stop.max_wall_s:
            break
        if should_stop is not None and should_stop():
            break
    if envs is not None and eval_envs is not None:
        envs.close()
        eval_envs.close()
    return SingleResult(solved, t195, s195, eval_return, rollout.env_steps,
                        learner.train_iterations, trainer.version, time.monotonic() - start,
                        t_solved, s_solved, games.games if games is not None else None,
                        eval_success, evaluations)


def train_in_dir(cfg: RunConfig, run_dir: Path, progress=None) -> tuple[SingleResult, str]:
    """`rlfleet single --run-dir DIR`: the run with what `rlfleet up` leaves in a run
    directory, so that the Python API (`rlfleet.single(...)`) and the tools that read runs
    read it alike: `config.yaml` (the config trained, overrides applied), `metrics.jsonl`
    (each evaluation as it is made, under the cluster's `eval/...` keys) and `summary.json`.
    A stop signal or the API's lifeline ends it in order, with its summary ("interrupted").
    The result and its outcome: "solved", "stopped" (a budget ran out) or "interrupted"."""
    from rlfleet.shared.run.config import dump_config
    from rlfleet.shared.telemetry.rundata import JSONL_NAME
    from rlfleet.stopping import StopSignals

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg.model_dump(mode="json")))
    metrics = (run_dir / JSONL_NAME).open("a", encoding="utf-8")

    def record(evaluation: dict) -> None:
        row = {"scope": "eval", "step": evaluation["env_steps"], "wall_time": time.time(),
               "eval/train_iterations": float(evaluation["train_iterations"]),
               "eval/deterministic/return_mean": evaluation["return"]}
        if evaluation.get("success") is not None:
            row["eval/deterministic/success_rate"] = evaluation["success"]
        if evaluation.get("truncated") is not None:
            row["eval/deterministic/truncated"] = float(evaluation["truncated"])
        if evaluation.get("stochastic_return") is not None:
            row["eval/stochastic/return_mean"] = evaluation["stochastic_return"]
        metrics.write(json.dumps(row) + "\n")
        metrics.flush()

    signals = StopSignals.from_environment().install()
    try:
        res = run_single(cfg, progress, should_stop=lambda: signals.received,
                         on_evaluation=record)
    finally:
        signals.restore()
        metrics.close()
    outcome = "solved" if res.solved else "interrupted" if signals.received else "stopped"
    summary = {"solved": res.solved, "outcome": outcome, "eval_return": res.eval_return,
               "stop_value": cfg.eval.stop_value, "env_steps": res.env_steps,
               "train_iterations": res.train_iterations, "policy_version": res.policy_version,
               "wall_seconds": res.wall_seconds, "solved_s": res.solved_s,
               "solved_env_steps": res.solved_env_steps, "eval_success_rate": res.eval_success,
               "evaluations": len(res.evaluations), "mode": "single"}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return res, outcome


if __name__ == "__main__":  # quick manual runs: python -m rlfleet.single_process CONFIG [SEED]
    import sys

    from rlfleet.shared.run.config import load_config

    cfg = load_config(sys.argv[1])
    if len(sys.argv) > 2:
        cfg = cfg.with_overrides(seed=int(sys.argv[2]))
    res = run_single(cfg, progress=lambda s, i, r, t: print(f"{t:6.1f}s steps={s} it={i} "
                                                           f"eval={r:.1f}", flush=True))
    print(asdict(res))
