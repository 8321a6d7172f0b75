"""The admin API's bearer token: who may read every tenant's usage.

The admin API listens on a loopback address unless the configuration gives it a token
(`admin.tokenFile`; `GatewayConfig` refuses a non-loopback admin address without one). With
a token, every admin route — `/metrics`, `/admin/*` — wants `Authorization: Bearer TOKEN`.
The probes, `/healthz` and `/readyz`, stay open on both ports for the kubelet (which
probes the admin port: tenant traffic cannot take its connections); without the token
they say only whether the gateway is alive and serving (`authenticated` tells the routes
whether to say more).

The file is read when it is first needed and again whenever it changes (`fairpool.files`:
a rotated Secret takes effect without a restart). A file that cannot be read, or is empty,
lets nobody in (503) and is logged once per change. Tokens are compared as SHA-256 digests
in constant time, and never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from fairpool.files import FileWatch
from fairpool_gateway.gateway import Gateway

log = logging.getLogger("fairpool.gateway")


class TokenFile:
    """The token in a file, re-read when the file changes; None when unusable."""

    def __init__(self) -> None:
        self._path: str | None = None
        self._watch: FileWatch | None = None
        self._digest: bytes | None = None

    def digest(self, path: str) -> bytes | None:
        """SHA-256 of the token now in `path` (None: unreadable or empty)."""
        if path != self._path or self._watch is None:
            self._path, self._watch = path, FileWatch(path)
            self._digest = _read(path)
        elif self._watch.changed():
            self._digest = _read(path)
        return self._digest


def _read(path: str) -> bytes | None:
    try:
        token = Path(path).read_text().strip()
    except OSError as error:
        log.error("admin.tokenFile %s cannot be read: %s; the admin API refuses all", path, error)
        return None
    if not token:
        log.error("admin.tokenFile %s is empty; the admin API refuses all", path)
        return None
    return hashlib.sha256(token.encode()).digest()


#: The scope key that says the admin token was given (or none is needed).
AUTHENTICATED = "fairpool.admin"
#: Routes that answer without the token, saying less.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})


def authenticated(scope: Scope) -> bool:
    """Whether the request may see the admin API's details: it came to the admin port with
    the token, or to an admin port that needs none."""
    return bool(scope.get(AUTHENTICATED))


class AdminAuth:
    """ASGI middleware in front of the admin API: the bearer token, when one is configured
    (read from the gateway's current configuration, so a reload that sets or moves
    `admin.tokenFile` takes effect at once)."""

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway
        self.token = TokenFile()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = self.gateway.config.admin.token_file
        if scope["type"] != "http" or path is None:
            await self.app({**scope, AUTHENTICATED: True}, receive, send)
            return
        expected = self.token.digest(path)
        presented = _bearer(scope)
        given = hashlib.sha256(presented.encode()).digest() if presented else b""
        if expected is not None and hmac.compare_digest(given, expected):
            await self.app({**scope, AUTHENTICATED: True}, receive, send)
        elif scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)  # a probe: answered, without details
        elif expected is None:
            await _refuse(send, 503, "The admin API's token cannot be read; see the gateway log.")
        else:
            await _refuse(send, 401, "The admin API wants `Authorization: Bearer TOKEN`.")


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


async def _refuse(send: Send, status: int, message: str) -> None:
    kind = "invalid_request_error" if status == 401 else "server_error"
    body = json.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": None}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
