"""The gateway's two HTTP faces.

Tenant API (public): `POST /v1/chat/completions`, `/v1/completions`, `/v1/responses`
(streamed or not), `/v1/embeddings`, `GET /v1/models`, `GET /openapi.json`, `/healthz`,
`/readyz`. Every POST endpoint is the same path (`generate`) over the pool's front. A request goes
through: size limit → API key → body → pool (by model) → permission → hard limits →
fair queue → routing → the engine, with one retry elsewhere if the worker fails before
its first byte → the answer, relayed → charges from the engine's usage.

Admin API (private port): `/metrics`, `/admin/tenants`, `/admin/tenants/{tenant}`,
`/admin/pools`, `/healthz`, `/readyz`. It shows every tenant, so it never shares the
tenant API's port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeVar

import aiohttp
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from fairpool.api.gateway_config import GatewayTenant
from fairpool.front import CLIENT_CLOSED, Flight, FrontRequest, NoWorker, Outcome, Rejection
from fairpool_gateway.admin_auth import AdminAuth
from fairpool_gateway.gateway import Gateway
from fairpool_gateway.openapi import openapi_document
from fairpool_gateway.pool import Pool, hold
from fairpool_gateway.protocol import (
    ENDPOINTS,
    Endpoint,
    GatewayError,
    ParsedRequest,
    parse_request,
)
from fairpool_gateway.proxy import (
    StreamRelay,
    UpstreamFailed,
    read_whole,
    send,
    upstream_body,
    upstream_timeout,
)

T = TypeVar("T")
log = logging.getLogger("fairpool.gateway")
REQUEST_ID = "x-request-id"


# ---------------------------------------------------------------------- tenant API


def tenant_app(gateway: Gateway) -> Starlette:
    def route(api: Endpoint) -> Route:
        async def serve(request: Request) -> Response:
            return await generate(gateway, request, api)

        return Route(api.path, serve, methods=["POST"])

    async def models(request: Request) -> Response:
        try:
            tenant = gateway.tenants.authenticate(request.headers.get("authorization"))
        except GatewayError as error:
            return error_response(error, None)
        allowed = [pool for name, pool in gateway.pools.items() if tenant.may_use(name)]
        data = [
            {"id": pool.spec.model, "object": "model", "created": 0, "owned_by": "fairpool"}
            for pool in allowed
        ]
        return JSONResponse({"object": "list", "data": data})

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document())

    return Starlette(
        routes=[
            *(route(api) for api in ENDPOINTS),
            Route("/v1/models", models, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
            *probe_routes(gateway),
        ],
        exception_handlers={404: not_found, 405: not_allowed},
    )


def probe_routes(gateway: Gateway) -> list[Route]:
    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        ready = gateway.ready
        return JSONResponse(
            {"status": "ready" if ready else "no pool has a worker in rotation yet"},
            status_code=200 if ready else 503,
        )

    return [Route("/healthz", healthz), Route("/readyz", readyz)]


async def not_found(request: Request, exc: Exception) -> Response:
    return error_response(GatewayError(HTTPStatus.NOT_FOUND, f"No route {request.url.path}."), None)


async def not_allowed(request: Request, exc: Exception) -> Response:
    error = GatewayError(HTTPStatus.METHOD_NOT_ALLOWED, f"{request.method} is not allowed here.")
    return error_response(error, None)


def error_response(error: GatewayError, request_id: str | None) -> Response:
    headers = dict(error.headers)
    if request_id:
        headers[REQUEST_ID] = request_id
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


@dataclass
class Exchange:
    """One request on its way through the gateway."""

    gateway: Gateway
    request_id: str
    path: str
    arrival: float
    tenant: GatewayTenant | None = None
    pool: Pool | None = None
    parsed: ParsedRequest | None = None
    flight: Flight | None = None
    streaming: bool = False  # the answer's stream settles the flight from here on

    @property
    def labels(self) -> tuple[str, str]:
        return (
            self.tenant.tenant if self.tenant else "unknown",
            self.pool.name if self.pool else "none",
        )

    def settle(self, outcome: Outcome) -> None:
        """End the request's flight (only the first call counts)."""
        if self.flight is not None:
            self.flight.settle(outcome)


async def generate(gateway: Gateway, request: Request, api: Endpoint) -> Response:
    """Serve one request of `api`: every endpoint is this same path over the pool's front."""
    exchange = Exchange(
        gateway, request.headers.get(REQUEST_ID) or uuid.uuid4().hex, api.path, time.monotonic()
    )
    try:
        body = await read_body(request, gateway.config.max_request_bytes)
        exchange.tenant = gateway.tenants.authenticate(request.headers.get("authorization"))
        exchange.parsed = parse_request(body, api)
        exchange.pool = choose_pool(gateway, exchange.tenant, exchange.parsed.request.model)
    except GatewayError as error:
        return refuse(exchange, error)
    except ClientDisconnect:
        return Response(status_code=CLIENT_CLOSED)
    response = await unless_client_leaves(request.receive, settled_on_every_path(exchange))
    return response or Response(status_code=CLIENT_CLOSED)


