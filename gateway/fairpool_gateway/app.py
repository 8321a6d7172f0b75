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
from starlette.types import Message, Receive, Scope, Send

from fairpool.api.gateway_config import GatewayTenant
from fairpool.front import CLIENT_CLOSED, Flight, FrontRequest, NoWorker, Outcome, Rejection
from fairpool_gateway.admin_auth import AdminAuth
from fairpool_gateway.body import check_shape, load_json, prepare
from fairpool_gateway.gateway import Gateway
from fairpool_gateway.openapi import openapi_document
from fairpool_gateway.pool import Pool, hold
from fairpool_gateway.protocol import (
    ENDPOINTS,
    Endpoint,
    GatewayError,
    ParsedRequest,
    bad_request,
    validate,
)
from fairpool_gateway.proxy import (
    EngineError,
    StreamRelay,
    UpstreamTimeout,
    WorkerUnreachable,
    read_whole,
    send,
)
from fairpool_gateway.shared_limits import SharedLimiter

T = TypeVar("T")
log = logging.getLogger("fairpool.gateway")
REQUEST_ID = "x-request-id"
#: Output reserved against tokens per minute for a request that sets no output limit, in a
#: pool that does not say its model's context (`maxModelLen`).
DEFAULT_OUTPUT_RESERVATION = 4096


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
        """Ready once serving, whatever the pools' workers: a pool without one answers 503
        for its own requests, and never takes the gateway out of service."""
        pools = {
            name: {"workersInRotation": len(pool.front.router.workers)}
            for name, pool in gateway.pools.items()
        }
        ready = gateway.ready
        document: dict[str, object] = {"status": "ready" if ready else "starting", "pools": pools}
        if gateway.shared is not None:  # down is reported, never a reason to stop serving
            document.update(gateway.shared.status())
        return JSONResponse(document, status_code=200 if ready else 503)

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
    request_id: str  # the client's x-request-id, echoed back
    path: str
    arrival: float
    tenant: GatewayTenant | None = None
    pool: Pool | None = None
    parsed: ParsedRequest | None = None
    flight: Flight | None = None
    sent: bool = False  # handed to a worker (which may be serving it)
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


async def generate(gateway: Gateway, request: Request, endpoint: Endpoint) -> Response:
    """Serve one request of `endpoint`: every endpoint is this same path over the pool's
    front. What a request costs the gateway is bounded before it is paid: the key is
    checked on the headers, the tenant's request-rate and concurrency limits before the
    body is read, the body's read time and size, and its parse (`body.load_json`)."""
    exchange = Exchange(gateway, client_request_id(request), endpoint.path, time.monotonic())
    clients = gateway.config.clients
    try:
        exchange.tenant = gateway.tenants.authenticate(request.headers.get("authorization"))
        gateway.limiter.check(exchange.tenant.tenant, exchange.tenant.limits)
        raw = await read_body(request, gateway.config.max_request_bytes, clients.body_timeout)
        document = load_json(raw, clients)
        del raw
        exchange.pool = choose_pool(gateway, exchange.tenant, document.get("model"))
        check_shape(document, clients)
        exchange.parsed = prepare(
            document,
            validate(document, endpoint),
            endpoint,
            exchange.tenant.tenant,
            share_cache=exchange.pool.spec.routing.share_cache_across_tenants,
        )
        del document  # a queued request keeps only what it still needs
    except Rejection as rejection:  # the limiter's check, before the body
        return refuse_early(exchange, rejection)
    except GatewayError as error:
        return refuse(exchange, error)
    except ClientDisconnect:
        return Response(status_code=CLIENT_CLOSED)
    response = await unless_client_leaves(request.receive, settled_on_every_path(exchange))
    return response or Response(status_code=CLIENT_CLOSED)


def client_request_id(request: Request) -> str:
    """The client's `x-request-id`, echoed back and logged; a new one if it sent none (or
    one over 128 characters). The front keys its requests by their own ids (`arrive`)."""
    given = request.headers.get(REQUEST_ID)
    return given if given and len(given) <= 128 else uuid.uuid4().hex


