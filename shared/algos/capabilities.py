"""What a policy may do beyond `Policy`: each optional capability is a named type.

Roles ask a policy what it can do with `isinstance(policy, Capability)`, never by looking
for an attribute by name; each docstring says who calls what and when. A class has a
capability when it defines all of its members. `hook_problems` reports a class that defines
a capability's member with the wrong signature, or only some of its members (a hook that
would otherwise be skipped without a word); `near_misses` reports names one typo away from a
member. `rlfleet check` prints all three for a config's policy, and the launch check refuses
a policy with hook problems.

The capabilities, and who calls them:

- `DataParallel` (`set_reducer`): the learner, as a learner group forms;
- `NormalizesObservations` (`tracks_obs_stats`, `preprocess`, `merge_obs_stats`): collectors
  before acting, the learner with each rollout's observation counts;
- `SeededActing` (`rng`): evaluation, which draws from a generator of its own seed;
- `Optimized` (`optimizer`): the learner, for `train/learning_rate`;
- `QValues` (`q_values`): the learner's dataset scorer (`eval.dataset`);
- `Placeable` (`device`, `to`): the learner and collectors, once, for `learner.device` and
  `collector.device` (a policy without it acts and learns on the CPU only);
- `MixedPrecision` (`set_precision`): the learner, once, for `learner.precision` other than
  fp32;
- `EpsilonGreedy` (`epsilon`, `set_epsilon`): collectors, for the epsilon they show, and
  once with their slot's fixed epsilon under `collector.epsilon_schedule: apex`;
- `Recurrent` (`reset_state`): collectors where an env's episode ends, evaluations as they
  start and where their episodes end.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from rlfleet.shared.algos.base import Optimizer, Policy, Reducer
from rlfleet.shared.contract.plugins import declared, members
from rlfleet.shared.util.moments import RunningMoments

if TYPE_CHECKING:
    import torch


@runtime_checkable
class DataParallel(Protocol):
    """Learns as one rank of a data-parallel learner group: every rank gets a disjoint shard
    of each batch and sums through the `Reducer` what must be global (its gradients, any
    statistic over the whole batch), so every rank takes the step one learner would take on
    the whole batch. A policy without it learns only alone (`learner.count: 1`)."""

    def set_reducer(self, reducer: Reducer | None) -> None:
        """Called by the learner each time a group generation forms (None: alone)."""


@runtime_checkable
class NormalizesObservations(Protocol):
    """Acts on observations normalised by statistics the learner owns (`algo.obs_norm`):
    collectors call `preprocess` before `act`, `act_eval` and `bootstrap`, count the raw
    observations of each chunk when `tracks_obs_stats` is true, and the learner merges
    those counts with `merge_obs_stats` before each learn round."""

    @property
    def tracks_obs_stats(self) -> bool:
        """Whether normalisation is on for this config (the statistics travel with the
        published weights)."""

    def preprocess(self, obs: np.ndarray) -> np.ndarray:
        """Observations as the network sees them."""

    def merge_obs_stats(self, moments: RunningMoments | Mapping[str, Any]) -> None:
        """Fold a chunk's raw-observation moments into the statistics."""


@runtime_checkable
class SeededActing(Protocol):
    """Draws its exploration from `rng`: an evaluation sets it to the evaluation's own seed
    and restores it afterwards, so how often a run is evaluated never changes what it
    collects."""

    rng: np.random.Generator


@runtime_checkable
class Optimized(Protocol):
    """Trains with one optimizer, whose learning rate the learner logs as
    `train/learning_rate`."""

    @property
    def optimizer(self) -> Optimizer:
        """The optimizer of the policy's networks."""


@runtime_checkable
class QValues(Protocol):
    """Gives Q(s, .) for a batch of observations: what `eval.dataset`'s `td_error` and
    `return_prediction` metrics read."""

    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        """(n, n_actions) Q-values, without gradients."""


@runtime_checkable
class Placeable(Protocol):
    """Lives on a device of its choosing: `to` moves every network, buffer and optimizer
    state there; `learn` then takes batches already on `device` and acting takes numpy
    observations and returns numpy actions as on the CPU. What it publishes and saves may
    live on the device too: the learner copies it to the host."""

    device: torch.device

    def to(self, device: torch.device) -> None:
        """Move everything to `device` (called before the first update or action)."""


@runtime_checkable
class MixedPrecision(Protocol):
    """Learns in the arithmetic of a `rlfleet.shared.algos.device.Precision`: its forward
    passes under `precision.autocast()`, its backward, unscale and step through the
    precision, its parameters fp32."""

    def set_precision(self, precision: Any) -> None:
        """Called by the learner once, before the first update."""


@runtime_checkable
class EpsilonGreedy(Protocol):
    """Explores epsilon-greedily while collecting: `act` picks a uniformly random action with
    probability `epsilon(env_step)`. Collectors show that epsilon in their `/status` and
    heartbeat; under `collector.epsilon_schedule: apex` each calls `set_epsilon` once with
    its slot's fixed epsilon, which `act` then uses instead of its own schedule. Evaluation
    (`act_eval`) never changes with it."""

    def epsilon(self, env_step: int) -> float:
        """The epsilon `act` explores with at this env step of the run."""

    def set_epsilon(self, epsilon: float | None) -> None:
        """Act with this fixed epsilon from now on (None: the algorithm's own schedule)."""


