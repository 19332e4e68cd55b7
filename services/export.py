"""`rlfleet export RUN_DIR --out DIR`: a run's collected data as a Minari dataset.

Three sources:
- `saved`: the episodes the run's buffer saver wrote (`collector.save_to`), every whole
  episode every collector made, in order;
- `snapshot`: the chunks a buffer snapshot in the run's storage refers to. Chunks cut
  episodes anywhere, so only the episodes wholly inside one chunk are exported: a run of rows
  that ends done and starts right after another episode's end (or, for chunks cut by
  episodes, every run).
- `policy`: episodes played now by the run's best-evaluated policy (`best_policy` in the run
  directory), acting as it did when collecting (DQN: epsilon at its final value), or with
  `--greedy` as it is evaluated deterministically: the expert dataset of a solved run, as
  many episodes as asked, where a run that stopped on solving collected only a few at its end.
  `--checkpoint N` plays them with the policy of the learner's checkpoint at train iteration
  N instead (`rlfleet checkpoints RUN_DIR` lists them), and implies `--source policy`.
`auto` takes the first of them, in that order, that holds a whole episode, so every kind of
run gives a dataset: an on-policy run's queue keeps no whole episodes and saves none, and
its dataset is then rolled out from its best policy (`Exported.origin` says so).
`--min-return` and `--max-return` keep the episodes that scored within them, and `--limit N`
the first N of those: an expert dataset from a run that learned along the way, or its first,
random episodes (`minari.combine_datasets` joins the two into one of mixed quality).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlfleet.collector.saver import as_episode, read_saved, run_rows
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.data.datasets import write_minari
from rlfleet.shared.infra.storage import open_storage
from rlfleet.shared.run.config import RunConfig, read_run_config

if TYPE_CHECKING:
    from rlfleet.shared.algos.base import Policy


# The env step a trained policy acts at "as when collecting": past every exploration schedule
# (DQN: epsilon at its final value).
COLLECTING_ENV_STEP = 2**62
BEST_POLICY_FILE = "best_policy.safetensors"  # in the run dir: the run's result


SOURCES = ("saved", "snapshot", "policy")  # the order `auto` tries them in
Episodes = Iterable[dict[str, np.ndarray]]


@dataclass
class Exported:
    path: Path
    dataset_id: str
    episodes: int
    steps: int
    source: str  # one of SOURCES
    mean_return: float
    origin: str = ""  # where the episodes came from, in words
    passed_over: list[str] = field(default_factory=list)  # auto: why earlier sources gave none


def _runs(arrays: dict[str, np.ndarray], whole_chunks: bool, envs: int = 1
          ) -> Iterator[dict[str, np.ndarray]]:
    """The whole episodes of one unpacked chunk. A chunk cut by samples is env-major: `envs`
    blocks of as many rows, one per env of the collector's vector env. A run in it is a
    whole episode when it ends done and starts right after an episode's end *in its own
    env's block*: the row before a block's first row is another env's, and its end says
    nothing of where this env's episode began (such a run is the tail of an episode)."""
    done = arrays["terminated"] | arrays["truncated"]
    rows = len(done)
    block = rows // envs if envs >= 1 and rows % envs == 0 else None
    start = 0
    for end in np.flatnonzero(arrays["cut"]).tolist():
        after_episode = (block is not None and start % block != 0
                         and bool(done[start - 1]))
        if done[end] and (whole_chunks or after_episode):
            yield as_episode([run_rows(arrays, start, end)])
        start = end + 1


def snapshot_episodes(cfg: RunConfig, run_dir: Path) -> Iterator[dict[str, np.ndarray]]:
    from rlfleet.shared.contract.codec import decode_arrays
    from rlfleet.shared.contract.frames import unpack
    from rlfleet.shared.replay.buffers.dataset import DatasetBuffer
    from rlfleet.shared.replay.replay import Replay

    storage = open_storage(cfg.storage or str(run_dir / "storage"), cfg.name)
    try:
        replay = Replay(cfg, storage)
        if replay.load(storage) is None:
            raise ConfigError(f"{run_dir}: no buffer snapshot in its storage")
        ids = sorted(set().union(*(b.chunk_ids() for b in replay.buffers.values()
                                   if not isinstance(b, DatasetBuffer))))
        whole = cfg.collector.mode == "episodes"
        for k in range(0, len(ids), 64):
            for blob in storage.get_chunks(ids[k:k + 64]):
                if blob is not None:
                    arrays, _ = decode_arrays(blob)
                    yield from _runs(unpack(arrays), whole, cfg.env.num_envs)
    finally:
        storage.close()


