"""`fairpool engine-sim`: an OpenAI-compatible server with vLLM's HTTP surface, serving a
simulated engine in wall-clock time.

Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `POST /v1/responses`
(streaming or not), `POST /v1/embeddings`, `GET /v1/models`, `GET /health`,
`GET /metrics`, and, for tests only,
`POST /admin/health {"healthy": false}`, which makes `/health` answer 503 (as vLLM's
does when its engine died) until set back.

A request is validated as vLLM validates it (`protocol`), tokenized (`text`), and
queued in the `SimEngine` in its flow — its tenant (`vllm_xargs` `fairpool_tenant`) in the
tenant's band, or in a lower one its `fairpool_band` asks (`LiveScheduler.flow_of`) —
where the scheduler configuration's policy orders it; the engine loop (`runner`) hands its tokens
to the handler as they are generated. A client that goes away aborts its request. An
embedding is prefill-only: one engine request per input, charged for its uncached
prompt, its prefix cache shared only within its tenant (and band, when one is asked:
`pooling_tenant`). vLLM serves
embeddings only with a pooling model (`--runner pooling`); engine-sim serves both kinds.

Failure injection (`--error-rate`, `--hang-rate`, `--crash-rate`) picks, per valid
request, one of: a 500 before the first byte; no answer at all until the client gives
up; or a response cut off after some of its tokens (the connection closes without the
end of the body). uvicorn logs one line for each cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Any, Protocol

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from fairpool.api.scheduler_config import CONFIG_ENV
from fairpool.front import Usage
from fairpool.runtime import ServerInThread, tune_collector_for_serving
from fairpool.sched.errors import ConfigError
from fairpool.sim.engine import SimEngine
from fairpool.sim.profiles import get_profile
from fairpool_engine import pooling_tenant
from fairpool_engine.live import LiveScheduler
from fairpool_engine.sim.bodies import (
    SSE_DONE,
    ChatChunks,
    CompletionChunks,
    ResponseHeader,
    chat_response,
    completion_response,
    dumps,
    model_list,
    random_id,
    sse,
)
from fairpool_engine.sim.embeddings import embedding_response, encode, salted, vector
from fairpool_engine.sim.metrics import EngineMetrics
from fairpool_engine.sim.options import SimOptions
from fairpool_engine.sim.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    GenerationRequest,
    Parsed,
    RequestError,
    ResponsesRequest,
    check_input_length,
    empty_decoder_prompt,
    empty_prompt,
    http_error,
    model_not_found,
    output_budget,
    parse_body,
    pooling_model_not_found,
    responses_output_budget,
)
from fairpool_engine.sim.responses import ResponseEvents, ResponseHead, response_body
from fairpool_engine.sim.runner import EngineRunner, Generation
from fairpool_engine.sim.text import filler, output_seed, render_chat, tokenize

log = logging.getLogger("fairpool.engine_sim")


class EventStream(Protocol):
    """How a streamed answer is written: before the first token, at each engine output
    (its text, the finish reason once finished, usage so far), and after the last."""

    def head(self) -> list[bytes]: ...

    def step(self, text: str, finish_reason: str | None, usage: Usage) -> list[bytes]: ...

    def tail(self, finish_reason: str, usage: Usage) -> list[bytes]: ...


class ChunkStream:
    """Completions and chat: `data:` chunks, optional usage, then `[DONE]`."""

    def __init__(self, request: GenerationRequest, chunks: CompletionChunks) -> None:
        self.request, self.chunks = request, chunks
        self.opened = False

    def head(self) -> list[bytes]:
        return []

    def step(self, text: str, finish_reason: str | None, usage: Usage) -> list[bytes]:
        continuous = self.request.continuous_usage
        events = []
        if not self.opened:
            self.opened = True
            opening_usage = replace(usage, completion_tokens=0) if continuous else None
            events += [sse(chunk) for chunk in self.chunks.opening(opening_usage)]
        delta = self.chunks.delta(text, finish_reason, usage if continuous else None)
        return [*events, sse(delta)]

    def tail(self, finish_reason: str, usage: Usage) -> list[bytes]:
        events = [sse(self.chunks.usage(usage))] if self.request.include_usage else []
        return [*events, SSE_DONE]


class ResponseStream:
    """The Responses API: named events from `response.created` to `response.completed`."""

    def __init__(self, head: ResponseHead) -> None:
        self.events = ResponseEvents(head)

    def head(self) -> list[bytes]:
        return self.events.start()

    def step(self, text: str, finish_reason: str | None, usage: Usage) -> list[bytes]:
        return self.events.delta(text)

    def tail(self, finish_reason: str, usage: Usage) -> list[bytes]:
        return self.events.finish(finish_reason, usage)


@dataclass
class Job:
    """A valid request, ready for the engine, and how to answer it."""

    request: GenerationRequest | ResponsesRequest
    tokens: list[int]
    max_tokens: int
    output_tokens: int
    seed: int
    stream: Callable[[], EventStream]  # a streamed answer
    whole: Callable[[str, str, Usage], dict[str, Any]]  # (text, finish_reason, usage)

    def text(self, start: int, stop: int) -> str:
        return filler(self.seed, start, stop)

    def usage(self, generation: Generation, completion_tokens: int) -> Usage:
        return Usage(len(self.tokens), generation.cached_tokens, completion_tokens)


class StreamCut(Exception):
    """Raised by a body iterator to end the response without its end (a crash)."""


class BodyStream(StreamingResponse):
    """A streamed body that calls `on_close` however it ends (done, client gone, cut);
    a `StreamCut` from the iterator leaves the response unfinished."""

    def __init__(
        self, content: AsyncIterator[bytes], media_type: str, on_close: Callable[[], None]
    ) -> None:
        super().__init__(content, media_type=media_type)
        self.on_close = on_close

    async def stream_response(self, send: Send) -> None:
        with contextlib.suppress(StreamCut):
            await super().stream_response(send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


class Faults:
    """Failure injection: which fault, if any, a request gets."""

    def __init__(self, options: SimOptions) -> None:
        self.rates = (
            ("error", options.error_rate),
            ("hang", options.hang_rate),
            ("crash", options.crash_rate),
        )
        self.random = random.Random(options.seed)

    def draw(self) -> str | None:
        point = self.random.random()
        for fault, rate in self.rates:
            if point < rate:
                return fault
            point -= rate
        return None

    def cut_after(self, output_tokens: int) -> int:
        """How many tokens a crashing response delivers before the cut."""
        return self.random.randint(1, max(output_tokens - 1, 1))


class SimServer:
    """The app and the engine behind it; `app` is an ASGI application."""

    def __init__(self, options: SimOptions) -> None:
        self.options = options
        #: Set by the process that runs only this server: see `tune_collector_for_serving`.
        self.freeze_when_started = False
        profile = get_profile(options.profile)
        live = LiveScheduler(
            options.scheduler_config or os.environ.get(CONFIG_ENV) or None,
            check_interval=options.reload_interval,
            policy_override=options.policy,
        )
        engine = SimEngine(
            live.policy,
            memory_tokens=options.memory_tokens or profile.memory_tokens,
            token_budget=profile.token_budget,
            step_time=profile.step_time,
            admission=profile.admission,
            block_size=profile.block_size,
            name=options.model,
        )
        self.metrics = EngineMetrics(options.model)
        self.runner = EngineRunner(engine, live, self.metrics, options.speedup)
        self.faults = Faults(options)
        self.healthy = True
        self.app = Starlette(
            routes=[
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/responses", self.responses, methods=["POST"]),
                Route("/v1/embeddings", self.embeddings, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/metrics", self.prometheus, methods=["GET"]),
                Route("/admin/health", self.set_health, methods=["POST"]),
            ],
            exception_handlers={HTTPException: _http_exception},  # type: ignore[dict-item]
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(self.runner.run(), name="engine-sim loop")
        task.add_done_callback(self._loop_ended)
        if self.freeze_when_started:
            tune_collector_for_serving()
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("engine loop died", exc_info=task.exception())
            self.healthy = False  # as vLLM's /health after its engine died

    # ------------------------------------------------------------------ generation

    async def completions(self, http: Request) -> Response:
        return await self._serve(http, self._completion_job)

    async def chat_completions(self, http: Request) -> Response:
        return await self._serve(http, self._chat_job)

    async def responses(self, http: Request) -> Response:
        return await self._serve(http, self._responses_job)

    async def _completion_job(self, http: Request) -> Job:
        request = self._check(await _parse(http, CompletionRequest))
        prompt = request.prompt_text_or_ids()
        tokens = tokenize(prompt) if isinstance(prompt, str) else prompt
        if not tokens:
            raise empty_prompt()
        header = ResponseHeader.new("cmpl", self.options.model, _request_id(http, request))
        chunks = CompletionChunks(header)
        return self._job(
            request,
            tokens,
            (request.max_tokens, "max_tokens"),
            lambda: ChunkStream(request, chunks),
            functools.partial(completion_response, header),
        )

    async def _chat_job(self, http: Request) -> Job:
        request = self._check(await _parse(http, ChatCompletionRequest))
        messages = [(message.role, message.text()) for message in request.messages]
        tokens = tokenize(render_chat(messages, request.add_generation_prompt))
        header = ResponseHeader.new("chatcmpl", self.options.model, _request_id(http, request))
        role = request.response_role
        chunks = ChatChunks(header, role)
        return self._job(
            request,
            tokens,
            request.output_limit,
            lambda: ChunkStream(request, chunks),
            functools.partial(chat_response, header, role),
        )

    async def _responses_job(self, http: Request) -> Job:
        request = self._check(await _parse(http, ResponsesRequest))
        messages, generation_prompt = request.messages()
        tokens = tokenize(render_chat(messages, generation_prompt))
        limit = self.options.max_model_len
        max_tokens = responses_output_budget(limit, len(tokens), request.max_output_tokens)
        head = ResponseHead(request, self.options.model, int(time.time()), max_tokens)
        return self._new_job(
            request,
            tokens,
            max_tokens,
            0,
            lambda: ResponseStream(head),
            functools.partial(response_body, head),
        )

    def _check(self, request: Parsed) -> Parsed:
        """The model first, as vLLM does, then what the simulated engine cannot serve."""
        if request.model and request.model != self.options.model:
            raise model_not_found(request.model, self.options.model)
        request.check_supported()
        return request

    def _job(
        self,
        request: GenerationRequest,
        tokens: list[int],
        output_limit: tuple[int | None, str],
        stream: Callable[[], EventStream],
        whole: Callable[[str, str, Usage], dict[str, Any]],
    ) -> Job:
        requested, param = output_limit
        max_tokens = output_budget(
            self.options.max_model_len, len(tokens), requested, param, request.min_tokens
        )
        return self._new_job(request, tokens, max_tokens, request.min_tokens, stream, whole)

    def _new_job(
        self,
        request: GenerationRequest | ResponsesRequest,
        tokens: list[int],
        max_tokens: int,
        min_tokens: int,
        stream: Callable[[], EventStream],
        whole: Callable[[str, str, Usage], dict[str, Any]],
    ) -> Job:
        seed = output_seed(tokens, self.options.seed)
        output = max_tokens
        eos = self.options.eos_after
        if eos is not None and not request.ignore_eos:
            low, high = eos
            output = min(max(low + seed % (high - low + 1), min_tokens), max_tokens)
        return Job(request, tokens, max_tokens, output, seed, stream, whole)

    async def _serve(
        self, http: Request, make_job: Callable[[Request], Awaitable[Job]]
    ) -> Response:
        try:
            job = await make_job(http)
        except APIError as error:
            return _error_response(error)
        except RequestError as error:
            return _error_response(error.api_error())
        fault = self.faults.draw()
        refused = await _fault_response(http, fault)
        if refused is not None:
            return refused
        cut_after = self.faults.cut_after(job.output_tokens) if fault == "crash" else None
        flow = self.runner.live.flow_of(job.request.vllm_xargs)
        cached_as = salted(job.tokens, job.request.cache_salt)  # the salt keys the cache
        generation = self.runner.submit(flow, cached_as, job.max_tokens, job.output_tokens)
        if job.request.stream:
            events = self._events(job, generation, cut_after)
            return BodyStream(events, "text/event-stream", lambda: self.runner.abort(generation))
        return await self._whole(http, job, generation, cut_after)

    async def _events(
        self, job: Job, generation: Generation, cut_after: int | None
    ) -> AsyncIterator[bytes]:
        stream, sent = job.stream(), 0
        for event in stream.head():
            yield event
        while not generation.finished:
            await generation.wait()
            count = generation.generated
            finish = generation.finish_reason if generation.finished else None
            for event in stream.step(job.text(sent, count), finish, job.usage(generation, count)):
                yield event
            sent = count
            if cut_after is not None and sent >= cut_after and not generation.finished:
                raise StreamCut
        for event in stream.tail(generation.finish_reason, job.usage(generation, sent)):
            yield event

    async def _whole(
        self, http: Request, job: Job, generation: Generation, cut_after: int | None
    ) -> Response:
        target = cut_after if cut_after is not None else job.output_tokens
        produced = asyncio.ensure_future(_tokens_out(generation, target))
        gone = asyncio.ensure_future(_client_gone(http))
        done, _ = await asyncio.wait({produced, gone}, return_when=asyncio.FIRST_COMPLETED)
        produced.cancel()
        gone.cancel()
        if generation.finished:
            text = job.text(0, generation.generated)
            usage = job.usage(generation, generation.generated)
            return JSONResponse(job.whole(text, generation.finish_reason, usage))
        self.runner.abort(generation)
        if gone in done:
            return Response(status_code=HTTPStatus.NO_CONTENT)  # nobody is listening
        body = dumps(job.whole("", "length", job.usage(generation, 0)))
        return BodyStream(_cut(body[: len(body) // 2]), "application/json", lambda: None)

    # ------------------------------------------------------------------ embeddings

    async def embeddings(self, http: Request) -> Response:
        options = self.options
        try:
            request = await _parse(http, EmbeddingRequest)
            if request.model and request.model != options.model:
                raise pooling_model_not_found(request.model)
            request.check_supported()
            if request.dimensions is not None:
                raise APIError(
                    f"Model '{options.model}' does not support Matryoshka embeddings; "
                    f"dimensions must be unset (received dimensions={request.dimensions})."
                )
            flow, salt = self._embedding_flow(request)
            prompts = [tokenize(p) if isinstance(p, str) else p for p in request.inputs()]
            for tokens in prompts:
                if not tokens:
                    raise empty_decoder_prompt()
                check_input_length(options.max_model_len, len(tokens))
        except APIError as error:
            return _error_response(error)
        except RequestError as error:
            return _error_response(error.api_error())
        fault = self.faults.draw()
        refused = await _fault_response(http, fault)
        if refused is not None:
            return refused
        runner = self.runner
        generations = [runner.submit(flow, salted(tokens, salt), 1, 0) for tokens in prompts]
        finished = asyncio.ensure_future(_all_finished(generations))
        gone = asyncio.ensure_future(_client_gone(http))
        await asyncio.wait({finished, gone}, return_when=asyncio.FIRST_COMPLETED)
        finished.cancel()
        gone.cancel()
        if not all(generation.finished for generation in generations):
            for generation in generations:
                runner.abort(generation)
            return Response(status_code=HTTPStatus.NO_CONTENT)  # nobody is listening
        embeddings = [
            encode(
                vector(tokens, options.embedding_dim, options.seed),
                request.encoding_format,
                request.embed_dtype,
                request.endianness,
            )
            for tokens in prompts
        ]
        response_id = (
            f"embd-{http.headers.get('x-request-id') or request.request_id or random_id()}"
        )
        body = embedding_response(
            response_id,
            int(time.time()),
            options.model,
            embeddings,
            sum(len(tokens) for tokens in prompts),
        )
        if fault == "crash":
            text = dumps(body)
            return BodyStream(_cut(text[: len(text) // 2]), "application/json", lambda: None)
        return JSONResponse(body)

    def _embedding_flow(self, request: EmbeddingRequest) -> tuple[str, str | None]:
        """The flow, and the cache salt vLLM would see: what fairpool's middleware makes
        of the request (the tenant and band moved into the salt; a salt like fairpool's
        refused)."""
        try:
            salt = pooling_tenant.carrying(request.vllm_xargs, request.cache_salt)
        except ConfigError as error:
            raise APIError(str(error), param=error.parameter) from None
        return self.runner.live.flow_of(request.vllm_xargs), salt

    # ------------------------------------------------------------------ the rest

    async def models(self, http: Request) -> Response:
        created = int(time.time())
        return JSONResponse(model_list(self.options.model, self.options.max_model_len, created))

    async def health(self, http: Request) -> Response:
        return Response(status_code=200 if self.healthy else 503)

    async def set_health(self, http: Request) -> Response:
        try:
            document = await http.json()
            healthy = document["healthy"]
            if not isinstance(healthy, bool):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return _error_response(APIError('expected {"healthy": true|false}', param="healthy"))
        self.healthy = healthy
        return JSONResponse({"healthy": healthy})

    async def prometheus(self, http: Request) -> Response:
        runner = self.runner
        self.metrics.observe_engine(runner.engine, runner.live, force=True)
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def _parse(http: Request, model: type[Parsed]) -> Parsed:
    body = await http.body()
    return parse_body(body, http.headers.get("content-type", ""), model)


def _request_id(http: Request, request: GenerationRequest) -> str | None:
    """vLLM's: the X-Request-Id header, else the body's `request_id`, else a random one."""
    return http.headers.get("x-request-id") or request.request_id


async def _fault_response(http: Request, fault: str | None) -> Response | None:
    """The answer an injected error or hang gives instead of serving (None: serve)."""
    if fault == "error":
        return _error_response(
            APIError(
                "Simulated engine failure (--error-rate).",
                "InternalServerError",
                HTTPStatus.INTERNAL_SERVER_ERROR,
            )
        )
    if fault == "hang":
        await _client_gone(http)
        return Response(status_code=HTTPStatus.NO_CONTENT)  # nobody is listening
    return None


async def _all_finished(generations: Sequence[Generation]) -> None:
    for generation in generations:
        while not generation.finished:
            await generation.wait()


async def _tokens_out(generation: Generation, count: int) -> None:
    while not generation.finished and generation.generated < count:
        await generation.wait()


async def _client_gone(http: Request) -> None:
    """Returns when the client disconnects (the body has been read already)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def _cut(partial: str) -> AsyncIterator[bytes]:
    yield partial.encode()
    raise StreamCut


