"""Deficit Longest Prefix Match.

Cao, Wang, Mao, Hsu, Yin, Xia, Li, Liu, Zhang, Zhou, Sheng, Gonzalez, Stoica,
"Locality-aware Fair Scheduling in LLM Serving" (arXiv 2501.14312), §4.1, Algorithm 1.

Waiting requests are taken in LPM order (most cached prompt tokens first), but only from
tenants with a positive deficit q_i. Admission deducts the service of the extend tokens
(line 23), every generated token deducts w_q (line 26). When every waiting tenant has
q ≤ 0, tenants are refilled by their quantum (CheckRefill, lines 3-8). The quantum trades
locality for fairness: Q → 0 behaves like VTC, Q → ∞ like LPM.

Theorem 4.1: two continuously backlogged tenants receive service within 2(U + Q) of each
other, U = w_e·L_input + w_q·M. The proof rests on q_i ∈ (−U, Q] at all times.

Choices the paper leaves open (reference digest §B.4), made here:

1. Loop termination. Algorithm 1's `while not Queue.empty()` spins when a request does not
   fit. We stop the pass at the first chosen request the engine cannot fit ("adds them to
   the new batch until the memory pool is full"); it stays queued in LPM order.
2. Who is refilled. Tenants that are *active*: with a waiting or a running request. A
   tenant whose requests are all running is still consuming service, so it takes part in
   the rounds like any DRR flow in service; an idle tenant is never refilled, so nobody
   banks credit while away. A tenant keeps its deficit across idle periods: only its
   first arrival starts it at q = 0 (Algorithm 1, line 12: "if i is a new client").
   Resetting on every return from idle would forgive up to U of debt each time, and a
   tenant that sends one request at a time, each costing more than Q, would have its
   debt wiped on every request and be served without bound beyond a tenant that waits
   (2.9× its service, a gap growing past any 2(U + Q), in the review that found it).
   Credit kept across an idle period is at most Q (refills stop at the first positive
   deficit), so −U < q ≤ Q still holds and Theorem 4.1's 2(U + Q) with it.
3. Repeated refills. One CheckRefill may not lift any waiting tenant above zero (a deep
   debt needs several quanta). We refill in rounds until some waiting tenant has credit,
   computing the number of rounds directly instead of looping, and each tenant gets at
   most the rounds it needs to turn positive — exactly what repeated CheckRefill calls do.
4. Weights (an extension; neither paper weights DLPM): tenant i's quantum is Q·w_i, the
   standard weighted DRR, so a weight-2 tenant earns twice the service per round.
6. Bands and groups (fairpool's tree, `fairpool.sched.tree`): the tree chooses the band
   and, through the groups, the sibling flows the next request may come from
   (`FairTree.candidates`); DLPM's deficits and LPM decide among those siblings, and a
   refill refills the siblings (the flows under the same node that have work). Over a flat
   table of tenants in one band the siblings are every tenant: Algorithm 1 exactly.
5. The quantum (the paper tunes Q^u by hand, Fig. 1): `auto` by default, the largest
   prompt cost w_e·L_input admitted so far, never below 2,048 (`fairpool.sched.quantum`,
   where the multiple is discussed). A tenant whose requests share a cached prefix keeps
   the engine for at least one more request after paying for a whole prompt; with
   L_input ≤ M the bound 2(U + Q) is at most 4/3 times VTC's 2U at w_e, w_q = 1, 2. How
   a larger multiple does on workloads it was not chosen on: docs/results.md §9. An
   explicit quantum wins.
"""

from __future__ import annotations

import math
from collections import defaultdict
from fractions import Fraction
from typing import Any

from fairpool.sched.policy import LocalPolicy, Waiting
from fairpool.sched.quantum import Quantum
from fairpool.sched.requests import EngineView

#: The smallest `auto` quantum, and the quantum before any request was admitted.
AUTO_QUANTUM_FLOOR = 2048.0
#: How many of the largest prompts admitted the `auto` quantum holds (choice 5).
AUTO_QUANTUM_REQUESTS = 1
#: Below this every integer is a float (2^53).
_EXACT_INTEGERS = float(2**53)


def refills_to_credit(deficit: float, quantum: float) -> int:
    """How many refills of `quantum` take `deficit` above zero (0 if it already is): the
    smallest n from ⌊−deficit/quantum⌋ + 1 up for which `deficit + n * quantum > 0` holds
    in floating point, as the refill then computes it.

    In closed form rather than by counting up from the estimate: the deficits of the
    gateway's routers take charges heard from other replicas, and a deficit so deep that
    adding 1 to n no longer changes `n * quantum` (n past 2^53) would keep a count
    spinning forever. OverflowError where no finite number of refills lifts it (the
    largest float of rounds times `quantum` does not reach it).
    """
    if deficit > 0:
        return 0
    fewest = _fewest_refills(deficit, quantum)
    estimate = -deficit / quantum
    return max(math.floor(estimate) + 1, fewest) if math.isfinite(estimate) else fewest


