"""The one interface every algorithm implements, and how a config names one.

A `Policy` is both sides of an algorithm, in the spirit of DI-engine's policy modes but
behind a much smaller surface: collectors call `act`, `act_eval`, `bootstrap` and
`load_policy`; learners call `learn`, `policy_state`, `state_dict` and `load_state_dict`.
Nothing here knows HTTP, storage or threads, so the cluster and the single-process runner
drive the same objects.

Data conventions (what `learn` receives, as torch tensors with one row per transition):
- always: `obs`, `action`, `reward`, `next_obs`, `terminated`, `truncated`, `cut`;
  `cut` marks the last row of a time-contiguous run (an episode end, or where a chunk or an
  env's block of rows stops), so the row after a cut row does not follow it in time;
- whatever `act` returned in `ActOutput.extras`, one value per row (PPO: `log_prob`, `value`);
- `bootstrap_value` when `bootstrap` returns values: V(next_obs) on cut rows that did not
  terminate, 0 elsewhere;
- in games with illegal moves: `action_mask` (the legal actions at `obs`, bool, one column
  per action) and `next_action_mask` (at `next_obs`). Collectors pass the same mask to `act`
  and `act_eval` as `mask=`; an algorithm that supports masks never returns an illegal action.
Off-policy algorithms (`on_policy = False`) get minibatches sampled from replay buffers,
possibly with importance weights; on-policy ones get whole chunks concatenated (each chunk's
rows in order) from a queue buffer, once each.

A user's own algorithm: a class with this interface, constructed as `cls(cfg, spec, seed)`,
named in the config as `algo.policy: "package.module:ClassName"`; a built-in one is a folder
of its own with a spec in `rlfleet.shared.algos.registry`. What a policy may do beyond this
interface (learn in a data-parallel group, normalise observations, give Q-values, ...) is a
named capability in `rlfleet.shared.algos.capabilities`, which the roles ask with
`isinstance`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np

# torch for annotations only: a collector acts, and the launcher checks a config, before
# torch (seconds to import) has loaded or without it.
if TYPE_CHECKING:
    import torch

BASE_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "cut")
# Act extras named with this prefix are a recurrent policy's state before it acted on the
# row's obs (`capabilities.Recurrent`); sequence batches carry them, with `cut`.
RECURRENT_PREFIX = "recurrent_"


@dataclass
class ActOutput:
    """Actions for a batch of observations, and per-env values to store beside them."""

    actions: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class LearnOutput:
    """Metrics stay 0-d tensors until someone reports them (`.item()` per step is costly);
    `priorities` has one entry per batch row for prioritized buffers (None: not computed).
    `sample_values` are per-sample figures of the update (a TD error per row, say), one
    entry per batch row: `logging.batch_log` logs them with the samples they belong to, and
    reads them only on the updates it logs, so giving detached tensors costs nothing."""

    metrics: dict[str, torch.Tensor | float]
    priorities: torch.Tensor | None = None
    sample_values: dict[str, torch.Tensor] = field(default_factory=dict)


@runtime_checkable
class Reducer(Protocol):
    """Sums tensors over the ranks of a data-parallel learner group. Every rank must call
    `sum_` the same number of times, in the same order, with tensors of the same shapes: it
    is a collective, and it raises (after the group's timeout at most) if a rank is gone."""

    rank: int
    world_size: int

    def sum_(self, tensors: list[torch.Tensor]) -> None:
        """Replace each tensor, in place, by its sum over all ranks (one collective)."""


@runtime_checkable
class Policy(Protocol):
    """Both halves of an algorithm. Collectors call `act`, `act_eval`, `bootstrap` and
    `load_policy`; learners call `learn`, `policy_state`, `state_dict` and
    `load_state_dict`."""

    on_policy: ClassVar[bool]
    version: int            # policy version the acting side holds (-1: none yet)
    train_iterations: int   # gradient steps taken by the learning side

    def act(self, obs: np.ndarray, env_step: int, mask: np.ndarray | None = None
            ) -> ActOutput:
        """Actions with exploration; `env_step` is the run's global env step count, for
        schedules such as epsilon decay; `mask` (n, n_actions) bool: the legal actions."""

    def act_eval(self, obs: np.ndarray, deterministic: bool = True,
                 mask: np.ndarray | None = None) -> np.ndarray:
        """Actions for evaluation: greedy/mean when deterministic, sampled otherwise."""

    def bootstrap(self, obs: np.ndarray) -> np.ndarray | None:
        """State values used to bootstrap cut runs, or None if the algorithm needs none."""

    def learn(self, batch: Mapping[str, torch.Tensor],
              weights: torch.Tensor | None = None) -> LearnOutput:
        """Train on one batch (off-policy) or one rollout of whole chunks (on-policy)."""

    def policy_state(self) -> dict[str, torch.Tensor]:
        """What collectors need to act: published as a policy version."""

    def load_policy(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        """Adopt published weights for acting."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything needed to continue training (networks, optimizer, counters)."""

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Continue from `state_dict()`'s output (a checkpoint, or rank 0's state)."""


@runtime_checkable
class Optimizer(Protocol):
    """The members of `torch.optim.Optimizer` that the learner, checkpoints and the built-in
    algorithms use."""

    param_groups: list[dict[str, Any]]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of every parameter."""

    def step(self) -> Any:
        """One update from the current gradients."""

    def state_dict(self) -> dict[str, Any]:
        """Per-parameter state and the parameter groups' settings."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from `state_dict()`'s output."""
