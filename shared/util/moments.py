"""Running moments of a stream of vectors, mergeable across processes (numpy only: the
collector's rollout counts raw observations with it before torch is even imported)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class RunningMoments:
    """Count, mean and sum of squared deviations (M2) of a stream of vectors, in float64."""

    count: float
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def empty(cls, shape: tuple[int, ...]) -> RunningMoments:
        return cls(0.0, np.zeros(shape), np.zeros(shape))

    @classmethod
    def of(cls, batch: np.ndarray) -> RunningMoments:
        x = np.asarray(batch, dtype=np.float64)
        mean = x.mean(axis=0)
        return cls(float(x.shape[0]), mean, ((x - mean) ** 2).sum(axis=0))

    def update(self, batch: np.ndarray) -> None:
        if len(batch):
            self.merge(RunningMoments.of(batch))

    def merge(self, other: RunningMoments) -> None:
        """Chan, Golub and LeVeque's pairwise update: the moments of both streams together."""
        if other.count == 0:
            return
        total = self.count + other.count
        delta = other.mean - self.mean
        self.mean = self.mean + delta * (other.count / total)
        self.m2 = self.m2 + other.m2 + delta * delta * (self.count * other.count / total)
        self.count = total

    @property
    def var(self) -> np.ndarray:
        return self.m2 / self.count if self.count else np.ones_like(self.mean)

    def to_wire(self) -> dict:
        return {"count": self.count, "mean": self.mean.ravel().tolist(),
                "m2": self.m2.ravel().tolist()}

    @classmethod
    def from_wire(cls, data: dict, shape: tuple[int, ...]) -> RunningMoments:
        """Moments sent by a collector; anything malformed raises ValueError."""
        count = float(data["count"])
        mean = np.asarray(data["mean"], dtype=np.float64).reshape(shape)
        m2 = np.asarray(data["m2"], dtype=np.float64).reshape(shape)
        if not count >= 0 or not np.isfinite(mean).all() or not (m2 >= 0).all():
            raise ValueError("observation moments must be finite, with count and M2 >= 0")
        return cls(count, mean, m2)
