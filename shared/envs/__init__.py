"""Environments: gymnasium construction, EnvPool, goal envs, two-player games."""
