"""What feeds the training loops: batches sampled ahead (a prefetch thread or a data process
of the learner's own, behind one `Feed` interface), rollouts of whole chunks for on-policy
learning, and batches staged onto the learner's device."""
