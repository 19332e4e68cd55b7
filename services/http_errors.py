"""JSON answers for the errors cheroot answers itself, before the Flask app sees a request.

A request line or headers that cheroot cannot parse, a request line or headers over the size
limit, an HTTP version it does not speak, a request that does not arrive in time: cheroot
answers these with `HTTPRequest.simple_response`, in plain text. Our request class answers them
as the app answers its own errors (`shared/infra/webapp.py`): `{"error": ..., "field": null}` with
`Content-Type: application/json`, where `error` is the status's reason and cheroot's message
(for example `Bad Request: Malformed Request-Line`). Cheroot closes the connection after every
one of these, so the answer says `Connection: close`.

The classes are installed on one server only (`install`): cheroot's `ConnectionManager` builds
each connection from `server.ConnectionClass`, and a connection builds each request from its
`RequestHandlerClass`. Nothing of cheroot's is patched.

Cheroot counts the request line and the headers together against
`server.max_request_header_size` (0, no limit, unless set): a request line over it alone is a
414, headers that take the total over it a 431 (cheroot says 413, and 400 to HTTP/1.0 clients;
the body limit is the app's, a JSON 413 naming it). Cheroot's one answer not built by the
connection's request class, a 503 when its queue of accepted connections is full, stays plain
text; our servers' queue has no bound (`accepted_queue_size=-1`), so it does not happen.
"""

from __future__ import annotations

import json

from cheroot import errors
from cheroot.server import HTTPConnection, HTTPRequest, HTTPServer

MAX_HEADER_BYTES = 64 * 1024
"""The request line and headers together, in bytes: far above what a client of ours or a
browser sends, low enough that no client makes a thread buffer an unbounded header."""

# What to say when cheroot's message is missing or says nothing of the problem.
_DETAILS = {
    408: "the request did not arrive within {timeout} s",
    501: "the only Transfer-Encoding understood is chunked",
    505: "this server speaks HTTP/1.0 and HTTP/1.1",
}


class JsonErrorRequest(HTTPRequest):
    """Cheroot's request, whose own error answers (status >= 400) are JSON."""

    def read_request_line(self) -> bool:
        try:
            return super().read_request_line()
        except errors.MaxSizeExceeded:
            self.simple_response(
                "414 URI Too Long",
                f"the request line is over {self.server.max_request_header_size} bytes, the "
                "limit for the request line and headers together")
            return False

    def read_request_headers(self) -> bool:
        try:
            return super().read_request_headers()
        except errors.MaxSizeExceeded:
            self.simple_response(
                "431 Request Header Fields Too Large",
                f"the request line and headers are over {self.server.max_request_header_size}"
                " bytes, their limit")
            return False

    def simple_response(self, status: str | int, msg: str | bytes = "") -> None:
        status = str(status)
        code = int(status[:3])
        if isinstance(msg, bytes):  # cheroot sends a str as ISO-8859-1: the same bytes
            msg = msg.decode("iso-8859-1")
        if code < 400:
            super().simple_response(status, msg)
            return
        reason = status[4:].strip() or str(code)
        if code in _DETAILS and (not msg or code == 505):  # 505: "Cannot fulfill request"
            msg = _DETAILS[code].format(timeout=self.server.timeout)
        body = json.dumps({"error": f"{reason}: {msg}" if msg else reason, "field": None})
        # Cheroot closes the connection after each of its own error answers.
        self.close_connection = True
        head = (f"{self.server.protocol} {code} {reason}\r\n"
                "Content-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n")
        try:
            self.conn.wfile.write(head.encode("iso-8859-1") + body.encode("ascii"))
        except OSError as ex:
            if ex.args[0] not in errors.socket_errors_to_ignore:
                raise


class JsonErrorConnection(HTTPConnection):
    """Cheroot's connection, building `JsonErrorRequest`s."""

    RequestHandlerClass = JsonErrorRequest


def install(server: HTTPServer, max_header_bytes: int = MAX_HEADER_BYTES) -> None:
    """Make `server`'s own error answers JSON and cap its request line and headers."""
    server.ConnectionClass = JsonErrorConnection
    server.max_request_header_size = max_header_bytes
