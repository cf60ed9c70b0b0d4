"""A proxy between a client (Terraform's AWS provider, boto3) and the AWS emulator that plants transient faults: the
first request of a named API action after `arm` gets a dropped connection, or the throttling answer AWS gives.

EC2's answer when it throttles a caller, as its API reference documents it (Query API, "Error codes for the Amazon
EC2 API": RequestLimitExceeded, HTTP 503): an XML `Response` with `Errors/Error/Code` and a `RequestID`. The AWS SDK
for Go v2, which the provider uses, retries both (a throttling code; a connection closed mid-request) up to the
provider's max_retries, so one fault is survived only when retries are allowed.
"""

from __future__ import annotations

import http.client
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

THROTTLED = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>RequestLimitExceeded</Code>'
    "<Message>Request limit exceeded.</Message></Error></Errors><RequestID>{id}</RequestID></Response>"
)
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "te", "trailer"}


def action_of(headers, body: bytes) -> str | None:
    """The API action: a Query API request's `Action`, or a JSON API's X-Amz-Target (`Service.Action`)."""
    target = headers.get("X-Amz-Target")
    if target:
        return target.rpartition(".")[2]
    if headers.get("Content-Type", "").startswith("application/x-www-form-urlencoded"):
        return parse_qs(body.decode(errors="replace")).get("Action", [None])[0]
    return None


class FaultyProxy:
    """Forwards every request to `upstream`; `arm({"DescribeVpcEndpoints": "drop", "DescribeVpcs": "throttle"})`
    plants one fault per action on its next request. `hits` lists the faults that happened: (action, kind)."""

    def __init__(self, upstream: str):
        self.upstream = urlparse(upstream)
        self.armed: dict[str, str] = {}
        self.hits: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def arm(self, faults: dict[str, str]) -> None:
        with self.lock:
            self.armed.update(faults)

    def _fault(self, action: str | None) -> str | None:
        with self.lock:
            kind = self.armed.pop(action, None) if action else None
            if kind:
                self.hits.append((action, kind))
            return kind

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                kind = proxy._fault(action_of(self.headers, body))
                if kind == "drop":  # the connection closes with no answer: the client sees EOF
                    self.close_connection = True
                    self.connection.close()
                    return
                if kind == "throttle":
                    return self._answer(503, {"Content-Type": "text/xml"}, THROTTLED.format(id=uuid.uuid4()).encode())
                upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                upstream.request(self.command, self.path, body=body, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                kept = {k: v for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP | {"content-length"}}
                upstream.close()
                self._answer(response.status, kept, data)

            def _answer(self, status: int, headers: dict, data: bytes) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                # One request per connection. Kept alive, some answers this server sent in full never reached the
                # SDK, which sent the request again: measured 2-5 such retries per round trip (0 with moto alone,
                # 0 with this), and a create sent twice meets its own first copy ("already exists": moto keeps no
                # ClientToken) and fails `make up`.
                self.send_header("Connection", "close")
                self.close_connection = True
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _forward

        return Handler

    def __enter__(self) -> FaultyProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
