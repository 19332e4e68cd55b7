"""One sample request cannot take the coordinator's memory: the items it asks for, all
batches together, are capped (`MAX_SAMPLE_ITEMS`), and past the cap it gets a 400 naming the
field. The learner asks for fewer batches a request rather than pass the cap."""

from __future__ import annotations

import pytest

from rlfleet.shared.contract.wire.sampling import MAX_SAMPLE_ITEMS, SampleRequest

from .helpers import HTTP, TIMEOUT


@pytest.mark.parametrize("body, field", [
    ({"batch_size": 65_536, "num_batches": 1024}, "num_batches"),
    ({"batch_size": 1, "num_batches": 1024, "by_buffer": {"a": 65_536, "b": 65_536}},
     "by_buffer"),
])
def test_a_request_past_the_cap_gets_a_400_naming_the_field(module_coordinator, body, field):
    before = module_coordinator.status()["counters"]
    r = HTTP.post(module_coordinator.api("/sample"), json={"worker_id": "learner", **body},
                  timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field and str(MAX_SAMPLE_ITEMS) in r.json()["error"]
    assert module_coordinator.status()["counters"] == before


def test_the_cap_itself_is_allowed():
    req = SampleRequest(worker_id="learner", batch_size=256, num_batches=MAX_SAMPLE_ITEMS // 256)
    assert req.batch_size * req.num_batches == MAX_SAMPLE_ITEMS
