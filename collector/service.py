"""The collector service: run envs with the newest policy, write chunks, evaluate on request.

One loop thread does all env work (collection and evaluation take turns, so they never fight
over the core); the reporter thread of the adder and the agent's heartbeat thread only wait on
the network.

A storage outage never ends the loop: the adder holds chunks it could not write (collection
pauses when it holds `max_held_chunks`), and a policy check that fails keeps the policy at
hand until storage answers again. Nor does a coordinator outage (killed, restarting, restored
from its snapshot): every request to it that fails, however it fails on the wire, is an
`HttpError`, which the loop rides out, and the reporter keeps what it could not announce.

Start-up: torch takes 2-3 s to import, longer than everything else a collector does before its
first chunk. It loads in a background thread, once the first chunk is in (an import holds the
GIL, and a nicer thread holding it kept the registration and the first chunk waiting), or as
soon as the loop needs it. Where the algorithm
would itself act uniformly at random at the run's start (`random_warmup_steps`: the built-in
DQN from epsilon 1, before its first update), the loop does not wait for it: it acts uniformly
at random, its chunks saying policy version -1 (no published policy acted), until torch and
the real policy are there, as SB3's and Dopamine's random warm-up steps do. Anything else
(PPO: its chunks carry the acting policy's log-probs) waits for torch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from rlfleet.collector.adder import StorageAdder
from rlfleet.collector.rollout import Rollout, evaluate
from rlfleet.collector.saver import EpisodeSaver
from rlfleet.shared.algos.base import ActOutput, Policy
from rlfleet.shared.algos.registry import algo_spec, make_policy
from rlfleet.shared.contract.codec import encode_weights
from rlfleet.shared.contract.schemas import (
    API,
    BattleOutcome,
    ChunkReportResponse,
    CollectPermitRequest,
    CollectPermitResponse,
    CollectTask,
    EvalEpisodes,
    EvaluateTask,
    EvaluationReport,
    Opponent,
    Role,
    TaskAccepted,
    TaskEnvelope,
    VideoReport,
)
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.envs.make import make_vector_env, run_spec
from rlfleet.shared.infra.http import HttpError
from rlfleet.shared.infra.storage import (
    Storage,
    StorageError,
    evaluated_blob,
    open_storage,
    video_blob,
    video_gif_blob,
)
from rlfleet.shared.run.config import RunConfig
from rlfleet.shared.worker import WorkerService

if TYPE_CHECKING:
    from rlfleet.collector.battle import BattleRollout, OpponentPool
    from rlfleet.collector.weights import StorageWeightSource

log = logging.getLogger("rlfleet.collector")


def random_warmup_steps(cfg: RunConfig) -> int:
    """Env steps of the run (all collectors' together) during which a collector may act
    uniformly at random instead of waiting for torch: what the algorithm's spec says its
    own behaviour is then (`AlgoSpec.warmup`). 0 for a user's policy (its behaviour is
    unknown) and in a game (random moves must be legal ones: the policy masks)."""
    if cfg.algo.policy or cfg.league is not None:
        return 0
    return algo_spec(cfg.algo.name).warmup(cfg)


class EvaluationCrashed(Exception):
    """An evaluation raised (a user env failing in `step()`, say): the evaluation's task is
    what failed, and the crash is reported as one, not as the collect task's."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"evaluation {task_id} crashed")
        self.task_id = task_id


class RandomPolicy:
    """Uniform random actions, as no published policy (version -1): what a DQN collector
    acts with while torch loads (`random_warmup_steps`). Only `act` and `bootstrap` are ever
    called on it; evaluation waits for the real policy."""

    on_policy = False
    version = -1
    train_iterations = 0

    def __init__(self, spec: EnvSpec, seed: int) -> None:
        if not spec.discrete:
            raise ValueError("uniform random warm-up needs a discrete action space")
        self.n_actions = spec.n_actions
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray, env_step: int) -> ActOutput:
        return ActOutput(self.rng.integers(self.n_actions, size=obs.shape[0]))

    def bootstrap(self, obs: np.ndarray) -> None:
        return None


IMPORT_NICE = 10


