"""A loopback proxy in front of the test S3 server that can answer a request its own way:
throttling, a page cut off, an error inside a 200 answer, a body cut short, as a real endpoint
sometimes does."""

from __future__ import annotations

import http.client
import http.server
import threading
from collections.abc import Callable

Answer = tuple[int, list[tuple[str, str]], bytes]  # status, headers, body


class Cut(bytes):
    """A body announced whole and cut off halfway (the connection closed): a connection reset
    while the answer is read, which botocore raises as ``ResponseStreamingError``."""


Meddle = Callable[[str, str, Callable[[], Answer]], Answer]


class S3Proxy(http.server.ThreadingHTTPServer):
    """Forwards each request to ``127.0.0.1:upstream_port``, through ``meddle(command, path,
    forward)``: it returns ``forward()`` (upstream's answer), changed or not, or an answer of
    its own without forwarding (``forward.headers``: the request's, by lower-case name).
    ``requests``: (command, path, headers) of each it answered."""

    def __init__(self, upstream_port: int, meddle: Meddle) -> None:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_request(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))

                def forward() -> Answer:
                    conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
                    conn.request(self.command, self.path, body, dict(self.headers))
                    answer = conn.getresponse()
                    return answer.status, answer.getheaders(), answer.read()

                forward.headers = {k.lower(): v for k, v in self.headers.items()}

                status, headers, data = meddle(self.command, self.path, forward)
                proxy.requests.append((self.command, self.path, dict(self.headers)))
                self.send_response(status)
                head = self.command == "HEAD"  # no body: its Content-Length is the object's
                for key, value in headers:
                    skip = ("transfer-encoding", "connection", "date", "server")
                    skip += () if head else ("content-length",)
                    if key.lower() not in skip:  # the last two: send_response says its own
                        self.send_header(key, value)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if isinstance(data, Cut):
                    self.wfile.write(data[: len(data) // 2])
                    self.close_connection = True
                else:
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_request

            def log_message(self, *args) -> None:
                pass

        self.requests: list[tuple[str, str, dict[str, str]]] = []
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"