class _Greedy:
    """A policy that acts as it is evaluated (its deterministic action), keeping whatever
    else a rollout stores beside each action (`extras`) and asks of it (`bootstrap`, ...)."""

    def __init__(self, policy) -> None:
        self._policy = policy

    def act(self, obs: np.ndarray, env_step: int, mask: np.ndarray | None = None):
        from rlfleet.shared.algos.base import ActOutput

        extras = self._policy.act(obs, env_step, mask).extras
        return ActOutput(np.asarray(self._policy.act_eval(obs, True, mask)), extras)

    def __getattr__(self, name: str):
        return getattr(self._policy, name)


class _GreedyRecurrent(_Greedy):
    """`_Greedy` of a recurrent policy: its acting state (the stored extras) and its
    evaluation state (the greedy actions) both follow the episodes, so an episode's end
    resets both."""

    def reset_state(self, envs: np.ndarray | None = None, evaluation: bool = False) -> None:
        self._policy.reset_state(envs, evaluation=False)
        self._policy.reset_state(envs, evaluation=True)


def greedy_policy(policy) -> _Greedy:
    """`policy` acting greedily, as evaluated."""
    from rlfleet.shared.algos.capabilities import Recurrent

    return _GreedyRecurrent(policy) if isinstance(policy, Recurrent) else _Greedy(policy)


def load_best_policy(cfg: RunConfig, run_dir: Path, seed: int | None = None
                     ) -> tuple[Policy, int]:
    """The run's best-evaluated policy (`best_policy.safetensors`), ready to act, and its
    policy version. `seed` seeds its sampling (default: the run's seed). Acting is one
    torch thread, as in a collector."""
    best = run_dir / BEST_POLICY_FILE
    if not best.is_file():
        raise ConfigError(f"{run_dir}: no {BEST_POLICY_FILE} (the run was never evaluated)")
    return policy_from_blob(cfg, best.read_bytes(), seed)


def policy_from_blob(cfg: RunConfig, blob: bytes, seed: int | None = None
                     ) -> tuple[Policy, int]:
    """A policy of the run's kind holding the weights of a safetensors blob, and the policy
    version its metadata names. Raises (`CodecError`, torch's `RuntimeError`, ...) for a
    blob that is not a whole policy of this run: the policy server's reloads keep the old
    one then."""
    import torch

    from rlfleet.shared.algos.registry import make_policy
    from rlfleet.shared.contract.codec import decode_weights
    from rlfleet.shared.envs.make import run_spec

    torch.set_num_threads(1)
    state, meta = decode_weights(blob)
    version = int(meta.get("policy_version", 0))
    policy = make_policy(cfg.algo, run_spec(cfg), cfg.seed if seed is None else seed)
    policy.load_policy(version, state)
    return policy, version