async def settled_on_every_path(exchange: Exchange) -> Response:
    """Admit and forward the request. Whatever happens — an answer, an error, the client
    leaving, a bug — its flight is settled before this returns or raises, unless a stream
    took it over (the stream settles it when it ends)."""
    try:
        response = await admit_and_forward(exchange)
    except asyncio.CancelledError:
        exchange.settle(Outcome(status=CLIENT_CLOSED, reason="client_closed"))
        raise
    except BaseException:
        exchange.settle(Outcome(status=500, reason="internal_error"))
        raise
    if not exchange.streaming:
        exchange.settle(Outcome(status=response.status_code, reason="unsettled"))
    return response


async def admit_and_forward(exchange: Exchange) -> Response:
    """Hard limits, then the fair queue; 429 with Retry-After when either refuses."""
    tenant, pool, parsed = exchange.tenant, exchange.pool, exchange.parsed
    assert tenant is not None and pool is not None and parsed is not None
    request = FrontRequest(
        exchange.request_id,
        tenant.tenant,
        parsed.prompt,
        parsed.estimated_input_tokens,
        parsed.request.output_limit(),
        tenant.limits,
        arrival=exchange.arrival,
    )
    try:
        exchange.flight = pool.front.arrive(request)
        if exchange.flight.queued:
            await hold(exchange.flight)
            if exchange.flight.settled:  # released, but could not be routed
                raise NoWorker(f"pool {pool.name!r} has no worker in rotation")
    except Rejection as rejection:
        return error_response(limit_error(rejection), exchange.request_id)
    except NoWorker as error:
        return error_response(unavailable(pool, str(error)), exchange.request_id)
    return await forward(exchange)


def limit_error(rejection: Rejection) -> GatewayError:
    return GatewayError(
        HTTPStatus.TOO_MANY_REQUESTS,
        rejection.message,
        "rate_limit_exceeded",
        code=rejection.reason,
        headers={"Retry-After": str(max(1, math.ceil(rejection.retry_after)))},
    )


def unavailable(
    pool: Pool, failure: str, status: HTTPStatus = HTTPStatus.SERVICE_UNAVAILABLE
) -> GatewayError:
    return GatewayError(
        status,
        f"No model server of pool {pool.name!r} could take the request ({failure}).",
        "server_error",
        code="upstream_unavailable",
    )


