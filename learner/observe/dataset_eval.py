"""The metric evaluator: the current policy scored on a held-out dataset, every N train
iterations, on the learner (which holds the policy; no env is stepped).

Metrics (`eval.dataset.metric`), over the dataset's first `max_steps` steps:
- `action_accuracy`: the share of steps where the policy's greedy action is the dataset's
  (discrete actions);
- `td_error`: mean |r + gamma (1 - terminated) max_a' Q(s', a') - Q(s, a)| with the online
  network throughout (Q-learning policies: dqn, cql);
- `return_prediction`: mean |max_a Q(s, a) - G(s)|, G the discounted return from s to its
  episode's end in the dataset.

`DatasetScores` is the built-in hook: after an update, when due, on the group's publisher,
into the next report.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlfleet.learner.hooks import HookContext, HookRunner, Order
from rlfleet.shared.algos.base import Policy
from rlfleet.shared.algos.capabilities import QValues
from rlfleet.shared.algos.nets import as_obs_tensor
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.data.datasets import discounted_returns, episodes, open_dataset, transitions
from rlfleet.shared.run.config import RunConfig

BATCH = 4096


def q_values(policy: Policy, obs: np.ndarray) -> np.ndarray:
    """Q(s, .) of a Q-learning policy (`QValues`), in batches."""
    if not isinstance(policy, QValues):  # the launch check refuses such a config first
        raise ConfigError(f"eval.dataset.metric: needs Q-values; {type(policy).__name__} is "
                          "not QValues (use algo.name dqn or cql)")
    with torch.inference_mode():
        return np.concatenate([policy.q_values(as_obs_tensor(obs[i:i + BATCH])).cpu().numpy()
                               for i in range(0, len(obs), BATCH)])


class DatasetScorer:
    def __init__(self, cfg: RunConfig, spec: EnvSpec) -> None:
        d = cfg.eval.dataset
        assert d is not None
        self.metric = d.metric
        self.every = d.every_train_iterations
        self.gamma = cfg.algo.gamma
        if self.metric == "action_accuracy" and not spec.discrete:
            raise ConfigError("eval.dataset.metric=action_accuracy needs discrete actions")
        self.data = transitions(episodes(open_dataset(d.path, d.minari_id, "eval.dataset"),
                                         spec, "eval.dataset", d.max_steps), "eval.dataset")
        self.returns = discounted_returns(self.data["reward"], self.data["cut"], self.gamma)
        self.last = 0

    def due(self, train_iterations: int) -> bool:
        return train_iterations - self.last >= self.every

    def score(self, policy: Policy, train_iterations: int) -> dict[str, float]:
        self.last = train_iterations
        return {self.metric: score(self.metric, policy, self.data, self.returns, self.gamma)}


class DatasetScores:
    """The built-in hook (`eval.dataset`). The dataset is read the first time the group's
    publisher scores (the other ranks never need it); the state is when it last scored."""

    def __init__(self, cfg: RunConfig, outbox: Any, session: Any) -> None:
        assert cfg.eval.dataset is not None
        self.cfg = cfg
        self.every = cfg.eval.dataset.every_train_iterations
        self.last = 0
        self.scorer: DatasetScorer | None = None
        self.outbox = outbox
        self.session = session

    def register(self, runner: HookRunner) -> None:
        runner.register_op("after_iter", self._after_iter, Order.DATASET_SCORES)
        runner.register_state("dataset_scores", self)

    def _after_iter(self, ctx: HookContext) -> None:
        iterations = ctx.train_iterations
        if not self.session.is_publisher or iterations - self.last < self.every:
            return
        if self.scorer is None:
            from rlfleet.shared.envs.make import run_spec

            self.scorer = DatasetScorer(self.cfg, run_spec(self.cfg))
        self.last = iterations
        self.outbox.dataset_eval = self.scorer.score(ctx.policy, iterations)

    def state_dict(self) -> dict[str, Any]:
        return {"last": self.last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last = int(state.get("last", self.last))


def score(metric: str, policy: Policy, data: dict[str, np.ndarray], returns: np.ndarray,
          gamma: float) -> float:
    obs, action = data["obs"], data["action"].astype(np.int64)
    if metric == "action_accuracy":
        greedy = np.concatenate([policy.act_eval(obs[i:i + BATCH], deterministic=True)
                                 for i in range(0, len(obs), BATCH)])
        return float((greedy == action).mean())
    q = q_values(policy, obs)
    if metric == "return_prediction":
        return float(np.abs(q.max(axis=1) - returns).mean())
    next_q = q_values(policy, data["next_obs"]).max(axis=1)
    target = data["reward"] + gamma * (1.0 - data["terminated"]) * next_q
    return float(np.abs(target - q[np.arange(len(q)), action]).mean())
