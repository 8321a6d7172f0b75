"""The gateway's two HTTP faces.

Tenant API (public): `POST /v1/chat/completions`, `/v1/completions`, `/v1/responses`
(streamed or not), `/v1/embeddings`, `GET /v1/models`, `GET /openapi.json`, `/healthz`,
`/readyz`. Every POST endpoint is the same path (`generate`) over the pool's front. A request goes
through: size limit → API key → bytes in flight → body → pool (by model) → permission →
hard limits → fair queue → routing → the engine, with one retry elsewhere if the worker
fails before its first byte → the answer, relayed as it arrives → charges from the
engine's usage.

Every request gets an id of the gateway's own: the one the engine, the logs, the limits
and the front know it by. A client's `x-request-id` is only echoed back (with the
gateway's in `x-fairpool-request-id`): two clients, or two tenants, sending the same id
must not meet anywhere.

Admin API (private port): `/metrics`, `/admin/tenants`, `/admin/tenants/{tenant}`,
`/admin/pools`, `/admin/status`, `/healthz`, `/readyz`. It shows every tenant, so it never
shares the tenant API's port; its probes answer without the admin token (they say only
whether the gateway is alive and serving), so the kubelet probes this port, whose
connections tenant traffic cannot take (`fairpool_gateway.connections`).
"""

from __future__ import annotations

import asyncio
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
from fairpool.front.charges import output_reservation
from fairpool.sched.tree import BAND_NAMES
from fairpool_gateway.admin_auth import AdminAuth, authenticated
from fairpool_gateway.body import check_shape, parse_body, prepare
from fairpool_gateway.budget import Holding
from fairpool_gateway.connections import connection_of
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
    AnswerTooLarge,
    EngineError,
    Relay,
    StreamRelay,
    UpstreamTimeout,
    WholeRelay,
    WorkerUnreachable,
    send,
)
from fairpool_gateway.shared_limits import SharedLimiter

