"""Expert CartPole episodes without training anything: a scripted controller written as a
Minari dataset (SQIL's demonstrations, `configs/cartpole-sqil.yaml`).

The controller is linear in the pole's angle and angular velocity: push the cart the way
the pole falls, `action = 1 if theta + 0.5 * theta_dot > 0 else 0`. It holds the pole to the
500-step time limit from every start state tried (CartPole's cart drifts slowly enough not
to leave the track within 500 steps), so every episode is truncated at return 500.

    python -m bench.expert_cartpole --out datasets [--episodes 20] [--seed 0]
    # -> datasets/rlfleet/cartpole-scripted-v0, for buffers.expert.path

The last line of stdout is one JSON object: the dataset's path, episodes, steps and returns.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

DATASET_ID = "rlfleet/cartpole-scripted-v0"


def scripted_action(obs: np.ndarray) -> int:
    """Push towards the side the pole leans and turns to."""
    return int(obs[2] + 0.5 * obs[3] > 0)


def expert_episodes(episodes: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Whole episodes of the scripted controller, in Minari's layout (one more observation
    than actions)."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    out = []
    for k in range(episodes):
        obs, _ = env.reset(seed=seed + k)
        observations, actions, rewards, terms, truncs = [obs], [], [], [], []
        done = False
        while not done:
            action = scripted_action(obs)
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            actions.append(action)
            rewards.append(reward)
            terms.append(terminated)
            truncs.append(truncated)
            done = terminated or truncated
        out.append({"observations": np.asarray(observations, dtype=np.float32),
                    "actions": np.asarray(actions, dtype=np.int64),
                    "rewards": np.asarray(rewards, dtype=np.float64),
                    "terminations": np.asarray(terms, dtype=bool),
                    "truncations": np.asarray(truncs, dtype=bool)})
    env.close()
    return out


def write_expert_dataset(root: str | Path, episodes: int = 20, seed: int = 0,
                         dataset_id: str = DATASET_ID) -> tuple[Path, list[float]]:
    """Write the dataset under the datasets root `root`; its directory and the returns."""
    import gymnasium as gym

    from rlfleet.shared.data.datasets import write_minari

    eps = expert_episodes(episodes, seed)
    env = gym.make("CartPole-v1")
    path = write_minari(root, dataset_id, eps, "CartPole-v1", env.observation_space,
                        env.action_space, "scripted-linear",
                        "CartPole-v1 episodes of a scripted linear controller "
                        "(theta + 0.5 theta_dot > 0: push right)")
    env.close()
    return path, [float(ep["rewards"].sum()) for ep in eps]


def main(argv: list[str] | None = None) -> int:
    from bench.common import emit

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("datasets"), help="datasets root")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    path, returns = write_expert_dataset(args.out, args.episodes, args.seed)
    print(f"{len(returns)} episodes, returns {min(returns):.0f}-{max(returns):.0f}: {path}")
    emit({"path": str(path), "episodes": len(returns), "steps": int(sum(returns)),
          "return_mean": float(np.mean(returns)), "return_min": float(min(returns))})
    return 0


if __name__ == "__main__":
    sys.exit(main())