@runtime_checkable
class Recurrent(Protocol):
    """Acts with a recurrent state per env (R2D2's LSTM), which it carries from one `act`
    to the next, across chunk boundaries and policy versions alike. `act` returns the state
    each env acted from as extras named `recurrent_*` (`base.RECURRENT_PREFIX`), so chunks
    store it beside every row and a learner can start a sequence from the state the
    collector had there. `act_eval` keeps a state of its own: an evaluation between two
    chunks never disturbs the collecting envs' memories.

    Only the caller knows where episodes end: collectors call `reset_state` with the envs
    whose episode just ended (their next observation starts a new one), and once for all
    envs as they reset them; an evaluation calls it with `evaluation=True` for all envs as
    it starts and for each env whose episode ends."""

    def reset_state(self, envs: np.ndarray | None = None, evaluation: bool = False) -> None:
        """Zero the state of these env indices (None: every env's, and forget how many
        envs there are), of acting or of evaluation."""


CAPABILITIES: tuple[type, ...] = (DataParallel, NormalizesObservations, SeededActing,
                                  Optimized, QValues, Placeable, MixedPrecision, EpsilonGreedy,
                                  Recurrent)


def capabilities_of(policy: object) -> list[type]:
    """The capabilities an object (a built policy) implements."""
    return [cap for cap in CAPABILITIES if isinstance(policy, cap)]


def class_capabilities(cls: type) -> list[type]:
    """The capabilities a class defines every member of (attributes set only in
    `__init__`, such as `rng`, count when the class annotates them; a built instance is
    asked with `capabilities_of`)."""
    return [cap for cap in CAPABILITIES if all(declared(cls, m) for m in members(cap))]


def _accepts(impl: Any, proto: Any) -> str | None:
    """Why a method `impl` cannot be called as the protocol's `proto` is, or None."""
    try:
        want = inspect.signature(proto)
        have = inspect.signature(impl)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return None
    w = [p for p in want.parameters.values() if p.name != "self"]
    h = [p for p in have.parameters.values() if p.name != "self"]
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in h)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in h)
    positional = [p for p in h if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < len(w) and not var_pos:
        return f"takes {len(positional)} arguments, the caller passes up to {len(w)}"
    names = {p.name for p in h}
    for p in w:
        if p.name not in names and not var_kw and p.default is not p.empty:
            return f"has no parameter {p.name!r} (the caller may pass it by name)"
    extra = [p.name for p in h if p.default is p.empty and p.kind not in (
        p.VAR_POSITIONAL, p.VAR_KEYWORD)][len(w):]
    if extra:
        return f"requires {', '.join(extra)}, which the caller never passes"
    return None


def _check_member(cls: type, proto: type, name: str) -> str | None:
    want = inspect.getattr_static(proto, name, None)
    have = inspect.getattr_static(cls, name, None)
    if have is None:  # an attribute only annotated (or set in __init__)
        return None
    if isinstance(want, property):
        return None  # a property, or a plain attribute standing for one
    if callable(want):
        if isinstance(have, property) or not callable(have):
            return f"{name} is an attribute; {proto.__name__} needs a method {name}()"
        why = _accepts(getattr(cls, name), want)
        return f"{name}() {why}" if why else None
    return None


def hook_problems(cls: type) -> list[str]:
    """What is wrong with how `cls` implements `Policy` and the capabilities: a member with
    a signature the caller cannot call, or a capability with only some of its members
    defined. Empty when nothing is."""
    out = []
    for proto in (Policy, *CAPABILITIES):
        names = members(proto)
        have = [n for n in names if declared(cls, n)]
        for name in have:
            why = _check_member(cls, proto, name)
            if why:
                out.append(f"{cls.__name__}.{why} ({proto.__name__})")
        if proto is not Policy and have and len(have) < len(names):
            missing = [n for n in names if n not in have]
            out.append(f"{cls.__name__} defines {', '.join(have)} but not "
                       f"{', '.join(missing)}: it is not {proto.__name__}, and the learner "
                       "and collectors will not call it")
    return out


def near_misses(cls: type) -> list[str]:
    """Names `cls` defines that are one typo from a capability's member it lacks (a
    misspelt hook would otherwise just never be called)."""
    known = {n: proto.__name__ for proto in (Policy, *CAPABILITIES) for n in members(proto)}
    own = {n for klass in cls.__mro__[:-1] for n in vars(klass) if not n.startswith("_")}
    out = []
    for name in sorted(own - set(known)):
        close = difflib.get_close_matches(name, [k for k in known if not declared(cls, k)],
                                          n=1, cutoff=0.85)
        if close:
            out.append(f"{cls.__name__}.{name}: did you mean {close[0]} "
                       f"({known[close[0]]})?")
    return out


def missing_policy_members(cls: type) -> list[str]:
    """The members of `Policy` that `cls` does not define."""
    return [n for n in members(Policy) if not declared(cls, n) and n not in (
        "version", "train_iterations")]
