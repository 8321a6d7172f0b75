"""Process-wide settings the long-running servers (gateway, engine-sim) share."""

from __future__ import annotations

import gc

#: Young-generation collections between full ones (CPython's default is 10).
FULL_COLLECTION_INTERVAL = 100


def tune_collector_for_serving() -> None:
    """Call once a server has started. CPython's cyclic garbage collector otherwise pauses
    every request for tens of milliseconds several times a minute at a few hundred
    requests per second, in full collections that traverse every live container object.

    - What exists at start-up (modules, classes, clients, the configuration: most of the
      process's objects) is frozen out of all collections.
    - Full collections of what comes later (a prefix tree's nodes, mostly) run 10× less
      often. Their pauses are as long as before, but they stall few enough requests to
      drop out of the 99th percentile; cyclic garbage lives a little longer.
    """
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_INTERVAL)
