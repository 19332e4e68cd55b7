"""Offline data in the field's format: Minari datasets in, Minari datasets out.

Minari (Farama's successor to D4RL) stores episodes: `observations` has one more entry than
`actions` (the final observation), beside `rewards`, `terminations` and `truncations`. Our
chunks store transitions (`rlfleet.shared.algos.base.BASE_FIELDS`); `transitions()` turns episodes
into those columns and `write_minari()` turns whole episodes back into a dataset.

A dataset is checked before anything learns from it, and every problem is a `DatasetError`
(a `ConfigError`) naming the config field: a path with no dataset, a file that cannot be
read (truncated, not HDF5), observations or actions whose shape or dtype are not the env's,
non-finite values, or an episode whose arrays disagree in length. Minari is imported only
here and only when a dataset is used (the `datasets` extra).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.spec import EnvSpec

EPISODE_FIELDS = ("observations", "actions", "rewards", "terminations", "truncations")


class DatasetError(ConfigError):
    """A dataset that cannot be used; the message names the config field."""


def _minari() -> Any:
    try:
        import minari
    except ImportError:
        raise DatasetError("datasets need Minari: pip install -e '.[datasets]'") from None
    return minari


def open_dataset(path: str | os.PathLike | None, minari_id: str | None, field: str) -> Any:
    """The `MinariDataset` at `path` (a dataset's directory, or its `data` directory) or
    registered as `minari_id`."""
    minari = _minari()
    if path is not None:
        root = Path(path).expanduser()
        data = root / "data" if (root / "data").is_dir() else root
        if not (data / "metadata.json").is_file():
            raise DatasetError(f"{field}.path={str(path)!r}: no Minari dataset there "
                               "(expected data/metadata.json)")
        where = f"{field}.path={str(path)!r}"
        opener = lambda: minari.MinariDataset(data)  # noqa: E731
    else:
        where = f"{field}.minari_id={minari_id!r}"
        opener = lambda: minari.load_dataset(minari_id)  # noqa: E731
    try:
        return opener()
    except FileNotFoundError as err:
        raise DatasetError(f"{where}: not found ({err})") from None
    except Exception as err:  # h5py's OSError on a truncated file, minari's own errors
        raise DatasetError(f"{where}: cannot be read: {type(err).__name__}: {err}") from None


def _space_shape(space: Any) -> tuple[tuple[int, ...], int]:
    """(shape, n) of a gymnasium space: n > 0 for Discrete."""
    n = int(getattr(space, "n", 0) or 0)
    return tuple(getattr(space, "shape", ()) or ()), n


def check_spaces(ds: Any, spec: EnvSpec, field: str) -> None:
    """The dataset's spaces are the env's: same observation shape, same kind and size of
    action space."""
    obs_shape, _ = _space_shape(ds.observation_space)
    if obs_shape != tuple(spec.obs_shape):
        raise DatasetError(f"{field}: observations of shape {obs_shape}, but the env's are "
                           f"{tuple(spec.obs_shape)}")
    act_shape, n = _space_shape(ds.action_space)
    if spec.discrete and n != spec.n_actions:
        raise DatasetError(f"{field}: actions {ds.action_space}, but the env has "
                           f"Discrete({spec.n_actions})")
    if not spec.discrete and (n or act_shape != tuple(spec.action_shape)):
        raise DatasetError(f"{field}: actions {ds.action_space}, but the env's are continuous "
                           f"of shape {tuple(spec.action_shape)}")


def _check_episode(ep: dict[str, np.ndarray], spec: EnvSpec, field: str, k: int) -> None:
    obs, act = ep["observations"], ep["actions"]
    n = len(act)
    if n == 0 or len(obs) != n + 1 or any(len(ep[f]) != n for f in EPISODE_FIELDS[2:]):
        raise DatasetError(f"{field}: episode {k} has {len(obs)} observations, {n} actions, "
                           f"{len(ep['rewards'])} rewards: an episode needs n >= 1 steps and "
                           "n + 1 observations")
    if obs.shape[1:] != tuple(spec.obs_shape):
        raise DatasetError(f"{field}: episode {k} has observations of shape {obs.shape[1:]}, "
                           f"the env's are {tuple(spec.obs_shape)}")
    if obs.dtype.kind not in "fiub":
        raise DatasetError(f"{field}: episode {k} has observations of dtype {obs.dtype}")
    if spec.discrete:
        if act.dtype.kind not in "iu":
            raise DatasetError(f"{field}: episode {k} has actions of dtype {act.dtype}; this "
                               f"env's actions are integers 0..{spec.n_actions - 1}")
        if n and (act.min() < 0 or act.max() >= spec.n_actions):
            raise DatasetError(f"{field}: episode {k} has actions outside "
                               f"0..{spec.n_actions - 1}")
    elif act.dtype.kind != "f" or act.shape[1:] != tuple(spec.action_shape):
        raise DatasetError(f"{field}: episode {k} has actions {act.dtype} {act.shape[1:]}; "
                           f"the env's are float {tuple(spec.action_shape)}")
    for name in ("observations", "actions", "rewards"):
        if ep[name].dtype.kind == "f" and not np.isfinite(ep[name]).all():
            raise DatasetError(f"{field}: episode {k} has non-finite {name}")


def episodes(ds: Any, spec: EnvSpec, field: str, max_steps: int | None = None
             ) -> Iterator[dict[str, np.ndarray]]:
    """The dataset's episodes as arrays, each checked; stops after the episode that reaches
    `max_steps` steps."""
    check_spaces(ds, spec, field)
    steps = 0
    try:
        for k, raw in enumerate(ds.iterate_episodes()):
            ep = {name: np.asarray(getattr(raw, name)) for name in EPISODE_FIELDS}
            _check_episode(ep, spec, field, k)
            yield ep
            steps += len(ep["actions"])
            if max_steps is not None and steps >= max_steps:
                return
    except DatasetError:
        raise
    except Exception as err:  # a file cut short reads fine until its missing part
        raise DatasetError(f"{field}: cannot be read: {type(err).__name__}: {err}") from None


def _stored(value: np.ndarray) -> np.ndarray:
    return value.astype(np.float32) if value.dtype == np.float64 else value


def transitions(eps: Iterable[dict[str, np.ndarray]], field: str) -> dict[str, np.ndarray]:
    """Episodes as transition columns (`BASE_FIELDS`), `cut` on each episode's last step."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in (
        "obs", "action", "reward", "next_obs", "terminated", "truncated", "cut")}
    for ep in eps:
        obs, n = ep["observations"], len(ep["actions"])
        parts["obs"].append(_stored(obs[:-1]))
        parts["next_obs"].append(_stored(obs[1:]))
        parts["action"].append(_stored(ep["actions"]))
        parts["reward"].append(ep["rewards"].astype(np.float32))
        parts["terminated"].append(ep["terminations"].astype(bool))
        truncated = ep["truncations"].astype(bool).copy()
        # An episode that ends neither terminated nor truncated (a collector stopped) is
        # truncated: bootstrapping from its last state is right, treating it as terminal not.
        truncated[-1] |= not ep["terminations"][-1]
        parts["truncated"].append(truncated)
        cut = np.zeros(n, dtype=bool)
        cut[-1] = True
        parts["cut"].append(cut)
    if not parts["obs"]:
        raise DatasetError(f"{field}: the dataset holds no episodes")
    return {k: np.concatenate(v) for k, v in parts.items()}


