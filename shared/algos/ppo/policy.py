"""PPO with the clipped surrogate objective and GAE(lambda): acting and learning, top to bottom.

Separate actor and critic MLPs (Tanh, orthogonal init as in CleanRL). Discrete actions come
from a categorical over the actor's logits; continuous ones from a diagonal Gaussian whose
mean is the actor's output and whose log std is one state-independent parameter per action
dimension. Continuous actions are not squashed: the env clips them, and the log-prob is that
of the raw sample the collector stores.

Collectors store `log_prob` and `value` (the critic's V(obs)) beside every action, and
`bootstrap_value` on cut rows, so the learner needs no second pass of the acting policy:
the old log-probs and values in a rollout are exactly those the actions were drawn with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from rlfleet.shared.algos.base import ActOutput, LearnOutput, Optimizer, Reducer
from rlfleet.shared.algos.device import FP32, Precision
from rlfleet.shared.algos.nets import (
    NatureCNN,
    as_obs_tensor,
    clip_grad_norm,
    load_optimizer_state,
    mlp,
    optimizer_state,
    orthogonal_,
    sum_gradients,
)
from rlfleet.shared.algos.obsnorm import ObsNormalizer
from rlfleet.shared.algos.optim import adam
from rlfleet.shared.algos.ppo.config import PPOConfig
from rlfleet.shared.contract.spec import EnvSpec, is_image
from rlfleet.shared.util.moments import RunningMoments

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
METRICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac", "grad_norm")


def _orthogonal_init(net: nn.Sequential, out_gain: float) -> nn.Sequential:
    """Orthogonal weights, zero biases; gain sqrt(2) for hidden layers and `out_gain` for the
    last, so initial logits are near uniform (0.01) and values near zero scale (1.0)."""
    linears = [m for m in net if isinstance(m, nn.Linear)]
    for i, layer in enumerate(linears):
        nn.init.orthogonal_(layer.weight, out_gain if i == len(linears) - 1 else math.sqrt(2))
        nn.init.zeros_(layer.bias)
    return net


class ActorCritic(nn.Module):
    """Actor, critic and (continuous actions) log std; its state dict is the published policy,
    since collectors need the critic too (values and bootstrap values are computed there)."""

    def __init__(self, spec: EnvSpec, hidden: tuple[int, ...], init_log_std: float,
                 obs_norm: ObsNormalizer | None = None) -> None:
        super().__init__()
        if obs_norm is not None:  # published with the weights: see shared/algos/obsnorm.py
            self.obs_norm = obs_norm
        obs_dim = int(np.prod(spec.obs_shape))
        self.discrete = spec.discrete
        self.action_shape = spec.action_shape
        out_dim = spec.n_actions if spec.discrete else int(np.prod(spec.action_shape))
        self.image = is_image(spec.obs_shape)
        if self.image:
            # CleanRL's ppo_atari: one Nature CNN trunk shared by a linear actor and critic
            # (`hidden` is then unused).
            if not spec.discrete:
                raise ValueError("PPO on image observations supports discrete actions only")
            self.trunk = NatureCNN(spec.obs_shape, init=orthogonal_)
            actor = nn.Linear(self.trunk.features, out_dim)
            critic = nn.Linear(self.trunk.features, 1)
            orthogonal_(actor, 0.01)
            orthogonal_(critic, 1.0)
            self.actor: nn.Module = actor
            self.critic: nn.Module = critic
        else:
            self.actor = _orthogonal_init(mlp(obs_dim, hidden, out_dim, nn.Tanh), 0.01)
            self.critic = _orthogonal_init(mlp(obs_dim, hidden, 1, nn.Tanh), 1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((out_dim,), float(init_log_std)))

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.trunk(obs) if self.image else obs.flatten(1).float()

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self._features(obs)).squeeze(1)

    def head(self, obs: torch.Tensor) -> torch.Tensor:
        """Discrete: logits (n, n_actions); continuous: the Gaussian's mean (n, action_dim)."""
        return self.actor(self._features(obs))

    def head_value(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both at once: an image is read by the shared trunk once, not twice."""
        x = self._features(obs)
        return self.actor(x), self.critic(x).squeeze(1)

    def log_prob_entropy(self, head: torch.Tensor, action: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-prob of `action` and the distribution's entropy, one value per row. Written out
        rather than via torch.distributions: these run on every env step, where the
        distribution objects' argument checks and broadcasting cost more than the maths."""
        if self.discrete:
            logp = torch.log_softmax(head, dim=1)
            chosen = logp.gather(1, action.long().reshape(-1, 1)).squeeze(1)
            return chosen, -(logp.exp() * logp).sum(dim=1)
        z = (action.reshape(head.shape) - head) * torch.exp(-self.log_std)
        logp = (-0.5 * z * z - self.log_std - LOG_SQRT_2PI).sum(dim=1)
        entropy = (self.log_std + 0.5 + LOG_SQRT_2PI).sum().expand(head.shape[0])
        return logp, entropy


def gae(reward: np.ndarray | torch.Tensor, value: np.ndarray | torch.Tensor,
        bootstrap_value: np.ndarray | torch.Tensor, terminated: np.ndarray | torch.Tensor,
        cut: np.ndarray | torch.Tensor, gamma: float, lam: float
        ) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimates and lambda-returns (advantage + value), float32 numpy.

    Rows are runs of consecutive steps, each ending at a `cut` row; the next value of row t is
    value[t+1] inside a run and bootstrap_value[t] on a cut row (V of the observation the run
    stopped at: a truncation, or where the chunk ended), and 0 when row t terminated. The
    lambda-recursion stops at every cut and termination, so runs never leak into each other.
    The TD errors are vectorised; only the recursion is a loop, over Python floats (far
    below one learn round's cost).
    """
    r = np.asarray(reward, dtype=np.float32)
    v = np.asarray(value, dtype=np.float32)
    boot = np.asarray(bootstrap_value, dtype=np.float32)
    term = np.asarray(terminated, dtype=bool)
    cut = np.asarray(cut, dtype=bool)
    n = r.shape[0]
    if n == 0 or not cut[-1]:
        raise ValueError("gae: the last row must end a run (cut=True): its next value is "
                         "otherwise unknown")
    next_value = np.where(cut, boot, np.append(v[1:], np.float32(0.0)))
    next_value = np.where(term, np.float32(0.0), next_value)
    delta = (r + np.float32(gamma) * next_value - v).tolist()
    carry = (np.float32(gamma * lam) * ~(cut | term)).tolist()
    adv = [0.0] * n
    last = 0.0
    for t in range(n - 1, -1, -1):
        last = delta[t] + carry[t] * last
        adv[t] = last
    advantages = np.asarray(adv, dtype=np.float32)
    return advantages, advantages + v


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1 - Var(target - pred) / Var(target): 1 is a perfect critic, 0 one that predicts the
    mean, negative one worse than that (NaN when the targets do not vary)."""
    return 1.0 - (target - pred).var() / target.var()


class PPO:
    on_policy: ClassVar[bool] = True
    device: torch.device  # where its networks live (Placeable)

    def __init__(self, cfg: PPOConfig, spec: EnvSpec, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.cfg = cfg
        self.spec = spec
        self.net = ActorCritic(spec, cfg.hidden_sizes, cfg.init_log_std,
                               ObsNormalizer(spec.obs_shape, cfg.obs_clip) if cfg.obs_norm
                               else None)
        self._params = list(self.net.parameters())
        self._optimizer: Optimizer | None = None  # see `optimizer`
        # Sampling and minibatch shuffling draw from a generator of their own, so a seed gives
        # the same actions however much other code touches torch's global generator.
        self.gen = torch.Generator().manual_seed(seed)
        self._act_gen = self.gen  # acting's: on the acting device (`to`)
        self._seed = seed
        self.device = torch.device("cpu")
        self.precision: Precision = FP32
        self.version = -1
        self.train_iterations = 0
        self.rows_learned = 0  # of whole rollouts (every rank's share): drives lr_anneal_rows
        self.reducer: Reducer | None = None

    @property
    def optimizer(self) -> Optimizer:
        """Made on first use: only a learner ever steps it (`shared/algos/optim.py`); eps
        1e-5 as in CleanRL."""
        if self._optimizer is None:
            self._optimizer = adam(self._params, lr=self.cfg.lr, eps=1e-5)
        return self._optimizer

    @optimizer.setter
    def optimizer(self, optimizer: Optimizer) -> None:
        """A subclass may bring its own (for a network of its own)."""
        self._optimizer = optimizer

    def set_reducer(self, reducer: Reducer | None) -> None:
        """Learn as one rank of a data-parallel group (None: alone)."""
        self.reducer = reducer

    def to(self, device: torch.device) -> None:
        """The network, and any optimizer state, on `device` (Placeable). Acting on a GPU
        samples from a generator there, seeded alike; the minibatch shuffle stays on the CPU
        generator, so a seed shuffles alike on any device."""
        self.device = torch.device(device)
        self.net.to(self.device)
        self._act_gen = (self.gen if self.device.type == "cpu"
                         else torch.Generator(self.device).manual_seed(self._seed))
        if self._optimizer is not None:  # its state follows the parameters it loads into
            self._optimizer.load_state_dict(self._optimizer.state_dict())

    def set_precision(self, precision: Precision) -> None:
        """Learn under `learner.precision` (MixedPrecision)."""
        self.precision = precision

    # -- acting -----------------------------------------------------------------------------

    def _masked(self, head: torch.Tensor, mask: torch.Tensor | np.ndarray | None
                ) -> torch.Tensor:
        """Logits of illegal actions at a large negative number (not -inf: the entropy's
        p log p must stay 0, not nan), so they are never sampled and carry no gradient."""
        if mask is None or not self.spec.discrete:
            return head
        legal = torch.as_tensor(mask, dtype=torch.bool, device=head.device)
        legal = legal | ~legal.any(dim=1, keepdim=True)
        return head.masked_fill(~legal, -1e9)

    def _sample(self, head: torch.Tensor) -> torch.Tensor:
        if self.spec.discrete:
            return torch.multinomial(torch.softmax(head, dim=1), 1,
                                     generator=self._act_gen).squeeze(1)
        noise = torch.randn(head.shape, generator=self._act_gen, device=head.device)
        return head + noise * self.net.log_std.exp()

    def _to_actions(self, action: torch.Tensor) -> np.ndarray:
        """int64 (n,) for discrete actions, float32 (n, *action_shape) for continuous ones."""
        action = action.cpu()
        if self.spec.discrete:
            return action.numpy().astype(np.int64, copy=False)
        return action.reshape(-1, *self.spec.action_shape).numpy()

    def act(self, obs: np.ndarray, env_step: int, mask: np.ndarray | None = None
            ) -> ActOutput:
        """Sampled actions with their log-probs and V(obs), both float32 (n,); only legal
        ones under `mask`."""
        with torch.inference_mode():
            head, value = self.net.head_value(as_obs_tensor(obs, self.device))
            head = self._masked(head, mask)
            action = self._sample(head)
            log_prob, _ = self.net.log_prob_entropy(head, action)
        return ActOutput(self._to_actions(action),
                         {"log_prob": log_prob.cpu().numpy(), "value": value.cpu().numpy()})

    def act_eval(self, obs: np.ndarray, deterministic: bool = True,
                 mask: np.ndarray | None = None) -> np.ndarray:
        """The most likely action (argmax, or the Gaussian's mean) or a sample."""
        with torch.inference_mode():
            head = self._masked(self.net.head(as_obs_tensor(obs, self.device)), mask)
            if not deterministic:
                action = self._sample(head)
            else:
                action = head.argmax(dim=1) if self.spec.discrete else head
        return self._to_actions(action)

    def bootstrap(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) as float32 (n,): the value a cut run continues with."""
        with torch.inference_mode():
            return self.net.value(as_obs_tensor(obs, self.device)).cpu().numpy()

    def load_policy(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        self.net.load_state_dict(state)
        self.version = version

    # -- observation normalisation (algo.obs_norm) ------------------------------------------

    @property
    def tracks_obs_stats(self) -> bool:
        """Whether collectors should count raw observations for this policy."""
        return hasattr(self.net, "obs_norm")

    def preprocess(self, obs: np.ndarray) -> np.ndarray:
        """What the policy acts on and chunks store: observations normalised by the
        statistics of the version held (frozen until the next one)."""
        return self.net.obs_norm.normalize(obs) if self.tracks_obs_stats else obs

    def merge_obs_stats(self, moments: RunningMoments | dict) -> None:
        """The learner's side: fold a chunk's raw-observation moments (or their wire form,
        which is checked: ValueError) into the statistics the next version carries."""
        if not self.tracks_obs_stats:
            return
        if isinstance(moments, dict):
            moments = RunningMoments.from_wire(moments, self.spec.obs_shape)
        self.net.obs_norm.merge(moments)

    def policy_state(self) -> dict[str, torch.Tensor]:
        """Actor, critic and log std (collectors compute values as well as actions)."""
        return {k: v.detach().clone() for k, v in self.net.state_dict().items()}

    # -- learning ---------------------------------------------------------------------------

    def learn(self, batch: Mapping[str, torch.Tensor],
              weights: torch.Tensor | None = None) -> LearnOutput:
        """`cfg.epochs` passes of shuffled minibatch updates over one rollout.

        `batch` is whole chunks concatenated (each chunk's rows in order) and needs `obs`,
        `action`, `reward`, `terminated`, `cut`, and the collectors' `log_prob`, `value` and
        `bootstrap_value`. Each epoch splits the rows into rows // batch_size minibatches of
        nearly equal size (at least batch_size rows each, one minibatch when the rollout is
        smaller), so every row is used every epoch and no minibatch is a tiny remainder whose
        advantage normalisation would be noise. Metrics are means over all minibatch updates;
        `explained_variance` and `value_mean` describe the collectors' values on the rollout.

        In a learner group, `batch` is this rank's share of the rollout (possibly empty: then
        `{}`). The rollout is the ranks' shares in rank order; every rank draws the same
        permutation of all its rows, and minibatch k is split of it, of which each rank
        holds the rows in its share. Losses are sums over a rank's rows divided by the whole
        minibatch's size and advantages are normalised with the whole minibatch's mean and
        std, so the summed gradients are exactly those of one learner on the whole rollout.
        """
        if weights is not None:
            raise ValueError("PPO learns from whole on-policy chunks; importance weights from "
                             "a prioritized buffer do not apply")
        c = self.cfg
        batch = batch if batch and batch["obs"].shape[0] else self._empty_batch()
        batch = {k: v.to(self.device) for k, v in batch.items()}  # no copy where they are
        rows = int(batch["obs"].shape[0])
        old_value = batch["value"].float()
        advantages, returns, extra = self._targets(batch, old_value, rows)
        obs = as_obs_tensor(batch["obs"])  # images stay uint8: the trunk scales them
        action = batch["action"] if self.spec.discrete else batch["action"].float()
        old_log_prob = batch["log_prob"].float()
        mask = batch.get("action_mask")
        if mask is not None:
            mask = mask.bool()

        offset, total = self._rows_before_and_total(rows)
        if total == 0:
            return LearnOutput({"rollout_rows": 0.0})
        n_minibatches = max(1, total // c.batch_size)
        self._set_lr()
        self.rows_learned += total
        totals = torch.zeros(len(METRICS), device=self.device)
        for _ in range(c.epochs):
            perm = torch.randperm(total, generator=self.gen).to(self.device)
            for idx in torch.tensor_split(perm, n_minibatches):
                mine = idx[(idx >= offset) & (idx < offset + rows)] - offset
                totals += self._update(obs[mine], action[mine], old_log_prob[mine],
                                       old_value[mine], advantages[mine], returns[mine],
                                       int(idx.numel()), None if mask is None else mask[mine])
        means = totals / (c.epochs * n_minibatches)
        metrics: dict[str, torch.Tensor | float] = dict(zip(METRICS, means.unbind(0),
                                                            strict=True))
        if rows > 1:
            metrics["explained_variance"] = explained_variance(old_value, returns)
        if rows:
            metrics["value_mean"] = old_value.mean()
        metrics["rollout_rows"] = float(total)
        metrics.update(extra)
        return LearnOutput(metrics)

    def _targets(self, batch: Mapping[str, torch.Tensor], old_value: torch.Tensor, rows: int
                 ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor | float]]:
        """Advantages and value targets for this rank's rows, and metrics of their own:
        GAE(lambda) over the values the collectors stored (the acting policy is the learning
        one, up to `max_policy_lag` versions)."""
        c = self.cfg
        if not rows:
            empty = torch.zeros(0, device=self.device)
            return empty, empty, {}
        # GAE is a sequential scan: numpy on the host, a few floats a row
        host = {k: batch[k].cpu().numpy()
                for k in ("reward", "bootstrap_value", "terminated", "cut")}
        adv_np, ret_np = gae(host["reward"] * c.reward_scale, old_value.cpu().numpy(),
                             host["bootstrap_value"], host["terminated"], host["cut"],
                             c.gamma, c.gae_lambda)
        return (torch.from_numpy(adv_np).to(self.device),
                torch.from_numpy(ret_np).to(self.device), {})

    def _policy_loss(self, advantages: torch.Tensor, ratio: torch.Tensor,
                     log_prob: torch.Tensor) -> torch.Tensor:
        """The clipped surrogate, summed over this rank's rows of a minibatch."""
        c = self.cfg
        return torch.max(-advantages * ratio,
                         -advantages * ratio.clamp(1 - c.clip_coef, 1 + c.clip_coef)).sum()

    def _set_lr(self) -> None:
        """The rate for the next rollout, on the optimizer. Annealed by rows learned
        rather than by learn rounds, since a distributed rollout's size varies with how many
        whole chunks arrived; every rank counts the same group-wide rows, so all agree."""
        c = self.cfg
        lr = c.lr if c.lr_anneal_rows is None else \
            c.lr * max(0.0, 1.0 - self.rows_learned / c.lr_anneal_rows)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _rows_before_and_total(self, rows: int) -> tuple[int, int]:
        """(rows held by lower ranks, rows in the whole rollout): one collective in a group."""
        r = self.reducer
        if r is None or r.world_size == 1:
            return 0, rows
        counts = torch.zeros(r.world_size, dtype=torch.float64)
        counts[r.rank] = rows
        r.sum_([counts])
        per_rank = counts.round().long().tolist()
        return int(sum(per_rank[:r.rank])), int(sum(per_rank))

    def _empty_batch(self) -> dict[str, torch.Tensor]:
        """A rank whose share is empty still takes part in every collective."""
        action_shape = () if self.spec.discrete else tuple(self.spec.action_shape)
        empty = {k: torch.zeros(0) for k in ("reward", "value", "bootstrap_value", "log_prob")}
        empty.update(terminated=torch.zeros(0, dtype=torch.bool),
                     cut=torch.zeros(0, dtype=torch.bool),
                     obs=torch.zeros((0, *self.spec.obs_shape),
                                     dtype=torch.uint8 if self.net.image else torch.float32),
                     action=torch.zeros((0, *action_shape),
                                        dtype=torch.long if self.spec.discrete else torch.float32))
        return empty

    def _update(self, obs: torch.Tensor, action: torch.Tensor, old_log_prob: torch.Tensor,
                old_value: torch.Tensor, advantages: torch.Tensor, returns: torch.Tensor,
                size: int, mask: torch.Tensor | None = None) -> torch.Tensor:
        """One gradient step on one minibatch of `size` rows (this rank holds the rows
        given); its METRICS as one detached tensor, the same on every rank."""
        c = self.cfg
        group = self.reducer if self.reducer is not None and self.reducer.world_size > 1 \
            else None
        with self.precision.autocast():
            head, value = self.net.head_value(obs)
            log_prob, entropy = self.net.log_prob_entropy(self._masked(head, mask), action)
        value, log_prob, entropy = value.float(), log_prob.float(), entropy.float()

        log_ratio = log_prob - old_log_prob
        ratio = log_ratio.exp()
        if c.norm_adv and size > 1:
            # Mean and unbiased std of the whole minibatch, from sums in float64.
            a64 = advantages.double()
            sums = torch.stack([a64.sum(), (a64 * a64).sum()])
            if group is not None:
                group.sum_([sums])
            mean = sums[0] / size
            std = ((sums[1] - size * mean * mean) / (size - 1)).clamp(min=0.0).sqrt()
            advantages = ((a64 - mean) / (std + 1e-8)).float()
        inv = 1.0 / size
        policy_loss = self._policy_loss(advantages, ratio, log_prob) * inv
        if c.clip_vloss:
            clipped = old_value + (value - old_value).clamp(-c.clip_coef, c.clip_coef)
            value_loss = 0.5 * torch.max((value - returns) ** 2,
                                         (clipped - returns) ** 2).sum() * inv
        else:
            value_loss = 0.5 * ((value - returns) ** 2).sum() * inv
        entropy_mean = entropy.sum() * inv
        loss = policy_loss - c.ent_coef * entropy_mean + c.vf_coef * value_loss

        self.optimizer.zero_grad(set_to_none=True)
        self.precision.backward(loss)
        with torch.no_grad():
            approx_kl = ((ratio - 1) - log_ratio).sum() * inv  # the low-variance k3 estimator
            clip_frac = ((ratio - 1).abs() > c.clip_coef).float().sum() * inv
            stats = torch.stack([policy_loss, value_loss, entropy_mean, approx_kl,
                                 clip_frac]).detach()
        if group is not None:  # gradients and metrics in one collective
            sum_gradients(self._params, group, extra=[stats])
        self.precision.unscale(self.optimizer)
        grad_norm = clip_grad_norm(self._params, c.max_grad_norm)
        self.precision.step(self.optimizer)
        self.train_iterations += 1
        return torch.cat([stats, grad_norm.detach().reshape(1)])

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {f"net.{k}": v for k, v in self.policy_state().items()}
        out.update(optimizer_state(self.optimizer))
        out["train_iterations"] = torch.tensor(self.train_iterations)
        out["rows_learned"] = torch.tensor(self.rows_learned)
        # The minibatch shuffle's generator: ranks that re-form a group from one rank's state
        # must draw the same permutations.
        out["gen_state"] = self.gen.get_state()
        return out

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.net.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("net.")})
        load_optimizer_state(self.optimizer, dict(state))
        self.train_iterations = int(state["train_iterations"])
        # absent from an earlier version's checkpoint, whose run annealed nothing
        self.rows_learned = int(state.get("rows_learned", torch.tensor(0)))
        if "gen_state" in state:  # absent from an earlier version's checkpoint
            self.gen.set_state(state["gen_state"].to(torch.uint8))
