"""A fake model server for the gateway's tests: healthy by its checks, and whatever else
a test needs it to be."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from polling import DEADLINE
from prometheus_client import CollectorRegistry, Gauge, generate_latest

IDLE = ((0, 0, 0.0),)


def vllm_metrics(
    kv_name: str = "vllm:kv_cache_usage_perc",
    loads: tuple[tuple[int, int, float], ...] = ((3, 5, 0.5), (1, 2, 0.25)),
) -> str:
    """A /metrics page as vLLM writes it, by default a two-engine (data-parallel) one:
    (waiting, running, KV usage) per engine."""
    registry = CollectorRegistry()
    labels = ("model_name", "engine")
    waiting = Gauge("vllm:num_requests_waiting", "w", labels, registry=registry)
    running = Gauge("vllm:num_requests_running", "r", labels, registry=registry)
    kv = Gauge(kv_name, "kv", labels, registry=registry)
    for engine, (w, r, usage) in enumerate(loads):
        waiting.labels("m", str(engine)).set(w)
        running.labels("m", str(engine)).set(r)
        kv.labels("m", str(engine)).set(usage)
    return generate_latest(registry).decode()


class FakeWorker:
    """A tiny real HTTP server: /health answers 200 (when `health_answers` is set; the
    test can hold it), /metrics what the test sets, and any POST (a generation request)
    is dropped without an answer: a worker that looks healthy but cannot serve. Counts
    the POSTs it dropped."""

    def __init__(self) -> None:
        self.health_asked = threading.Event()
        self.health_answers = threading.Event()
        self.health_answers.set()
        self.metrics_status = 200
        self.metrics_body = vllm_metrics()
        self.dropped = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = fake.health() if self.path == "/health" else fake.metrics()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                fake.dropped += 1
                self.close_connection = True  # no status line: the connection just ends

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def health(self) -> tuple[int, bytes]:
        self.health_asked.set()
        self.health_answers.wait(DEADLINE)
        return 200, b""

    def metrics(self) -> tuple[int, bytes]:
        return self.metrics_status, self.metrics_body.encode()

    def __enter__(self) -> FakeWorker:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.health_answers.set()
        self.server.shutdown()
        self.server.server_close()
