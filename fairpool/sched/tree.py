"""The fair order as a tree: priority bands, groups of any depth, tenants, requests.

Platform teams do not organise tenants as equals. They run interactive traffic beside
batch jobs on the same GPUs, and they nest tenants: an organisation's weight is split among
its teams, a team's among its keys. One order serves both, decided level by level:

1. **Bands** (`interactive`, `standard`, `batch`, highest first): a waiting request of a
   higher band goes before any of a lower band (strict priority) — except that a lower band
   with work is guaranteed a minimum share of the service while any other band has work
   too, counted in service, not seconds: while band b and another band have work, b
   earns `min_share · s` of credit for every unit s of service charged to anyone and pays
   for its own service; a lower band with positive credit goes first. A band that is alone
   with work earns and pays nothing (serving it alone is no debt); a band that gets work
   starts one request's worth in debt (the largest charge seen), so that it does not jump
   in after the first charge to another, and banks nothing while it has no work.
2. **Groups** (any depth) and **tenants** inside a band: weighted fair sharing by virtual
   counters at every level, as VTC shares between tenants (Sheng et al., OSDI'24, §4,
   Algorithm 2, weighted §4.3), applied to every node of the tree (a hierarchical VTC): a
   node's counter is the service charged to anything below it divided by the node's
   weight; among the active children of a node the one with the smallest counter goes
   next; a node that becomes active is lifted to the smallest counter among its active
   siblings (to the counter of the sibling that left last when none is active: VTC lines
   7-13 at every level), so no node banks credit while idle.
3. **Requests** of one tenant in one band (a *flow*): the local policy's own order — FIFO
   (VTC), or DLPM's longest prefix match among the sibling flows the tree offers
   (`FairTree.candidates`), with DLPM's deficits deciding between them.

A request runs in its tenant's band unless it asks for a lower one (an interactive tenant's
batch job), never a higher one: its flow is then `tenant@band` (`flow`), with its own
queue and counters, under the same groups and with the tenant's weight.

The bounds each level gives, their assumptions and the tests that check them by random
search are in `docs/scheduling.md` ("The tree").
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from fairpool.sched.cost import BAND_SEPARATOR, TenantWeights, tenant_of
from fairpool.sched.errors import ConfigError, require_positive

#: The bands, highest first (TenantQuota's `slo.class`).
BAND_NAMES = ("interactive", "standard", "batch")
#: A tenant's band when its configuration names none.
DEFAULT_BAND = "standard"
#: The band whose requests are ordered by deadline (`slo.ttftSeconds`) where the fair order
#: leaves a choice (`FairTree.slack`).
DEADLINE_BAND = "interactive"

#: The minimum share of each band while another band has work (the highest band's is
#: meaningless: it goes first anyway).
DEFAULT_MIN_SHARES = {"interactive": 0.0, "standard": 0.10, "batch": 0.05}


def flow(tenant: str, band: str | None = None, tenant_band: str = DEFAULT_BAND) -> str:
    """The flow a request of `tenant` runs in: the tenant itself in its own band
    (`tenant_band`), `tenant@band` in a lower one it asked for. A request may not rise
    above its tenant's band: a higher `band` is refused."""
    if band is None or band == tenant_band:
        return tenant
    require_band(band)
    if BAND_NAMES.index(band) < BAND_NAMES.index(tenant_band):
        raise ConfigError(
            "band",
            f"{band!r} is above the tenant's band {tenant_band!r}; a request may only ask lower",
        )
    return f"{tenant}{BAND_SEPARATOR}{band}"


def require_band(band: str) -> str:
    if band not in BAND_NAMES:
        raise ConfigError("band", f"unknown band {band!r}; known: {', '.join(BAND_NAMES)}")
    return band


@dataclass(frozen=True)
class Group:
    """A node between a band and its tenants: an organisation, a team."""

    weight: float = 1.0
    parent: str | None = None

    def __post_init__(self) -> None:
        require_positive("weight", self.weight)


