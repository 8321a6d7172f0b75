"""Shared test settings."""

import importlib.util
import logging

import pytest
from hypothesis import HealthCheck, settings

# The real-vLLM tier runs in its own environment (`make test-vllm`).
collect_ignore_glob = [] if importlib.util.find_spec("vllm") else ["real_vllm/*"]

#: The test tiers, by what a test needs besides this process. Every test module declares
#: exactly one with `pytestmark`; `pytest -m unit` runs the fast tier alone.
TIERS = {
    "unit": "in-process only: the core library, renderers, policies, fakes",
    "loopback": "servers in threads of this process on loopback: engine-sim, the gateway, kmock",
    "subprocess": "child processes: fairpool up, the command line, helm, hadolint",
    "fuzz": "hostile clients, generated with fixed seeds, against the gateway: `make test-fuzz`",
    "vllm": "real vLLM (its CPU build), in tests/real_vllm: `make test-vllm`",
}


def pytest_configure(config: pytest.Config) -> None:
    for tier, meaning in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: {meaning}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tiers = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
        if len(tiers) != 1:
            raise pytest.UsageError(
                f"{item.nodeid}: its module must declare exactly one test tier with "
                f"`pytestmark = pytest.mark.<tier>` ({', '.join(TIERS)}); it has {sorted(tiers)}"
            )


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