T = TypeVar("T")
log = logging.getLogger("fairpool.gateway")
REQUEST_ID = "x-request-id"
GATEWAY_REQUEST_ID = "x-fairpool-request-id"
#: The band a request asks to run in (only below its tenant's), and the one it ran in.
BAND = "x-fairpool-band"
#: The Gateway API Inference Extension's objective header: a band's name, or an
#: InferenceObjective-style priority (above 0 interactive, 0 standard, below 0 batch).
OBJECTIVE = "x-gateway-inference-objective"


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
    """`/healthz` and `/readyz`: alive, and serving. Ready once serving, whatever the pools'
    workers: a pool without one answers 503 for its own requests, and never takes the
    gateway out of service. They name nothing: the pools and the shared state are the
    admin API's to show (`/admin/status`), to those with its token."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        ready = gateway.ready
        document: dict[str, object] = {"status": "ready" if ready else "starting"}
        if authenticated(request.scope):  # the admin port, with its token (or none set)
            document.update(serving_status(gateway))
        return JSONResponse(document, status_code=200 if ready else 503)

    return [Route("/healthz", healthz), Route("/readyz", readyz)]


def serving_status(gateway: Gateway) -> dict[str, object]:
    """Each pool's workers in rotation, and the shared state's health (down is reported,
    never a reason to stop serving)."""
    pools = {
        name: {"workersInRotation": len(pool.front.router.workers)}
        for name, pool in gateway.pools.items()
    }
    document: dict[str, object] = {"pools": pools}
    if gateway.shared is not None:
        document.update(gateway.shared.status())
    return document


async def not_found(request: Request, exc: Exception) -> Response:
    return error_response(GatewayError(HTTPStatus.NOT_FOUND, f"No route {request.url.path}."), None)


async def not_allowed(request: Request, exc: Exception) -> Response:
    error = GatewayError(HTTPStatus.METHOD_NOT_ALLOWED, f"{request.method} is not allowed here.")
    return error_response(error, None)


def error_response(error: GatewayError, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(
        error.body(), status_code=error.status, headers={**error.headers, **(headers or {})}
    )


@dataclass
class Exchange:
    """One request on its way through the gateway."""

    gateway: Gateway
    request_id: str  # the gateway's own: upstream, in the logs, in the limits
    client_request_id: str | None  # the client's x-request-id, echoed back only
    path: str
    arrival: float
    client: str  # the client's address
    tenant: GatewayTenant | None = None
    band: str | None = None  # the band it asked for (below its tenant's); None: the tenant's
    holding: Holding | None = None  # its bytes in flight (body, then answer)
    body_bytes: int = 0  # of those, the body's, until the engine has it
    body_read: int = 0  # bytes of body read (what a refusal of it cost)
    pool: Pool | None = None
    parsed: ParsedRequest | None = None
    flight: Flight | None = None
    sent: bool = False  # handed to a worker (which may be serving it)
    relayed: bool = False  # a relay answers it: the relay settles and releases from here on

    @property
    def answer_headers(self) -> dict[str, str]:
        """The request ids an answer carries — the client's echoed (ours if it sent none),
        and ours — and, once known, the band it runs in."""
        headers = {
            REQUEST_ID: self.client_request_id or self.request_id,
            GATEWAY_REQUEST_ID: self.request_id,
        }
        if self.flight is not None:
            headers[BAND] = self.flight.band
        return headers

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

    def engine_has_body(self) -> None:
        """The engine has the request: its body no longer counts in the bytes in flight."""
        if self.holding is not None:
            self.holding.give_back(self.body_bytes)
        self.body_bytes = 0

    def release(self) -> None:
        """Every byte this request holds (every exit path calls it)."""
        if self.holding is not None:
            self.holding.release()


async def generate(gateway: Gateway, request: Request, endpoint: Endpoint) -> Response:
    """Serve one request of `endpoint`: every endpoint is this same path over the pool's
    front. Refusals of a tenant, or of a client without a valid key, that come in a storm
    are damped (`fairpool_gateway.refusals`). The request's bytes in flight are given back
    when its answer is done (by the relay, for a relayed answer)."""
    client = request.client.host if request.client else ""
    exchange = Exchange(
        gateway,
        uuid.uuid4().hex,
        client_request_id(request),
        endpoint.path,
        time.monotonic(),
        client,
    )
    try:
        response = await serve_request(exchange, request, endpoint)
        if refused(exchange, response):
            who = exchange.tenant.tenant if exchange.tenant else client
            await gateway.refusals.damp(who, response, exchange.body_read)
        return response
    finally:
        if not exchange.relayed:
            exchange.release()


def refused(exchange: Exchange, response: Response) -> bool:
    """Whether the gateway refused the request itself (a 4xx of its own, not the engine's,
    nor a client that left): what a refusal storm is made of."""
    status = response.status_code
    return 400 <= status < 500 and status != CLIENT_CLOSED and not exchange.relayed


async def serve_request(exchange: Exchange, request: Request, endpoint: Endpoint) -> Response:
    """What a request costs the gateway is bounded before it is paid: the key is checked on
    the headers, the tenant's request-rate and concurrency limits before the body is read,
    the body's read time, size and bytes in flight, and its parse (`body.parse_body`)."""
    gateway = exchange.gateway
    clients = gateway.config.clients
    try:
        exchange.tenant = gateway.tenants.authenticate(request.headers.get("authorization"))
        if gateway.refusals.storming(exchange.tenant.tenant):
            raise refusals_damped()
        exchange.band = requested_band(request, exchange.tenant)
        exchange.holding = gateway.bytes_in_flight.holding(exchange.tenant.tenant)
        gateway.limiter.check(exchange.tenant.tenant, exchange.tenant.limits)
        raw = await read_body(
            request, gateway.config.max_request_bytes, clients.body_timeout, exchange.holding
        )
        exchange.body_bytes = exchange.holding.held
        exchange.body_read = len(raw)
        document = await parse_body(raw, clients)
        del raw
        exchange.pool = choose_pool(gateway, exchange.tenant, document.get("model"))
        check_shape(document, clients)
        exchange.parsed = prepare(
            document,
            validate(document, endpoint),
            endpoint,
            exchange.tenant.tenant,
            share_cache=exchange.pool.spec.routing.share_cache_across_tenants,
            band=exchange.band,
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


def requested_band(request: Request, tenant: GatewayTenant) -> str | None:
    """The band the request asks to run in (`x-fairpool-band`, or the Inference
    Extension's objective header), read only now that its key is known; None for its
    tenant's own. A request may ask a lower band than its tenant's (an interactive
    tenant's batch job), never a higher one: a 400 naming the header."""
    header = BAND if BAND in request.headers else OBJECTIVE
    asked = request.headers.get(header)
    if asked is None:
        return None
    band = band_named(asked.strip().lower())
    if band is None:
        raise bad_request(
            f"{header}: {asked[:40]!r} is not a band (interactive, standard, batch) or a "
            "priority (an integer)",
            header,
        )
    own = tenant.slo.slo_class
    if BAND_NAMES.index(band) < BAND_NAMES.index(own):
        raise bad_request(
            f"{header}: {band!r} is above this key's band {own!r}; a request may only ask a "
            "lower one",
            header,
        )
    return None if band == own else band


def band_named(value: str) -> str | None:
    """A band by its name, or by an InferenceObjective-style priority; None if neither."""
    if value in BAND_NAMES:
        return value
    try:
        priority = int(value)
    except ValueError:
        return None
    return "interactive" if priority > 0 else "standard" if priority == 0 else "batch"


def refusals_damped() -> GatewayError:
    return GatewayError(
        HTTPStatus.TOO_MANY_REQUESTS,
        "This key's requests have been refused too often in the last seconds; its requests "
        "are refused unread until they have not been for a while. Retry after the time given.",
        "rate_limit_exceeded",
        code="refusals_damped",
        headers={"Retry-After": "1"},
    )


def client_request_id(request: Request) -> str | None:
    """The client's `x-request-id`, to echo back: None if it sent none, or one over 128
    characters or of other than printable ASCII."""
    given = request.headers.get(REQUEST_ID)
    if given and len(given) <= 128 and given.isascii() and given.isprintable():
        return given
    return None


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
    if not exchange.relayed:
        exchange.settle(Outcome(status=response.status_code, reason="unsettled"))
    return response


def client_left(exchange: Exchange) -> Outcome:
    """What a request whose client left before its answer is charged: the core's rule
    (`Flight.left_by_client`)."""
    flight, parsed = exchange.flight, exchange.parsed
    if flight is None or parsed is None:
        return Outcome(CLIENT_CLOSED, reason="client_closed")
    return flight.left_by_client(exchange.sent, parsed.stream)


async def admit_and_forward(exchange: Exchange) -> Response:
    """Hard limits, then the fair queue; 429 with Retry-After when either refuses."""
    tenant, pool, parsed = exchange.tenant, exchange.pool, exchange.parsed
    assert tenant is not None and pool is not None and parsed is not None
    request = FrontRequest(
        exchange.request_id,
        tenant.tenant,
        parsed.key,
        parsed.estimated_input_tokens,
        output_reservation(
            parsed.output_limit,
            parsed.choices,
            parsed.estimated_input_tokens,
            pool.spec.max_model_len,
        ),
        tenant.limits,
        arrival=exchange.arrival,
        band=exchange.band,
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
        return error_response(limit_error(rejection), exchange.answer_headers)
    except NoWorker as error:
        return error_response(unavailable(pool, str(error)), exchange.answer_headers)
    return await forward(exchange)


async def reserve_shared(shared: SharedLimiter, pool: Pool, request: FrontRequest) -> None:
    """Count `request` under the limits the replicas share; a refusal is told to the
    pool's listeners as the front's own refusals are."""
    try:
        await shared.reserve(request)
    except Rejection as rejection:
        pool.front.tell_rejected(request, rejection)
        raise


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


async def read_body(request: Request, limit: int, timeout: float, holding: Holding) -> bytearray:
    """The whole body, at most `limit` bytes (413) within `timeout` seconds (408), held in
    the tenant's bytes in flight from its first byte — from its declared length, before
    any is read, when it declares one (429/503 when they have no room)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit():
        if int(declared) > limit:
            raise too_large(limit)
        holding.take(int(declared))
    body = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise too_large(limit)
                holding.take(len(body) - holding.held)
    except TimeoutError:
        raise GatewayError(
            HTTPStatus.REQUEST_TIMEOUT, f"The request body did not arrive within {timeout:g} s."
        ) from None
    return body


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
    return error_response(limit_error(rejection), exchange.answer_headers)


def refuse(exchange: Exchange, error: GatewayError) -> Response:
    """Answer a request refused before it reached a pool's front, and record it."""
    tenant, pool = exchange.labels
    reason = error.code or error.status.phrase
    exchange.gateway.ledger.refused(exchange.request_id, tenant, pool, int(error.status), reason)
    return error_response(error, exchange.answer_headers)


# ---------------------------------------------------------------------- forwarding


async def forward(exchange: Exchange) -> Response:
    """Send the dispatched request to its worker and relay the answer as it arrives."""
    gateway, parsed, flight = exchange.gateway, exchange.parsed, exchange.flight
    assert parsed is not None and flight is not None
    try:
        upstream = await open_upstream(exchange)
    except GatewayError as error:
        return error_response(error, exchange.answer_headers)
    exchange.engine_has_body()
    idle = gateway.config.timeouts.idle
    stream_format = parsed.endpoint.stream
    relay: Relay
    if upstream.status < 400 and parsed.stream and stream_format is not None:
        relay = StreamRelay(
            upstream,
            stream_format,
            parsed.wants_usage_chunk,
            idle,
            on_output=flight.observe_output,
            on_end=exchange.settle,  # the engine is done: settle now, whatever the client reads
            holding=exchange.holding,
        )
        headers, media_type = exchange.answer_headers, "text/event-stream"
    else:
        cap = gateway.config.clients.max_answer_bytes
        declared = upstream.content_length
        if declared is not None and declared > cap:
            upstream.close()
            return answer_too_large(exchange, AnswerTooLarge(declared, cap))
        relay = WholeRelay(
            upstream,
            idle,
            cap,
            reserved_output=flight.request.output_limit or 0,
            on_end=exchange.settle,
            holding=exchange.holding,
        )
        headers = dict(exchange.answer_headers)
        if declared is not None:
            headers["content-length"] = str(declared)
        media_type = upstream.headers.get("content-type", "application/json")
    exchange.relayed = True
    write_timeout = gateway.config.clients.write_timeout
    return RelayResponse(exchange, relay, write_timeout, upstream.status, headers, media_type)


def answer_too_large(exchange: Exchange, error: AnswerTooLarge) -> Response:
    """A 502 naming the cap, for an answer the gateway will not relay."""
    exchange.settle(Outcome(status=502, reason="answer_too_large"))
    failure = GatewayError(
        HTTPStatus.BAD_GATEWAY,
        f"The model server's answer is too large: {error}.",
        "server_error",
        param="clients.maxAnswerBytes",
        code="answer_too_large",
    )
    return error_response(failure, exchange.answer_headers)


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


class RelayResponse(StreamingResponse):
    """A relayed answer, streamed or not. It stops, and closes the engine's answer, as soon
    as the client leaves (whatever ASGI version the server speaks) or stops reading for
    `write_timeout` seconds, so the engine aborts the request; a client that stopped
    reading gets its connection reset (RST: closing would wait to flush to it). An answer
    that is not streamed and fails midway also ends in a reset: the client must not take a
    short answer for a whole one. The request's flight is settled when the relay ends,
    however it ends (the engine finishing settles it earlier), and its bytes in flight
    given back."""

    def __init__(
        self,
        exchange: Exchange,
        relay: Relay,
        write_timeout: float,
        status_code: int = 200,
        headers: dict[str, str] | None = None,
        media_type: str = "text/event-stream",
    ) -> None:
        super().__init__(
            relay.chunks(time.monotonic),
            status_code=status_code,
            headers=headers,
            media_type=media_type,
        )
        self.exchange = exchange
        self.relay = relay
        self.write_timeout = write_timeout
        self.stalled = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await unless_client_leaves(receive, self._relay(scope, send))
        finally:
            iterator: Any = self.body_iterator
            await iterator.aclose()
            self.relay.close()
            self.exchange.settle(self.exchange.gateway.drain.outcome(self.relay.outcome()))
            self.exchange.release()
            if self.stalled:
                log.warning(
                    "answer cut: the client stopped reading",
                    extra={
                        "request_id": self.exchange.request_id,
                        "client_request_id": self.exchange.client_request_id,
                        "seconds": self.write_timeout,
                    },
                )

    async def _relay(self, scope: Scope, send: Send) -> None:
        async def send_or_stall(message: Message) -> None:
            try:
                async with asyncio.timeout(self.write_timeout):
                    await send(message)
            except TimeoutError:
                self.stalled = True
                raise _Stalled from None

        connection = connection_of(scope)
        try:
            await send_or_stall(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            async for chunk in self.body_iterator:
                await send_or_stall(
                    {"type": "http.response.body", "body": chunk, "more_body": True}
                )
            if self.relay.error is not None and isinstance(self.relay, WholeRelay):
                raise _Stalled  # not a whole answer: the connection is reset, not ended
            await send_or_stall({"type": "http.response.body", "body": b"", "more_body": False})
        except _Stalled:
            if connection is not None:
                connection.reset()
        except OSError:  # the client went away
            pass


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

    async def status(request: Request) -> Response:
        """Serving or not, the pools' workers, the shared state, and what clients hold."""
        guards = {
            "connections": {
                "tenant": gateway.connections.tenant.open,
                "admin": gateway.connections.admin.open,
            },
            "bytesInFlight": gateway.bytes_in_flight.total,
            "eventLoopLagSeconds": round(gateway.lag.recent(), 4),
        }
        document = {"status": "ready" if gateway.ready else "starting"}
        return JSONResponse({**document, **serving_status(gateway), "clients": guards})

    return Starlette(
        routes=[
            Route("/metrics", metrics),
            Route("/admin/tenants", tenants),
            Route("/admin/tenants/{tenant}", tenant),
            Route("/admin/pools", pools),
            Route("/admin/status", status),
            *probe_routes(gateway),
        ],
        exception_handlers={404: not_found, 405: not_allowed},
        middleware=[Middleware(AdminAuth, gateway=gateway)],  # admin.tokenFile's bearer token
    )
