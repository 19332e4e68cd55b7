"""Policy versions stored by the learner's data process (`learner/output/weight_relay.py`):
the bytes are the ones the learner would have written, conflicts and outages reach the publisher as
storage's own errors, and a version the data process cannot store (it died, or a dtype
numpy lacks) is stored by the learner, in order and without a gap."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch
from safetensors.torch import save as torch_save

from rlfleet.learner.output.publisher import PublishConflict, Publisher, RelaySink
from rlfleet.learner.output.weight_relay import (
    RelayClient,
    RelayUnavailable,
    WeightRegion,
    WeightRelay,
)
from rlfleet.shared.contract.codec import decode_weights, encode_weights
from rlfleet.shared.infra.storage import StorageError, VersionConflict, open_storage

from .helpers import wait_for
from .test_dataproc import _data_process, _fed, _own_files
from .test_storage_outage import store_on


def _state(value: float, width: int = 4) -> dict[str, torch.Tensor]:
    return {"net.0.weight": torch.full((width, 4), value),
            "net.0.bias": torch.full((width,), value),
            "steps": torch.tensor(7, dtype=torch.int64), "mask": torch.ones(3, dtype=torch.bool),
            "empty": torch.zeros(0)}


def _weight_files(dp) -> list:
    return [p for p in _own_files(dp) if "-w-" in p.name]


def _same(blob: bytes, state: dict[str, torch.Tensor], meta: dict[str, str]) -> bool:
    tensors, got = decode_weights(blob)
    return got == meta and tensors.keys() == state.keys() and all(
        torch.equal(tensors[k], state[k]) and tensors[k].dtype == state[k].dtype
        for k in state)


def test_the_codec_writes_what_safetensors_torch_writes():
    meta = {"policy_version": "3", "train_iterations": "25"}
    ours, theirs = encode_weights(_state(1.5), meta), torch_save(_state(1.5), metadata=meta)
    assert len(ours) == len(theirs) and _same(theirs, _state(1.5), meta)
    assert _same(ours, _state(1.5), meta)
    bf16 = {"w": torch.ones(2, 2, dtype=torch.bfloat16)}
    assert torch.equal(decode_weights(encode_weights(bf16))[0]["w"], bf16["w"])


def test_versions_go_through_the_data_process_as_the_learner_would_write_them(
        coordinator, task_sink):
    c = coordinator()
    dp = _data_process(c, _fed(c, task_sink))
    store = open_storage(str(c.storage_dir), "run")
    try:
        meta = {"policy_version": "0", "train_iterations": "25"}
        dp.put(0, _state(1.0), meta)
        assert store.latest_version() == 0
        assert _same(store.get_weights(0)[1], _state(1.0), meta)
        assert _weight_files(dp) == []  # the name goes once the data process has it

        with pytest.raises(VersionConflict):  # another learner's version 0 stands
            dp.put(0, _state(2.0), meta)
        big = _state(3.0, width=4096)  # outgrows the region: a new one
        dp.put(1, big, {"policy_version": "1"})
        tensors, got = decode_weights(store.get_weights(1)[1])
        assert got == {"policy_version": "1"} and torch.equal(tensors["net.0.weight"],
                                                             big["net.0.weight"])
        assert _weight_files(dp) == []
    finally:
        dp.close()
        store.close()
    assert _own_files(dp) == []


def test_a_data_process_that_dies_hands_publishing_back_to_the_learner(coordinator, task_sink):
    c = coordinator()
    dp = _data_process(c, _fed(c, task_sink))
    store = open_storage(str(c.storage_dir), "run")
    publisher = Publisher(threading.Event())
    publisher.attach(store, -1)
    publisher.use(dp.weight_sink(store))
    try:
        for i in range(3):
            publisher.submit(_state(float(i)), i)
            assert publisher.flush(timeout_s=10)
        assert publisher.relayed == 3 and publisher.version == 2

        publisher.submit({"w": torch.ones(2, dtype=torch.bfloat16)}, 3)  # no numpy twin
        assert publisher.flush(timeout_s=10) and publisher.version == 3
        assert publisher.relayed == 3

        assert dp._proc is not None
        os.kill(dp._proc.pid, signal.SIGKILL)
        wait_for(lambda: dp._ended, what="the data process to be seen gone")
        for i in range(4, 7):
            publisher.submit(_state(float(i)), i)
            assert publisher.flush(timeout_s=10)
        assert publisher.version == store.latest_version() == 6 and publisher.relayed == 3
        for v in range(7 - store.keep_weight_versions, 7):  # the versions kept, in order
            assert decode_weights(store.get_weights(v)[1])[1]["policy_version"] == str(v)
        assert decode_weights(store.get_weights(6)[1])[0]["net.0.weight"][0, 0] == 6.0
    finally:
        publisher.close()
        dp.close()
        store.close()
    assert _own_files(dp) == []


def test_an_outage_reaches_the_publisher_as_a_storage_error_and_no_version_is_lost(
        redis_server, tmp_path):
    """The relay's two ends in one process (the pipe replaced by direct calls), on a real
    Redis that goes away."""
    store = store_on(redis_server, retry_s=0.05)
    client: RelayClient
    relay = WeightRelay(store, lambda message: client.reply(message))
    shm = tmp_path / "shm"
    shm.mkdir()
    client = RelayClient(WeightRegion(shm, "relay-"), relay.submit, lambda: None)
    publisher = Publisher(threading.Event())
    publisher.attach(store, -1)
    publisher.use(RelaySink(client, store))
    try:
        publisher.submit(_state(0.0), 0)
        assert publisher.flush(timeout_s=10) and publisher.relayed == 1
        redis_server.kill()
        with pytest.raises(StorageError):
            client.put(1, _state(1.0), {})
        publisher.submit(_state(1.0), 1)
        assert not publisher.flush(timeout_s=1.0)  # still retrying
        publisher.submit(_state(2.0), 2)           # replaces the state that waits
        redis_server.start()
        assert publisher.flush(timeout_s=20)
        assert publisher.version == 1 and publisher.relayed == 2  # no gap, the newest state
        tensors, meta = decode_weights(store.get_weights(1)[1])
        assert meta["train_iterations"] == "2" and tensors["net.0.weight"][0, 0] == 2.0
    finally:
        publisher.close()
        relay.end()
        client.close()
        store.close()
    assert list(shm.iterdir()) == []


def test_a_relay_that_is_gone_says_so_before_copying_anything(tmp_path):
    region = WeightRegion(tmp_path, "relay-")
    client = RelayClient(region, lambda message: None, lambda: "the data process has exited")
    with pytest.raises(RelayUnavailable, match="exited"):
        client.put(0, _state(0.0), {})
    assert region.path is None and list(tmp_path.iterdir()) == []


def test_a_version_the_data_process_stored_as_it_died_is_no_conflict(tmp_path):
    store = open_storage(str(tmp_path / "s"))

    class StoreThenDie:
        def put(self, version, state, metadata):
            store.put_weights(version, encode_weights(state, metadata))
            raise RelayUnavailable("the data process has exited (code -9)")

    publisher = Publisher(threading.Event())
    publisher.attach(store, -1)
    publisher.use(RelaySink(StoreThenDie(), store))
    try:
        for i in range(3):
            publisher.submit(_state(float(i)), i)
            assert publisher.flush(timeout_s=10)
        assert publisher.version == store.latest_version() == 2
        store.put_weights(3, encode_weights(_state(-1.0), {"policy_version": "3"}))
        publisher.submit(_state(3.0), 3)  # another learner's version 3 is still a conflict
        with pytest.raises(PublishConflict):
            publisher.flush(timeout_s=10)
    finally:
        publisher.close()