def _fewest_refills(deficit: float, quantum: float) -> int:
    """The smallest n ≥ 0 with `deficit + n * quantum > 0` in floating point.

    The sum of two floats is positive exactly when its exact value is, so the condition
    is fl(fl(n)·quantum) > −deficit: some float x = fl(n) must make the rounded product
    pass −deficit. The product rounds above −deficit exactly when it reaches the midpoint
    between −deficit and the next float up (ties to even), which gives the smallest such
    x (`_smallest_float_over`), and then the smallest integer that rounds to x or more.
    """
    owed = -deficit
    above = math.nextafter(owed, math.inf)
    midpoint = (Fraction(owed) + _exact(above)) / 2
    least = _smallest_float_over(midpoint / Fraction(quantum), inclusive=_even(above))
    return _smallest_integer_rounding_to(least)


def _smallest_float_over(bound: Fraction, inclusive: bool) -> float:
    """The smallest float above `bound` (or equal to it, `inclusive`); OverflowError if
    none is finite."""
    nearest = float(bound)  # correctly rounded, so the answer is it or the next float up
    if nearest > bound or (inclusive and nearest == bound):
        return nearest
    following = math.nextafter(nearest, math.inf)
    if math.isinf(following):
        raise OverflowError("no finite number of refills lifts the deficit above zero")
    return following


def _smallest_integer_rounding_to(least: float) -> int:
    """The smallest integer n with float(n) ≥ `least` (≥ 0): below 2^53 every integer is
    a float; above, the integers past the midpoint to the float below round up to it."""
    if least <= _EXACT_INTEGERS:
        return math.ceil(least)
    below = math.nextafter(least, 0.0)
    midpoint = (int(below) + int(least)) // 2  # both even: the midpoint is an integer
    return midpoint if _even(least) else midpoint + 1


def _exact(value: float) -> Fraction:
    """`value` as an exact fraction; infinity as 2^1024, where rounding to it begins."""
    return Fraction(2**1024) if math.isinf(value) else Fraction(value)


def _even(value: float) -> bool:
    """Whether `value`'s significand is even: where ties round to (infinity counts as even,
    as rounding to it does)."""
    if math.isinf(value):
        return True
    return (Fraction(value) / Fraction(math.ulp(value))).numerator % 2 == 0


class DLPM(LocalPolicy):
    """LPM order gated by per-tenant deficits with quantum Q (scaled by tenant weight)."""

    name = "dlpm"
    shares_memory = True
    weighs_tenants = True

    def __init__(self, quantum: float | None = None, **options: Any) -> None:
        """`quantum`: Q in service units; None for `auto` (choice 5)."""
        super().__init__(**options)
        self.quantum_rule = Quantum(
            quantum, floor=AUTO_QUANTUM_FLOOR, requests=AUTO_QUANTUM_REQUESTS
        )
        self.deficits: dict[str, float] = defaultdict(float)
        self.refill_rounds = 0
        self._refills: dict[str, int] = defaultdict(int)

    @property
    def quantum(self) -> float:
        """Q in force."""
        return self.quantum_rule.value(self.largest_prompt)

    def tenant_quantum(self, tenant: str) -> float:
        return self.quantum * self.weights[tenant]

    def service_bound(self, memory_tokens: int) -> float:
        """Theorem 4.1: 2(U + Q), with the quantum in force."""
        return 2 * (self._largest_request(memory_tokens) + self.quantum)

    def _on_charge(self, tenant: str, service: float) -> None:
        self.deficits[tenant] -= service

    def _select(self, view: EngineView) -> Waiting | None:
        deficits = self.deficits
        waiting = self.tree.candidates(self._queues)
        if not waiting:
            return None
        credited = [tenant for tenant in waiting if deficits[tenant] > 0]
        if not credited:
            self._refill(waiting)
            credited = [tenant for tenant in waiting if deficits[tenant] > 0]
        return self._longest_match(view, credited)

    def _refill(self, waiting: list[str]) -> None:
        """CheckRefill (Algorithm 1, lines 3-8), repeated until a waiting tenant has credit;
        the active flows beside the `waiting` ones in the tree are refilled with them."""
        rounds = min(
            refills_to_credit(self.deficits[tenant], self.tenant_quantum(tenant))
            for tenant in waiting
        )
        self.refill_rounds += rounds
        for tenant in self._siblings(waiting[0]):
            quantum = self.tenant_quantum(tenant)
            needed = refills_to_credit(self.deficits[tenant], quantum)
            self._refills[tenant] += min(rounds, needed)
            self.deficits[tenant] += min(rounds, needed) * quantum

    def _siblings(self, flow: str) -> list[str]:
        """The active flows under the same node of the tree as `flow` (every active tenant,
        over a flat table)."""
        shares = self.weights
        band, parent = shares.band_of(flow), shares.path(flow)
        return [
            other
            for other in self.active_tenants()
            if shares.band_of(other) == band and shares.path(other) == parent
        ]

    def refills(self, tenant: str) -> int:
        """How many quanta `tenant` has been refilled by (k_i in Theorem A.1, k_{i,w} at
        this worker in Theorem A.3)."""
        return self._refills.get(tenant, 0)

    def tenant_state(self) -> dict[str, float]:
        return dict(self.deficits)
