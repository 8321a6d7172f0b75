"""The gateway's two HTTP faces.

Tenant API (public): `POST /v1/chat/completions`, `POST /v1/completions` (streamed or
not), `GET /v1/models`, `GET /openapi.json`, `/healthz`, `/readyz`. A request goes
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
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeVar

import aiohttp
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from fairpool.api.gateway_config import GatewayTenant
from fairpool.sched.errors import ConfigError
from fairpool_gateway.gateway import Gateway
from fairpool_gateway.limits import Rejection, Ticket
from fairpool_gateway.openapi import openapi_document
from fairpool_gateway.pool import Dispatch, Pool
from fairpool_gateway.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GatewayError,
    GenerationRequest,
    ParsedRequest,
    parse_request,
)
from fairpool_gateway.proxy import (
    StreamRelay,
    UpstreamFailed,
    Usage,
    read_whole,
    send,
    upstream_body,
    upstream_timeout,
)

T = TypeVar("T")
log = logging.getLogger("fairpool.gateway")
REQUEST_ID = "x-request-id"
CLIENT_CLOSED = 499  # nginx's status for a client that left before the answer


# ---------------------------------------------------------------------- tenant API


def tenant_app(gateway: Gateway) -> Starlette:
    async def chat(request: Request) -> Response:
        return await generate(gateway, request, ChatCompletionRequest, "/v1/chat/completions")

    async def completions(request: Request) -> Response:
        return await generate(gateway, request, CompletionRequest, "/v1/completions")

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
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
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
    """One request on its way through the gateway, and what it was charged."""

    gateway: Gateway
    request_id: str
    path: str
    arrival: float
    tenant: GatewayTenant | None = None
    pool: Pool | None = None
    parsed: ParsedRequest | None = None
    ticket: Ticket | None = None
    dispatch: Dispatch | None = None

    @property
    def labels(self) -> tuple[str, str]:
        return (
            self.tenant.tenant if self.tenant else "unknown",
            self.pool.name if self.pool else "none",
        )


async def generate(
    gateway: Gateway, request: Request, kind: type[GenerationRequest], path: str
) -> Response:
    exchange = Exchange(
        gateway, request.headers.get(REQUEST_ID) or uuid.uuid4().hex, path, time.monotonic()
    )
    try:
        body = await read_body(request, gateway.config.max_request_bytes)
        exchange.tenant = gateway.tenants.authenticate(request.headers.get("authorization"))
        exchange.parsed = parse_request(body, kind)
        exchange.pool = choose_pool(gateway, exchange.tenant, exchange.parsed.request.model)
    except GatewayError as error:
        reject(exchange, error)
        return error_response(error, exchange.request_id)
    except ClientDisconnect:
        return Response(status_code=CLIENT_CLOSED)
    response = await unless_client_leaves(request.receive, admit_and_forward(exchange))
    return response or Response(status_code=CLIENT_CLOSED)


async def admit_and_forward(exchange: Exchange) -> Response:
    try:
        await admit(exchange)
    except GatewayError as error:
        reject(exchange, error)
        return error_response(error, exchange.request_id)
    return await forward(exchange)


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


async def admit(exchange: Exchange) -> None:
    """Hard limits, then the fair queue; 429 with Retry-After when either refuses."""
    tenant, pool, parsed = exchange.tenant, exchange.pool, exchange.parsed
    assert tenant is not None and pool is not None and parsed is not None
    estimate = parsed.estimated_input_tokens
    output_limit = parsed.request.output_limit() or 0
    try:
        exchange.ticket = exchange.gateway.limiter.admit(
            tenant.tenant, tenant.limits, estimate + output_limit
        )
        queued_at = time.monotonic()
        try:
            await pool.queue.enter(
                exchange.request_id,
                tenant.tenant,
                estimate,
                max(output_limit, 1),
                tenant.limits.queued,
                pool.spec.routing.queue_timeout_seconds,
            )
        except BaseException:
            exchange.gateway.limiter.settle(exchange.ticket)
            raise
        exchange.gateway.metrics.queue_time.labels(*exchange.labels).observe(
            time.monotonic() - queued_at
        )
    except Rejection as rejection:
        raise GatewayError(
            HTTPStatus.TOO_MANY_REQUESTS,
            rejection.message,
            "rate_limit_exceeded",
            code=rejection.reason,
            headers={"Retry-After": str(max(1, math.ceil(rejection.retry_after)))},
        ) from None


def reject(exchange: Exchange, error: GatewayError) -> None:
    metrics = exchange.gateway.metrics
    tenant, pool = exchange.labels
    metrics.requests.labels(tenant, pool, str(int(error.status))).inc()
    metrics.rejections.labels(tenant, pool, error.code or error.status.phrase).inc()
    log.info(
        "request refused",
        extra={
            "request_id": exchange.request_id,
            "tenant": tenant,
            "pool": pool,
            "status": int(error.status),
            "reason": error.code or error.status.phrase,
        },
    )


# ---------------------------------------------------------------------- forwarding


async def forward(exchange: Exchange) -> Response:
    """Send the admitted request to a worker and relay the answer. From here on the
    request holds a place in the pool's queue, so every path ends in `settle`."""
    parsed = exchange.parsed
    assert parsed is not None and exchange.tenant is not None
    body = upstream_body(parsed.document, exchange.tenant.tenant, parsed.stream)
    try:
        upstream = await open_upstream(exchange, body)
    except GatewayError as error:
        settle(exchange, None, 0, int(error.status), None)
        reject(exchange, error)
        return error_response(error, exchange.request_id)
    except BaseException:
        settle(exchange, None, 0, CLIENT_CLOSED, None)
        raise
    headers = {REQUEST_ID: exchange.request_id}
    if upstream.status >= 400 or not parsed.stream:
        return await relay_whole(exchange, upstream, headers)
    want_usage = bool(parsed.request.stream_options and parsed.request.stream_options.include_usage)
    relay = StreamRelay(upstream, want_usage)
    return RelayResponse(relayed(exchange, relay), headers=headers, media_type="text/event-stream")


