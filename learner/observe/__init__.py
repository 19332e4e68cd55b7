"""What the learner measures and logs: its timers, the metric window between reports, data
shortages, histograms, the batch log and the dataset scores; the last three as built-in
hooks."""
