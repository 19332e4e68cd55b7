"""The run's log records, as a feed (`GET /records`, the dashboard's curves)."""

from __future__ import annotations

from pydantic import Field

from rlfleet.shared.contract.wire.base import Count, Request, Response

MAX_RECORDS_PER_PAGE = 5000


class RecordsQuery(Request):
    """`GET /records` query: the records after a cursor, of some scopes."""

    after: Count = Field(0, description="the `next` of the previous answer; 0: from the "
                         "oldest record kept")
    # The scopes of rlfleet.shared.contract.config.SCOPES (a unit test holds the two together).
    scope: str | None = Field(None, pattern=r"^(train|collect|eval|update|info)"
                              r"(,(train|collect|eval|update|info))*$",
                              description="comma-separated scopes; all when absent")
    limit: int = Field(1000, ge=1, le=MAX_RECORDS_PER_PAGE,
                       description="at most this many records per answer")

    def scopes(self) -> list[str] | None:
        return self.scope.split(",") if self.scope else None


class LogRecord(Response):
    seq: int = Field(description="the record's position in this coordinator's feed")
    scope: str
    step: int = Field(description="the run's env step (train iterations for offline runs)")
    wall_time: float
    values: dict[str, float]


class RecordsPage(Response):
    """`GET /records`: the records written since the cursor, oldest first."""

    epoch: str = Field(description="this coordinator process's feed; when it changes (the "
                       "coordinator restarted), start again from after=0")
    next: int = Field(description="the cursor to pass as `after` next time")
    latest: int = Field(description="the newest record's sequence number")
    missed: int = Field(description="records after the cursor that are no longer kept "
                        "(the feed keeps the newest 4,000 whole and, of older ones, a "
                        "thinned history per scope)")
    more: bool = Field(description="more records are waiting: ask again at once")
    records: list[LogRecord]
