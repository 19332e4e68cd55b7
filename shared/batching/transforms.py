"""What the learner does to sampled rows on their way into a batch: n-step returns, hindsight
relabelling (HER) and per-buffer rewards (SQIL). Stored chunks never change; every batch is
computed afresh from them, where the data is, with one numpy call per field and look-ahead
step, never a Python loop over rows.

Chunks are env-major (`shared/rollout/rollout.py`): the rows of one env follow each other in
time, and `cut` marks the last row of each run (an episode's end, or where the chunk stops
the env's rows). So the rows after a sampled row, up to its run's cut, are its future.

- **n-step** (`algo.n_step`): row t's reward becomes r_t + g r_{t+1} + ... + g^(m-1)
  r_{t+m-1}, with m <= n rows of its run (stopping after a cut or a terminal row), its
  `next_obs`, `terminated` and `next_action_mask` those of row t+m-1, and the batch gets a
  per-row `discount` g^m for the target's bootstrap. A run that ends in a time limit or a
  chunk's cut is bootstrapped from its last next_obs with g^m; a terminal row is not.
- **HER** (`algo.her`): for k/(k+1) of the rows, a goal achieved later in the same run (the
  `next_obs` achieved goal of a row drawn uniformly from this row to the run's last row:
  `future`; of the run's last row: `final`) replaces the desired goal in obs and next_obs,
  and the env's `compute_reward` (and `compute_terminated`, when the env has one) gives the
  reward (and termination) for it. The flattened observation's parts are where the env's
  spec says (`shared/envs/goals.py`). Runs are what a chunk holds: with `collector.mode:
  episodes` a run is a whole episode.
- **Per-buffer rewards** (`learner.mix[].reward`): every row drawn from that buffer gets
  that reward (SQIL: 1 for expert data, 0 for the agent's own).

They compose: relabelled rewards and overrides are per row, then summed over n steps. This
module imports no torch: the learner's data process runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlfleet.shared.contract.algo import HindsightSettings, NStepSettings
from rlfleet.shared.contract.frames import take

# Fields computed here rather than indexed straight from the chunks.
DISCOUNT = "discount"
_FROM_LAST = ("next_obs", "next_action_mask")  # taken from the last row an n-step sum uses
GoalFn = Callable[[np.ndarray, np.ndarray, Any], np.ndarray]


class BatchTransforms:
    """The transforms of one run's batches. Settings are plain JSON (`settings()`), so the
    learner's data process builds the same object from the line it reads."""

    def __init__(self, n_step: int = 1, gamma: float = 0.99,
                 rewards: Mapping[str, float] | None = None, her: Mapping[str, Any] | None = None,
                 seed: int | None = None) -> None:
        """`her`: {strategy, k, achieved_goal: [start, stop], desired_goal: [start, stop],
        env: the EnvConfig as a dict (to make one env for its compute_reward)}."""
        if n_step < 1:
            raise ValueError(f"n_step={n_step}: at least 1")
        self.n_step = int(n_step)
        self.gamma = float(gamma)
        self.rewards = {str(k): float(v) for k, v in (rewards or {}).items()}
        self.her = dict(her) if her else None
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self._goal_fns: tuple[GoalFn, GoalFn | None] | None = None

    @classmethod
    def from_config(cls, cfg: Any, spec: Any = None, seed: int | None = None
                    ) -> BatchTransforms:
        """From a `RunConfig` (and the env's spec, made if not given, for HER's layout)."""
        algo = cfg.algo
        her = None
        if isinstance(algo, HindsightSettings) and algo.her is not None:
            if spec is None:
                from rlfleet.shared.envs.make import run_spec

                spec = run_spec(cfg)
            if spec.goal is None:
                from rlfleet.shared.contract.config import ConfigError

                raise ConfigError(f"algo.her: env.id={cfg.env.id!r} is not goal-conditioned "
                                  "(observations Dict(observation, achieved_goal, "
                                  "desired_goal))")
            her = {"strategy": algo.her.strategy, "k": algo.her.k,
                   "achieved_goal": list(spec.goal.achieved_goal),
                   "desired_goal": list(spec.goal.desired_goal),
                   "env": cfg.env.model_dump(mode="json")}
        rewards = {p.buffer: p.reward for p in cfg.learner.mix if p.reward is not None}
        n_step = algo.n_step if isinstance(algo, NStepSettings) else 1
        return cls(n_step=n_step, gamma=algo.gamma, rewards=rewards,
                   her=her, seed=cfg.seed if seed is None else seed)

    def settings(self) -> dict[str, Any]:
        return {"n_step": self.n_step, "gamma": self.gamma, "rewards": dict(self.rewards),
                "her": self.her, "seed": self.seed}

    @property
    def active(self) -> bool:
        """Whether any batch can differ from plain indexing."""
        return self.n_step > 1 or self.her is not None or bool(self.rewards)

    def plain(self, buffer: str) -> bool:
        """Rows of `buffer` are taken as stored."""
        return self.n_step == 1 and self.her is None and buffer not in self.rewards

    def fields(self, fields: Sequence[str]) -> tuple[str, ...]:
        """The batch's fields: with n-step returns, a per-row `discount` too."""
        out = tuple(fields)
        return out + (DISCOUNT,) if self.n_step > 1 and DISCOUNT not in out else out

    @staticmethod
    def columns_needed(fields: Sequence[str]) -> tuple[str, ...]:
        """The stored columns the fields are computed from."""
        return tuple(f for f in fields if f != DISCOUNT) + ("cut", "terminated", "reward")

    # -- one part's rows -----------------------------------------------------------------

    def gather(self, columns: Mapping[str, np.ndarray], flat: np.ndarray,
               fields: Sequence[str], buffer: str) -> dict[str, np.ndarray]:
        """Each field for the rows `flat` (any shape, indices into `columns`) drawn from
        `buffer`: `columns[f][flat]`, transformed as this run's settings say."""
        if self.plain(buffer):
            return {f: take(columns, f, flat) for f in fields}
        shape = flat.shape
        rows = flat.reshape(-1).astype(np.int64, copy=False)
        override = self.rewards.get(buffer)
        own = {"reward", "terminated", DISCOUNT, *_FROM_LAST}
        out = {f: take(columns, f, rows) for f in fields if f not in own}

        relabel = goal = None
        if self.her is not None:
            relabel, goal = self._goals(columns, rows)
        reward, terminated = self._rewards(columns, rows, relabel, goal, override)
        last = rows
        if self.n_step > 1:
            cut = np.asarray(columns["cut"], dtype=bool)
            top = len(cut) - 1
            steps = np.ones(rows.shape, dtype=np.int64)
            alive = ~(cut[rows] | terminated)  # the run goes on after this row
            for k in range(1, self.n_step):
                if not alive.any():
                    break
                # Rows past a chunk's end are never used: the chunk's last row is a cut.
                idx = np.minimum(rows + k, top)
                r_k, t_k = self._rewards(columns, idx, relabel, goal, override)
                reward = np.where(alive, reward + np.float32(self.gamma ** k) * r_k, reward)
                terminated = np.where(alive, t_k, terminated)
                last = np.where(alive, idx, last)
                steps += alive
                alive &= ~(cut[idx] | t_k)
            out[DISCOUNT] = np.power(self.gamma, steps).astype(np.float32)
        out["reward"] = reward.astype(np.float32, copy=False)
        out["terminated"] = terminated
        for f in _FROM_LAST:
            if f in fields:
                out[f] = take(columns, f, last)
        if self.her is not None and relabel is not None and goal is not None and relabel.any():
            desired = slice(*self.her["desired_goal"])
            for f in ("obs", "next_obs"):
                if f in out:  # a fresh array (np.take copies): written in place
                    out[f][relabel, desired] = goal[relabel]
        return {f: out[f].reshape(shape + out[f].shape[1:]) for f in fields}

    def _goals(self, columns: Mapping[str, np.ndarray], rows: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """Which rows are relabelled, and each row's hindsight goal (rows not relabelled
        get one too; it is not used)."""
        her = self.her
        assert her is not None
        relabel = self.rng.random(rows.shape) < her["k"] / (her["k"] + 1)
        cuts = np.flatnonzero(np.asarray(columns["cut"], dtype=bool))
        # The run's last row: the first cut at or after the row (every chunk ends in one).
        end = cuts[np.minimum(np.searchsorted(cuts, rows), len(cuts) - 1)]
        if her["strategy"] == "final":
            source = end
        else:  # future: a row from this one to the run's last, uniformly
            source = rows + (self.rng.random(rows.shape) * (end - rows + 1)).astype(np.int64)
            source = np.minimum(source, end)
        achieved = slice(*her["achieved_goal"])
        return relabel, take(columns, "next_obs", source)[:, achieved]

    def _rewards(self, columns: Mapping[str, np.ndarray], idx: np.ndarray,
                 relabel: np.ndarray | None, goal: np.ndarray | None,
                 override: float | None) -> tuple[np.ndarray, np.ndarray]:
        """Reward and terminated of rows `idx`: stored, recomputed for relabelled rows'
        goals, or the buffer's override."""
        reward = np.asarray(columns["reward"])[idx].astype(np.float32)
        terminated = np.asarray(columns["terminated"])[idx].astype(bool)
        if self.her is not None and relabel is not None and goal is not None and relabel.any():
            compute_reward, compute_terminated = self.goal_functions()
            sel = np.flatnonzero(relabel)
            achieved = take(columns, "next_obs", idx[sel])[:, slice(*self.her["achieved_goal"])]
            reward[sel] = np.asarray(compute_reward(achieved, goal[sel], {}),
                                     dtype=np.float32).reshape(-1)
            if compute_terminated is not None:
                terminated[sel] = np.asarray(compute_terminated(achieved, goal[sel], {}),
                                             dtype=bool).reshape(-1)
        if override is not None:
            reward[:] = override
        return reward, terminated

    def goal_functions(self) -> tuple[GoalFn, GoalFn | None]:
        """The env's vectorised `compute_reward` and `compute_terminated` (None if it has
        none: relabelled rows then keep their stored `terminated`), from one env made
        here."""
        if self._goal_fns is None:
            assert self.her is not None
            from rlfleet.shared.contract.config import EnvConfig
            from rlfleet.shared.envs.make import goal_functions

            self._goal_fns = goal_functions(EnvConfig(**self.her["env"]))
        return self._goal_fns
