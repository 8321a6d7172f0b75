"""Shared test settings."""

import importlib.util

from hypothesis import HealthCheck, settings

# The real-vLLM tier runs in its own environment (`make test-vllm`).
collect_ignore_glob = [] if importlib.util.find_spec("vllm") else ["real_vllm/*"]

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=100
)
settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=200
)
settings.load_profile("default")
