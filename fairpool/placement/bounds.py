"""Mean response time of JFFC over chains: Theorem 3.7's bounds, the exact K = 2 value, M/M/c.

Sun, He, Hou 2026, seed 003, §3.2.2 and App. A.2-A.3. Under Poisson(λ) arrivals and
exponential service (chain k serves at rate μ_k, c_k jobs at a time), the number of jobs
in the system is a birth-death process with birth rate λ and an unknown death rate ν_n
(eq. 26) between ν̲_n (jobs on the slowest chains, eq. 29) and ν̄_n (on the fastest,
eq. 28). Mean occupancy falls as death rates rise (eqs. 43-45), so ν̄ gives the lower bound
(31) and ν̲ the upper bound (32); Little's law (24) divides by λ.

The products ∏ λ/ν_i run over C = Σ c_k terms (hundreds or thousands), so they are summed
as logarithms and normalised against their largest term.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fairpool.placement.model import Chain, ResponseBounds
from fairpool.sched.errors import ConfigError, require_count, require_positive


def jffc_bounds(
    arrival_rate: float, rates: Sequence[float], capacities: Sequence[int]
) -> ResponseBounds:
    """Theorem 3.7 (eqs. 28-32) divided by λ: bounds on JFFC's mean response time.

    `rates[k]` = μ_k and `capacities[k]` = c_k, in any order (sorted here by descending μ).
    Raises ConfigError when λ ≥ ν = Σ c_k μ_k: no steady state (Lemma 3.6)."""
    slot_rates = _slot_rates(arrival_rate, rates, capacities)
    fastest_first = sorted(slot_rates, reverse=True)
    return ResponseBounds(
        lower=_mean_occupancy(arrival_rate, fastest_first) / arrival_rate,
        upper=_mean_occupancy(arrival_rate, fastest_first[::-1]) / arrival_rate,
    )


def chain_bounds(arrival_rate: float, chains: Sequence[Chain]) -> ResponseBounds:
    """`jffc_bounds` for planned chains (μ_k = 1/T_k)."""
    return jffc_bounds(
        arrival_rate, [chain.service_rate for chain in chains], [c.capacity for c in chains]
    )


def total_rate(chains: Sequence[Chain]) -> float:
    """ν = Σ_k c_k μ_k (eq. 4): JFFC is stable for every λ < ν (Lemma 3.6)."""
    return sum(chain.capacity * chain.service_rate for chain in chains)


def mmc_response_time(arrival_rate: float, service_rate: float, servers: int) -> float:
    """M/M/c mean response time, 1/μ + C(c, a)/(cμ − λ) with a = λ/μ (Erlang C).

    Theorem 3.7 is exact for one chain (K = 1): both bounds equal this. Erlang B comes from
    its stable recursion B_k = a·B_{k−1}/(k + a·B_{k−1}); then C = cB/(c − a(1 − B))."""
    rate = require_positive("arrivalRate", arrival_rate)
    mu = require_positive("serviceRate", service_rate)
    count = require_count("servers", servers, minimum=1)
    if rate >= count * mu:
        raise ConfigError("arrivalRate", f"{rate} ≥ cμ = {count * mu}: no steady state")
    offered = rate / mu
    blocking = 1.0
    for k in range(1, count + 1):
        blocking = offered * blocking / (k + offered * blocking)
    waiting_probability = count * blocking / (count - offered * (1 - blocking))
    return 1 / mu + waiting_probability / (count * mu - rate)


def exact_two_chains(
    arrival_rate: float, rates: tuple[float, float], capacities: tuple[int, int]
) -> float:
    """Exact JFFC mean response time for K = 2 chains, App. A.3 (eqs. 46-53).

    α_z = π_z/π_{(0,0,c2)} is built column by column (z2 = c2, c2 − 1, …, 0), each column as an
    affine function β·α_{(0,0,z2)} + γ of its first entry (eqs. 50-52). The recursion
    subtracts nearly equal terms in (52), so it is meant for small capacities (checks), not
    for planning; `jffc_bounds` is what scales."""
    rate = require_positive("arrivalRate", arrival_rate)
    (mu1, c1), (mu2, c2) = sorted(zip(rates, capacities, strict=True), key=lambda chain: -chain[0])
    for mu, c in ((mu1, c1), (mu2, c2)):
        require_positive("rates", mu)
        require_count("capacities", c, minimum=1)
    nu = c1 * mu1 + c2 * mu2
    if rate >= nu:
        raise ConfigError("arrivalRate", f"{rate} ≥ ν = {nu}: no steady state (Lemma 3.6)")
    # columns[z2][z1] = α_{(0, z1, z2)}
    top = [1.0]
    for n in range(1, c1 + 1):  # eq. (46)
        top.append((c2 * mu2 * sum(top) + rate * top[-1]) / (n * mu1))
    columns = {c2: top}
    for z2 in range(c2 - 1, -1, -1):
        above = columns[z2 + 1]
        last = (z2 + 1) * mu2 / rate * sum(above)  # eq. (48): α_{(0, c1, z2)}
        beta, gamma = [1.0], [0.0]
        for n in range(1, c1 + 1):  # eqs. (50), (51)
            beta.append((z2 * mu2 * sum(beta) + rate * beta[-1]) / (n * mu1))
            gamma.append(
                (z2 * mu2 * sum(gamma) + rate * gamma[-1] - (z2 + 1) * mu2 * sum(above[:n]))
                / (n * mu1)
            )
        first = (last - gamma[c1]) / beta[c1]  # eq. (52)
        columns[z2] = [b * first + g for b, g in zip(beta, gamma, strict=True)]
    weights = sum(sum(column) for column in columns.values())
    occupancy = sum(
        alpha * (z1 + z2) for z2, column in columns.items() for z1, alpha in enumerate(column)
    )
    queue_mass = rate * columns[c2][c1] / (nu - rate)  # Σ_{n≥1} α_{(n, c1, c2)}, eq. (47)
    occupancy += queue_mass * (nu / (nu - rate) + c1 + c2)
    return occupancy / (weights + queue_mass) / rate  # eq. (53), then Little's law (24)


def _slot_rates(
    arrival_rate: float, rates: Sequence[float], capacities: Sequence[int]
) -> list[float]:
    """One entry μ_k per job slot: the death-rate increments of eqs. (28)/(29)."""
    require_positive("arrivalRate", arrival_rate)
    if len(rates) != len(capacities):
        raise ConfigError("capacities", "needs one capacity per rate")
    if not rates:
        raise ConfigError("chains", "needs at least one chain")
    slots: list[float] = []
    for rate, capacity in zip(rates, capacities, strict=True):
        slots += [require_positive("rates", rate)] * require_count(
            "capacities", capacity, minimum=1
        )
    nu = math.fsum(slots)
    if arrival_rate >= nu:
        raise ConfigError(
            "arrivalRate", f"{arrival_rate} ≥ ν = Σ c_k μ_k = {nu}: no steady state (Lemma 3.6)"
        )
    return slots


def _mean_occupancy(arrival_rate: float, slot_rates: Sequence[float]) -> float:
    """E[Φ] of the birth-death process whose n-th death rate is Σ of the first n slot rates
    (n ≤ C) and ν beyond (eqs. 30-32, 39)."""
    slots = len(slot_rates)
    log_weights = [0.0]  # log ∏_{i≤n} λ/ν_i, n = 0..C
    death_rate = 0.0
    for slot_rate in slot_rates:
        death_rate += slot_rate
        log_weights.append(log_weights[-1] + math.log(arrival_rate / death_rate))
    rho = arrival_rate / death_rate  # death_rate is now ν
    # The tail n ≥ C is geometric: φ_n = φ_C ρ^{n−C}, so it weighs φ_C/(1 − ρ) in all.
    log_tail = log_weights[-1] - math.log1p(-rho)
    peak = max(*log_weights[:-1], log_tail)
    scale = [math.exp(value - peak) for value in log_weights]
    total = math.fsum(scale[:-1]) + math.exp(log_tail - peak)
    below = math.fsum(n * weight for n, weight in enumerate(scale[:-1]))
    tail = scale[-1] * (rho / (1 - rho) ** 2 + slots / (1 - rho))
    return (below + tail) / total
