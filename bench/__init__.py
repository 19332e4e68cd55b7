"""Benchmarks: each script prints its figures beside the ceiling they are measured against
(a human table), then one JSON object as the very last line of stdout. None passes or fails
on time."""
