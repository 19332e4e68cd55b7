"""The storage password: where a process finds it, and how it is kept out of everything else.

A Redis URL may carry a password (`redis://:secret@host:6379/0`). Such a URL must not reach a
log, an HTTP answer, an error message or a file of the run, so everything the system says or
writes about storage goes through `redact` (`redis://:***@host:6379/0`). A process that
connects finds the password, in this order:

1. in the URL itself, unless it is the redacted `***` (what the coordinator hands out when it
   registers a worker);
2. in the file named by `RLFLEET_STORAGE_PASSWORD_FILE` (a Kubernetes or compose secret
   mounted into every role: the way to run a cluster);
3. in `RLFLEET_STORAGE_PASSWORD`, which `rlfleet up` sets for the processes it starts when it
   was given a URL with a password, so the password never appears on a command line.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from rlfleet.shared.contract.config import ConfigError

PASSWORD_FILE_ENV = "RLFLEET_STORAGE_PASSWORD_FILE"
PASSWORD_ENV = "RLFLEET_STORAGE_PASSWORD"
REDACTED = "***"

# `scheme://[user][:password]@`: the userinfo of any URL inside a longer text.
_USERINFO = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)(?P<password>[^@\s/]+)@",
                       re.IGNORECASE)


class CredentialError(ConfigError):
    """The password file named by `RLFLEET_STORAGE_PASSWORD_FILE` cannot be read, or a URL
    whose password was redacted reached a process that has none configured."""


def redact(text: str) -> str:
    """`text` with the password of every URL in it replaced by `***` (safe to log)."""
    return _USERINFO.sub(lambda m: f"{m['head']}{REDACTED}@", text)


def split_password(url: str) -> tuple[str, str | None]:
    """(`url` with its password redacted, the password or None). A URL that already says
    `***` has none to give."""
    parts = urlsplit(url)
    password = parts.password
    if password is None or password == REDACTED:
        return url, None
    return redact(url), password


def has_password(url: str) -> bool:
    """The URL names a password, given or redacted."""
    return urlsplit(url).password is not None


def configured_password() -> str | None:
    """The password this process was given outside any URL (file first, then environment)."""
    path = os.environ.get(PASSWORD_FILE_ENV, "").strip()
    if path:
        try:
            secret = Path(path).read_text().strip()
        except OSError as err:
            raise CredentialError(f"{PASSWORD_FILE_ENV}={path}: cannot read the storage "
                                  f"password: {err.strerror or err}") from None
        if not secret:
            raise CredentialError(f"{PASSWORD_FILE_ENV}={path} is empty")
        return secret
    return os.environ.get(PASSWORD_ENV) or None


def connect_password(url: str) -> str | None:
    """The password to connect to `url` with: its own, else the configured one."""
    shown, password = split_password(url)
    if password is None:
        password = configured_password()
        if password is None and has_password(url):
            raise CredentialError(f"storage {shown} needs its password, which is never handed "
                                  f"out: name a file holding it in {PASSWORD_FILE_ENV}")
    return password


def without_userinfo(url: str) -> str:
    """`url` with user and password dropped, for a client that is given them apart."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=host))


class RedactingFormatter(logging.Formatter):
    """Log lines with URL passwords redacted: the last guard for a message that quotes a
    URL some library put in an exception."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def log_to_stderr(level: str, fmt: str) -> None:
    """`logging.basicConfig` on stderr, through `RedactingFormatter`."""
    import sys

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter(fmt))
    logging.basicConfig(level=level, handlers=[handler])
