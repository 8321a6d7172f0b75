"""What the gateway holds for its clients: request bodies and answers in flight, bounded
per tenant and in all (`clients.maxTenantBytesInFlight`, `clients.maxBytesInFlight`), and
each tenant's requests open at once (`clients.maxTenantRequests`).

A tenant's requests are counted from the moment its key is known until the answer is done,
whatever the phase (body, queue, engine, answer): however many addresses and connections
one key comes through, it holds at most its requests, and the other tenants keep the
connections and memory that are left. Beyond, a request is refused on its headers (429,
`code: too_many_open_requests`).

Every byte is counted from the moment it is held, before it costs more: a body from its
first byte (from its declared `Content-Length`, when it has one, before any is read), until
the engine has it; an answer from the moment it is read from the engine until the client
has taken it. So a tenant that keeps a hundred half-sent bodies open, or a hundred streams
it never reads, holds at most its own budget, and the gateway at most the total.

- A **body** that does not fit is refused: 429 (`code: bytes_in_flight`) when its tenant's
  budget is full, 503 (`code: server_busy`) when the gateway's is. `Retry-After: 1` either
  way (bodies leave quickly), and the connection is closed: the rest of the body is not
  read.
- An **answer** that does not fit waits (the engine is read no further) until the client
  takes what is held, or until other answers free room; a request that holds nothing may
  always take one chunk, so every answer moves.

`Holding` is one request's share; it gives everything back when the request ends
(`release`, called on every exit path).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus

from fairpool_gateway.protocol import GatewayError


@dataclass(frozen=True)
class ByteLimits:
    total: int
    per_tenant: int
    requests_per_tenant: int = 1 << 30


class OverBudget(GatewayError):
    """A body that does not fit in its tenant's budget (429) or the gateway's (503), or a
    request over its tenant's open requests (429)."""

    def __init__(self, whose: str, limit: int) -> None:
        if whose == "requests":
            status, code = HTTPStatus.TOO_MANY_REQUESTS, "too_many_open_requests"
            message = (
                f"This tenant already has {limit} requests open at the gateway "
                "(clients.maxTenantRequests); retry when some have finished."
            )
        elif whose == "tenant":
            status, code = HTTPStatus.TOO_MANY_REQUESTS, "bytes_in_flight"
            message = (
                f"This tenant's requests and answers in flight already hold {limit} bytes "
                "(clients.maxTenantBytesInFlight); retry when some have finished."
            )
        else:
            status, code = HTTPStatus.SERVICE_UNAVAILABLE, "server_busy"
            message = (
                f"The gateway already holds {limit} bytes of requests and answers "
                "(clients.maxBytesInFlight); retry shortly."
            )
        super().__init__(status, message, "rate_limit_exceeded", code=code)
        self.headers["Retry-After"] = "1"
        self.headers["Connection"] = "close"  # the rest of its body is not read
        self.whose = whose


class BytesInFlight:
    """The gateway's byte budget (module docstring). `limits` is read at every request, so a
    reloaded configuration applies to the next one."""

    def __init__(self, limits: Callable[[], ByteLimits]) -> None:
        self.limits = limits
        self.total = 0
        self.by_tenant: dict[str, int] = {}
        self.requests: dict[str, int] = {}  # tenant → requests open
        self.refused = {"tenant": 0, "total": 0, "requests": 0}
        self._freed: asyncio.Event | None = None  # set when bytes are given back

    def holding(self, tenant: str) -> Holding:
        """A new request of `tenant`'s share; OverBudget if the tenant has all its
        requests open already."""
        limit = self.limits().requests_per_tenant
        if self.requests.get(tenant, 0) >= limit:
            self.refused["requests"] += 1
            raise OverBudget("requests", limit)
        self.requests[tenant] = self.requests.get(tenant, 0) + 1
        return Holding(self, tenant)

    def _request_ended(self, tenant: str) -> None:
        left = self.requests.get(tenant, 0) - 1
        if left > 0:
            self.requests[tenant] = left
        else:
            self.requests.pop(tenant, None)

    def held_by(self, tenant: str) -> int:
        return self.by_tenant.get(tenant, 0)

    def _fits(self, tenant: str, amount: int) -> str | None:
        """None if `amount` more fits for `tenant`, else whose budget it would break."""
        limits = self.limits()
        if self.held_by(tenant) + amount > limits.per_tenant:
            return "tenant"
        if self.total + amount > limits.total:
            return "total"
        return None

    def _add(self, tenant: str, amount: int) -> None:
        self.total += amount
        held = self.by_tenant.get(tenant, 0) + amount
        if held > 0:
            self.by_tenant[tenant] = held
        else:
            self.by_tenant.pop(tenant, None)
        if amount < 0 and self._freed is not None:
            self._freed.set()
            self._freed = None

    async def _room(self) -> None:
        """Until some bytes are given back."""
        if self._freed is None:
            self._freed = asyncio.Event()
        await self._freed.wait()


class Holding:
    """One request's bytes in the budget."""

    def __init__(self, budget: BytesInFlight, tenant: str) -> None:
        self.budget = budget
        self.tenant = tenant
        self.held = 0
        self.open = True  # counted among its tenant's open requests

    def take(self, amount: int) -> None:
        """Hold `amount` more bytes of a body, or raise OverBudget."""
        if amount <= 0:
            return
        whose = self.budget._fits(self.tenant, amount)
        if whose is not None:
            self.budget.refused[whose] += 1
            limits = self.budget.limits()
            raise OverBudget(whose, limits.per_tenant if whose == "tenant" else limits.total)
        self._add(amount)

    async def take_when_room(self, amount: int) -> None:
        """Hold `amount` more bytes of an answer, waiting until they fit; at once if this
        request holds nothing (every answer moves)."""
        while self.held > 0 and self.budget._fits(self.tenant, amount) is not None:
            await self.budget._room()
        self._add(amount)

    def give_back(self, amount: int) -> None:
        amount = min(amount, self.held)
        if amount > 0:
            self._add(-amount)

    def release(self) -> None:
        """Everything this request holds, and its place among its tenant's open requests
        (every exit path calls it; again is harmless)."""
        self.give_back(self.held)
        if self.open:
            self.open = False
            self.budget._request_ended(self.tenant)

    def _add(self, amount: int) -> None:
        self.held += amount
        self.budget._add(self.tenant, amount)
