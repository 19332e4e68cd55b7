"""A run's whole config (`config.py`) and whether it can run (`check.py`): the top of
`shared`, above the algorithms, envs and data it names."""