async def unless_client_leaves(receive: Receive, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None if the client disconnected first: then `work` is
    cancelled (leaving the fair queue, or closing the engine's request, which aborts it).
    Plain asyncio rather than a task group, as it runs twice for every request: one
    watcher task, which cancels this one when the client leaves."""
    task = asyncio.current_task()
    assert task is not None
    watching, left = True, False

    def on_watcher_done(watcher: asyncio.Task[None]) -> None:
        nonlocal left
        if watching and not watcher.cancelled() and watcher.exception() is None:
            left = True
            task.cancel()

    watcher = asyncio.ensure_future(until_disconnect(receive))
    watcher.add_done_callback(on_watcher_done)
    try:
        result = await work
    except asyncio.CancelledError:
        if not left:
            raise
        task.uncancel()  # our own cancellation, not the server's
        return None
    finally:
        watching = False
        watcher.cancel()
    if left:  # `work` finished although it was told to stop
        task.uncancel()
    return result


async def until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large(limit)
    return bytes(body)


def too_large(limit: int) -> GatewayError:
    return GatewayError(
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"The request body is over {limit} bytes."
    )


def choose_pool(gateway: Gateway, tenant: GatewayTenant, model: str) -> Pool:
    pool = gateway.pool_for_model(model)
    if pool is None:
        raise GatewayError(
            HTTPStatus.NOT_FOUND,
            f"The model `{model}` does not exist.",
            param="model",
            code="model_not_found",
        )
    if not tenant.may_use(pool.name):
        raise GatewayError(
            HTTPStatus.FORBIDDEN,
            f"Tenant {tenant.tenant!r} may not use the model `{model}`.",
            "permission_error",
            param="model",
            code="model_not_allowed",
        )
    return pool


def refuse(exchange: Exchange, error: GatewayError) -> Response:
    """Answer a request refused before it reached a pool's front, and record it."""
    tenant, pool = exchange.labels
    reason = error.code or error.status.phrase
    exchange.gateway.ledger.refused(exchange.request_id, tenant, pool, int(error.status), reason)
    return error_response(error, exchange.request_id)


# ---------------------------------------------------------------------- forwarding


async def forward(exchange: Exchange) -> Response:
    """Send the dispatched request to its worker and relay the answer."""
    parsed = exchange.parsed
    assert parsed is not None and exchange.tenant is not None
    stream_format = parsed.api.stream if parsed.stream else None
    ask_for_usage = stream_format is not None and stream_format.asks_for_usage
    body = upstream_body(parsed.document, exchange.tenant.tenant, ask_for_usage)
    try:
        upstream = await open_upstream(exchange, body)
    except GatewayError as error:
        return error_response(error, exchange.request_id)
    headers = {REQUEST_ID: exchange.request_id}
    if upstream.status >= 400 or stream_format is None:
        return await relay_whole(exchange, upstream, headers)
    flight = exchange.flight
    assert flight is not None
    relay = StreamRelay(
        upstream, stream_format, parsed.request.wants_usage_chunk(), flight.observe_output
    )
    exchange.streaming = True
    return RelayResponse(exchange, relay, headers=headers, media_type="text/event-stream")


async def open_upstream(exchange: Exchange, body: bytes) -> aiohttp.ClientResponse:
    """The worker's response; a failure before its first byte is retried once elsewhere.
    When no worker answers, the flight is settled (nothing served) and GatewayError raised."""
    gateway, pool, parsed, flight = (
        exchange.gateway,
        exchange.pool,
        exchange.parsed,
        exchange.flight,
    )
    assert pool is not None and parsed is not None and flight is not None
    timeouts = gateway.config.timeouts
    timeout = upstream_timeout(
        timeouts.connect, timeouts.idle if parsed.stream else timeouts.first_byte
    )
    failure = "no worker in rotation"
    status = HTTPStatus.SERVICE_UNAVAILABLE
    for attempt in range(2):
        try:
            decision = flight.decision or flight.redispatch()
        except NoWorker:
            break
        worker = decision.worker
        try:
            return await send(
                gateway.session, worker + exchange.path, body, timeout, exchange.request_id
            )
        except UpstreamFailed as error:
            failure, status = f"{worker}: {error}", HTTPStatus.BAD_GATEWAY
            log.warning(
                "worker failed before the first byte",
                extra={"request_id": exchange.request_id, "worker": worker, "error": str(error)},
            )
            flight.undispatch()  # nothing served there
            pool.worker_failed(worker, str(error))
            if attempt == 0:
                gateway.metrics.retries.labels(pool.name).inc()
    flight.settle(Outcome(status=int(status), reason="upstream_unavailable"))
    raise unavailable(pool, failure, status)


async def relay_whole(
    exchange: Exchange, upstream: aiohttp.ClientResponse, headers: dict[str, str]
) -> Response:
    try:
        content, usage = await read_whole(upstream)
    except UpstreamFailed as error:
        exchange.settle(Outcome(status=502, reason="upstream_failed"))
        failure = GatewayError(
            HTTPStatus.BAD_GATEWAY, f"The model server failed: {error}", "server_error"
        )
        return error_response(failure, exchange.request_id)
    exchange.settle(Outcome(upstream.status, usage, first_token_at=time.monotonic()))
    return Response(
        content,
        status_code=upstream.status,
        headers=headers,
        media_type=upstream.headers.get("content-type", "application/json"),
    )


class RelayResponse(StreamingResponse):
    """A relayed stream. It stops, and closes the engine's stream, as soon as the client
    leaves (whatever ASGI version the server speaks), so the engine aborts the request; and
    it settles the request's flight when it ends, however it ends."""

    def __init__(
        self, exchange: Exchange, relay: StreamRelay, headers: dict[str, str], media_type: str
    ) -> None:
        super().__init__(relay.chunks(time.monotonic), headers=headers, media_type=media_type)
        self.exchange = exchange
        self.relay = relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await unless_client_leaves(receive, self._relay(send))
        finally:
            iterator: Any = self.body_iterator
            await iterator.aclose()
            self.relay.close()
            self.exchange.settle(self.relay.outcome())

    async def _relay(self, send: Send) -> None:
        with contextlib.suppress(OSError):  # the client went away mid-send
            await self.stream_response(send)


# ---------------------------------------------------------------------- admin API


def admin_app(gateway: Gateway) -> Starlette:
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def tenants(request: Request) -> Response:
        names = sorted(gateway.tenants.tenants)
        return JSONResponse({"tenants": [gateway.tenant_state(name) for name in names]})

    async def tenant(request: Request) -> Response:
        name = request.path_params["tenant"]
        if name not in gateway.tenants.tenants:
            return error_response(GatewayError(HTTPStatus.NOT_FOUND, f"No tenant {name!r}."), None)
        return JSONResponse(gateway.tenant_state(name))

    async def pools(request: Request) -> Response:
        return JSONResponse({name: pool.snapshot() for name, pool in gateway.pools.items()})

    return Starlette(
        routes=[
            Route("/metrics", metrics),
            Route("/admin/tenants", tenants),
            Route("/admin/tenants/{tenant}", tenant),
            Route("/admin/pools", pools),
            *probe_routes(gateway),
        ],
        exception_handlers={404: not_found, 405: not_allowed},
        middleware=[Middleware(AdminAuth, gateway=gateway)],  # admin.tokenFile's bearer token
    )
