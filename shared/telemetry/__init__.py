"""Telemetry: the run's logger, its writers, the run directory's data and videos."""
