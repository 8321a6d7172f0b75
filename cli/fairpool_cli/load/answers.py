"""Reading an answer's body as it arrives, for each API the gateway serves.

The connection feeds each piece of the body to the request's reader (`feed`) as soon as
it is decoded, inside the event loop's callback (no coroutine switch per piece), and
tells it when the body is complete (`finish`). A reader notes the times of the first
body byte, of the first output token and of the end, and the usage:

- chat and completions stream `data: JSON` chunks and end with `data: [DONE]`; usage is
  in the last chunk (asked for with `stream_options.include_usage`);
- a Responses API stream (`/v1/responses`) is `event: TYPE` / `data: JSON` pairs without
  `[DONE]`: output in `response.output_text.delta`, and the end and the usage in
  `response.completed` (or `response.incomplete`);
- embeddings, and every error answer, come whole: one JSON body.

`EventStream` parses every event (the output's text and the first token's time: what
`fairpool load` reports), about 4 µs of CPU per event. `QuickStream` only looks for the
end marker in each piece and parses the one last event that has a usage object: 8 µs
for a 4-token chat stream against 27, 26 against 265 for 64 tokens. That is for a
benchmark of a proxy, where the client shares a core with what it measures; its
`first_byte` stands for the first token (the first chunk of a stream goes out with the
first token).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from fairpool_cli.load.request import STREAM, RequestResult, category, now

DONE = b"[DONE]"
DONE_LINE = b"data: [DONE]"  # as servers write it, for the quick reader's search
RESPONSE_ENDS = ("response.completed", "response.incomplete")
RESPONSE_FAILS = ("response.failed", "error")
OUTPUT_DELTA = "response.output_text.delta"
DETAIL_BYTES = 200  # of an error answer's body, kept as the result's detail


class Reader(Protocol):
    """What the connection tells a request's reader."""

    def feed(self, data: bytes) -> None: ...

    def finish(self) -> None: ...


def take_usage(result: RequestResult, usage: Any) -> bool:
    """Copy a usage object in either of OpenAI's shapes: chat, completions and embeddings
    (`prompt_tokens`, `prompt_tokens_details.cached_tokens`, `completion_tokens`), or the
    Responses API (`input_tokens`, `input_tokens_details.cached_tokens`,
    `output_tokens`). False when `usage` is not one."""
    if not isinstance(usage, dict):
        return False
    responses = "input_tokens" in usage
    details = usage.get("input_tokens_details" if responses else "prompt_tokens_details")
    try:
        result.prompt_tokens = int(usage.get("input_tokens" if responses else "prompt_tokens") or 0)
        result.completion_tokens = int(
            usage.get("output_tokens" if responses else "completion_tokens") or 0
        )
        cached = details.get("cached_tokens") if isinstance(details, dict) else 0
        result.cached_tokens = int(cached or 0)
    except (TypeError, ValueError):
        return False
    result.usage_reported = True
    return True


def usage_in(event: Any) -> Any:
    """The usage object of an event or a whole answer: its own `usage`, or its
    response's (a Responses API `response.completed`)."""
    if not isinstance(event, dict):
        return None
    usage = event.get("usage")
    if usage is None and isinstance(event.get("response"), dict):
        usage = event["response"].get("usage")
    return usage


def error_detail(body: bytes) -> str:
    return body[:DETAIL_BYTES].decode(errors="replace")


class WholeBody:
    """A body read whole: embeddings, an error answer, any answer that is not a stream."""

    __slots__ = ("body", "parts", "result")

    def __init__(self, result: RequestResult) -> None:
        self.result = result
        self.parts: list[bytes] = []
        self.body = b""

    def feed(self, data: bytes) -> None:
        if self.result.first_byte is None:
            self.result.first_byte = now()
        self.parts.append(data)

    def finish(self) -> None:
        result = self.result
        result.ended = now()
        self.body = b"".join(self.parts)
        if result.first_byte is None:
            result.first_byte = result.ended
        if result.status != 200:
            result.fail(category(result.status), error_detail(self.body))
            return
        try:
            document = json.loads(self.body)
        except ValueError:
            return
        take_usage(result, usage_in(document))


