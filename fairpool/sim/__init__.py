"""Simulation in virtual time: engines, workloads and reports, on the core policies."""