def _nicer(steps: int) -> None:
    """Lower the calling thread's scheduling priority by `steps` (Linux: per thread; where
    that is not so or not allowed, nothing changes)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid)
                                                 + steps))
    except (AttributeError, OSError):
        pass


def _load_torch_library() -> None:
    """Map torch's main shared library before `import torch` does. An import holds the GIL
    throughout, and the dynamic loader's work on libtorch_cpu (a third of a second, more on a
    busy core) held up every other thread of the collector: on a nicer thread, its
    registration and first chunk waited behind a thread the scheduler kept waiting (a
    priority inversion). ctypes releases the GIL while it loads; the import then finds the
    library loaded. Nothing changes where it cannot be found."""
    import ctypes
    from importlib.util import find_spec

    spec = find_spec("torch")
    if spec is None or spec.origin is None:
        return
    path = os.path.join(os.path.dirname(spec.origin), "lib", "libtorch_cpu.so")
    if os.path.exists(path):
        with contextlib.suppress(OSError):  # the import will say what is wrong
            ctypes.CDLL(path)


class TorchLoader:
    """Imports torch (and what needs it) in a background thread, begun by `start` or `wait`,
    with one intra-op thread (shared with env stepping on a small machine, more threads only
    contend). `ready` is set when done; an import error is kept and raised by `wait`.

    The thread runs `IMPORT_NICE` steps nicer than the process (Linux sets niceness per
    thread): while the whole cluster starts on a small machine, the coordinator's start, this
    collector's registration and its first chunks should get the cores before 2-3 CPU seconds
    of importing torch that nothing needs yet."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._load, name="torch-import", daemon=True)
        self._started = threading.Lock()

    def start(self) -> None:
        """Begin loading (once; `wait` begins it too)."""
        with self._started:
            if self._thread.ident is None:
                self._thread.start()

    def _load(self) -> None:
        try:
            _nicer(IMPORT_NICE)
            _load_torch_library()
            import torch

            import rlfleet.collector.weights  # noqa: F401 - its import needs torch

            torch.set_num_threads(1)
        except BaseException as err:  # raised again on the loop's thread by wait()
            self.error = err
        finally:
            self.ready.set()

    def wait(self, timeout: float | None = None) -> bool:
        self.start()
        if not self.ready.wait(timeout):
            return False
        if self.error is not None:
            raise RuntimeError(f"importing torch failed: {self.error}") from self.error
        return True


