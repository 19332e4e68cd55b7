"""The crash record a dying role leaves for its supervisor (`shared/infra/crash.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.shared.infra.crash import CRASH_FILE_ENV, describe, read_crash, signature, write_crash


def _raise(message: str) -> BaseException:
    try:
        raise ValueError(message)
    except ValueError as err:
        return err


def test_a_crash_is_recorded_with_its_traceback(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "collector-1.crash.json"
    monkeypatch.setenv(CRASH_FILE_ENV, str(path))
    written = write_crash(_raise("bad obs"), "collector", "evaluation evaluate-3", "collector-1")
    read = read_crash(path)
    assert read == written
    assert read["error"] == "ValueError: bad obs" and read["type"] == "ValueError"
    assert read["where"] == "evaluation evaluate-3" and read["worker_id"] == "collector-1"
    assert "in _raise" in read["traceback"] and not path.with_name(path.name + ".tmp").exists()


def test_without_a_crash_file_nothing_is_written_and_nothing_raises(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(CRASH_FILE_ENV, raising=False)
    assert write_crash(_raise("x"), "learner", "training") is None
    # An unwritable place: the crash itself must not be hidden by a second error.
    assert write_crash(_raise("x"), "learner", "training",
                       path=str(tmp_path / "missing" / "dir" / "f.json")) is None
    assert read_crash(tmp_path / "none.json") is None
    (tmp_path / "garbled.json").write_text("{not json")
    assert read_crash(tmp_path / "garbled.json") is None


def test_the_same_error_in_another_evaluation_is_the_same_crash():
    a = {"where": "evaluation evaluate-3", "type": "RuntimeError", "message": "boom"}
    b = {**a, "where": "evaluation evaluate-9"}
    assert signature(a) == signature(b)
    assert signature(a) != signature({**a, "where": "collection"})
    assert signature(a) != signature({**a, "message": "other"})


def test_describe_is_one_line_with_the_type():
    assert describe(_raise("a\n  b")) == "ValueError: a b"
    assert describe(KeyError("k")) == "KeyError: 'k'"
    assert describe(StopIteration()) == "StopIteration"
