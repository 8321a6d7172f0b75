"""`fairpool engine-sim`: bad input gets vLLM's 4xx bodies, failure injection, /health
switching, and a bad configuration at start."""

from __future__ import annotations

import httpx
import pytest
from polling import wait_until
from sim_http import drained, sse_events, tenant

from fairpool_cli.main import main
from fairpool_engine.sim.options import SimOptions
from fairpool_engine.sim.server import ServerThread

pytestmark = pytest.mark.loopback


@pytest.fixture(scope="module")
def server():
    with ServerThread(SimOptions(speedup=1000.0, max_model_len=64)) as running:
        yield running


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        yield http


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == status
    assert "Traceback" not in body["error"]["message"]
    return body["error"]


CHAT = {"messages": [{"role": "user", "content": "Hi"}]}


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens", "at least 1, got 0"),
        ("/v1/completions", {"prompt": "x", "max_tokens": -5}, "max_tokens", "got -5"),
        (
            "/v1/completions",
            {"prompt": "x", "max_tokens": 65},
            "max_tokens",
            "max_tokens=65 cannot be greater than max_model_len=64",
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "max_completion_tokens": 100},
            "max_completion_tokens",
            "max_completion_tokens=100 cannot be greater than max_model_len=64",
        ),
        (
            "/v1/completions",
            {"prompt": "word " * 65},
            "input_tokens",
            "This model's maximum context length is 64 tokens. However, your prompt contains "
            "65 input tokens",
        ),
        ("/v1/completions", {"prompt": "x", "min_tokens": 20, "max_tokens": 5}, None, "min_tok"),
        ("/v1/completions", {"prompt": ""}, "prompt", "Either prompt or prompt_embeds"),
        (
            "/v1/completions",
            {"prompt": "x", "stream_options": {"include_usage": True}},
            "stream_options",
            "Stream options can only be defined when `stream=True`.",
        ),
        (
            "/v1/completions",
            {"prompt": "x", **tenant("")},
            "vllm_xargs.fairpool_tenant",
            "tenant name",
        ),
        (
            "/v1/completions",
            {"prompt": "x", "vllm_xargs": {"fairpool_weight": 2}},
            "vllm_xargs.fairpool_weight",
            "unknown key",
        ),
        ("/v1/completions", {"prompt": "x", "n": 2}, "n", "does not support"),
        ("/v1/completions", {"prompt": ["a", "b"]}, "prompt", "several prompts"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages",
            "image_url",
        ),
        ("/v1/chat/completions", {"messages": []}, "messages", "at least one message"),
    ],
)
def test_requests_vllm_refuses_get_its_400(client, path, body, param, message):
    error = error_of(client.post(path, json=body), 400)
    assert error["type"] == "BadRequestError"
    assert error["param"] == param
    assert message in error["message"]


@pytest.mark.parametrize(
    ("body", "param", "kind"),
    [
        ({"prompt": "x", "max_tokens": "many"}, "body.max_tokens", "int_parsing"),
        ({"prompt": 5}, "body.prompt", "list_type"),
        ({"prompt": "x", "stream": "maybe"}, "body.stream", "bool_parsing"),
        ({"prompt": "x", "vllm_xargs": ["fairpool_tenant"]}, "body.vllm_xargs", "dict_type"),
        ([1, 2], "body", "model_type"),
    ],
)
def test_wrong_types_get_vllms_validation_error(client, body, param, kind):
    error = error_of(client.post("/v1/completions", json=body), 400)
    assert error["type"] == "Bad Request" and error["param"] == param
    assert error["message"].startswith("1 validation error") or error["message"].startswith(
        f"{error['message'].split()[0]} validation errors"
    )
    assert kind in error["message"]


def test_chat_without_messages_is_a_validation_error(client):
    error = error_of(client.post("/v1/chat/completions", json={"model": "sim"}), 400)
    assert error["param"] == "body.messages" and "missing" in error["message"]


