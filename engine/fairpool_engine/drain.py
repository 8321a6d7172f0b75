"""`fairpool drain`: the engine pods' preStop hook, so that a stopping engine finishes what
it serves instead of cutting it.

When Kubernetes stops a pod it marks its endpoint terminating — the gateway drops it from
rotation and sends it nothing new — and runs this hook before the SIGTERM. The hook waits
`settle` seconds (for the endpoint's removal to reach every gateway replica), then until the
engine reports no request running or waiting (`vllm:num_requests_running` and
`vllm:num_requests_waiting` on its /metrics, which vLLM and engine-sim both export), at most
`timeout` seconds in all. The pod's `terminationGracePeriodSeconds` leaves room for it.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

BUSY = ("vllm:num_requests_running", "vllm:num_requests_waiting")


#: What `requests_in_engine` says of an engine that is there but did not answer in time
#: (busy): keep waiting.
UNKNOWN = -1


def requests_in_engine(url: str) -> int | None:
    """Requests running or waiting in the engine at `url`; None when nothing listens there
    (the engine is gone), `UNKNOWN` when it did not answer in time."""
    try:  # the standard library's client: the engine images need nothing more for the hook
        with urllib.request.urlopen(f"{url}/metrics", timeout=5.0) as response:
            text = response.read().decode("utf-8", "replace")
    except urllib.error.URLError as error:
        return None if isinstance(error.reason, ConnectionRefusedError) else UNKNOWN
    except ConnectionRefusedError:
        return None
    except OSError:  # a timeout, a reset: an engine that is there and slow
        return UNKNOWN
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in BUSY:
                total += sample.value
    return round(total)


def drain(
    url: str,
    timeout: float,
    settle: float,
    say: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Waits as the module says; True when the engine emptied (or stopped answering),
    False when `timeout` passed first."""
    deadline = clock() + timeout
    sleep(min(settle, timeout))
    told = clock() - 10.0
    while True:
        busy = requests_in_engine(url)
        if busy is None or busy == 0:
            say("drained" if busy == 0 else "the engine does not answer: nothing to drain")
            return True
        shown = "some" if busy == UNKNOWN else str(busy)
        if clock() >= deadline:
            say(f"{shown} request(s) still in the engine after {timeout:g} s: stopping anyway")
            return False
        if clock() - told >= 10.0:
            say(f"draining: {shown} request(s) running or waiting")
            told = clock()
        sleep(min(1.0, max(0.0, deadline - clock())))