def _error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


async def _http_exception(http: Request, error: HTTPException) -> Response:
    return _error_response(http_error(error.status_code, error.detail))


# ---------------------------------------------------------------------- running it


def serve(options: SimOptions) -> int:
    """Run the server until interrupted (the `fairpool engine-sim` command)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
    logging.getLogger("fairpool").addHandler(handler)  # config reloads, the loop's fate
    logging.getLogger("fairpool").setLevel(logging.INFO)
    server = SimServer(options)
    server.freeze_when_started = True  # this process's own server
    config = _uvicorn_config(server, options.host, options.port, options.access_log)
    live = server.runner.live
    log.info(
        "engine-sim: model %s, profile %s, policy %s, max-model-len %d, speedup %g",
        options.model,
        options.profile,
        live.config.policy_name,
        options.max_model_len,
        options.speedup,
    )
    try:
        uvicorn.Server(config).run()
    except KeyboardInterrupt:  # a second Ctrl-C skips the graceful shutdown
        return 130
    return 0


def _uvicorn_config(
    server: SimServer, host: str, port: int, access_log: bool, log_level: str = "info"
) -> uvicorn.Config:
    # Hanging requests must not hold a shutdown for ever.
    return uvicorn.Config(
        server.app,
        host=host,
        port=port,
        access_log=access_log,
        log_level=log_level,
        timeout_graceful_shutdown=2,
    )


class ServerThread:
    """A server on a free loopback port, in a thread: for tests, benchmarks and the
    gateway's tests. `with ServerThread(SimOptions(speedup=100)) as server: server.url`."""

    def __init__(self, options: SimOptions) -> None:
        self.sim = SimServer(options)
        # IPPROTO_TCP, not 0: asyncio turns Nagle off only on sockets that say they are TCP.
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.bind(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = _uvicorn_config(self.sim, "127.0.0.1", self.port, False, "warning")
        self._running = ServerInThread(
            uvicorn.Server(config), [self._socket], f"engine-sim:{self.port}"
        )

    def __enter__(self) -> ServerThread:
        self._running.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._running.stop()