async def settled_on_every_path(exchange: Exchange) -> Response:
    """Admit and forward the request. Whatever happens — an answer, an error, the client
    leaving, a bug — its flight is settled before this returns or raises, unless a stream
    took it over (the stream settles it when it ends)."""
    try:
        response = await admit_and_forward(exchange)
    except asyncio.CancelledError:  # the client left, or the drain cut the request
        exchange.settle(exchange.gateway.drain.outcome(client_left(exchange)))
        raise
    except BaseException:
        exchange.settle(Outcome(status=500, reason="internal_error"))
        raise
    if not exchange.streaming:
        exchange.settle(Outcome(status=response.status_code, reason="unsettled"))
    return response


def client_left(exchange: Exchange) -> Outcome:
    """What a request whose client left before its answer is charged. A non-streamed
    request sent to a worker is charged its whole output reservation: the gateway cannot
    see what the engine produced before it aborted, and charging less would let a tenant
    slip past its limits by hanging up. A stream is charged what was observed of it (none
    of it, if it had not started), and a request never sent nothing."""
    flight, parsed = exchange.flight, exchange.parsed
    if flight is None or parsed is None or flight.settled:
        return Outcome(CLIENT_CLOSED, reason="client_closed")
    if exchange.sent and not parsed.stream:
        reserved = flight.request.output_limit or 0
        return Outcome(CLIENT_CLOSED, reason="client_closed", output_tokens=reserved)
    if flight.decision is not None and not exchange.sent:
        flight.undispatch()  # routed, never sent: nothing served
    return Outcome(CLIENT_CLOSED, reason="client_closed")


async def admit_and_forward(exchange: Exchange) -> Response:
    """Hard limits, then the fair queue; 429 with Retry-After when either refuses."""
    tenant, pool, parsed = exchange.tenant, exchange.pool, exchange.parsed
    assert tenant is not None and pool is not None and parsed is not None
    request = FrontRequest(
        pool.front.unused_id(exchange.request_id),
        tenant.tenant,
        parsed.key,
        parsed.estimated_input_tokens,
        output_reservation(parsed, pool),
        tenant.limits,
        arrival=exchange.arrival,
    )
    shared = exchange.gateway.shared
    try:
        if shared is not None:
            await reserve_shared(shared, pool, request)
        try:
            exchange.flight = pool.front.arrive(request)
        finally:
            if shared is not None:
                shared.forget(request.request_id)  # reserved, and the front never took it
        if exchange.flight.queued:
            await hold(exchange.flight)
            if exchange.flight.settled:  # released, but could not be routed
                raise NoWorker(f"pool {pool.name!r} has no worker in rotation")
    except Rejection as rejection:
        return error_response(limit_error(rejection), exchange.request_id)
    except NoWorker as error:
        return error_response(unavailable(pool, str(error)), exchange.request_id)
    return await forward(exchange)


async def reserve_shared(shared: SharedLimiter, pool: Pool, request: FrontRequest) -> None:
    """Count `request` under the limits the replicas share; a refusal is told to the
    pool's listeners as the front's own refusals are."""
    try:
        await shared.reserve(request)
    except Rejection as rejection:
        pool.front.tell_rejected(request, rejection)
        raise


def output_reservation(parsed: ParsedRequest, pool: Pool) -> int:
    """The output a request may produce, reserved against its tenant's tokens per minute
    until the engine reports what it produced: its output limit (for each answer it asks
    for), or when it sets none what the model's context leaves after the prompt (the pool's
    `maxModelLen`; DEFAULT_OUTPUT_RESERVATION when the pool does not say)."""
    limit = parsed.output_limit
    if limit is None:
        context = pool.spec.max_model_len
        if context is None:
            limit = DEFAULT_OUTPUT_RESERVATION
        else:
            limit = max(context - parsed.estimated_input_tokens, 1)
    return limit * parsed.choices


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


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The whole body, at most `limit` bytes (413) within `timeout` seconds (408)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    body = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise too_large(limit)
    except TimeoutError:
        raise GatewayError(
            HTTPStatus.REQUEST_TIMEOUT, f"The request body did not arrive within {timeout:g} s."
        ) from None
    return bytes(body)


