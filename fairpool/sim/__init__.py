"""Simulation in virtual time, on the core policies: engines, fleets, workloads, metrics,
and the chain simulator of pipeline placement with the baselines it compares against."""