def test_malformed_json(client):
    response = client.post(
        "/v1/completions", content=b'{"prompt": ', headers={"content-type": "application/json"}
    )
    error = error_of(response, 400)
    assert error["type"] == "Bad Request" and "JSON decode error" in error["message"]
    assert error["param"].startswith("body.")


def test_a_body_that_is_not_json(client):
    error = error_of(client.post("/v1/completions", content=b"prompt=x"), 400)
    assert "Only 'application/json' is allowed" in error["message"]
    error = error_of(
        client.post("/v1/completions", headers={"content-type": "application/json"}), 400
    )
    assert error["param"] == "body"


def test_an_unknown_model_is_a_404(client):
    error = error_of(client.post("/v1/completions", json={"model": "gpt-9", "prompt": "x"}), 404)
    assert error == {
        "message": "The model `gpt-9` does not exist. Valid aliases: sim.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }


def test_unknown_paths_and_methods(client):
    assert error_of(client.get("/v1/nothing"), 404)["message"] == "Not Found"
    assert error_of(client.get("/v1/completions"), 405)["type"] == "Method Not Allowed"


def test_bad_requests_leave_nothing_behind(server, client):
    client.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
    assert drained(server)


# ---------------------------------------------------------------------- failure injection


def test_error_rate_answers_500_before_the_first_byte():
    with ServerThread(SimOptions(error_rate=1.0)) as server:
        request = {"prompt": "x", "stream": True}
        error = error_of(httpx.post(f"{server.url}/v1/completions", json=request), 500)
        assert error["type"] == "InternalServerError"
        assert drained(server)


def test_hang_rate_never_answers_and_forgets_the_request_when_the_client_leaves():
    with ServerThread(SimOptions(hang_rate=1.0)) as server:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/completions", json={"prompt": "x"}, timeout=0.2)
        assert drained(server)


def test_crash_rate_cuts_streams_after_some_tokens():
    with ServerThread(SimOptions(crash_rate=1.0, speedup=1000.0)) as server:
        request = {"prompt": "x", "max_tokens": 30, "stream": True}
        received = []
        with (
            pytest.raises(httpx.RemoteProtocolError),
            httpx.stream("POST", f"{server.url}/v1/completions", json=request) as response,
        ):
            assert response.status_code == 200
            received.extend(line for line in response.iter_lines() if line.startswith("data:"))
        assert received and "data: [DONE]" not in received
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 30})
        wait_until(lambda: drained(server))


def test_fault_rates_mix_by_fraction():
    options = SimOptions(error_rate=0.5, speedup=1000.0, seed=7)
    with ServerThread(options) as server, httpx.Client(base_url=server.url) as client:
        codes = [
            client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).status_code
            for _ in range(60)
        ]
    assert 15 < codes.count(500) < 45 and codes.count(200) == 60 - codes.count(500)


def test_health_can_be_switched_off_for_tests(client):
    assert client.get("/health").status_code == 200
    assert client.post("/admin/health", json={"healthy": False}).json() == {"healthy": False}
    assert client.get("/health").status_code == 503
    assert client.post("/admin/health", json={"healthy": True}).status_code == 200
    assert client.get("/health").status_code == 200
    assert error_of(client.post("/admin/health", json={"healthy": "no"}), 400)["param"] == "healthy"


def test_streams_still_work_after_errors(client):
    events = sse_events(
        client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2, "stream": True})
    )
    assert events[-1] == "[DONE]"


# ---------------------------------------------------------------------- starting


def test_a_bad_scheduler_config_at_start_exits_2_naming_the_field(tmp_path, capsys):
    config = tmp_path / "scheduler.yaml"
    config.write_text("policy: vtc\ntenants: {acme: -1}\n")
    assert main(["engine-sim", "--scheduler-config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "tenants" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--policy", "fifo"], "--policy"),
        (["--error-rate", "0.7", "--hang-rate", "0.7"], "--error-rate"),
        (["--max-model-len", "900000"], "--max-model-len"),
        (["--profile", "nope"], "--profile"),
        (["--speedup", "0"], "--speedup"),
    ],
)
def test_bad_options_exit_2_naming_the_option(capsys, args, named):
    assert main(["engine-sim", *args]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err
