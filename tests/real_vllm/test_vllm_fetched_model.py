"""The Kubernetes path of a gated Hub model, run here: the operator's rendered fetch step
downloads the model with a token from a Hub on loopback (the Hub's protocol, the real
`huggingface_hub` client) into a cache, and real vLLM with fairpool's scheduler starts on
the directory the rendered engine container is told to load, offline, and answers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fake_hub import Hub, HubServer, Repository

from fairpool.api.inference_pool import InferencePool
from fairpool.api.stored import stored
from fairpool_operator import contract
from fairpool_operator.config import OperatorConfig
from fairpool_operator.render import engine_deployment

from .conftest import MODEL_NAME, start_server, stop_server

pytestmark = pytest.mark.vllm

REPOSITORY = "tiny-org/tiny-llama"


def test_a_gated_hub_model_is_fetched_once_and_served(scratch: Path, tiny_model: Path):
    pool = InferencePool.model_validate(
        stored(
            {
                "apiVersion": "fairpool.io/v1alpha1",
                "kind": "InferencePool",
                "metadata": {"name": "tiny"},
                "spec": {
                    "model": {
                        "name": MODEL_NAME,
                        "source": f"hf://{REPOSITORY}",
                        "secretRef": {"name": "hf-token"},
                        "cache": {"volume": "pvc"},
                    }
                },
            }
        )
    )
    config = OperatorConfig(namespace="serving", engine_sim_image="sim:1", engine_image="e:1")
    spec = engine_deployment(pool, config)["spec"]["template"]["spec"]
    fetcher, engine = spec["initContainers"][0], spec["containers"][0]
    cache, secret = scratch / "model-cache", scratch / "hf-token"
    secret.mkdir()
    (secret / "HF_TOKEN").write_text("hf_reader")
    here = {contract.MODEL_CACHE_DIR: str(cache), contract.MODEL_CREDENTIALS_DIR: str(secret)}
    arguments = [here.get(argument, argument) for argument in fetcher["args"]]
    arguments = arguments[: arguments.index("--termination-log")]
    files = {
        str(path.relative_to(tiny_model)): path.read_bytes()
        for path in sorted(tiny_model.rglob("*"))
        if path.is_file()
    }
    hub = Hub({REPOSITORY: Repository(files, gated=True)}, {"hf_reader": {REPOSITORY}})
    with HubServer(hub) as server:
        environment = {**os.environ, "HF_ENDPOINT": server.url, "HF_HUB_OFFLINE": "0"}
        command = [sys.executable, "-m", "fairpool_cli", *arguments]
        for _ in range(2):  # the first replica downloads, the second finds it all there
            subprocess.run(command, check=True, capture_output=True, env=environment, timeout=300)
    assert sum(hub.downloads.values()) == len(files)

    model = engine["args"][engine["args"].index("--model") + 1]
    server = start_server(
        scratch, Path(model.replace(contract.MODEL_CACHE_DIR, str(cache))), "fetched"
    )
    try:
        answer = httpx.post(
            f"{server.url}/v1/completions",
            json={"model": MODEL_NAME, "prompt": "hello", "max_tokens": 4, "ignore_eos": True},
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 4
    finally:
        stop_server(server)
