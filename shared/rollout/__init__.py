"""Acting in envs: a vector env and a policy turned into chunks of experience (`rollout.py`)
and evaluation episodes, and two-player games against opponents (`battle.py`). Collectors
run them; so does the single-process runner's collector.
"""
