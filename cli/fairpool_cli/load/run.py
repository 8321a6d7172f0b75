"""The asyncio engine of a load run: each tenant's arrivals (Poisson at a rate, a number
of requests kept in flight, or a trace's times), the bounds, sampling and stopping.

A run ends at the first of: its duration (requests still in flight are cancelled and
counted as such), every request of its `requests` budget or of its trace answered, or
`stop` set (the CLI sets it on Ctrl-C). What was measured until then is the result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from fairpool_cli.load.loops import closed_loop, open_loop, poisson
from fairpool_cli.load.prompts import Prompt, PromptSource, TraceText, prompt_source
from fairpool_cli.load.prompts import request_body as make_body
from fairpool_cli.load.request import CONNECTION, OutgoingRequest, RequestResult, now
from fairpool_cli.load.send import Sender, auth, body_bytes, first_model
from fairpool_cli.load.spec import LoadSpec, TenantSpec
from fairpool_cli.load.stats import LoadResult

Progress = Callable[[LoadResult], None]

# A closed-loop client whose endpoint refused the connection waits this long before its
# next request, so that a dead endpoint is not hammered in a tight loop.
CONNECTION_PAUSE = 0.05


async def run_load(
    spec: LoadSpec, progress: Progress | None = None, stop: asyncio.Event | None = None
) -> LoadResult:
    """Run `spec` against its endpoint; what it measured. `progress` is called with the
    growing result every `spec.sample_interval` seconds; setting `stop` ends the run
    early, with everything measured until then."""
    async with Sender(spec.url, spec.timeout) as sender:
        model = spec.model or await first_model(sender, _first_key(spec))
        return await _Run(spec, sender, model).execute(progress, stop)


def _first_key(spec: LoadSpec) -> str | None:
    return next((tenant.key for tenant in spec.tenants if tenant.key), None)


class _Budget:
    """Requests left to send (None: no limit)."""

    def __init__(self, total: int | None) -> None:
        self.left = total

    def take(self) -> bool:
        if self.left is None:
            return True
        if self.left <= 0:
            return False
        self.left -= 1
        return True

    @property
    def spent(self) -> bool:
        return self.left == 0


class _Run:
    def __init__(self, spec: LoadSpec, sender: Sender, model: str) -> None:
        self.spec = spec
        self.sender = sender
        self.model = model
        self.budget = _Budget(spec.requests)
        self.sources = {} if spec.trace else {t.name: prompt_source(spec, t) for t in spec.tenants}
        self.trace_text = TraceText(spec.seed)
        self.result = LoadResult.begin(spec, model)

    async def execute(self, progress: Progress | None, stop: asyncio.Event | None) -> LoadResult:
        self.result.started = now()
        answered = asyncio.create_task(self._all_answered())
        sampler = asyncio.create_task(self._sample(progress))
        timers: dict[str, asyncio.Task[Any]] = {}
        if self.spec.duration is not None:
            timers["duration"] = asyncio.create_task(asyncio.sleep(self.spec.duration))
        if stop is not None:
            timers["stopped"] = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait(
                [answered, sampler, *timers.values()], return_when=asyncio.FIRST_COMPLETED
            )
            for task in (answered, sampler):
                if task in done:
                    task.result()  # a failure of the run itself, not of a request
            self.result.stopped_by = next(
                (reason for reason, task in timers.items() if task in done), self._completion()
            )
        finally:
            await _cancel([answered, sampler, *timers.values()])
        self.result.sample()
        return self.result

    def _completion(self) -> str:
        if self.budget.spent:
            return "requests"
        return "trace" if self.spec.trace else "done"

    async def _all_answered(self) -> None:
        """Every arrival made and every request it sent answered."""
        if self.spec.trace:
            await self._replay()
        else:
            await asyncio.gather(*(self._arrivals(tenant) for tenant in self.spec.tenants))

    def _arrivals(self, tenant: TenantSpec) -> Coroutine[Any, Any, None]:
        return self._open_loop(tenant) if tenant.open_loop else self._closed_loop(tenant)

    async def _open_loop(self, tenant: TenantSpec) -> None:
        """Poisson arrivals at the tenant's rate, each request on its own."""
        assert tenant.rate is not None
        source = self.sources[tenant.name]
        seed = f"{self.spec.seed}:{tenant.name}:arrivals"
        await open_loop(
            lambda _, moment: self._request(tenant, source.next(), source, moment),
            poisson(tenant.rate, seed, self.result.started),
            self.budget.take,
        )

    async def _closed_loop(self, tenant: TenantSpec) -> None:
        """`concurrency` clients, each sending its next request when its last one ends."""
        source = self.sources[tenant.name]

        async def request(_: int) -> None:
            result = await self._request(tenant, source.next(), source)
            if result.error == CONNECTION:
                await asyncio.sleep(CONNECTION_PAUSE)

        await closed_loop(request, tenant.concurrency or 1, self.budget.take)

    async def _replay(self) -> None:
        """The trace's requests at their times."""
        tenants = {tenant.name: tenant for tenant in self.spec.tenants}
        trace = self.spec.trace

        def launch(number: int, moment: float) -> Coroutine[Any, Any, RequestResult]:
            request = trace[number]
            prompt = self.trace_text.prompt(request)
            return self._request(tenants[request.tenant], prompt, None, moment)

        start = self.result.started
        await open_loop(launch, (start + request.t for request in trace), self.budget.take)

    async def _request(
        self,
        tenant: TenantSpec,
        prompt: Prompt,
        source: PromptSource | None,
        scheduled: float | None = None,
    ) -> RequestResult:
        stats = self.result.tenants[tenant.name]
        stats.sent += 1
        stats.outstanding += 1
        stats.active = True
        answer = None
        try:
            body = body_bytes(make_body(self.spec, self.model, tenant.name, prompt))
            request = OutgoingRequest(tenant.name, self.spec.api, body, auth(tenant.key))
            result = await self.sender.send(request, scheduled)
            stats.record(result, self.spec.cost)
            answer = result.text if result.ok else None
            return result
        except asyncio.CancelledError:
            stats.cancelled += 1
            raise
        finally:
            stats.outstanding -= 1
            if source is not None:
                source.finished(prompt, answer)

    async def _sample(self, progress: Progress | None) -> None:
        while True:
            await asyncio.sleep(self.spec.sample_interval)
            self.result.sample()
            if progress is not None:
                progress(self.result)


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel the tasks and wait until they are over."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
