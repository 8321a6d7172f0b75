"""Shared test settings."""

import importlib.util
import logging

import pytest
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


@pytest.fixture(autouse=True)
def _no_logging_into_closed_streams():
    """Drop log handlers an earlier test left writing to a stream that is now closed
    (pytest closes its capture streams after each test): a later test's logs would
    otherwise print "--- Logging error ---" tracebacks that are not the code's."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        if not isinstance(logger, logging.Logger):
            continue
        for handler in list(logger.handlers):
            stream = getattr(handler, "stream", None)
            if stream is not None and getattr(stream, "closed", False):
                logger.removeHandler(handler)
    yield
