"""Output lengths predicted per tenant, so a fair policy can charge a request's output when
it admits it.

Sheng et al., "Fairness in Serving Large Language Models", OSDI'24, §4.4 and Algorithm 3
(VTC with length prediction): charging only the tokens served so far, a counter lags the
service its running requests have committed it to, so a fair policy admits a tenant's
requests in bursts and the others catch up only as those produce their output — under
KV-memory pressure, bursts that fill the cache, get preempted, and leave a tenant that
waits with far less than its share. Charging the predicted output at admission, and the
difference as the output is produced, keeps the counters in step with the committed
service. The evaluated predictor ("VTC (predict)", §5) is the mean output of the tenant's
last five requests; until a tenant has finished one, the request's own limit.
"""

from __future__ import annotations

from collections import defaultdict, deque

from fairpool.sched.errors import require_count
from fairpool.sched.requests import Request

#: Finished requests per tenant the prediction averages (the paper's five).
WINDOW = 5


class RecentOutputs:
    """Each tenant's recent output lengths, and the prediction they give."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = require_count("window", window, minimum=1)
        self._recent: dict[str, deque[int]] = defaultdict(lambda: deque(maxlen=self.window))

    def predict(self, request: Request) -> int:
        """The output `request` is expected to produce: its tenant's recent mean, never
        above its `max_tokens`; `max_tokens` itself before the tenant finished any."""
        recent = self._recent.get(request.tenant)
        if not recent:
            return request.max_tokens
        return min(round(sum(recent) / len(recent)), request.max_tokens)

    def observe(self, tenant: str, output_tokens: int) -> None:
        """A request of `tenant` finished after producing `output_tokens`."""
        self._recent[tenant].append(require_count("output_tokens", output_tokens))
