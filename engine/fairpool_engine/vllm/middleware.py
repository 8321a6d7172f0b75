"""An ASGI middleware for vLLM's OpenAI server (`--middleware`).

- On completions, chat, responses and embeddings it refuses requests whose `vllm_xargs`
  carry a fairpool key that is unknown or malformed, with vLLM's own 400 error body,
  before vLLM accepts them.
- On embeddings, where vLLM 0.32 ignores `vllm_xargs`, it moves the tenant (and the band
  the request asks) into the request's `cache_salt`, the one field that reaches the
  scheduler (`pooling_tenant` explains why); a `cache_salt` of the client's that looks
  like fairpool's is refused.

Streams pass through untouched.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fairpool.api.scheduler_config import check_xargs
from fairpool.sched.errors import ConfigError
from fairpool_engine import pooling_tenant

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

EMBEDDINGS = pooling_tenant.EMBEDDINGS
CHECKED_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses", EMBEDDINGS)


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
        document = _document(body)
        try:
            if document is not None:
                check_xargs(document.get("vllm_xargs"))
                if scope["path"] == EMBEDDINGS:
                    rewritten = _salted(document)
                    if rewritten is not None:
                        scope, messages = _with_body(scope, messages, rewritten)
        except ConfigError as error:
            await _send_error(send, error)
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


def _document(body: bytes) -> dict[str, Any] | None:
    try:
        document = json.loads(body)
    except ValueError:
        return None  # vLLM answers malformed JSON itself
    return document if isinstance(document, dict) else None


def _salted(document: dict[str, Any]) -> bytes | None:
    """The embeddings body with the tenant and band in its `cache_salt`, or None to leave
    it."""
    client_salt = document.get("cache_salt")
    client_salt = client_salt if isinstance(client_salt, str) else None
    salt = pooling_tenant.carrying(document.get("vllm_xargs"), client_salt)
    if salt == client_salt:
        return None
    return json.dumps({**document, "cache_salt": salt}).encode()


def _with_body(scope: Scope, messages: list[Message], body: bytes) -> tuple[Scope, list[Message]]:
    headers = [
        (name, str(len(body)).encode() if name.lower() == b"content-length" else value)
        for name, value in scope.get("headers", [])
    ]
    rest = [message for message in messages if message["type"] != "http.request"]
    return {**scope, "headers": headers}, [
        {"type": "http.request", "body": body, "more_body": False},
        *rest,
    ]


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
