"""Soft Actor-Critic: acting and learning, top to bottom, in the manner of CleanRL's
`sac_continuous_action.py`, so the whole algorithm reads in one place.

Why SAC: for continuous control it learns from every transition many times over (replay), so
it needs far fewer env steps than PPO, which uses each rollout for a few epochs and drops it.
What it is (Haarnoja et al. 2018, 'Soft Actor-Critic Algorithms and Applications'):

- **Policy**: a diagonal Gaussian over pre-squash actions u, whose mean and log std (bounded
  to [log_std_min, log_std_max] by a tanh) an MLP gives; the action is a = tanh(u) in
  [-1, 1]^|A|, scaled to the env's Box [low, high] when acting. Stored actions are at the
  env's scale; the learner maps them back to [-1, 1] for the Q-networks.
- **Log-probabilities** are densities of the squashed action a in [-1, 1]^|A| (not of the
  env-scale action: that would subtract sum log(scale) more, a constant the temperature's
  target would have to carry): log N(u; mu, sigma) - sum log(1 - tanh(u)^2), the Jacobian
  written as 2 (log 2 - u - softplus(-2u)), which stays finite where tanh(u) rounds to 1.
- **Critics**: twin Q-networks Q1, Q2 over (obs, a) with Polyak-averaged targets (tau after
  every step). The target is y = r + discount (1 - terminated) (min(Q1', Q2')(s', a') -
  alpha log pi(a'|s')) with a' drawn from the current policy at s'; discount is gamma, or the
  per-row gamma^m of n-step returns (`batch["discount"]`). Each critic regresses on y (half
  squared error); importance weights from a prioritized buffer weight each row, and the new
  priorities are the two critics' mean |TD error|.
- **Actor**: minimises alpha log pi(a|s) - min(Q1, Q2)(s, a) with a resampled from the
  policy (reparameterised), the critics' parameters frozen for that forward pass, so the
  actor's loss moves the actor only.
- **Temperature**: log alpha minimises -log alpha (log pi(a|s) + target_entropy), so alpha
  grows while the policy's entropy is below the target (-|A| by default) and shrinks above it.

One `learn` call is one gradient step of all three, from one backward pass of the summed
losses (their parameters are disjoint: the target is computed without gradients, the actor's
loss sees frozen critics, the temperature's loss a detached log pi) through one Adam, with the
actor's and the critics' gradients each clipped to `max_grad_norm`. Updates per env step are
not a setting here: the buffer's rate limiter holds the replay ratio
(`samples_per_insert` = updates per env step x `batch_size`).

Acting draws its noise from `rng` (numpy, `SeededActing`), and for the run's first
`random_steps` env steps acts uniformly at random in the Box, as collectors do before torch
has loaded (`warmup` in the spec). Learning draws its noise (for a' and for the actor's
resampled actions) from a torch generator of its own, saved in checkpoints. In a learner
group each rank holds rows [rank * b, (rank + 1) * b) of the group's batch; every rank draws
the noise of the whole group batch and takes its rows' slice, so with the gradients of the
shard means averaged over the ranks each step is the one a single learner takes on the whole
batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlfleet.shared.algos.base import ActOutput, LearnOutput, Optimizer, Reducer
from rlfleet.shared.algos.device import FP32, Precision
from rlfleet.shared.algos.nets import (
    as_obs_tensor,
    clip_grad_norm,
    load_optimizer_state,
    mlp,
    optimizer_state,
    sum_gradients,
)
from rlfleet.shared.algos.obsnorm import ObsNormalizer
from rlfleet.shared.algos.optim import adam
from rlfleet.shared.algos.sac.config import SACConfig
from rlfleet.shared.contract.spec import EnvSpec, is_image
from rlfleet.shared.util.moments import RunningMoments

LOG_2 = math.log(2.0)
LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def squashed_log_prob(u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor
                      ) -> torch.Tensor:
    """log pi(tanh(u)) for u ~ N(mean, exp(log_std)^2) per dimension: the density of the
    squashed action in [-1, 1]^|A|, summed over the last dimension. The tanh correction
    log(1 - tanh(u)^2) is written 2 (log 2 - u - softplus(-2u)), exact and finite for any u."""
    z = (u - mean) * torch.exp(-log_std)
    gaussian = (-0.5 * z * z - log_std - LOG_SQRT_2PI).sum(-1)
    return gaussian - (2.0 * (LOG_2 - u - F.softplus(-2.0 * u))).sum(-1)


def squash(mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """A reparameterised sample a = tanh(mean + std * noise) in [-1, 1]^|A| and its
    log-probability (`squashed_log_prob`; (u - mean) / std is `noise` itself)."""
    u = mean + torch.exp(log_std) * noise
    gaussian = (-0.5 * noise * noise - log_std - LOG_SQRT_2PI).sum(-1)
    return torch.tanh(u), gaussian - (2.0 * (LOG_2 - u - F.softplus(-2.0 * u))).sum(-1)


class Actor(nn.Module):
    """obs -> (mean, log std) of the pre-squash Gaussian: one MLP whose last layer gives both,
    the log std squashed into [log_std_min, log_std_max] as CleanRL does. With `algo.obs_norm`
    it also holds the published observation statistics (`obs_norm`): what collectors need to
    act is this module's state dict."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...],
                 log_std_min: float, log_std_max: float,
                 obs_norm: ObsNormalizer | None = None) -> None:
        super().__init__()
        if obs_norm is not None:  # published with the weights: see shared/algos/obsnorm.py
            self.obs_norm = obs_norm
        self.net = mlp(obs_dim, hidden, 2 * act_dim)
        self.log_std_min = log_std_min
        self.log_std_max = log_std_max

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, raw = self.net(obs.flatten(1).float()).chunk(2, dim=-1)
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (
            torch.tanh(raw) + 1.0)
        return mean, log_std


