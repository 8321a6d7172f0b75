"""What each flow is entitled to while it is backlogged: its share of the service by the tree.

At any moment the flows with demand waiting — the backlogged set A (a flow is a tenant in
one band, `fairpool.sched.tree.flow`) — are entitled to the service delivered between them
as the fair order (`fairpool.sched.tree`) would split it if all of them kept demanding:

- **bands**: while several bands have a backlogged flow, each lower band is entitled to
  its minimum share φ_b and the highest to the rest, 1 − Σ φ_b (strict priority with the
  lower bands' guarantees, as `FairTree` serves them); a band alone takes everything;
- **groups and tenants**, inside a band: at every node of the groups' tree, the node's
  entitlement is split among its children with a backlogged flow below them, in proportion
  to their weights (a group's `weight`, a flow's its tenant's weight).

With a flat table of tenants (one band, no groups) a tenant's entitlement is
w_i / Σ_{j∈A} w_j; with groups it is its share of its group's share. A flow alone backlogged
is entitled to everything. `entitled_shares` states the rule for one moment.

`Entitlements` integrates the rule over a run: flows `join` and `leave` A as they become
backlogged and stop, and `serve(amount)` hands out `amount` of service among the flows in
A at that moment. It does so lazily, because a run has as many changes of A as requests
and as many flows backlogged at once as it has tenants: a node keeps the entitled service
per unit of its children's weight handed to it so far (its *level*), and a child's
entitlement is settled from the difference of its parent's level when it leaves, so that
a change of A costs the depth of the tree and `serve` costs the groups with a backlogged
flow, never the flows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from fairpool.sched.tree import BAND_NAMES, Shares

#: A node while flows below it are backlogged: (band, "") is a band's root, then its groups
#: (as `Shares.node_path` names them) and the flows.
Node = tuple[str, str]


class Entitlements:
    """Each flow's entitled service, integrated as flows join and leave the backlogged set
    (module docstring)."""

    def __init__(self, shares: Shares) -> None:
        self.shares = shares
        self._weights: dict[Node, float] = defaultdict(float)  # Σ weight of active children
        self._active: dict[Node, int] = defaultdict(int)  # active children, by parent
        self._inner: dict[Node, set[Node]] = defaultdict(set)  # active children that are groups
        self._level: dict[Node, float] = defaultdict(float)  # entitled service per unit weight
        self._mark: dict[Node, float] = {}  # a backlogged flow: its parent's level when it joined
        self._entitled: dict[str, float] = defaultdict(float)  # flow → settled entitlement
        self._paths: dict[str, list[tuple[Node, Node]]] = {}  # flow → `_edges` (memo)

    def join(self, flow: str) -> None:
        """`flow` became backlogged: it, and every group above it that had no backlogged
        flow, start sharing their parent's entitlement."""
        for parent, child in self._edges(flow):
            was_active = self._active[parent] > 0
            self._active[parent] += 1
            self._weights[parent] += self._weight(child)
            if child[1] == flow:
                self._mark[child] = self._level[parent]
            else:
                self._inner[parent].add(child)
            if was_active:  # the parent already shares in its own parent's entitlement
                return

    def leave(self, flow: str) -> None:
        """`flow` is no longer backlogged: its entitlement so far is settled, and groups
        left with no backlogged flow stop sharing."""
        self._entitled[flow] += self._pending(flow)
        self._mark.pop(self._edges(flow)[0][1], None)
        for parent, child in self._edges(flow):
            self._inner[parent].discard(child)
            self._active[parent] -= 1
            if self._active[parent]:
                self._weights[parent] -= self._weight(child)
                return
            self._weights[parent] = 0.0  # exactly nothing, whatever the rounding

    def serve(self, amount: float) -> None:
        """`amount` of service was delivered while the current flows were backlogged: each
        is entitled to its share of it (nothing, if none is backlogged)."""
        busy = [band for band in BAND_NAMES if self._active[band, ""]]
        if not busy or not amount:
            return
        lower = {band: self.shares.min_shares[band] for band in busy[1:]}
        self._hand_out((busy[0], ""), amount * (1.0 - sum(lower.values())))
        for band, share in lower.items():
            self._hand_out((band, ""), amount * share)

    def entitled(self, flow: str) -> float:
        """The service `flow` has been entitled to so far."""
        return self._entitled.get(flow, 0.0) + self._pending(flow)

    # ------------------------------------------------------------------ internals

    def _hand_out(self, node: Node, amount: float) -> None:
        """`node` is entitled to `amount`: split among its active children by weight."""
        per_weight = amount / self._weights[node]
        self._level[node] += per_weight
        for child in self._inner[node]:
            self._hand_out(child, self._weight(child) * per_weight)

    def _pending(self, flow: str) -> float:
        """What `flow` was entitled to since it was last settled (0 unless backlogged)."""
        parent, node = self._edges(flow)[0]
        mark = self._mark.get(node)
        if mark is None:
            return 0.0
        return self._weight(node) * (self._level[parent] - mark)

    def _edges(self, flow: str) -> list[tuple[Node, Node]]:
        """(parent, child) from `flow` up to its band's root."""
        edges = self._paths.get(flow)
        if edges is None:
            band = self.shares.band_of(flow)
            nodes = [(band, name) for name in ("", *self.shares.node_path(flow))]
            edges = self._paths[flow] = list(zip(nodes[-2::-1], nodes[:0:-1], strict=True))
        return edges

    def _weight(self, node: Node) -> float:
        return self.shares.node_weight(node[1])


def entitled_shares(shares: Shares, backlogged: Iterable[str]) -> dict[str, float]:
    """The share of the service each of the `backlogged` flows is entitled to while
    exactly these are backlogged (the module's rule: bands' minimum shares, then weights
    down the groups' tree). They add up to one."""
    flows = sorted(set(backlogged))
    entitlements = Entitlements(shares)
    for flow in flows:
        entitlements.join(flow)
    entitlements.serve(1.0)
    return {flow: entitlements.entitled(flow) for flow in flows}