class CollectorService(WorkerService):
    role = Role.COLLECTOR

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.task: CollectTask | None = None
        self._evals: queue.Queue[EvaluateTask] = queue.Queue()
        self._closing = threading.Event()
        self._loop: threading.Thread | None = None
        self._lock = threading.Lock()
        self.env_steps = 0
        self.policy_version = -1
        self.policy_loads = 0
        self.evaluations_run = 0
        self._video_off = False  # this env could not render: warned once, no more videos
        self.chunks_written = 0
        self.chunks_reported = 0
        self.adder: StorageAdder | None = None
        self._storage_out = False  # the policy check failed: log once per outage
        self.error: str | None = None
        self._t0 = time.monotonic()
        self.torch = TorchLoader()
        self.random_steps = 0  # env steps acted by RandomPolicy while torch loaded
        # self-play: whom the next games meet, as the coordinator assigns them
        self._opponents: deque[Opponent] = deque(maxlen=4096)
        self._last_opponent = Opponent(name="main", kind="main")
        self.games_played = 0
        self.evaluate_only = False  # collect nothing, only evaluate (--evaluate-only)
        self.saver: EpisodeSaver | None = None  # collector.save_to

    # -- tasks ------------------------------------------------------------------------------

    def accept(self, envelope: TaskEnvelope) -> TaskAccepted:
        task = envelope.task
        if isinstance(task, CollectTask):
            with self._lock:
                if self.task is None or self.task.task_id != task.task_id:
                    self._opponents.extend(task.opponents)
                self.task = task
                if self._loop is None:
                    self._loop = threading.Thread(target=self._run_guarded, name="collect",
                                                  daemon=True)
                    self._loop.start()
        elif isinstance(task, EvaluateTask):
            self._evals.put(task)
        else:
            return TaskAccepted(task_id=task.task_id, accepted=False)
        return TaskAccepted(task_id=task.task_id, accepted=True)

    def _task_id(self) -> str | None:
        return self.task.task_id if self.task else None

    def _on_answer(self, resp: ChunkReportResponse) -> None:
        self._opponents.extend(resp.opponents)

    def _next_opponent(self) -> Opponent:
        """The next assigned opponent; the last one again while none is queued (the answer
        that brings more is on its way)."""
        with contextlib.suppress(IndexError):
            self._last_opponent = self._opponents.popleft()
        return self._last_opponent

    # -- the loop ---------------------------------------------------------------------------

    def _run_guarded(self) -> None:
        try:
            self._run()
            if self.task:
                self.agent.end_task(self.task.task_id)
        except Exception as err:  # reported to the coordinator, then the process stops
            where = "collection"
            if isinstance(err, EvaluationCrashed):  # the evaluation's task is what failed
                where, err = f"evaluation {err.task_id}", err.__cause__ or err
            log.error("collector crashed in %s", where, exc_info=err)
            self.error = f"{type(err).__name__}: {err}"
            if where != "collection":
                self.agent.end_task(where.split(" ", 1)[1], f"evaluation crashed: {self.error}")
            if self.task:
                self.agent.end_task(self.task.task_id, f"collector crashed in {where}: "
                                    f"{self.error}" if where != "collection" else self.error)
            self.fail(err, where)

    def _config(self) -> RunConfig | None:
        """The run's config. The loop starts on a pushed task, which can come before the
        registration's answer that brings the config; if the coordinator died in between, the
        answer comes from its restarted process, however long that takes: no time limit to
        crash on, only closing (then None)."""
        while not self.configured.wait(0.5):
            if self._closing.is_set():
                return None
        return self.wait_config(0)

    def _run(self) -> None:
        cfg = self._config()
        if cfg is None:
            return
        assert self.task is not None
        # A short retry window: during an outage the adder holds chunks and the envs go on,
        # rather than the whole loop waiting inside one write.
        storage = open_storage(self.storage_url, cfg.name, max_retry_s=1.0)
        spec = run_spec(cfg)
        seed = self.task.seed
        battle = cfg.league is not None
        # Nothing to collect for: evaluations only (an offline run's evaluator, or a run
        # whose every buffer is a read-only dataset).
        evaluate_only = self.evaluate_only or not cfg.receiving_buffers
        envs = (None if battle or evaluate_only
                else make_vector_env(cfg.env, cfg.env.num_envs, seed))
        if cfg.collector.save_to and not evaluate_only:
            self.saver = EpisodeSaver(cfg.collector.save_to, self.agent.worker_id or "collector",
                                      cfg.env.num_envs, cfg.collector.mode)
        adder = StorageAdder(storage, self.agent.client, lambda: self.agent.worker_id,
                             self._task_id, cfg.collector.report_interval_s,
                             max_held_chunks=cfg.collector.max_held_chunks,
                             on_answer=self._on_answer if battle else None,
                             compression=cfg.collector.compression)
        # Where the run is (a restart mid-run): exploration goes on from there, and the
        # random warm-up, which belongs to the run's start, is not played again.
        if self.agent.info is not None:
            adder.global_env_steps = max(adder.global_env_steps, self.agent.info.env_steps)
        self.adder = adder
        if self._closing.is_set():  # closed while starting: an add() must not wait for room
            adder.halt()
        task = self.task
        warmup_steps = random_warmup_steps(cfg)
        # The real policy and its weight source once torch is there; until then, uniform
        # random actions where the algorithm allows (None: wait for torch).
        policy: Policy | RandomPolicy | None = (
            RandomPolicy(spec, seed) if warmup_steps and not self.torch.ready.is_set()
            else None)
        weights: StorageWeightSource | None = None
        rollout: Rollout | BattleRollout | None = None
        pool: OpponentPool | None = None
        eval_envs = None
        try:
            while not self._closing.is_set() and not adder.stop.is_set():
                if weights is None and (policy is None or self.torch.ready.is_set()
                                        or not self._evals.empty()
                                        or adder.global_env_steps >= warmup_steps
                                        or self.random_steps >= warmup_steps):
                    if not self.torch.wait(0.1):  # then look at closing again
                        continue
                    policy, weights = self._real_policy(cfg, spec, seed, storage)
                    if rollout is not None:
                        rollout.policy = policy
                        log.info("torch loaded: acting with the %s policy after %d env steps "
                                 "at random", cfg.algo.name, self.random_steps)
                assert policy is not None
                if battle and pool is None:
                    from rlfleet.collector.battle import BattleRollout, OpponentPool

                    pool = OpponentPool(cfg, spec, storage, seed)
                if rollout is None and battle and not evaluate_only:
                    assert pool is not None
                    rollout = BattleRollout(cfg, policy, pool, self._next_opponent,
                                            task.chunk_size, task.mode,
                                            task.episodes_per_chunk, seed)
                elif rollout is None and not evaluate_only:
                    assert envs is not None
                    rollout = Rollout(envs, policy, task.chunk_size, task.mode,
                                      task.episodes_per_chunk)
                while weights is not None and not self._evals.empty():
                    task = self._evals.get_nowait()
                    try:
                        if pool is not None:
                            self._evaluate_battles(cfg, task, policy, weights, pool, storage)
                            continue
                        if eval_envs is None or eval_envs.num_envs != task.num_envs:
                            eval_envs = make_vector_env(cfg.env, task.num_envs, task.seed)
                        self._evaluate(task, eval_envs, policy, weights, storage)
                    except Exception as err:
                        raise EvaluationCrashed(task.task_id) from err
                if evaluate_only:
                    self._closing.wait(0.05)
                    continue
                assert rollout is not None
                if adder.throttle.is_set() and not self._wait_for_permit(adder):
                    continue
                if weights is not None:
                    self._refresh(policy, weights)
                if rollout.bootstraps and policy.version < 0:
                    # On-policy data must carry the log-probs of a published policy.
                    self._closing.wait(0.05)
                    continue
                chunk = rollout.collect(max(adder.global_env_steps, rollout.env_steps))
                if isinstance(policy, RandomPolicy):
                    self.random_steps += len(chunk.arrays["reward"])
                if self.saver is not None:  # before the adder packs frames
                    self.saver.add(chunk.arrays)
                adder.add(chunk.arrays, chunk.policy_version, chunk.episode_returns,
                          chunk.episode_lengths, chunk.segments, chunk.timers,
                          chunk.episode_return_components, chunk.games,
                          chunk.opponents_skipped, chunk.obs_moments, chunk.episode_envs)
                self.games_played += len(chunk.games)
                if adder.chunks_reported:  # the first chunk is in: torch may have the GIL
                    self.torch.start()
                self.env_steps = rollout.env_steps
                self.chunks_written = adder.chunks_written
                self.chunks_reported = adder.chunks_reported
        finally:
            flushed = adder.close()
            self.chunks_reported = adder.chunks_reported
            log.info("drained: %d chunks written, %d reported%s", adder.chunks_written,
                     adder.chunks_reported, "" if flushed else " (the rest could not be sent)")
            if envs is not None:
                envs.close()
            if eval_envs is not None:
                eval_envs.close()
            if self.saver is not None:
                self.saver.close()
            storage.close()

    def _real_policy(self, cfg: RunConfig, spec: EnvSpec, seed: int, storage: Storage
                     ) -> tuple[Policy, StorageWeightSource]:
        """The config's policy and the source of its published weights (torch is loaded)."""
        import torch

        from rlfleet.collector.weights import StorageWeightSource

        torch.set_num_threads(1)  # this thread acts: say it here too, not only on the loader's
        weights = StorageWeightSource(storage, cfg.collector.policy_check_interval_s)
        return make_policy(cfg.algo, spec, seed), weights

    def _refresh(self, policy: Policy, weights: StorageWeightSource,
                 force: bool = False) -> None:
        try:
            got = weights.poll(policy.version, force=force)
        except StorageError as err:
            if not self._storage_out:
                log.warning("cannot check for a newer policy (going on with version %d "
                            "until storage answers): %s", policy.version, err)
            self._storage_out = True
            return
        if self._storage_out:
            log.info("storage answers again: policy checks resume")
            self._storage_out = False
        if got is not None:
            policy.load_policy(*got)
            self.policy_version = policy.version
            self.policy_loads += 1

    def _wait_for_permit(self, adder: StorageAdder) -> bool:
        """The coordinator said the learner is behind: wait until it has the answer to every
        chunk written here, then (blocking on its side) until collecting may go on. A permit
        lets one chunk in; the throttle stays until an answer lifts it. Returns False to let
        the loop look at evals and closing."""
        if not adder.flush(timeout=1.0):
            return False
        if not adder.throttle.is_set():  # the answer to the last chunk lifted it
            return True
        try:
            resp = self.agent.client.post(
                f"{API}/permits/collect",
                CollectPermitRequest(worker_id=self.agent.worker_id, wait_s=1.0),
                CollectPermitResponse, timeout_s=15)
        except HttpError as err:
            log.warning("permit request failed: %s", err)
            self._closing.wait(0.5)
            return False
        if resp.stop:
            adder.halt()
        return resp.granted

    def _evaluate(self, task: EvaluateTask, envs, policy: Policy,
                  weights: StorageWeightSource, storage: Storage) -> None:
        """Deterministic, then (if asked) stochastic episodes from the same seed, so the two
        figures differ only by how actions are chosen."""
        if policy.version < task.policy_version:
            self._refresh(policy, weights, force=True)
        runs = {}
        for deterministic in (True, False) if task.stochastic else (True,):
            done = evaluate(envs, policy, task.episodes, task.seed, deterministic)
            # successes only from envs that report them: the report of any other env is
            # what it always was
            known = any(s is not None for s in done.successes)
            runs["deterministic" if deterministic else "stochastic"] = EvalEpisodes(
                returns=done.returns, lengths=done.lengths,
                successes=done.successes if known else None)
        self.evaluations_run += 1
        try:
            video = self._record(task, policy, storage) if task.video else None
            storage.put_blob(evaluated_blob(task.task_id), encode_weights(
                policy.policy_state(), {"policy_version": str(policy.version)}))
            self.agent.client.post(f"{API}/evaluations", EvaluationReport(
                worker_id=self.agent.worker_id, task_id=task.task_id,
                policy_version=policy.version, video=video, **runs))
        except (HttpError, StorageError) as err:
            log.warning("could not report evaluation %s: %s", task.task_id, err)

    def _record(self, task: EvaluateTask, policy: Policy, storage: Storage
                ) -> VideoReport | None:
        """The video the evaluation asked for, in storage; None (and one warning per
        process) when this env cannot render or the video extra is missing."""
        cfg = self.wait_config()
        if cfg.eval.video is None or self._video_off:
            return None
        from rlfleet.collector.video import record  # imageio only where videos are recorded
        from rlfleet.shared.telemetry.video import VideoUnavailable

        try:
            rec = record(cfg.env, policy, cfg.eval.video, task.seed)
        except VideoUnavailable as err:
            self._video_off = True
            log.warning("no evaluation videos from this collector: %s", err)
            return None
        storage.put_blob(video_blob(task.task_id), rec.mp4)
        storage.put_blob(video_gif_blob(task.task_id), rec.gif)
        return VideoReport(frames=rec.frames, fps=cfg.eval.video.fps,
                           episodes=len(rec.returns), returns=rec.returns)

    def _evaluate_battles(self, cfg: RunConfig, task: EvaluateTask, policy: Policy,
                          weights: StorageWeightSource, pool: OpponentPool,
                          storage: Storage) -> None:
        """`task.episodes` games against each opponent from each seat, the policy greedy;
        the games are also the report's deterministic episodes (+1, 0, -1 each)."""
        from rlfleet.collector.battle import battle_evaluate

        if policy.version < task.policy_version:
            self._refresh(policy, weights, force=True)
        tallies = battle_evaluate(cfg, policy, pool, task.battles, task.episodes, task.seed,
                                  task.num_envs)
        returns = [r for t in tallies for r in t.returns]
        plies = [p for t in tallies for p in t.plies]
        self.evaluations_run += 1
        if not returns:
            log.warning("evaluation %s: no opponent could be loaded", task.task_id)
            self.agent.end_task(task.task_id, "no evaluation opponent could be loaded")
            return
        try:
            storage.put_blob(evaluated_blob(task.task_id), encode_weights(
                policy.policy_state(), {"policy_version": str(policy.version)}))
            self.agent.client.post(f"{API}/evaluations", EvaluationReport(
                worker_id=self.agent.worker_id, task_id=task.task_id,
                policy_version=policy.version,
                deterministic=EvalEpisodes(returns=returns, lengths=plies),
                battles=[BattleOutcome(opponent=t.opponent, first=t.first, win=t.win,
                                       draw=t.draw, loss=t.loss) for t in tallies]))
        except (HttpError, StorageError) as err:
            log.warning("could not report evaluation %s: %s", task.task_id, err)

    # -- reporting --------------------------------------------------------------------------

    def heartbeat_status(self) -> dict[str, float]:
        held, failures = self._storage_counters()
        return {"env_steps": float(self.env_steps), "policy_version": float(self.policy_version),
                "chunks_held": float(held), "write_failures": float(failures)}

    def _storage_counters(self) -> tuple[int, int]:
        """(chunks held, failed writes) of the adder, read live: while storage is down the
        loop may be waiting inside `add()` for room."""
        adder = self.adder
        return (adder.chunks_held, adder.write_failures) if adder else (0, 0)

    def status(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        held, failures = self._storage_counters()
        return {"task_id": self._task_id(), "env_steps": self.env_steps,
                "env_steps_per_s": round(self.env_steps / elapsed, 1),
                "policy_version": self.policy_version, "policy_loads": self.policy_loads,
                "chunks_written": self.chunks_written, "chunks_reported": self.chunks_reported,
                "chunks_held": held, "write_failures": failures,
                "evaluations": self.evaluations_run, "error": self.error,
                "random_warmup_env_steps": self.random_steps,
                "games_played": self.games_played}

    def on_run_stopped(self) -> None:
        self._closing.set()
        self._halt_adder()

    def close(self) -> None:
        self._closing.set()
        self._halt_adder()
        if self._loop is not None:
            self._loop.join(timeout=15)
        super().close()

    def _halt_adder(self) -> None:
        """Wake the loop if it waits in `add()` for room while storage is down."""
        adder = self.adder
        if adder is not None:
            adder.halt()
