"""The asyncio engine of a load run: each tenant's arrivals (Poisson at a rate, a number
of requests kept in flight, or a trace's times), the bounds, sampling and stopping.

A run ends at the first of: its duration (requests still in flight are cancelled and
counted as such), every request of its `requests` budget or of its trace answered, or
`stop` set (the CLI sets it on Ctrl-C). What was measured until then is the result.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from fairpool_cli.load.prompts import Prompt, PromptSource, TraceText, prompt_source
from fairpool_cli.load.prompts import request_body as make_body
from fairpool_cli.load.spec import LoadSpec, TenantSpec
from fairpool_cli.load.stats import LoadResult, Outcome

if TYPE_CHECKING:
    from fairpool_cli.load.send import Sender

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
    from fairpool_cli.load.send import Sender  # httpx: the gateway extra

    async with Sender(spec) as sender:
        model = spec.model or await sender.first_model(_first_key(spec))
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
        self.in_flight: set[asyncio.Task[Any]] = set()
        self.sources = {} if spec.trace else {t.name: prompt_source(spec, t) for t in spec.tenants}
        self.trace_text = TraceText(spec.seed)
        self.result = LoadResult.begin(spec, model)

    async def execute(self, progress: Progress | None, stop: asyncio.Event | None) -> LoadResult:
        self.result.started = time.monotonic()
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
            await _cancel([answered, sampler, *timers.values(), *self.in_flight])
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
        while self.in_flight:
            await asyncio.wait(set(self.in_flight))

    def _arrivals(self, tenant: TenantSpec) -> Coroutine[Any, Any, None]:
        return self._open_loop(tenant) if tenant.open_loop else self._closed_loop(tenant)

    async def _open_loop(self, tenant: TenantSpec) -> None:
        """Poisson arrivals at the tenant's rate, each request on its own."""
        assert tenant.rate is not None
        gaps = random.Random(f"{self.spec.seed}:{tenant.name}:arrivals")
        source = self.sources[tenant.name]
        arrival = self.result.started
        while True:
            arrival += gaps.expovariate(tenant.rate)
            await _sleep_until(arrival)
            if not self.budget.take():
                return
            self._spawn(self._request(tenant, source.next(), source))

    async def _closed_loop(self, tenant: TenantSpec) -> None:
        """`concurrency` clients, each sending its next request when its last one ends."""
        source = self.sources[tenant.name]

        async def client() -> None:
            while self.budget.take():
                outcome = await self._request(tenant, source.next(), source)
                if outcome.status == "connection":
                    await asyncio.sleep(CONNECTION_PAUSE)

        await asyncio.gather(*(client() for _ in range(tenant.concurrency or 1)))

    async def _replay(self) -> None:
        """The trace's requests at their times."""
        tenants = {tenant.name: tenant for tenant in self.spec.tenants}
        for request in self.spec.trace:
            await _sleep_until(self.result.started + request.t)
            if not self.budget.take():
                return
            prompt = self.trace_text.prompt(request)
            self._spawn(self._request(tenants[request.tenant], prompt, None))

    def _spawn(self, request: Coroutine[Any, Any, Outcome]) -> None:
        task = asyncio.create_task(request)
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)

    async def _request(
        self, tenant: TenantSpec, prompt: Prompt, source: PromptSource | None
    ) -> Outcome:
        stats = self.result.tenants[tenant.name]
        stats.sent += 1
        stats.outstanding += 1
        stats.active = True
        answer = None
        try:
            outcome = await self.sender.send(
                make_body(self.spec, self.model, tenant.name, prompt), tenant.key
            )
            stats.record(outcome, self.spec.cost)
            answer = outcome.text if outcome.ok else None
            return outcome
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


async def _sleep_until(moment: float) -> None:
    """Sleep until `time.monotonic()` reaches `moment`; yield at least once."""
    await asyncio.sleep(max(moment - time.monotonic(), 0.0))
