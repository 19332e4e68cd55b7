"""Algorithms behind the `Policy` interface (`shared/algos/base.py`): DQN and PPO."""