class TwinQ(nn.Module):
    """Two independent Q-networks over (obs, action in [-1, 1]^|A|)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.q1 = mlp(obs_dim + act_dim, hidden, 1)
        self.q2 = mlp(obs_dim + act_dim, hidden, 1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs.flatten(1).float(), action], dim=1)
        return self.q1(x).squeeze(1), self.q2(x).squeeze(1)


class Temperature(nn.Module):
    """log alpha, a module so that `to` moves it with the networks."""

    def __init__(self, init_alpha: float, learn: bool) -> None:
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(init_alpha)), requires_grad=learn)


class SAC:
    on_policy: ClassVar[bool] = False
    rng: np.random.Generator  # the acting stream (SeededActing)
    device: torch.device  # where its networks live (Placeable)

    def __init__(self, cfg: SACConfig, spec: EnvSpec, seed: int = 0) -> None:
        if spec.discrete:
            raise ValueError(f"algo.name='sac' needs a continuous action space; this env has "
                             f"discrete actions ({spec.n_actions})")
        if is_image(spec.obs_shape):
            raise ValueError(f"algo.name='sac' has MLP networks over flat observations only; "
                             f"this env gives images {tuple(spec.obs_shape)}")
        shape = tuple(spec.action_shape)
        low = np.asarray(spec.action_low, dtype=np.float64).reshape(shape)
        high = np.asarray(spec.action_high, dtype=np.float64).reshape(shape)
        if not (np.isfinite(low).all() and np.isfinite(high).all()) or (high <= low).any():
            raise ValueError(f"algo.name='sac' scales its squashed actions to the action "
                             f"space's bounds, which must be finite with low < high; got low "
                             f"{spec.action_low}, high {spec.action_high}")
        torch.manual_seed(seed)
        self.cfg = cfg
        self.spec = spec
        obs_dim = int(np.prod(spec.obs_shape))
        self.act_dim = act_dim = int(np.prod(shape))
        # env action = unit action * scale + bias, elementwise (numpy for acting, torch for
        # learning)
        self._low, self._high = low.astype(np.float32), high.astype(np.float32)
        self._scale = ((high - low) / 2.0).astype(np.float32)
        self._bias = ((high + low) / 2.0).astype(np.float32)
        self.action_scale = torch.from_numpy(self._scale.reshape(-1).copy())
        self.action_bias = torch.from_numpy(self._bias.reshape(-1).copy())

        hidden = tuple(cfg.hidden_sizes)
        self.actor = Actor(obs_dim, act_dim, hidden, cfg.log_std_min, cfg.log_std_max,
                           ObsNormalizer(spec.obs_shape, cfg.obs_clip) if cfg.obs_norm
                           else None)
        self.critic = TwinQ(obs_dim, act_dim, hidden)
        self.critic_target = TwinQ(obs_dim, act_dim, hidden)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.critic_target.requires_grad_(False)
        self.temperature = Temperature(cfg.init_alpha, cfg.autotune)
        self.target_entropy = (-float(act_dim) if cfg.target_entropy is None
                               else float(cfg.target_entropy))
        self._actor_params = list(self.actor.parameters())
        self._critic_params = list(self.critic.parameters())
        self._params = self._actor_params + self._critic_params + (
            [self.temperature.log_alpha] if cfg.autotune else [])
        self._optimizer: Optimizer | None = None  # see `optimizer`
        self.rng = np.random.default_rng(seed)
        # Learning's noise: a stream of its own, saved in checkpoints (see the docstring)
        self.gen = torch.Generator().manual_seed(seed)
        self.version = -1
        self.train_iterations = 0
        self.reducer: Reducer | None = None
        self.device = torch.device("cpu")
        self.precision: Precision = FP32

    @property
    def optimizer(self) -> Optimizer:
        """One Adam over the actor, the critics and log alpha, made on first use: only a
        learner ever steps it (`shared/algos/optim.py`)."""
        if self._optimizer is None:
            self._optimizer = adam(self._params, lr=self.cfg.lr)
        return self._optimizer

    @optimizer.setter
    def optimizer(self, optimizer: Optimizer) -> None:
        """A subclass may bring its own."""
        self._optimizer = optimizer

    @property
    def alpha(self) -> float:
        """The entropy temperature now."""
        return float(self.temperature.log_alpha.detach().exp())

    def set_reducer(self, reducer: Reducer | None) -> None:
        """Learn as one rank of a data-parallel group (None: alone)."""
        self.reducer = reducer

    def to(self, device: torch.device) -> None:
        """Every network, log alpha, and any optimizer state, on `device` (Placeable). The
        learning noise stays on the CPU generator, so a seed learns alike on any device."""
        self.device = torch.device(device)
        for module in (self.actor, self.critic, self.critic_target, self.temperature):
            module.to(self.device)
        self.action_scale = self.action_scale.to(self.device)
        self.action_bias = self.action_bias.to(self.device)
        if self._optimizer is not None:  # its state follows the parameters it loads into
            self._optimizer.load_state_dict(self._optimizer.state_dict())

    def set_precision(self, precision: Precision) -> None:
        """Learn under `learner.precision` (MixedPrecision)."""
        self.precision = precision

    # -- acting -----------------------------------------------------------------------------

    def _to_env(self, unit: torch.Tensor) -> np.ndarray:
        """Actions in [-1, 1]^|A| to the env's Box, float32 (n, *action_shape)."""
        a = unit.float().cpu().numpy().reshape(-1, *self._scale.shape)
        return np.clip(a * self._scale + self._bias, self._low, self._high)

    def _random(self, n: int) -> np.ndarray:
        return self.rng.uniform(self._low, self._high,
                                size=(n, *self._low.shape)).astype(np.float32)

    def _sample(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            mean, log_std = self.actor(self._normalized(as_obs_tensor(obs, self.device)))
            noise = torch.from_numpy(self.rng.standard_normal(
                tuple(mean.shape), dtype=np.float32)).to(self.device)
            unit = torch.tanh(mean + torch.exp(log_std) * noise)
        return self._to_env(unit)

    def act(self, obs: np.ndarray, env_step: int, mask: np.ndarray | None = None
            ) -> ActOutput:
        """Uniform random actions in the Box for the run's first `random_steps` env steps,
        then samples of the squashed Gaussian, both at the env's scale."""
        if env_step < self.cfg.random_steps:
            return ActOutput(self._random(int(obs.shape[0])))
        return ActOutput(self._sample(obs))

    def act_eval(self, obs: np.ndarray, deterministic: bool = True,
                 mask: np.ndarray | None = None) -> np.ndarray:
        """tanh(mean) at the env's scale, or a sample."""
        if not deterministic:
            return self._sample(obs)
        with torch.inference_mode():
            mean, _ = self.actor(self._normalized(as_obs_tensor(obs, self.device)))
            return self._to_env(torch.tanh(mean))

    def bootstrap(self, obs: np.ndarray) -> None:
        return None  # targets bootstrap from next_obs in the learner

    def load_policy(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        self.actor.load_state_dict(state)
        self.version = version

    def policy_state(self) -> dict[str, torch.Tensor]:
        """The actor (and the observation statistics it holds): all that acting needs."""
        return {k: v.detach().clone() for k, v in self.actor.state_dict().items()}

    # -- observation normalisation (algo.obs_norm) ------------------------------------------

    @property
    def tracks_obs_stats(self) -> bool:
        """Whether collectors should count raw observations for this policy."""
        return hasattr(self.actor, "obs_norm")

    def preprocess(self, obs: np.ndarray) -> np.ndarray:
        """What chunks store: the raw observations. Replay holds a transition for hundreds
        of thousands of steps while the statistics move, so SAC normalises at use, with the
        statistics it has then (`_normalized`: acting with the published version's,
        learning with the learner's current ones), as SB3's replay buffer does with
        VecNormalize; observations normalised when acted on would mix every past version's
        statistics in one batch."""
        return obs

    def _normalized(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.obs_norm.normalize_tensor(obs) if self.tracks_obs_stats else obs

    def merge_obs_stats(self, moments: RunningMoments | dict) -> None:
        """Fold a chunk's raw-observation moments (or their wire form, checked) into the
        statistics the next version carries."""
        if not self.tracks_obs_stats:
            return
        if isinstance(moments, dict):
            moments = RunningMoments.from_wire(moments, self.spec.obs_shape)
        self.actor.obs_norm.merge(moments)

    # -- learning ---------------------------------------------------------------------------

    def to_unit(self, action: torch.Tensor) -> torch.Tensor:
        """Stored env-scale actions back in [-1, 1]^|A|, (n, |A|)."""
        return (action.reshape(action.shape[0], -1).float() - self.action_bias) \
            / self.action_scale

    def _noise(self, rows: int) -> torch.Tensor:
        """(2, rows, |A|) standard normal noise for this learn step: [0] for a' at the next
        observations, [1] for the actor's resampled actions. Drawn for the whole group batch
        (rows x world size) and sliced to this rank's rows."""
        r = self.reducer
        world, rank = (r.world_size, r.rank) if r is not None and r.world_size > 1 else (1, 0)
        full = torch.randn((2, rows * world, self.act_dim), generator=self.gen)
        return full[:, rank * rows:(rank + 1) * rows].to(self.device)

    def losses(self, batch: Mapping[str, torch.Tensor], weights: torch.Tensor | None,
               noise: torch.Tensor) -> dict[str, torch.Tensor]:
        """The critic, actor and temperature losses of one batch with the given noise, and
        what goes with them (TD errors, log pi, Q-values): everything `learn` steps on.

        `noise[0]` draws a' ~ pi(.|s') for the target, `noise[1]` the actor's a ~ pi(.|s)."""
        obs, next_obs = self._normalized(batch["obs"]), self._normalized(batch["next_obs"])
        action = self.to_unit(batch["action"])
        reward = batch["reward"].float()
        not_done = 1.0 - batch["terminated"].float()
        per_row = batch.get("discount")
        discount = self.cfg.gamma if per_row is None else per_row.float()
        log_alpha = self.temperature.log_alpha
        alpha = log_alpha.detach().exp()
        with self.precision.autocast():
            with torch.no_grad():
                next_mean, next_log_std = self.actor(next_obs)
                next_action, next_log_prob = squash(next_mean.float(), next_log_std.float(),
                                                    noise[0])
                tq1, tq2 = self.critic_target(next_obs, next_action)
                soft_value = torch.min(tq1, tq2).float() - alpha * next_log_prob
                target = reward + discount * not_done * soft_value
            q1, q2 = self.critic(obs, action)
            mean, log_std = self.actor(obs)
            pi_action, log_prob = squash(mean.float(), log_std.float(), noise[1])
            # The actor's Q-values through frozen critics: its loss moves the actor only.
            self.critic.requires_grad_(False)
            try:
                pq1, pq2 = self.critic(obs, pi_action)
            finally:
                self.critic.requires_grad_(True)
        q1, q2 = q1.float(), q2.float()
        td1, td2 = q1 - target, q2 - target
        per_row = 0.5 * (td1 * td1 + td2 * td2)
        critic_loss = per_row.mean() if weights is None else (weights * per_row).mean()
        actor_loss = (alpha * log_prob - torch.min(pq1, pq2).float()).mean()
        if self.cfg.autotune:
            alpha_loss = -(log_alpha * (log_prob.detach() + self.target_entropy)).mean()
        else:
            alpha_loss = torch.zeros((), device=q1.device)
        return {"critic_loss": critic_loss, "actor_loss": actor_loss, "alpha_loss": alpha_loss,
                "td_abs": 0.5 * (td1.detach().abs() + td2.detach().abs()),
                "log_prob": log_prob.detach(), "q1": q1.detach(), "target": target}

    def learn(self, batch: Mapping[str, torch.Tensor],
              weights: torch.Tensor | None = None) -> LearnOutput:
        """One gradient step on the critics, the actor and the temperature, then the targets'
        Polyak step. `weights` are importance-sampling weights from a prioritized buffer
        (None: all ones); the new priorities are the critics' mean |TD error| per row."""
        rows = int(batch["obs"].shape[0])
        out = self.losses(batch, weights, self._noise(rows))
        alpha = self.temperature.log_alpha.detach().exp()
        critic_norm, actor_norm = self._step(out["critic_loss"] + out["actor_loss"]
                                             + out["alpha_loss"])
        metrics: dict[str, torch.Tensor | float] = {
            "critic_loss": out["critic_loss"].detach(), "actor_loss": out["actor_loss"].detach(),
            "alpha_loss": out["alpha_loss"].detach(), "alpha": alpha,
            "entropy": -out["log_prob"].mean(), "q_mean": out["q1"].mean(),
            "critic_grad_norm": critic_norm, "actor_grad_norm": actor_norm}
        return LearnOutput(metrics, out["td_abs"], {"td_error": out["td_abs"], "q": out["q1"]})

    def _step(self, loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One gradient step on `loss` (gradients averaged over a learner group's ranks),
        then the targets' Polyak step; returns the critics' and the actor's gradient norms
        before clipping."""
        c = self.cfg
        optimizer = self.optimizer
        optimizer.zero_grad(set_to_none=True)
        self.precision.backward(loss)
        if self.reducer is not None and self.reducer.world_size > 1:
            sum_gradients(self._params, self.reducer, scale=1.0 / self.reducer.world_size)
        self.precision.unscale(optimizer)
        critic_norm = clip_grad_norm(self._critic_params, c.max_grad_norm)
        actor_norm = clip_grad_norm(self._actor_params, c.max_grad_norm)
        self.precision.step(optimizer)
        with torch.no_grad():
            for target, online in zip(self.critic_target.parameters(), self._critic_params,
                                      strict=True):
                target.lerp_(online, c.tau)
        self.train_iterations += 1
        return critic_norm, actor_norm

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {f"actor.{k}": v.detach().clone() for k, v in self.actor.state_dict().items()}
        out.update({f"critic.{k}": v.detach().clone()
                    for k, v in self.critic.state_dict().items()})
        out.update({f"critic_target.{k}": v.detach().clone()
                    for k, v in self.critic_target.state_dict().items()})
        out["log_alpha"] = self.temperature.log_alpha.detach().clone()
        out.update(optimizer_state(self.optimizer))
        out["train_iterations"] = torch.tensor(self.train_iterations)
        # The learning noise's generator: ranks that re-form a group from one rank's state,
        # and a resumed run, go on with the same stream.
        out["gen_state"] = self.gen.get_state()
        return out

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        def part(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}

        self.actor.load_state_dict(part("actor."))
        self.critic.load_state_dict(part("critic."))
        self.critic_target.load_state_dict(part("critic_target."))
        with torch.no_grad():
            self.temperature.log_alpha.copy_(state["log_alpha"])
        load_optimizer_state(self.optimizer, dict(state))
        self.train_iterations = int(state["train_iterations"])
        self.gen.set_state(state["gen_state"].to(torch.uint8).cpu())
