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

from shared.algos.base import ActOutput, LearnOutput
from shared.algos.nets import clip_grad_norm, load_optimizer_state, mlp, optimizer_state
from shared.config import PPOConfig
from shared.envs import EnvSpec

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

    def __init__(self, spec: EnvSpec, hidden: tuple[int, ...], init_log_std: float) -> None:
        super().__init__()
        obs_dim = int(np.prod(spec.obs_shape))
        self.discrete = spec.discrete
        self.action_shape = spec.action_shape
        out_dim = spec.n_actions if spec.discrete else int(np.prod(spec.action_shape))
        self.actor = _orthogonal_init(mlp(obs_dim, hidden, out_dim, nn.Tanh), 0.01)
        self.critic = _orthogonal_init(mlp(obs_dim, hidden, 1, nn.Tanh), 1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((out_dim,), float(init_log_std)))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs.flatten(1)).squeeze(1)

    def head(self, obs: torch.Tensor) -> torch.Tensor:
        """Discrete: logits (n, n_actions); continuous: the Gaussian's mean (n, action_dim)."""
        return self.actor(obs.flatten(1))

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
    The TD errors are vectorised; only the recursion is a loop, over Python floats (about
    2 ms for 8k rows, far below one learn round).
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

    def __init__(self, cfg: PPOConfig, spec: EnvSpec, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.cfg = cfg
        self.spec = spec
        self.net = ActorCritic(spec, cfg.hidden_sizes, cfg.init_log_std)
        self._params = list(self.net.parameters())
        # eps 1e-5 as in CleanRL; fused: one kernel over all parameters, about a quarter off
        # each learn round's time on CPU.
        self.optimizer = torch.optim.Adam(self._params, lr=cfg.lr, eps=1e-5, fused=True)
        # Sampling and minibatch shuffling draw from a generator of their own, so a seed gives
        # the same actions however much other code touches torch's global generator.
        self.gen = torch.Generator().manual_seed(seed)
        self.version = -1
        self.train_iterations = 0

    # -- acting -----------------------------------------------------------------------------

    def _sample(self, head: torch.Tensor) -> torch.Tensor:
        if self.spec.discrete:
            return torch.multinomial(torch.softmax(head, dim=1), 1, generator=self.gen).squeeze(1)
        noise = torch.randn(head.shape, generator=self.gen)
        return head + noise * self.net.log_std.exp()

    def _to_actions(self, action: torch.Tensor) -> np.ndarray:
        """int64 (n,) for discrete actions, float32 (n, *action_shape) for continuous ones."""
        if self.spec.discrete:
            return action.numpy().astype(np.int64, copy=False)
        return action.reshape(-1, *self.spec.action_shape).numpy()

    def act(self, obs: np.ndarray, env_step: int) -> ActOutput:
        """Sampled actions with their log-probs and V(obs), both float32 (n,)."""
        with torch.inference_mode():
            x = torch.as_tensor(obs, dtype=torch.float32)
            head = self.net.head(x)
            action = self._sample(head)
            log_prob, _ = self.net.log_prob_entropy(head, action)
            value = self.net.value(x)
        return ActOutput(self._to_actions(action),
                         {"log_prob": log_prob.numpy(), "value": value.numpy()})

    def act_eval(self, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
        """The most likely action (argmax, or the Gaussian's mean) or a sample."""
        with torch.inference_mode():
            head = self.net.head(torch.as_tensor(obs, dtype=torch.float32))
            if not deterministic:
                action = self._sample(head)
            else:
                action = head.argmax(dim=1) if self.spec.discrete else head
        return self._to_actions(action)

    def bootstrap(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) as float32 (n,): the value a cut run continues with."""
        with torch.inference_mode():
            return self.net.value(torch.as_tensor(obs, dtype=torch.float32)).numpy()

    def load_policy(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        self.net.load_state_dict(state)
        self.version = version

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
        """
        if weights is not None:
            raise ValueError("PPO learns from whole on-policy chunks; importance weights from "
                             "a prioritized buffer do not apply")
        c = self.cfg
        old_value = batch["value"].float()
        adv_np, ret_np = gae(batch["reward"].numpy() * c.reward_scale, old_value.numpy(),
                             batch["bootstrap_value"].numpy(), batch["terminated"].numpy(),
                             batch["cut"].numpy(), c.gamma, c.gae_lambda)
        advantages, returns = torch.from_numpy(adv_np), torch.from_numpy(ret_np)
        obs = batch["obs"].float()
        action = batch["action"] if self.spec.discrete else batch["action"].float()
        old_log_prob = batch["log_prob"].float()

        rows = obs.shape[0]
        n_minibatches = max(1, rows // c.batch_size)
        totals = torch.zeros(len(METRICS))
        for _ in range(c.epochs):
            perm = torch.randperm(rows, generator=self.gen)
            for idx in torch.tensor_split(perm, n_minibatches):
                stats = self._update(obs[idx], action[idx], old_log_prob[idx], old_value[idx],
                                     advantages[idx], returns[idx])
                totals += stats
        means = totals / (c.epochs * n_minibatches)
        metrics: dict[str, torch.Tensor | float] = dict(zip(METRICS, means.unbind(0),
                                                            strict=True))
        metrics["explained_variance"] = explained_variance(old_value, returns)
        metrics["value_mean"] = old_value.mean()
        metrics["rollout_rows"] = float(rows)
        return LearnOutput(metrics)

    def _update(self, obs: torch.Tensor, action: torch.Tensor, old_log_prob: torch.Tensor,
                old_value: torch.Tensor, advantages: torch.Tensor, returns: torch.Tensor
                ) -> torch.Tensor:
        """One gradient step on one minibatch; its METRICS as one detached tensor."""
        c = self.cfg
        log_prob, entropy = self.net.log_prob_entropy(self.net.head(obs), action)
        value = self.net.value(obs)

        log_ratio = log_prob - old_log_prob
        ratio = log_ratio.exp()
        if c.norm_adv and advantages.numel() > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        policy_loss = torch.max(-advantages * ratio,
                                -advantages * ratio.clamp(1 - c.clip_coef, 1 + c.clip_coef)).mean()
        if c.clip_vloss:
            clipped = old_value + (value - old_value).clamp(-c.clip_coef, c.clip_coef)
            value_loss = 0.5 * torch.max((value - returns) ** 2, (clipped - returns) ** 2).mean()
        else:
            value_loss = 0.5 * ((value - returns) ** 2).mean()
        entropy_mean = entropy.mean()
        loss = policy_loss - c.ent_coef * entropy_mean + c.vf_coef * value_loss

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = clip_grad_norm(self._params, c.max_grad_norm)
        self.optimizer.step()
        self.train_iterations += 1

        with torch.no_grad():
            approx_kl = ((ratio - 1) - log_ratio).mean()  # the low-variance k3 estimator
            clip_frac = ((ratio - 1).abs() > c.clip_coef).float().mean()
            return torch.stack([policy_loss, value_loss, entropy_mean, approx_kl, clip_frac,
                                grad_norm]).detach()

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {f"net.{k}": v for k, v in self.policy_state().items()}
        out.update(optimizer_state(self.optimizer))
        out["train_iterations"] = torch.tensor(self.train_iterations)
        return out

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.net.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("net.")})
        load_optimizer_state(self.optimizer, dict(state))
        self.train_iterations = int(state["train_iterations"])
