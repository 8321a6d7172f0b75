"""The operator's own metrics (served by `fairpool operator --metrics-port`): how often it
reconciles and how long that takes, what it writes, and what the API server refused."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter(
    "fairpool_operator_reconciles_total",
    "Full reconciles of the namespace, by result (ok, error: an API error stopped it).",
    ["result"],
)
RECONCILE_SECONDS = Histogram(
    "fairpool_operator_reconcile_seconds",
    "How long a full reconcile took.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
WRITES = Counter(
    "fairpool_operator_writes_total",
    "Writes to the API server, by verb (create, apply, delete, status) and kind.",
    ["verb", "kind"],
)
REFUSED = Gauge(
    "fairpool_operator_refused_objects",
    "Objects the API server refused that wait to be tried again (their pools are Degraded).",
)
