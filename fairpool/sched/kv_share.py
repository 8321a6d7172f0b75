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

**Bands** (`fairpool.sched.tree`: interactive above standard above batch). A tenant here is
a flow — a tenant in one band — and the rules above apply inside each band, among the
flows of that band and the memory its running requests hold; across bands the priority is
strict, as in the admission order:

- victims come from the lowest band with a running request first (batch, then standard,
  then interactive): no request of a band is preempted while one of a lower band runs.
  Inside a band, the flow furthest above its share of the band's memory first, as above;
  a policy that does not share memory keeps vLLM's most recently admitted first inside a
  band (`latest_first`).
- a request is held back only to leave room for requests of its own band or a higher one,
  never for a lower band's: its share is counted among its band's flows, and the headroom
  it must leave is a block per running request of its band or a higher one. A lower
  band's running requests need none: when their next decode finds no room, they are the
  victims, so the memory they would have grown into goes to the higher band, as strict
  priority wants.

On a single band (every tenant in one, as without `tenantBands`) the rules are exactly
those above. Both band rules are checked by random search in the same tests.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence

from fairpool.sched.cost import TenantWeights
from fairpool.sched.requests import EngineView, Request, Running
from fairpool.sched.tree import BAND_NAMES, Shares

#: A flow's band, by its id.
BandOf = Callable[[str], str]


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
    parts = Shares.of(weights).parts(tenants)  # by the fair order's tree
    total = sum(held.values())
    return {tenant: held.get(tenant, 0) - total * parts[tenant] for tenant in tenants}


def band_of(weights: TenantWeights) -> BandOf:
    """Each flow's band under `weights` (all in the default band, unless a flow asks
    another, for weights that are not a `Shares` tree)."""
    return Shares.of(weights).band_of


def by_band_lowest_first(
    requests: Sequence[Running], band_of_flow: Mapping[str, str]
) -> list[tuple[str, list[Running]]]:
    """`requests` grouped by band (`band_of_flow`: each of their flows' band), the lowest
    band first, each group in the given order."""
    present = set(band_of_flow.values())
    if len(present) <= 1:  # one band (or none): nothing to group
        return [(band, list(requests)) for band in present]
    groups: dict[str, list[Running]] = defaultdict(list)
    for request in requests:
        groups[band_of_flow[request.tenant]].append(request)
    return [(band, groups[band]) for band in reversed(BAND_NAMES) if band in groups]


def spans_bands(flows: Iterable[str], weights: TenantWeights) -> bool:
    """Whether `flows` run in more than one band."""
    bands = band_of(weights)
    return len({bands(flow) for flow in flows}) > 1


def latest_first(running: Sequence[Running], weights: TenantWeights) -> list[Running]:
    """vLLM's victims, by band: the lowest band's most recently admitted request first.
    `running` is in admission order."""
    bands = band_of(weights)
    band_of_flow = {flow: bands(flow) for flow in {request.tenant for request in running}}
    groups = by_band_lowest_first(running[::-1], band_of_flow)
    return [request for _, group in groups for request in group]


def preemption_order(
    running: Sequence[Running], waiting_tenants: Iterable[str], weights: TenantWeights
) -> list[Running]:
    """Running requests in the order memory should be taken back: the lowest band first;
    inside a band, the tenant furthest above its share of the band's memory first (its
    share counted before any preemption), each tenant's most recently admitted request
    first. `running` is in admission order."""
    bands = band_of(weights)
    held = holdings(running)  # by flow: a flow is in one band
    band_of_flow = {flow: bands(flow) for flow in held}
    waiting = set(waiting_tenants)
    order: list[Running] = []
    for band, members in by_band_lowest_first(running, band_of_flow):
        own = {flow: tokens for flow, tokens in held.items() if band_of_flow[flow] == band}
        over = excess(own, {tenant for tenant in waiting if bands(tenant) == band}, weights)
        order += sorted(reversed(members), key=lambda request: -over[request.tenant])
    return order


def leaves_headroom(
    view: EngineView, request: Request, waiting_tenants: Iterable[str], weights: TenantWeights
) -> bool:
    """Whether admitting `request` is fine for the memory: yes if its tenant stays within
    its share of its band's memory; otherwise only if a block of room per running request
    of its band or a higher one is left after it (one more decode step for each). Filling
    the last blocks with a tenant already above its share would have the next steps
    preempt — recomputation that costs every tenant, and a wait for memory the
    under-served tenants' requests then queue behind. A lower band is never protected
    (module docstring)."""
    bands = band_of(weights)
    band = bands(request.tenant)
    held = holdings(view.running)
    own = {flow: tokens for flow, tokens in held.items() if bands(flow) == band}
    active = {tenant for tenant in waiting_tenants if bands(tenant) == band}
    if excess(_with(own, request), active, weights)[request.tenant] <= 0:
        return True
    lower = BAND_NAMES[BAND_NAMES.index(band) + 1 :]
    below = {flow for flow in held if bands(flow) in lower}
    protected = len(view.running)
    if below:
        protected -= sum(1 for running in view.running if running.tenant in below)
    # Whole tokens are free: rounding undoes the float error of going through a fraction
    # (3.9999… free tokens would refuse a request that leaves exactly its headroom).
    free = round((1.0 - view.memory_utilization) * view.memory_tokens)
    needs = request.prompt_tokens - view.cached_tokens(request)
    return free - needs >= (protected + 1) * view.block_size


def _with(held: dict[str, int], request: Request) -> dict[str, int]:
    """`held` with `request`'s prompt admitted."""
    with_it = dict(held)
    with_it[request.tenant] = with_it.get(request.tenant, 0) + request.prompt_tokens
    return with_it
