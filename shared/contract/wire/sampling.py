"""Sampling and learning (learner <-> coordinator): sample requests and their answers,
and what a learner reports back (metrics, priorities, consumed chunks, logged samples).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rlfleet.shared.contract.wire.base import (
    MAX_COUNT,
    Count,
    Finite,
    Id,
    Int64,
    Request,
    Response,
    Version,
)


class MixShare(Request):
    buffer: Id
    fraction: float = Field(gt=0, le=1)


# Items (batch rows) one sample request may ask for, all batches together: an answer holds
# three int64 arrays per item (and their JSON lists), so one request cannot take the
# coordinator's memory (1024 x 65,536 items would be 1.6 GB of arrays alone).
MAX_SAMPLE_ITEMS = 262_144


def sample_items(batch_size: int, num_batches: int, by_buffer: dict[str, int] | None) -> int:
    """The items a request asks for: its batches times their size (by_buffer: their sum)."""
    per_batch = sum(by_buffer.values()) if by_buffer else batch_size
    return per_batch * num_batches


class SampleRequest(Request):
    worker_id: Id
    batch_size: int = Field(ge=1, le=65_536, description="items per batch (with `mix`)")
    num_batches: int = Field(ge=1, le=1024)
    wait_s: float = Field(0.0, ge=0, le=30, description="how long to wait for the buffer or "
                          "the rate limiter before answering 429")
    mix: list[MixShare] | None = Field(None, min_length=1, max_length=16, description="draw "
                                       "each batch from these buffers in these fractions")
    # The size bound is on the values' type, so the OpenAPI document states it too.
    by_buffer: dict[str, Annotated[int, Field(ge=1, le=65_536)]] | None = Field(
        None, min_length=1, max_length=16, description="or: one batch per buffer, of this size")
    group_generation: int | None = Field(None, ge=0, le=MAX_COUNT, description="a learner in "
                                         "a group of several: its generation; the answer is "
                                         "this rank's shard of the group's batches")
    group_cursor: int | None = Field(None, ge=0, le=MAX_COUNT, description="with "
                                     "group_generation: the sequence number of the first "
                                     "group batch (or rollout) wanted; earlier ones are done")

    @field_validator("num_batches")
    @classmethod
    def _items_capped(cls, num_batches: int, info: ValidationInfo) -> int:
        batch_size = info.data.get("batch_size")
        if batch_size is not None and batch_size * num_batches > MAX_SAMPLE_ITEMS:
            raise ValueError(f"{num_batches} batches of {batch_size} items is "
                             f"{batch_size * num_batches} items; one request may ask for at "
                             f"most {MAX_SAMPLE_ITEMS}")
        return num_batches

    @field_validator("by_buffer")
    @classmethod
    def _buffer_items_capped(cls, by_buffer: dict[str, int] | None,
                             info: ValidationInfo) -> dict[str, int] | None:
        num_batches = info.data.get("num_batches")
        if by_buffer and num_batches is not None and \
                sample_items(0, num_batches, by_buffer) > MAX_SAMPLE_ITEMS:
            raise ValueError(f"{num_batches} x {sum(by_buffer.values())} items is more than "
                             f"one request may ask for ({MAX_SAMPLE_ITEMS})")
        return by_buffer

    @model_validator(mode="after")
    def _one_mode(self) -> SampleRequest:
        if (self.group_generation is None) != (self.group_cursor is None):
            raise ValueError("give group_generation and group_cursor together")
        if self.mix is not None and self.by_buffer is not None:
            raise ValueError("give either mix or by_buffer, not both")
        if self.mix is not None:
            total = sum(m.fraction for m in self.mix)
            if abs(total - 1.0) > 1e-6:
                raise ValueError(f"mix fractions sum to {total}, not 1")
        return self


class SamplePart(Response):
    """The items one buffer contributed: batch b, item i is row `rows[b][i]` (the first row
    of a sequence when `sequence_length` is set; a whole chunk when `lengths` is set) of
    chunk `chunk_ids[chunk_index[b][i]]` of the response."""

    buffer: str
    key: str | None = Field(None, description="by_buffer mode: the batch this part is")
    chunk_index: list[list[int]]
    rows: list[list[int]]
    item_ids: list[list[int]]
    weights: list[list[float]] | None = None
    sequence_length: int | None = None
    lengths: list[int] | None = None


class SampleResponse(Response):
    chunk_ids: list[str]
    parts: list[SamplePart]
    num_batches: int
    env_steps: int
    train_iterations: int = 0
    policy_version: int = -1
    stop: bool = False
    group_generation: int | None = Field(None, description="the learner group's generation")
    first_seq: int | None = Field(None, description="group shards: the sequence number of "
                                  "the first batch (or rollout) in this answer")


class PriorityUpdate(Request):
    buffer: Id
    item_ids: list[Int64] = Field(max_length=1_000_000)
    priorities: list[float] = Field(max_length=1_000_000)

    @model_validator(mode="after")
    def _same_length(self) -> PriorityUpdate:
        if len(self.item_ids) != len(self.priorities):
            raise ValueError(f"{len(self.item_ids)} item_ids but {len(self.priorities)} "
                             "priorities")
        return self


class Consumed(Request):
    buffer: Id
    chunk_ids: list[Id] = Field(max_length=100_000)


class HistogramData(Request):
    """One histogram, as TensorBoard keeps one: each bucket's right edge and count."""

    min: Finite
    max: Finite
    num: Finite = Field(ge=0)
    sum: Finite
    sum_squares: Finite
    bucket_limits: list[Finite] = Field(min_length=1, max_length=256)
    bucket_counts: list[Finite] = Field(min_length=1, max_length=256)

    @model_validator(mode="after")
    def _same_length(self) -> HistogramData:
        if len(self.bucket_limits) != len(self.bucket_counts):
            raise ValueError(f"bucket_limits has {len(self.bucket_limits)} entries but "
                             f"bucket_counts has {len(self.bucket_counts)}")
        return self