async def open_upstream(exchange: Exchange, body: bytes) -> aiohttp.ClientResponse:
    """The worker's response; a failure before its first byte is retried once elsewhere."""
    gateway, pool, parsed = exchange.gateway, exchange.pool, exchange.parsed
    assert pool is not None and parsed is not None and exchange.tenant is not None
    timeouts = gateway.config.timeouts
    timeout = upstream_timeout(
        timeouts.connect, timeouts.idle if parsed.stream else timeouts.first_byte
    )
    failure = "no worker in rotation"
    for attempt in range(2):
        try:
            exchange.dispatch = pool.dispatch(
                exchange.request_id,
                exchange.tenant.tenant,
                parsed.prompt,
                parsed.estimated_input_tokens,
            )
        except ConfigError:
            break
        worker = exchange.dispatch.worker
        note_dispatch(exchange)
        try:
            return await send(
                gateway.session, worker + exchange.path, body, timeout, exchange.request_id
            )
        except UpstreamFailed as error:
            failure = f"{worker}: {error}"
            log.warning(
                "worker failed before the first byte",
                extra={"request_id": exchange.request_id, "worker": worker, "error": str(error)},
            )
            pool.complete(exchange.request_id, 0, 0)  # nothing served: refund the input
            exchange.dispatch = None
            pool.worker_failed(worker, str(error))
            if attempt == 0:
                gateway.metrics.retries.labels(pool.name).inc()
    raise GatewayError(
        HTTPStatus.BAD_GATEWAY if "no worker" not in failure else HTTPStatus.SERVICE_UNAVAILABLE,
        f"No model server of pool {pool.name!r} could take the request ({failure}).",
        "server_error",
        code="upstream_unavailable",
    )