class QuickStream(WholeBody):
    """A stream read cheaply: the first byte, the end marker, and the usage of the last
    event that has one."""

    __slots__ = ("markers",)

    def __init__(self, result: RequestResult, api: str) -> None:
        super().__init__(result)
        self.markers: tuple[bytes, ...] = (
            tuple(end.encode() for end in RESPONSE_ENDS) if api == "responses" else (DONE_LINE,)
        )

    def feed(self, data: bytes) -> None:
        result = self.result
        if result.first_byte is None:
            result.first_byte = now()
        self.parts.append(data)
        for marker in self.markers:
            if marker in data:
                result.ended = now()

    def finish(self) -> None:
        result = self.result
        body = self.body = b"".join(self.parts)
        if result.status != 200:
            result.ended = result.ended or now()
            result.fail(category(result.status), error_detail(body))
            return
        if result.ended is None:
            if not body.startswith((b"data:", b"event:")):  # not a stream after all
                super().finish()
                return
            if not any(marker in body for marker in self.markers):  # split over pieces
                result.fail(STREAM, f"the stream ended without {self.markers[0].decode()}")
                return
            result.ended = now()
        at = body.rfind(b'"usage"')
        if at < 0:
            return
        start = body.rfind(b"data:", 0, at)
        end = body.find(b"\n", at)
        try:
            event = json.loads(body[start + len(b"data:") : end if end >= 0 else len(body)])
        except ValueError:
            return
        take_usage(result, usage_in(event))


class EventStream:
    """A stream read event by event: its text, the first token's time, error events."""

    __slots__ = ("api", "done", "pending", "pieces", "quiet", "result", "usage")

    def __init__(self, result: RequestResult, api: str) -> None:
        self.result = result
        self.api = api
        self.pending = b""
        self.pieces: list[str] = []
        self.usage: Any = None
        self.done = False
        self.quiet = False  # an error answer, or a stream that ended or failed: no parsing

    def feed(self, data: bytes) -> None:
        result = self.result
        if result.first_byte is None:
            result.first_byte = now()
            if result.status != 200:
                self.quiet = True
        if self.quiet:
            if not self.done:  # an error answer: keep its start for the detail
                self.pending += data
            return
        pending = self.pending + data
        end = pending.rfind(b"\n")
        if end < 0:
            self.pending = pending
            return
        self.pending = pending[end + 1 :]
        for line in pending[:end].split(b"\n"):
            if line.startswith(b"data:"):
                self._event(line[len(b"data:") :].strip())
                if self.quiet:
                    return

    def _event(self, payload: bytes) -> None:
        result = self.result
        if payload == DONE:
            self._end()
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            self._fail(f"not JSON: {error_detail(payload)}")
            return
        if not isinstance(chunk, dict) or "error" in chunk:
            self._fail(error_detail(payload))
            return
        if self.api == "responses":
            kind = chunk.get("type")
            if kind == OUTPUT_DELTA:
                text = chunk.get("delta")
            elif kind in RESPONSE_ENDS:
                self.usage = usage_in(chunk)
                self._end()
                return
            elif kind in RESPONSE_FAILS:
                self._fail(error_detail(payload))
                return
            else:
                return
        else:
            self.usage = chunk.get("usage") or self.usage
            text = self._content(chunk)
        if isinstance(text, str) and text:
            if result.first_token is None:
                result.first_token = now()
            self.pieces.append(text)

    def _content(self, chunk: dict[str, Any]) -> Any:
        choices = chunk.get("choices")
        if not choices or not isinstance(choices[0], dict):
            return None
        choice = choices[0]
        if self.api == "chat":
            delta = choice.get("delta")
            return delta.get("content") if isinstance(delta, dict) else None
        return choice.get("text")

    def _end(self) -> None:
        self.result.ended = now()
        self.done = self.quiet = True

    def _fail(self, detail: str) -> None:
        self.result.fail(STREAM, detail)
        self.done = self.quiet = True

    def finish(self) -> None:
        result = self.result
        if result.status != 200:
            result.ended = result.ended or now()
            result.fail(category(result.status), error_detail(self.pending))
            return
        if not self.quiet and self.pending.startswith(b"data:"):  # a last line without \n
            self._event(self.pending[len(b"data:") :].strip())
        if not self.done:
            end = "response.completed" if self.api == "responses" else "data: [DONE]"
            result.fail(STREAM, f"the stream ended without {end}")
        if result.error is not None:
            return
        result.text = "".join(self.pieces)
        if not take_usage(result, self.usage):  # no usage: each piece counts as a token
            result.completion_tokens = len(self.pieces)