def policy_episodes(cfg: RunConfig, run_dir: Path, episodes: int, greedy: bool = False,
                    checkpoint: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    from rlfleet.shared.envs.make import make_vector_env, with_step_cap
    from rlfleet.shared.rollout.rollout import Rollout

    if checkpoint is not None:
        from rlfleet.checkpoints_cli import checkpoint_policy

        policy, _ = checkpoint_policy(cfg, run_dir, checkpoint)
    else:
        policy, _ = load_best_policy(cfg, run_dir)
    # episodes end by `eval.max_steps` at the latest: an endless env is cut, not hung
    envs = make_vector_env(with_step_cap(cfg.env, cfg.eval.max_steps),
                           min(cfg.env.num_envs, episodes), cfg.seed + 77_777)
    try:
        rollout = Rollout(envs, greedy_policy(policy) if greedy else policy, mode="episodes",
                          episodes_per_chunk=1)
        for _ in range(episodes):
            yield from _runs(rollout.collect(COLLECTING_ENV_STEP).arrays, True)
    finally:
        envs.close()


def _saved_dir(cfg: RunConfig, run_dir: Path) -> Path | None:
    saved = Path(cfg.collector.save_to) if cfg.collector.save_to else None
    if saved is not None and not saved.is_absolute():
        saved = run_dir / saved
    return saved


def _opener(source: str, cfg: RunConfig, run_dir: Path, episodes: int, greedy: bool,
            checkpoint: int | None = None) -> Callable[[], Episodes]:
    """What reads `source`'s episodes; its errors (ConfigError) come when it is called or,
    for snapshot and policy, when the first episode is read."""
    def saved() -> Episodes:
        where = _saved_dir(cfg, run_dir)
        if where is None or not where.is_dir():
            raise ConfigError(f"{run_dir}: the run saved no episodes (collector.save_to unset "
                              "or its directory missing)")
        return read_saved(where)

    openers = {"saved": saved,
               "snapshot": lambda: snapshot_episodes(cfg, run_dir),
               "policy": lambda: policy_episodes(cfg, run_dir, episodes, greedy, checkpoint)}
    if source not in openers:
        raise ConfigError(f"--source={source!r}: one of auto, {', '.join(SOURCES)}")
    return openers[source]


def _peeked(eps: Episodes) -> Episodes | None:
    """`eps` whole again after reading its first episode; None when it holds none."""
    it = iter(eps)
    first = next(it, None)
    return None if first is None else itertools.chain([first], it)


def _auto(cfg: RunConfig, run_dir: Path, episodes: int, greedy: bool
          ) -> tuple[str, Episodes, list[str]]:
    """The first source in `SOURCES` order that holds a whole episode, its episodes, and why
    each one before it was passed over."""
    passed_over = []
    for source in SOURCES:
        try:
            eps = _peeked(_opener(source, cfg, run_dir, episodes, greedy)())
        except ConfigError as err:
            passed_over.append(f"{source}: {err}")
            continue
        if eps is not None:
            return source, eps, passed_over
        passed_over.append(f"{source}: no whole episodes")
    raise ConfigError(f"{run_dir}: no source holds a whole episode (" +
                      "; ".join(passed_over) + ")")


def _origin(source: str, cfg: RunConfig, run_dir: Path, greedy: bool,
            checkpoint: int | None = None) -> str:
    if source == "saved":
        return f"from saved episodes ({_saved_dir(cfg, run_dir)})"
    if source == "snapshot":
        return "from the buffer snapshot in the run's storage"
    if checkpoint is not None:
        return (f"rolled out from the checkpoint at train iteration {checkpoint} (acting "
                f"{'greedily' if greedy else 'as when collecting'})")
    return (f"rolled out from the best policy ({BEST_POLICY_FILE}, acting "
            f"{'greedily' if greedy else 'as when collecting'})")


def export_run(run_dir: str | Path, out: str | Path, dataset_id: str | None = None,
               source: str = "auto", min_return: float | None = None,
               max_return: float | None = None, limit: int | None = None,
               episodes: int = 20, greedy: bool = False, checkpoint: int | None = None
               ) -> Exported:
    from rlfleet.shared.envs.make import make_vector_env

    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)
    if cfg.league is not None:
        raise ConfigError("rlfleet export: self-play runs are two-player games, not Minari's "
                          "single-agent episodes")
    passed_over: list[str] = []
    if checkpoint is not None:  # a checkpoint's policy plays the episodes
        if source not in ("auto", "policy"):
            raise ConfigError(f"--checkpoint={checkpoint} names the policy that plays the "
                              f"episodes: it goes with --source policy, not --source {source}")
        source = "policy"
        from rlfleet.checkpoints_cli import checkpoint_blob

        checkpoint_blob(cfg, run_dir, checkpoint)  # an unknown one fails before any work
    if source == "auto":
        source, eps, passed_over = _auto(cfg, run_dir, episodes, greedy)
    else:
        eps = _opener(source, cfg, run_dir, episodes, greedy, checkpoint)()
    returns: list[float] = []
    steps = [0]

    def kept() -> Iterator[dict[str, np.ndarray]]:
        for ep in eps:
            if limit is not None and len(returns) >= limit:
                return
            ret = float(np.sum(ep["rewards"]))
            if (min_return is None or ret >= min_return) and \
                    (max_return is None or ret <= max_return):
                returns.append(ret)
                steps[0] += len(ep["actions"])
                yield ep

    envs = make_vector_env(cfg.env, 1, cfg.seed)
    try:
        obs_space, act_space = envs.single_observation_space, envs.single_action_space
    finally:
        envs.close()
    dataset_id = dataset_id or f"rlfleet/{cfg.name.replace('.', '-')}-v0"
    path = write_minari(out, dataset_id, kept(), cfg.env.id, obs_space, act_space,
                        algorithm_name=cfg.algo.name,
                        description=f"episodes collected by rlfleet run {cfg.name} "
                                    f"({source}; returns in [{min_return}, {max_return}]"
                                    f"{f', the first {limit}' if limit else ''})")
    return Exported(path, dataset_id, len(returns), steps[0], source,
                    float(np.mean(returns)) if returns else float("nan"),
                    _origin(source, cfg, run_dir, greedy, checkpoint), passed_over)
