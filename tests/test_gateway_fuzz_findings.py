"""What the fuzz tier found (tests/test_gateway_fuzz.py, tests/test_gateway_fuzz_hostile.py),
each reduced to the smallest request that shows it and kept as a regression test once
fixed."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from gateway_helpers import (
    MODEL,
    client,
    completion,
    engines,
    gateway,
    gateway_config,
    tenant_entry,
)

pytestmark = pytest.mark.loopback


def test_a_lone_surrogate_in_the_model_is_a_4xx():
    with engines(1, speedup=1000.0) as workers:
        config = gateway_config([workers[0].url], [tenant_entry("light")])
        with gateway(config) as running, client(running, "light") as api:
            body = b'{"model": "\\ud800", "prompt": "x"}'
            answer = api.post(
                "/v1/completions", content=body, headers={"content-type": "application/json"}
            )
            assert answer.status_code < 500, answer.text


def test_a_token_id_past_64_bits_is_a_4xx():
    with engines(1, speedup=1000.0) as workers:
        body = {"model": MODEL, "prompt": [2**64], "max_tokens": 1, "cache_salt": "salt"}
        answer = httpx.post(f"{workers[0].url}/v1/completions", json=body, timeout=30)
        assert answer.status_code == 400, answer.text


class CloseAfterAFailure:
    """A model server that answers its first generation request 500 on a kept-alive
    connection (no `Connection: close`, as uvicorn answers an exception) and closes that
    connection when the next request arrives on it, as uvicorn does right after such a
    500; a request on a new connection gets a whole completion. /health answers 200."""

    def __init__(self) -> None:
        # The connection of the 500, the socket itself: an id() would be reused by a later
        # socket once this one is gone, and that connection would be closed too.
        self.failed_on: set[socket.socket] = set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self.answer(200, b"")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                if self.connection in server.failed_on:
                    self.close_connection = True  # the closed connection, reused
                    return
                if not server.failed_on:
                    server.failed_on.add(self.connection)
                    self.answer(500, b"Internal Server Error")
                    return
                usage = b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}'
                self.answer(200, b'{"choices":[{"text":"x"}],' + usage + b"}")

            def answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> CloseAfterAFailure:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_an_engine_error_does_not_take_the_worker_out_of_rotation():
    with CloseAfterAFailure() as engine:
        config = gateway_config([engine.url], [tenant_entry("light")])
        with gateway(config) as running, client(running, "light") as api:
            assert api.post("/v1/completions", json=completion("x")).status_code == 502
            answer = api.post("/v1/completions", json=completion("x"))
            assert answer.status_code == 200, answer.text