def discounted_returns(reward: np.ndarray, cut: np.ndarray, gamma: float) -> np.ndarray:
    """Return from each step to its episode's end, discounted (0 after a terminal step; an
    episode cut short is scored on what it got)."""
    out = np.zeros(len(reward), dtype=np.float64)
    running = 0.0
    for i in range(len(reward) - 1, -1, -1):
        if cut[i]:
            running = 0.0
        running = float(reward[i]) + gamma * running
        out[i] = running
    return out


@contextmanager
def _datasets_root(root: Path) -> Iterator[None]:
    """Minari writes under MINARI_DATASETS_PATH: point it at `root` for one call."""
    before = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = before


def write_minari(root: str | os.PathLike, dataset_id: str,
                 eps: Iterable[dict[str, np.ndarray]], env_id: str, observation_space: Any,
                 action_space: Any, algorithm_name: str, description: str) -> Path:
    """Write whole episodes as Minari dataset `dataset_id` under the datasets root `root`;
    returns the dataset's directory (`minari.load_dataset(dataset_id)` reads it with
    MINARI_DATASETS_PATH=root)."""
    import warnings

    from rlfleet.shared.envs.make import resolve_env_id  # gymnasium's import, when exporting

    minari = _minari()  # a clear error without the datasets extra
    from minari.data_collector import EpisodeBuffer

    buffers = [EpisodeBuffer(id=k, observations=ep["observations"], actions=ep["actions"],
                             rewards=ep["rewards"], terminations=ep["terminations"],
                             truncations=ep["truncations"], infos={})
               for k, ep in enumerate(eps)]
    if not buffers:
        raise DatasetError("no whole episodes to write")
    root = Path(root).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    with _datasets_root(root), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # author, permalink...: advice, not problems
        minari.create_dataset_from_buffers(
            dataset_id, buffers, env=resolve_env_id(env_id), algorithm_name=algorithm_name,
            observation_space=observation_space, action_space=action_space,
            description=description, data_format="hdf5",
            code_permalink="https://github.com/rlfleet/rlfleet", author="rlfleet")
    namespace, _, name = dataset_id.rpartition("/")
    return root / namespace / name if namespace else root / name


def check_datasets(cfg: Any, spec: EnvSpec) -> None:
    """Open and read every dataset a run's config names (dataset buffers, the metric
    evaluator's), so a bad one stops the launch with its field named."""
    for name, bcfg in cfg.buffers.items():
        if bcfg.kind == "dataset":
            field = f"buffers.{name}"
            transitions(episodes(open_dataset(bcfg.path, bcfg.minari_id, field), spec, field),
                        field)
    if cfg.eval.dataset is not None:
        d = cfg.eval.dataset
        transitions(episodes(open_dataset(d.path, d.minari_id, "eval.dataset"), spec,
                             "eval.dataset", d.max_steps), "eval.dataset")
