"""The replay: the run's buffers (uniform, prioritized, episode, sequence, queue, dataset),
their rate limiters and the chunk registry, as a library the coordinator owns and the
single-process runner shares. It imports no torch.

- `replay.py`: `Replay`, every buffer of a run behind one interface (insert, plan and
  sample, priorities, consumption, clear and load, snapshots);
- `buffers/`: the buffer kinds, the sum tree, the rate limiter;
- `datasets.py`: a dataset buffer filled from a Minari dataset.
"""
