"""The simulated engine's `/metrics`: vLLM's own names, which routers and dashboards read,
and the per-tenant `fairpool_engine_*` metrics (`tenant_metrics`), in one registry per
server, so that one process can run several servers (tests do).

vLLM names, labelled `model_name` and `engine="0"` as vLLM labels them:

- gauges `vllm:num_requests_running`, `vllm:num_requests_waiting`, and
  `vllm:kv_cache_usage_perc`, a fraction 0-1 (evictable cached prefixes count as free);
- counters `vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total` (tokens,
  at every admission), `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
  `vllm:num_preemptions_total`, `vllm:request_success_total{finished_reason}` (client
  aborts are not counted, as in vLLM);
- histograms with vLLM's buckets: `vllm:time_to_first_token_seconds`,
  `vllm:inter_token_latency_seconds`, `vllm:e2e_request_latency_seconds`,
  `vllm:request_queue_time_seconds`.

Times are the engine's: model time, which follows wall time × `--speedup` whenever the
engine loop keeps up.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fairpool.sim.engine import SimEngine
from fairpool_engine.live import LiveScheduler
from fairpool_engine.tenant_metrics import TenantMetrics

LABELS = ("model_name", "engine")
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
# vLLM 0.32's default buckets (vllm/v1/metrics/buckets.py).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class EngineMetrics:
    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        labels = (model_name, "0")

        def gauge(name: str, documentation: str) -> Gauge:
            return Gauge(name, documentation, LABELS, registry=self.registry).labels(*labels)

        def counter(name: str, documentation: str) -> Counter:
            return Counter(name, documentation, LABELS, registry=self.registry).labels(*labels)

        def histogram(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
            family = Histogram(name, documentation, LABELS, registry=self.registry, buckets=buckets)
            return family.labels(*labels)

        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*LABELS, "finished_reason"],
            registry=self.registry,
        )
        self.success = {reason: success.labels(*labels, reason) for reason in FINISH_REASONS}
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.inter_token = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            INTER_TOKEN_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.tenants = TenantMetrics(self.registry)
        self._seen = {"preemptions": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0}

    def observe_engine(self, engine: SimEngine, live: LiveScheduler, force: bool = False) -> None:
        """Scheduler state and the engine's cumulative counts, after a step or at a scrape."""
        self.running.set(len(engine.running))
        self.waiting.set(engine.policy.waiting_count)
        self.kv_usage.set(engine.memory_utilization)
        for name, metric in (
            ("preemptions", self.preemptions),
            ("prompt_tokens", self.prefix_queries),
            ("cached_prompt_tokens", self.prefix_hits),
        ):
            total = getattr(engine, name)
            if total > self._seen[name]:
                metric.inc(total - self._seen[name])
                self._seen[name] = total
        self.tenants.export(live, engine.memory_tokens, force=force)

    def first_token(self, prompt_tokens: int, time_to_first_token: float) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.ttft.observe(time_to_first_token)

    def tokens(self, count: int, gap: float | None) -> None:
        """`count` new tokens of one request; `gap` since its previous ones (None: first)."""
        self.generation_tokens.inc(count)
        if gap is not None:
            self.inter_token.observe(gap)

    def finished(self, reason: str, latency: float, queued: float) -> None:
        self.success[reason].inc()
        self.e2e.observe(latency)
        self.queue_time.observe(queued)
