"""An ASGI middleware for vLLM's OpenAI server (`--middleware`): refuses requests whose
`vllm_xargs` carry a fairpool key that is unknown or malformed, with vLLM's own 400 error
body, before vLLM accepts them. Streams pass through untouched."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fairpool.api.scheduler_config import check_xargs
from fairpool.sched.errors import ConfigError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CHECKED_PATHS = ("/v1/completions", "/v1/chat/completions")


class TenantXargsMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] not in CHECKED_PATHS
        ):
            await self.app(scope, receive, send)
            return
        messages, body = await _read_body(receive)
        problem = _xargs_problem(body)
        if problem is not None:
            await _send_error(send, problem)
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


async def _read_body(receive: Receive) -> tuple[list[Message], bytes]:
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return messages, b"".join(chunks)


def _xargs_problem(body: bytes) -> ConfigError | None:
    try:
        document = json.loads(body)
    except ValueError:
        return None  # vLLM answers malformed JSON itself
    if not isinstance(document, dict):
        return None
    try:
        check_xargs(document.get("vllm_xargs"))
    except ConfigError as error:
        return error
    return None


async def _send_error(send: Send, error: ConfigError) -> None:
    body = json.dumps(
        {
            "error": {
                "message": str(error),
                "type": "BadRequestError",
                "param": error.parameter,
                "code": 400,
            }
        }
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})