def too_large(limit: int) -> GatewayError:
    return GatewayError(
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"The request body is over {limit} bytes."
    )


def choose_pool(gateway: Gateway, tenant: GatewayTenant, model: object) -> Pool:
    """The pool serving `model`. A model the tenant may not use is answered like one that
    does not exist (404): the answer never tells a tenant what others may use."""
    if not isinstance(model, str) or not model:
        raise bad_request("model: a non-empty string is required", "model")
    if not model.isascii() and not _encodable(model):
        raise bad_request("model: not valid Unicode (a lone surrogate)", "model")
    pool = gateway.pool_for_model(model)
    if pool is None or not tenant.may_use(pool.name):
        raise GatewayError(
            HTTPStatus.NOT_FOUND,
            f"The model `{model}` does not exist.",
            param="model",
            code="model_not_found",
        )
    return pool


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def refuse_early(exchange: Exchange, rejection: Rejection) -> Response:
    """Answer a request its tenant's limits refused before its body was read, telling the
    pools' listeners as a front tells them of its own refusals (the pool is not known)."""
    assert exchange.tenant is not None
    request = FrontRequest(exchange.request_id, exchange.tenant.tenant, "", 0)
    for listener in exchange.gateway.listeners:
        listener.rejected("none", request, rejection)
    return error_response(limit_error(rejection), exchange.request_id)


def refuse(exchange: Exchange, error: GatewayError) -> Response:
    """Answer a request refused before it reached a pool's front, and record it."""
    tenant, pool = exchange.labels
    reason = error.code or error.status.phrase
    exchange.gateway.ledger.refused(exchange.request_id, tenant, pool, int(error.status), reason)
    return error_response(error, exchange.request_id)


# ---------------------------------------------------------------------- forwarding


async def forward(exchange: Exchange) -> Response:
    """Send the dispatched request to its worker and relay the answer."""
    parsed, flight = exchange.parsed, exchange.flight
    assert parsed is not None and flight is not None
    try:
        upstream = await open_upstream(exchange)
    except GatewayError as error:
        return error_response(error, exchange.request_id)
    headers = {REQUEST_ID: exchange.request_id}
    stream_format = parsed.endpoint.stream
    if upstream.status >= 400 or not parsed.stream or stream_format is None:
        return await relay_whole(exchange, upstream, headers)
    timeouts = exchange.gateway.config.timeouts
    relay = StreamRelay(
        upstream,
        stream_format,
        parsed.wants_usage_chunk,
        timeouts.idle,
        on_output=flight.observe_output,
        on_end=exchange.settle,  # the engine is done: settle now, whatever the client reads
    )
    exchange.streaming = True
    write_timeout = exchange.gateway.config.clients.write_timeout
    return RelayResponse(exchange, relay, write_timeout, headers=headers)


