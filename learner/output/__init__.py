"""What the learner sends out: policy versions (the publish thread and where it writes:
storage, or a data process's relay), checkpoints, learn-info reports and priorities; and the
built-in hooks that do each at its stage of the training loops."""
