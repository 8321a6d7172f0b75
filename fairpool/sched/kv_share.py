"""Who holds the KV memory, against what each tenant's weight entitles it to.

A fair admission order (VTC, DLPM) decides who is served next, but under KV-memory
pressure it is undone by who keeps the memory: a tenant whose whole backlog was admitted
holds the cache, decode growth then preempts — in vLLM the most recently admitted request,
which is the fair policy's latest choice — and an under-served tenant's request waits for
memory however far ahead it is in the fair order. Sheng et al. (OSDI'24, Remark 4.7 and
§C.3) name capping a client's memory and preemption as the levers beyond the admission
order; this module is fairpool's form of both, one implementation for every engine
(simulator, engine-sim, the vLLM plugin):

- **Shares.** The tenants with a running or waiting request are active; tenant i's share
  of the memory the running requests hold is that total times w_i / Σ_active w. A
  request's holding is its tokens (prompt and output so far), its part of a common prefix
  included, so tenants whose requests share prefixes alike compare alike; the rule needs
  no engine capacity and no cache layout.
- **Victims** (`preemption_order`). When memory runs out, the most recently admitted
  request of the tenant furthest above its share goes first: memory comes back from whom
  holds most of it beyond its share, and the youngest request loses the least work.
- **Headroom** (`leaves_headroom`). A request that would take its tenant above its share
  is admitted only while a block per running request stays free; otherwise nothing is
  admitted until memory frees (the policy's order is kept: the next pick may be another
  tenant's).

The admission order stays the policy's (VTC's, DLPM's): these rules only choose victims
and hold back. So the papers' service bounds keep holding (tests/test_fairness_bounds.py,
tests/test_fleet.py). Two stronger rules were tried and dropped: admitting the tenant
furthest below its *memory* share out of the policy's order broke DLPM's Theorem 5.1 (a
tenant with short prompts and long answers holds little memory but receives much
service); and letting the policy's pick preempt requests of tenants above their share to
make room for it (a "claim") changed nothing for the under-served tenant in the KV
benchmark while, on the long-context QA reproduction, it cost 7 % of the throughput and
doubled the well-behaved clients' mean latency (4.2 s against 1.9 s) — and vLLM has no
hook for it. What the rules add is measured, not proved: a tenant's requests are preempted
only after every request of each tenant further above its share (tests/test_kv_share.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from fairpool.sched.cost import TenantWeights
from fairpool.sched.requests import EngineView, Request, Running


def holdings(running: Iterable[Running]) -> dict[str, int]:
    """KV tokens each tenant's running requests hold."""
    held: dict[str, int] = defaultdict(int)
    for request in running:
        held[request.tenant] += request.held_tokens
    return held


def excess(held: dict[str, int], active: Iterable[str], weights: TenantWeights) -> dict[str, float]:
    """Per active tenant: tokens held beyond its weighted share of everything held
    (negative: below its share)."""
    tenants = set(active) | set(held)
    total_weight = sum(weights[tenant] for tenant in tenants)
    total = sum(held.values())
    return {
        tenant: held.get(tenant, 0) - total * weights[tenant] / total_weight for tenant in tenants
    }


def preemption_order(
    running: Sequence[Running], waiting_tenants: Iterable[str], weights: TenantWeights
) -> list[Running]:
    """Running requests in the order memory should be taken back: the tenant furthest
    above its share first (its share counted before any preemption), each tenant's most
    recently admitted request first. `running` is in admission order."""
    over = excess(holdings(running), waiting_tenants, weights)
    youngest_first = list(reversed(running))
    return sorted(youngest_first, key=lambda request: -over[request.tenant])


def leaves_headroom(
    view: EngineView, request: Request, waiting_tenants: Iterable[str], weights: TenantWeights
) -> bool:
    """Whether admitting `request` is fine for the memory: yes if its tenant stays within
    its share; otherwise only if a block of room per running request is left after it
    (one more decode step for everyone). Filling the last blocks with a tenant already
    above its share would have the next steps preempt — recomputation that costs every
    tenant, and a wait for memory the under-served tenants' requests then queue behind."""
    held = holdings(view.running)
    if excess(_with(held, request), set(waiting_tenants), weights)[request.tenant] <= 0:
        return True
    # Whole tokens are free: rounding undoes the float error of going through a fraction
    # (3.9999… free tokens would refuse a request that leaves exactly its headroom).
    free = round((1.0 - view.memory_utilization) * view.memory_tokens)
    needs = request.prompt_tokens - view.cached_tokens(request)
    return free - needs >= (len(view.running) + 1) * view.block_size


def _with(held: dict[str, int], request: Request) -> dict[str, int]:
    """`held` with `request`'s prompt admitted."""
    with_it = dict(held)
    with_it[request.tenant] = with_it.get(request.tenant, 0) + request.prompt_tokens
    return with_it