async def open_upstream(exchange: Exchange) -> aiohttp.ClientResponse:
    """The worker's response. A worker that cannot be reached is taken out of rotation
    and the request tried once more elsewhere; an engine's 5xx or a timeout ends the
    request (502, 504) and leaves the worker in rotation. The flight is settled when no
    answer comes, and GatewayError raised."""
    gateway, pool, parsed = exchange.gateway, exchange.pool, exchange.parsed
    flight = exchange.flight
    assert pool is not None and parsed is not None and flight is not None
    timeouts = gateway.config.timeouts
    answer_timeout = timeouts.first_byte if parsed.stream else timeouts.total
    failure = "no worker in rotation"
    status = HTTPStatus.SERVICE_UNAVAILABLE
    for attempt in range(2):
        try:
            decision = flight.decision or flight.redispatch()
        except NoWorker:
            break
        worker = decision.worker
        exchange.sent = True
        try:
            return await send(
                gateway.session,
                worker + exchange.path,
                parsed.upstream,
                timeouts.connect,
                answer_timeout,
                flight.request_id,
            )
        except WorkerUnreachable as error:
            exchange.sent = False
            failure, status = f"{worker}: {error}", HTTPStatus.BAD_GATEWAY
            log.warning(
                "worker unreachable",
                extra={"request_id": exchange.request_id, "worker": worker, "error": str(error)},
            )
            flight.undispatch()  # nothing served there
            pool.worker_failed(worker, str(error))
            if attempt == 0:
                gateway.metrics.retries.labels(pool.name).inc()
        except EngineError as error:
            flight.settle(Outcome(status=502, reason="engine_error"))
            raise GatewayError(
                HTTPStatus.BAD_GATEWAY,
                f"The model server failed this request ({error}).",
                "server_error",
                code="engine_error",
            ) from None
        except UpstreamTimeout as error:
            flight.settle(Outcome(status=504, reason="upstream_timeout"))
            raise GatewayError(
                HTTPStatus.GATEWAY_TIMEOUT,
                f"The model server did not answer in time ({error}).",
                "server_error",
                code="upstream_timeout",
            ) from None
    flight.settle(Outcome(status=int(status), reason="upstream_unavailable"))
    raise unavailable(pool, failure, status)


async def relay_whole(
    exchange: Exchange, upstream: aiohttp.ClientResponse, headers: dict[str, str]
) -> Response:
    timeout = exchange.gateway.config.timeouts.total
    try:
        content, usage = await read_whole(upstream, timeout)
    except (EngineError, UpstreamTimeout) as error:
        status = 504 if isinstance(error, UpstreamTimeout) else 502
        exchange.settle(Outcome(status=status, reason="upstream_failed"))
        failure = GatewayError(
            HTTPStatus(status), f"The model server failed: {error}", "server_error"
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
    leaves (whatever ASGI version the server speaks) or stops reading for `write_timeout`
    seconds, so the engine aborts the request; and it settles the request's flight when
    it ends, however it ends (the engine finishing settles it earlier: `StreamRelay`)."""

    def __init__(
        self,
        exchange: Exchange,
        relay: StreamRelay,
        write_timeout: float,
        headers: dict[str, str],
    ) -> None:
        super().__init__(
            relay.chunks(time.monotonic), headers=headers, media_type="text/event-stream"
        )
        self.exchange = exchange
        self.relay = relay
        self.write_timeout = write_timeout
        self.stalled = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await unless_client_leaves(receive, self._relay(send))
        finally:
            iterator: Any = self.body_iterator
            await iterator.aclose()
            self.relay.close()
            self.exchange.settle(self.exchange.gateway.drain.outcome(self.relay.outcome()))
            if self.stalled:
                log.warning(
                    "stream cut: the client stopped reading",
                    extra={"request_id": self.exchange.request_id, "seconds": self.write_timeout},
                )

    async def _relay(self, send: Send) -> None:
        async def send_or_stall(message: Message) -> None:
            try:
                async with asyncio.timeout(self.write_timeout):
                    await send(message)
            except TimeoutError:
                self.stalled = True
                raise _Stalled from None

        with contextlib.suppress(OSError, _Stalled):  # the client went away, or stalled
            await self.stream_response(send_or_stall)


class _Stalled(Exception):
    pass


# ---------------------------------------------------------------------- admin API


def admin_app(gateway: Gateway) -> Starlette:
    async def metrics(request: Request) -> Response:
        if gateway.fleet is not None:
            await gateway.fleet.refresh()  # the fleet-wide shares, from the shared state
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def tenants(request: Request) -> Response:
        names = sorted(gateway.tenants.tenants)
        return JSONResponse({"tenants": [await gateway.tenant_state(name) for name in names]})

    async def tenant(request: Request) -> Response:
        name = request.path_params["tenant"]
        if name not in gateway.tenants.tenants:
            return error_response(GatewayError(HTTPStatus.NOT_FOUND, f"No tenant {name!r}."), None)
        return JSONResponse(await gateway.tenant_state(name))

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
