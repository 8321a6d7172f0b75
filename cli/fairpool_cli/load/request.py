"""One request of a load: what to send (`OutgoingRequest`) and how it went
(`RequestResult`).

Times are `time.perf_counter()` seconds (`now`), the one clock of the load generator:
when the request was due (`scheduled`), when its bytes were written (`started`), when
the first byte of the answer's body came (`first_byte`), when the first output token
came (`first_token`: read only when the sender parses every event, and None for an
answer without output, such as embeddings), and when the answer ended (`ended`).

Failure categories (`error`; None when the answer came whole): `limited` (429), the HTTP
status for other error answers (`401`, `503`, ...), `connection` (no answer: refused,
reset, closed before the headers), `timeout` (no byte for the sender's timeout),
`stream` (the stream broke, carried an error event, or did not end as its API ends one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

now = time.perf_counter

#: the APIs the gateway serves, each at its path below the OpenAI base URL (`.../v1`)
API_PATHS = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "responses": "/responses",
    "embeddings": "/embeddings",
}
#: the APIs whose answers stream (embeddings come whole)
STREAMED = ("chat", "completions", "responses")

LIMITED = "limited"
CONNECTION = "connection"
TIMEOUT = "timeout"
STREAM = "stream"


def category(status: int) -> str:
    """The failure category of an error answer's HTTP status."""
    return LIMITED if status == 429 else str(status)


@dataclass(frozen=True)
class OutgoingRequest:
    """A request to send: the tenant it counts for, its API (a key of `API_PATHS`), the
    JSON body, and extra headers (`Authorization`, ...)."""

    tenant: str
    api: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class RequestResult:
    """How one request went, as the client saw it."""

    tenant: str = ""
    scheduled: float = 0.0
    started: float = 0.0
    first_byte: float | None = None
    first_token: float | None = None
    ended: float | None = None
    status: int = 0  # the HTTP status; 0 before (or without) an answer
    error: str | None = None  # the failure category; None: answered completely
    detail: str = ""  # what went wrong, for a person
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    usage_reported: bool = False
    text: str = ""  # the output, when the sender parses every event

    @property
    def ok(self) -> bool:
        return self.error is None and self.ended is not None

    @property
    def ttfb(self) -> float | None:
        """Seconds from writing the request to the first byte of the answer's body."""
        return None if self.first_byte is None else self.first_byte - self.started

    @property
    def ttft(self) -> float | None:
        """Seconds from writing the request to the first output token."""
        return None if self.first_token is None else self.first_token - self.started

    @property
    def latency(self) -> float | None:
        """Seconds from writing the request to the end of the answer."""
        return None if self.ended is None else self.ended - self.started

    @property
    def lag(self) -> float:
        """How late the request was written after it was due: the load generator's own
        delay (a few hundred microseconds when it keeps up)."""
        return self.started - self.scheduled

    def fail(self, error: str, detail: str = "") -> None:
        """Note the first failure (a later one is its consequence)."""
        if self.error is None:
            self.error, self.detail = error, detail