def note_dispatch(exchange: Exchange) -> None:
    pool, dispatch, parsed = exchange.pool, exchange.dispatch, exchange.parsed
    assert pool is not None and dispatch is not None and parsed is not None
    metrics = exchange.gateway.metrics
    prefix = "hit" if dispatch.matched_chars else "miss"
    metrics.routing.labels(pool.name, dispatch.worker, prefix).inc()
    metrics.prefix_chars.labels(pool.name, "total").inc(len(parsed.prompt))
    metrics.prefix_chars.labels(pool.name, "matched").inc(dispatch.matched_chars)


async def relay_whole(
    exchange: Exchange, upstream: aiohttp.ClientResponse, headers: dict[str, str]
) -> Response:
    try:
        content, usage = await read_whole(upstream)
    except BaseException as error:
        if not isinstance(error, UpstreamFailed):  # the client left (cancelled)
            settle(exchange, None, 0, CLIENT_CLOSED, None)
            raise
        settle(exchange, None, 0, 502, None)
        failure = GatewayError(
            HTTPStatus.BAD_GATEWAY, f"The model server failed: {error}", "server_error"
        )
        return error_response(failure, exchange.request_id)
    settle(exchange, usage, 0, upstream.status, time.monotonic())
    return Response(
        content,
        status_code=upstream.status,
        headers=headers,
        media_type=upstream.headers.get("content-type", "application/json"),
    )


async def relayed(exchange: Exchange, relay: StreamRelay) -> AsyncIterator[bytes]:
    try:
        async for chunk in relay.chunks(time.monotonic):
            yield chunk
    finally:
        status = 200 if relay.error is None else 502
        settle(exchange, relay.usage, relay.output_events, status, relay.first_byte_at)


class RelayResponse(StreamingResponse):
    """A stream that stops, and closes the engine's stream, as soon as the client leaves
    (whatever ASGI version the server speaks), so the engine aborts the request."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await unless_client_leaves(receive, self._relay(send))
        finally:
            iterator: Any = self.body_iterator
            await iterator.aclose()

    async def _relay(self, send: Send) -> None:
        with contextlib.suppress(OSError):  # the client went away mid-send
            await self.stream_response(send)


def settle(
    exchange: Exchange,
    usage: Usage | None,
    output_events: int,
    status: int,
    first_byte_at: float | None,
) -> None:
    """Charge the tenant for what the engine served and record the request: with the
    engine's usage when it sent one, else the input estimate and the output relayed."""
    gateway, pool, parsed = exchange.gateway, exchange.pool, exchange.parsed
    assert pool is not None and parsed is not None
    tenant, pool_name = exchange.labels
    if usage is not None:
        completion, uncached = usage.completion_tokens, usage.uncached_prompt_tokens
        prompt, cached = usage.prompt_tokens, usage.cached_tokens
    else:
        completion, uncached = output_events, None
        prompt, cached = parsed.estimated_input_tokens, 0
    if exchange.dispatch is not None:
        pool.complete(exchange.request_id, completion, uncached)
    pool.queue.finish(exchange.request_id, prompt, cached, completion)
    if exchange.ticket is not None:
        gateway.limiter.settle(exchange.ticket, prompt + completion)
    now = time.monotonic()
    metrics = gateway.metrics
    metrics.requests.labels(tenant, pool_name, str(status)).inc()
    if status < 400 and exchange.dispatch is not None:
        metrics.tokens.labels(tenant, pool_name, "prompt").inc(prompt)
        metrics.tokens.labels(tenant, pool_name, "cached").inc(cached)
        metrics.tokens.labels(tenant, pool_name, "completion").inc(completion)
        metrics.service.labels(tenant, pool_name).inc(
            pool.spec.cost.model().service(prompt - cached, completion)
        )
        metrics.latency.labels(tenant, pool_name).observe(now - exchange.arrival)
        if first_byte_at is not None:
            metrics.ttft.labels(tenant, pool_name).observe(first_byte_at - exchange.arrival)
    log.info(
        "request done",
        extra={
            "request_id": exchange.request_id,
            "tenant": tenant,
            "pool": pool_name,
            "worker": exchange.dispatch.worker if exchange.dispatch else None,
            "status": status,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "completion_tokens": completion,
            "seconds": round(now - exchange.arrival, 4),
        },
    )


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
    )
