"""The storage password: found in the URL, a secret file or the environment, and redacted in
everything shown (messages, logs, crash files)."""

from __future__ import annotations

import json
import logging

import pytest
from redis_server import RedisServer

from rlfleet.shared.infra.crash import write_crash
from rlfleet.shared.infra.storage import StorageError, open_storage
from rlfleet.shared.infra.storage.credentials import (
    PASSWORD_ENV,
    PASSWORD_FILE_ENV,
    CredentialError,
    RedactingFormatter,
    connect_password,
    redact,
    split_password,
)

SECRET = "s3cret-7d1b"


@pytest.fixture(autouse=True)
def _no_configured_password(monkeypatch):
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    monkeypatch.delenv(PASSWORD_FILE_ENV, raising=False)


@pytest.mark.parametrize("text,shown", [
    (f"redis://:{SECRET}@host:6379/0", "redis://:***@host:6379/0"),
    (f"rediss://user:{SECRET}@host/1", "rediss://user:***@host/1"),
    (f"failed at redis://:{SECRET}@10.0.0.2:6379/0: refused; also unix://:{SECRET}@/tmp/r.sock",
     "failed at redis://:***@10.0.0.2:6379/0: refused; also unix://:***@/tmp/r.sock"),
    ("redis://host:6379/0", "redis://host:6379/0"),
    ("redis://user@host:6379/0", "redis://user@host:6379/0"),
    ("/runs/x/storage", "/runs/x/storage"),
])
def test_redact_hides_every_password_and_nothing_else(text, shown):
    assert redact(text) == shown
    assert redact(shown) == shown


def test_the_password_comes_from_the_url_then_the_file_then_the_environment(monkeypatch,
                                                                            tmp_path):
    assert split_password(f"redis://:{SECRET}@h/0") == ("redis://:***@h/0", SECRET)
    assert split_password("redis://:***@h/0") == ("redis://:***@h/0", None)
    assert connect_password("redis://h/0") is None
    with pytest.raises(CredentialError, match=PASSWORD_FILE_ENV):
        connect_password("redis://:***@h/0")  # redacted, and nothing configured
    monkeypatch.setenv(PASSWORD_ENV, "from-env")
    assert connect_password("redis://:***@h/0") == "from-env"
    secret = tmp_path / "password"
    secret.write_text(SECRET + "\n")
    monkeypatch.setenv(PASSWORD_FILE_ENV, str(secret))
    assert connect_password("redis://:***@h/0") == SECRET  # the file before the environment
    assert connect_password("redis://:given@h/0") == "given"  # the URL's own first
    secret.write_text("")
    with pytest.raises(CredentialError, match="is empty"):
        connect_password("redis://h/0")
    monkeypatch.setenv(PASSWORD_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(CredentialError, match="cannot read"):
        connect_password("redis://h/0")


def test_redis_storage_connects_with_a_secret_file_and_never_says_the_password(
        monkeypatch, tmp_path):
    server = RedisServer(tmp_path, password=SECRET)
    server.start()
    try:
        secret = tmp_path / "password"
        secret.write_text(SECRET)
        monkeypatch.setenv(PASSWORD_FILE_ENV, str(secret))
        redacted = f"redis://:***@127.0.0.1:{server.port}/0"
        storage = open_storage(redacted, "creds")  # what a registered worker is handed
        storage.put_blob("x", b"1")
        assert storage.get_blob("x") == b"1"
        given = open_storage(f"redis://:{SECRET}@127.0.0.1:{server.port}/0", "creds",
                             max_retry_s=0.0)
        assert SECRET not in repr(given) and given.get_blob("x") == b"1"
        server.kill()
        with pytest.raises(StorageError) as err:
            given.get_blob("x")
        assert redacted in str(err.value) and SECRET not in str(err.value)
    finally:
        server.close()
    monkeypatch.delenv(PASSWORD_FILE_ENV)
    wrong = open_storage(f"redis://:wrong@127.0.0.1:{server.port}/0", "creds", max_retry_s=0.0)
    with pytest.raises(StorageError) as err:
        wrong.get_blob("x")
    assert "wrong" not in str(err.value)


def test_logs_and_crash_files_never_hold_a_password(tmp_path):
    record = logging.LogRecord("rlfleet", logging.ERROR, __file__, 1,
                               "cannot reach %s", (f"redis://:{SECRET}@h:1/0",), None)
    assert SECRET not in RedactingFormatter("%(message)s").format(record)
    try:
        raise StorageError(f"redis get failed at redis://:{SECRET}@h:1/0: timeout")
    except StorageError as err:
        report = write_crash(err, "collector", "collect", path=str(tmp_path / "crash.json"))
    assert report is not None
    assert SECRET not in (tmp_path / "crash.json").read_text()
    assert "redis://:***@h:1/0" in json.loads((tmp_path / "crash.json").read_text())["error"]
