"""What a collector counts for its `/status` and its heartbeat."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CollectorCounters:
    """The collector's figures, written by the pieces of its loop and read by the service.

    Every field has one writer, on the loop's thread (the policy refresh, the evaluator, the
    collect loop); the HTTP and heartbeat threads only read. So no lock: a reader sees each
    figure as it was after the last chunk or evaluation, which is all `/status` promises."""

    env_steps: int = 0  # this collector's env steps (the learning side's moves in a game)
    policy_version: int = -1  # the version acting now; -1: no published policy yet
    policy_loads: int = 0  # newer versions loaded from storage
    evaluations: int = 0  # evaluation tasks run
    chunks_written: int = 0
    chunks_reported: int = 0
    random_steps: int = 0  # env steps acted by `RandomPolicy` while torch loaded
    games_played: int = 0  # self-play games that ended in a chunk
    epsilon: float | None = None  # what acting explores with now (None: not epsilon-greedy)
    apex_slot: int | None = None  # Ape-X: the collect task's slot (None: no Ape-X)
