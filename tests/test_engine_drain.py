"""`fairpool drain`, the engine pods' preStop hook, against engine-sim on loopback: it
returns only once nothing runs or waits in the engine, or when its timeout is up."""

from __future__ import annotations

import contextlib
import threading

import httpx
import pytest
from polling import wait_until
from sim_http import drained, held

from fairpool_engine.drain import drain, requests_in_engine
from fairpool_engine.sim.options import SimOptions
from fairpool_engine.sim.server import ServerThread

pytestmark = pytest.mark.loopback


def draining(url: str, timeout: float) -> tuple[threading.Thread, list[bool], list[str]]:
    result: list[bool] = []
    said: list[str] = []
    thread = threading.Thread(
        target=lambda: result.append(drain(url, timeout, settle=0.0, say=said.append))
    )
    thread.start()
    return thread, result, said


def test_the_hook_waits_for_the_request_in_the_engine_then_returns():
    with ServerThread(SimOptions(speedup=50.0)) as server:
        policy = server.sim.runner.engine.policy
        request = {"prompt": "hold on", "max_tokens": 200, "stream": True}
        with contextlib.ExitStack() as holding:
            holding.enter_context(held(server))
            with httpx.stream("POST", f"{server.url}/v1/completions", json=request) as response:
                assert response.status_code == 200
                wait_until(lambda: policy.waiting_count == 1)
                assert requests_in_engine(server.url) == 1
                thread, result, said = draining(server.url, timeout=600.0)
                wait_until(lambda: said)  # it looked, and the request still waits
                assert said == ["draining: 1 request(s) running or waiting"]
                assert thread.is_alive() and result == []
                holding.close()  # the engine goes on and serves the request to its end
                streamed = [line for line in response.iter_lines() if line.startswith("data:")]
        assert streamed[-1] == "data: [DONE]"
        thread.join(120.0)
        assert result == [True] and said[-1] == "drained"
        wait_until(lambda: drained(server))


def test_the_hook_gives_up_at_its_timeout():
    with ServerThread(SimOptions(speedup=50.0)) as server:
        policy = server.sim.runner.engine.policy
        request = {"prompt": "hold on", "max_tokens": 200, "stream": True}
        url = f"{server.url}/v1/completions"
        with held(server), httpx.stream("POST", url, json=request):
            wait_until(lambda: policy.waiting_count == 1)
            thread, result, said = draining(server.url, timeout=1.0)
            thread.join(120.0)
            assert result == [False] and "still in the engine" in said[-1]


def test_an_engine_that_is_there_but_slow_is_waited_for_and_one_gone_is_not():
    import socket

    with socket.socket() as listening:  # accepts, never answers: a busy engine
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        said: list[str] = []
        assert drain(url, 0.0, 0.0, say=said.append) is False  # at its timeout, not before
        assert "some request(s) still in the engine" in said[-1]


def test_an_engine_that_does_not_answer_has_nothing_to_drain():
    assert requests_in_engine("http://127.0.0.1:9") is None
    said: list[str] = []
    assert drain("http://127.0.0.1:9", 600.0, 0.0, say=said.append) is True
    assert said == ["the engine does not answer: nothing to drain"]
