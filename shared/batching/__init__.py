"""Batches from chunks: the rows a sample answer names (`rows.py`), the chunk arena that keeps
sampled chunks' columns side by side (`arena.py`), batch assembly with its data transforms
(`batching.py`, `transforms.py`: n-step returns, hindsight relabelling, per-buffer rewards).
The learner's sampler, data process and prefetch thread build on them. Only `batching.py`
imports torch.
"""