class Shares(TenantWeights):
    """Tenant weights with the tree around them: each tenant's band and group, the groups'
    weights and parents, and the bands' minimum shares. A flat `TenantWeights` is the tree
    with one level: every tenant in the default band, no group."""

    def __init__(
        self,
        weights: Mapping[str, float] | None = None,
        default: float = 1.0,
        *,
        groups: Mapping[str, Group] | None = None,
        tenant_groups: Mapping[str, str] | None = None,
        tenant_bands: Mapping[str, str] | None = None,
        min_shares: Mapping[str, float] | None = None,
        ttft: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(weights, default)
        self.groups = dict(groups or {})
        self.tenant_groups = dict(tenant_groups or {})
        self.tenant_bands = {t: require_band(b) for t, b in (tenant_bands or {}).items()}
        self.min_shares = {**DEFAULT_MIN_SHARES, **(min_shares or {})}
        #: tenant → its first-token target in seconds (`slo.ttftSeconds`), for the deadlines
        #: of its requests in the band that orders by them (`DEADLINE_BAND`).
        self.ttft = {
            t: require_positive(f"tenants[{t}].ttftSeconds", s) for t, s in (ttft or {}).items()
        }
        self._check()
        self._node_paths: dict[str, tuple[str, ...]] = {}  # flow → its nodes (memo)
        self._flat = not self.tenant_groups and not self.tenant_bands

    @classmethod
    def of(cls, weights: TenantWeights | Mapping[str, float] | None) -> Shares:
        """`weights` as a tree (a flat one unless it is one already)."""
        if isinstance(weights, Shares):
            return weights
        if isinstance(weights, TenantWeights):
            return cls(dict(weights), weights.default)
        return cls(weights)

    def band_of(self, flow_id: str) -> str:
        """The band a flow runs in."""
        tenant, _, band = flow_id.partition(BAND_SEPARATOR)
        return band or self.tenant_bands.get(tenant, DEFAULT_BAND)

    def due(self, flow_id: str, arrival: float) -> float:
        """When a request of `flow_id` that arrived at `arrival` is due its first token:
        its tenant's `ttft` after, if the flow runs in `DEADLINE_BAND`; never (inf)
        otherwise."""
        target = self.ttft.get(tenant_of(flow_id))
        if target is None or self.band_of(flow_id) != DEADLINE_BAND:
            return math.inf
        return arrival + target

    def parts(self, flows: Iterable[str]) -> dict[str, float]:
        """Each of `flows` (those with work)'s part of the service the tree entitles them
        to among themselves: the highest band with work what the lower bands' minimum
        shares leave, each lower band with work its minimum share; inside a band, at every
        level, a node's part is its parent's times its weight over the weights of its
        siblings with work. Over a flat table: weight over the weights' sum."""
        flows = set(flows)
        if not flows:
            return {}
        if self.flat() and not any(BAND_SEPARATOR in name for name in flows):
            total = sum(self[name] for name in flows)
            return {name: self[name] / total for name in flows}
        by_band: dict[str, list[str]] = defaultdict(list)
        for name in flows:
            by_band[self.band_of(name)].append(name)
        bands = [band for band in BAND_NAMES if band in by_band]
        band_part = {band: self.min_shares[band] for band in bands[1:]}
        band_part[bands[0]] = 1.0 - sum(band_part.values())
        parts: dict[str, float] = {}
        for band, members in by_band.items():
            parts.update(self._split(band_part[band], [self.node_path(f) for f in members]))
        return parts

    def _split(self, part: float, paths: list[tuple[str, ...]]) -> dict[str, float]:
        """`part` divided among the nodes first on `paths` by weight, then down each."""
        children: dict[str, list[tuple[str, ...]]] = defaultdict(list)
        for path in paths:
            children[path[0]].append(path[1:])
        total = sum(self.node_weight(node) for node in children)
        parts: dict[str, float] = {}
        for node, rests in children.items():
            share = part * self.node_weight(node) / total
            below = [rest for rest in rests if rest]
            if below:
                parts.update(self._split(share, below))
            else:
                parts[node] = share  # a flow
        return parts

    def without_deadlines(self) -> Shares:
        """The same tree without first-token targets: what the engines run (their
        configuration leaves the targets out; docs/scheduling.md)."""
        if not self.ttft:
            return self
        return Shares(
            dict(self),
            self.default,
            groups=self.groups,
            tenant_groups=self.tenant_groups,
            tenant_bands=self.tenant_bands,
            min_shares=self.min_shares,
        )

    def orders_by_deadline(self, flow_id: str) -> bool:
        """Whether the flows beside `flow_id` (its band's) may be ordered by deadline."""
        return bool(self.ttft) and self.band_of(flow_id) == DEADLINE_BAND

    def tenant_band(self, tenant: str) -> str:
        return self.tenant_bands.get(tenant, DEFAULT_BAND)

    def path(self, flow_id: str) -> tuple[str, ...]:
        """The groups above a flow, outermost first."""
        groups = []
        group = self.tenant_groups.get(tenant_of(flow_id))
        while group is not None:
            groups.append(group)
            group = self.groups[group].parent
        return tuple(reversed(groups))

    def node_path(self, flow_id: str) -> tuple[str, ...]:
        """The nodes from a flow's band down to it: its groups (as `group_node` names them,
        apart from tenants' names), then the flow."""
        found = self._node_paths.get(flow_id)
        if found is None:
            found = (*(group_node(group) for group in self.path(flow_id)), flow_id)
            if len(self._node_paths) < 100_000:  # flows are tenants × bands: bounded
                self._node_paths[flow_id] = found
        return found

    def node_weight(self, node: str) -> float:
        """A group node's weight, or a flow's (its tenant's)."""
        if node.startswith(GROUP_MARK):
            return self.groups[node[len(GROUP_MARK) :]].weight
        return self[node]

    def flat(self) -> bool:
        """No groups, and every tenant in the default band: the tree's one level is the
        tenants (flows of another band may still come, asked by requests)."""
        return self._flat

    def _check(self) -> None:
        for name, spec in self.groups.items():
            seen = {name}
            parent = spec.parent
            while parent is not None:
                if parent not in self.groups:
                    raise ConfigError(f"groups[{name}].parent", f"no group {parent!r}")
                if parent in seen:
                    raise ConfigError(f"groups[{name}].parent", "the groups form a cycle")
                seen.add(parent)
                parent = self.groups[parent].parent
        for tenant, named in self.tenant_groups.items():
            if named not in self.groups:
                raise ConfigError(f"tenants[{tenant}].group", f"no group {named!r}")
        for band, share in self.min_shares.items():
            require_band(band)
            if not 0 <= share < 1:
                raise ConfigError(f"bands[{band}].minShare", "must be at least 0 and below 1")
        if sum(self.min_shares[band] for band in BAND_NAMES[1:]) >= 1:
            raise ConfigError("bands", "the lower bands' minimum shares must add up to below 1")

    def __repr__(self) -> str:
        return (
            f"Shares({dict(self)!r}, groups={self.groups!r}, tenant_groups="
            f"{self.tenant_groups!r}, tenant_bands={self.tenant_bands!r})"
        )


#: A node of the tree while it runs: a band's root, a group in a band, or a flow.
Node = tuple[str, str]  # (band, group node or flow id); the band root is (band, "")
#: What sets a group's node apart from a flow (tenant names never hold it).
GROUP_MARK = "/"


def group_node(group: str) -> str:
    return GROUP_MARK + group


@dataclass
class _Level:
    """The children of one node that have work, and the one that left last."""

    active: set[str] = field(default_factory=set)
    last_left: str | None = None


class FairTree:
    """The running order over a `Shares` tree (module docstring): which band, then which
    group at each depth, then which flows a policy may choose from. Driven by the policy
    that owns it, as an engine drives the policy: a flow `join`s when it gets its first
    waiting request, `leave`s when its last one leaves, and is `charge`d its service."""

    def __init__(self, shares: Shares) -> None:
        self.shares = shares
        #: band → node (group node or flow) → its virtual counter
        self.counters: dict[str, defaultdict[str, float]] = {
            band: defaultdict(float) for band in BAND_NAMES
        }
        self._other_bands = 0  # flows with work in a band other than the default one
        self._largest_charge = 0.0  # the largest single charge seen: one request's worth
        self.credits: dict[str, float] = defaultdict(float)  # band → minimum-share credit
        self._levels: dict[Node, _Level] = defaultdict(_Level)  # parent → its children
        self._waiting: dict[str, int] = defaultdict(int)  # band → flows with work

    # ------------------------------------------------------------------ events

    def join(self, flow_id: str, lift_floor: Iterable[float] = (), lift: bool = True) -> None:
        """`flow_id` has work now. Every node on its path that had none is lifted (VTC's
        lift, at its level); `lift_floor` adds counters of sibling flows waiting elsewhere
        (a gateway's other replicas) to the flow's own lift."""
        band = self.shares.band_of(flow_id)
        if self._waiting[band] == 0:
            # No credit banked while a band has no work; and a band owes one request
            # before it is owed: a lower band does not jump in after the first charge.
            self.credits[band] = -self._largest_charge
        self._waiting[band] += 1
        if band != DEFAULT_BAND:
            self._other_bands += 1
        parent: Node = (band, "")
        for name in self.shares.node_path(flow_id):
            level = self._levels[parent]
            node = (band, name)
            if name not in level.active:
                if lift:
                    self._lift(node, level, lift_floor if name == flow_id else ())
                level.active.add(name)
            parent = node

    def leave(self, flow_id: str) -> None:
        """`flow_id` has no work left: it, and every group on its path left with none
        under it, stop competing."""
        band = self.shares.band_of(flow_id)
        self._waiting[band] = max(self._waiting[band] - 1, 0)
        if band != DEFAULT_BAND:
            self._other_bands -= 1
        names = self.shares.node_path(flow_id)
        parents: list[Node] = [(band, "")] + [(band, name) for name in names[:-1]]
        for parent, name in reversed(list(zip(parents, names, strict=True))):
            level = self._levels[parent]
            level.active.discard(name)
            level.last_left = name
            if level.active:  # a sibling still has work: the parent keeps competing
                return

    def charge(self, flow_id: str, service: float) -> None:
        """`flow_id` received `service`: every node on its path counts it, and the bands
        earn and pay their minimum-share credit."""
        band = self.shares.band_of(flow_id)
        counters = self.counters[band]
        for name in self.shares.node_path(flow_id):
            counters[name] += service / self.shares.node_weight(name)
        self._largest_charge = max(self._largest_charge, service)
        self._credit(band, service)

    def reshape(self, shares: Shares, waiting: Iterable[str]) -> None:
        """A new shape (reloaded weights, bands, groups): the `waiting` flows leave the
        old one and join the new; counters keep their values."""
        waiting = list(waiting)
        for flow_id in waiting:
            self.leave(flow_id)
        self.shares = shares
        for flow_id in waiting:
            self.join(flow_id)

    # ------------------------------------------------------------------ the order

    def candidates(self, waiting: Iterable[str]) -> list[str]:
        """The flows the next request may come from, among the `waiting` flows (those with
        a request waiting, as `join` and `leave` told the tree): the band that goes next,
        then at each depth the child with work with the smallest counter, until a node
        whose child with the smallest counter is a flow; then every flow with work under
        that node (a policy that orders by counters alone takes the one with the smallest;
        DLPM chooses among them by deficit and prefix). It walks the tree's own record of
        the nodes with work, so a decision costs the depth times the siblings, not the
        number of flows."""
        if self.shares.flat() and not self._other_bands:
            return list(waiting)  # one level, one band: every waiting flow is a candidate
        bands = {band for band in BAND_NAMES if self._waiting[band] > 0}
        if not bands:
            return []
        band = self._band_to_serve(bands)
        counters = self.counters[band]
        node: Node = (band, "")
        while True:
            active = self._levels[node].active
            chosen = min(active, key=lambda name: (counters[name], name))
            if not chosen.startswith(GROUP_MARK):  # a flow: its siblings with work
                return sorted(name for name in active if not name.startswith(GROUP_MARK))
            node = (band, chosen)

    def next_flow(self, waiting: Iterable[str]) -> str | None:
        """The flow VTC's order takes next: the candidate with the smallest counter."""
        candidates = self.candidates(waiting)
        if not candidates:
            return None
        counters = self.band_counters(candidates[0])
        return min(candidates, key=lambda name: (counters[name], name))

    def counter(self, flow_id: str) -> float:
        return self.counters[self.shares.band_of(flow_id)][flow_id]

    def slack(self, flow_id: str) -> float:
        """How far above the least-served candidate's counter `flow_id`'s may be and still
        be a choice for deadlines: one request's worth of its service (the largest single
        charge seen, over its weight)."""
        return self._largest_charge / self.shares.node_weight(flow_id)

    def band_counters(self, flow_id: str) -> defaultdict[str, float]:
        """The counters of `flow_id`'s band, by node: a candidate's rank, without a lookup
        of its band per flow (every candidate of one decision is of one band)."""
        return self.counters[self.shares.band_of(flow_id)]

    def flow_counters(self) -> defaultdict[str, float]:
        """Every flow's counter (its weighted service in its band; 0 for one never seen)."""
        return defaultdict(
            float,
            {
                name: value
                for counters in self.counters.values()
                for name, value in counters.items()
                if not name.startswith(GROUP_MARK)
            },
        )

    def group_counters(self) -> Iterator[tuple[str, str, float]]:
        """(band, group, counter) of every group that has been charged."""
        for band, counters in self.counters.items():
            for name, value in counters.items():
                if name.startswith(GROUP_MARK):
                    yield band, name[len(GROUP_MARK) :], value

    # ------------------------------------------------------------------ internals

    def _lift(self, node: Node, level: _Level, extra: Iterable[float]) -> None:
        band, name = node
        counters = self.counters[band]
        floors = [counters[sibling] for sibling in level.active]
        floors.extend(extra)
        if floors:
            floor = min(floors)
        elif level.last_left is not None:
            floor = counters[level.last_left]
        else:
            return
        counters[name] = max(counters[name], floor)

    def _credit(self, charged_band: str, service: float) -> None:
        busy = [band for band in BAND_NAMES if self._waiting[band] > 0]
        if len(busy) < 2:  # no contention between bands: nothing earned or owed
            return
        for band in busy[1:]:  # the highest busy band goes first anyway
            self.credits[band] += self.shares.min_shares[band] * service
        if charged_band in busy[1:]:
            self.credits[charged_band] -= service

    def _band_to_serve(self, bands: set[str]) -> str:
        """The highest band with work, unless a lower band with work is owed its minimum
        share (positive credit): then the one owed most."""
        ordered = [band for band in BAND_NAMES if band in bands]
        owed = [band for band in ordered[1:] if self.credits[band] > 0]
        if owed:
            return max(owed, key=lambda band: (self.credits[band], -BAND_NAMES.index(band)))
        return ordered[0]