MAX_LOGGED_SAMPLES = 65_536  # per report: logging.batch_log's rows, all entries together
MAX_LOGGED_ENTRIES = 1024  # per report: logged updates x buffers
MAX_SAMPLE_VALUES = 32  # per entry: value names
SAMPLE_VALUE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"
SampleValueName = Annotated[str, Field(pattern=SAMPLE_VALUE_PATTERN)]


class BatchLogEntry(Request):
    """`logging.batch_log`: one logged update's samples from one buffer, with the
    per-sample values the policy and the hooks gave for them (`null`: not finite)."""

    train_iteration: Count
    buffer: Id
    item_ids: list[Int64] = Field(min_length=1, max_length=MAX_LOGGED_SAMPLES)
    values: dict[SampleValueName, list[Finite | None]] = Field(default_factory=dict,
                                                              max_length=MAX_SAMPLE_VALUES)

    @model_validator(mode="after")
    def _same_length(self) -> BatchLogEntry:
        for name, column in self.values.items():
            if len(column) != len(self.item_ids):
                raise ValueError(f"values.{name} has {len(column)} entries but item_ids "
                                 f"has {len(self.item_ids)}")
        return self


class LearnInfo(Request):
    worker_id: Id
    train_iterations: Count
    policy_version: Version
    metrics: dict[str, Finite] = Field(default_factory=dict, max_length=256, description=
                                       "each metric's mean over the updates since the last "
                                       "report (its finite values)")
    metric_counts: dict[str, Count] = Field(default_factory=dict, max_length=256, description=
                                            "how many values each mean is of (absent: 1), "
                                            "to weight reports into a logging interval")
    metrics_min: dict[str, Finite] = Field(default_factory=dict, max_length=256)
    metrics_max: dict[str, Finite] = Field(default_factory=dict, max_length=256)
    arrays: dict[str, Annotated[list[Finite], Field(max_length=4096)]] = Field(
        default_factory=dict, max_length=16, description="array metrics (a value per action, "
        "say): the last one of the interval, finite elements only")
    nonfinite: dict[str, Count] = Field(default_factory=dict, max_length=256, description=
                                        "NaN or infinite values dropped per metric since the "
                                        "last report")
    histograms: dict[str, HistogramData] = Field(default_factory=dict, max_length=64,
                                                 description="logging.histograms, when taken "
                                                 "since the last report")
    priorities: list[PriorityUpdate] = Field(default_factory=list, max_length=64)
    consumed: list[Consumed] = Field(default_factory=list, max_length=64)
    timers: dict[str, Finite] = Field(default_factory=dict, max_length=32, description="ms per "
                                     "train iteration since the last report, by phase")
    dataset_eval: dict[str, Finite] = Field(default_factory=dict, max_length=8, description=
                                            "the metric evaluator's scores (eval.dataset), when "
                                            "one ran since the last report")
    batch_log: list[BatchLogEntry] = Field(default_factory=list, max_length=MAX_LOGGED_ENTRIES,
                                           description="logging.batch_log: the samples of "
                                           "the updates logged since the last report")

    @model_validator(mode="after")
    def _bounded_batch_log(self) -> LearnInfo:
        rows = sum(len(e.item_ids) for e in self.batch_log)
        if rows > MAX_LOGGED_SAMPLES:
            raise ValueError(f"batch_log holds {rows} samples; at most {MAX_LOGGED_SAMPLES} "
                             "go in one report")
        return self


class LearnInfoResponse(Response):
    stop: bool
    best_policy_version: int | None = Field(None, description="the best-evaluated policy "
                                            "version so far: its checkpoint is kept")
