"""One streamed request, as the client sees it: status, time to the first content, time
to the end, usage and the answer's text. Nothing here raises for a failed request: the
outcome names what went wrong.

Failure categories: `limited` (429), the HTTP status for other error answers (`401`,
`503`, ...), `connection` (no answer: refused, reset, closed before the headers),
`timeout` (no byte for `--timeout` seconds), `stream` (the stream broke, carried an error
event, or ended without `data: [DONE]`).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from fairpool.sched.errors import ConfigError
from fairpool_cli.load.spec import LoadSpec
from fairpool_cli.load.stats import Outcome

LIMITED = "limited"
LIST_TIMEOUT = 10.0  # seconds for GET /models: an endpoint that hangs is an error soon


class Sender:
    """The run's HTTP client: one connection pool, no proxies from the environment."""

    def __init__(self, spec: LoadSpec) -> None:
        self.url = spec.url
        self.path = "/chat/completions" if spec.api == "chat" else "/completions"
        self.chat = spec.api == "chat"
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(spec.timeout, connect=min(spec.timeout, 10.0)),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=1000),
            trust_env=False,
        )

    async def __aenter__(self) -> Sender:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.client.aclose()

    async def first_model(self, key: str | None) -> str:
        """The first model `GET /models` lists (with a tenant's key: the gateway lists
        the pools that tenant may use)."""
        try:
            response = await self.client.get(
                f"{self.url}/models", headers=_auth(key), timeout=LIST_TIMEOUT
            )
            response.raise_for_status()
            return str(response.json()["data"][0]["id"])
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as error:
            reason = str(error) or type(error).__name__
            raise ConfigError(
                "--model", f"could not list the models at {self.url}/models ({reason}); name one"
            ) from None

    async def send(self, body: dict[str, Any], key: str | None) -> Outcome:
        started = time.monotonic()
        stream = _Stream(started, self.chat)
        try:
            async with self.client.stream(
                "POST", f"{self.url}{self.path}", json=body, headers=_auth(key)
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    return Outcome(_category(response.status_code))
                stream.answered = True
                async for line in response.aiter_lines():
                    if stream.read(line):
                        break
        except httpx.TimeoutException:
            return Outcome("timeout")
        except httpx.TransportError:
            return Outcome("stream" if stream.answered else "connection")
        return stream.outcome()


def _auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _category(status: int) -> str:
    return LIMITED if status == 429 else str(status)


class _Stream:
    """What the server-sent events of one answer said."""

    def __init__(self, started: float, chat: bool) -> None:
        self.started = started
        self.chat = chat
        self.answered = False
        self.first: float | None = None
        self.done = False
        self.failed = False
        self.usage: dict[str, Any] | None = None
        self.pieces: list[str] = []

    def read(self, line: str) -> bool:
        """Take one SSE line; True when the stream is over."""
        if not line.startswith("data:"):
            return False
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            self.done = True
            return True
        try:
            chunk = json.loads(payload)
        except json.JSONDecodeError:
            self.failed = True
            return True
        if not isinstance(chunk, dict) or "error" in chunk:
            self.failed = True
            return True
        self.usage = chunk.get("usage") or self.usage
        text = self._content(chunk)
        if text:
            if self.first is None:
                self.first = time.monotonic()
            self.pieces.append(text)
        return False

    def _content(self, chunk: dict[str, Any]) -> str:
        choices = chunk.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            return ""
        choice = choices[0]
        text = (choice.get("delta") or {}).get("content") if self.chat else choice.get("text")
        return text if isinstance(text, str) else ""

    def outcome(self) -> Outcome:
        ended = time.monotonic()
        if self.failed or not self.done:
            return Outcome("stream")
        outcome = Outcome(
            "ok",
            ttft=None if self.first is None else self.first - self.started,
            latency=ended - self.started,
            text="".join(self.pieces),
        )
        _take_usage(outcome, self.usage, len(self.pieces))
        return outcome


def _take_usage(outcome: Outcome, usage: dict[str, Any] | None, chunks: int) -> None:
    """Token counts from the usage chunk; without one, each content chunk counts as one
    output token and the prompt as unknown (0)."""
    if not usage:
        outcome.completion_tokens = chunks
        return
    details = usage.get("prompt_tokens_details") or {}
    outcome.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    outcome.cached_tokens = int(details.get("cached_tokens") or 0)
    outcome.completion_tokens = int(usage.get("completion_tokens") or 0)
    outcome.usage_reported = True
