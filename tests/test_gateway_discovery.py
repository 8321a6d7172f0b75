"""Where the gateway's workers come from: a fixed list, a file re-read on change, and a
Service's EndpointSlices watched through a Kubernetes API (kmock, a real HTTP server that
emulates the API with real watch streams)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling import eventually

from fairpool.api.gateway_config import KubernetesWorkersSpec, WorkerSource
from fairpool_gateway.discovery import (
    FileWorkers,
    KubernetesWorkers,
    StaticWorkers,
    WorkerDiscovery,
    discovery_for,
    parse_worker_file,
)

pytestmark = pytest.mark.loopback


@contextlib.asynccontextmanager
async def following(discovery: WorkerDiscovery) -> AsyncIterator[list[list[str]]]:
    """`discovery.run` in the background for the block; yields the lists it published."""
    published: list[list[str]] = []
    task = asyncio.create_task(discovery.run(published.append))
    try:
        yield published
        assert not task.done(), "discovery stopped by itself"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# --- static and file --------------------------------------------------------------------------


def test_static_workers_publish_once_and_keep_running() -> None:
    async def scenario() -> list[list[str]]:
        urls = ["http://a:8000/", "http://b:8000", "http://a:8000"]
        async with following(StaticWorkers(urls)) as published:
            await eventually(lambda: published)
            for _ in range(10):  # the loop runs; the list is not published again
                await asyncio.sleep(0)
        return published

    assert asyncio.run(scenario()) == [["http://a:8000", "http://b:8000"]]
    with pytest.raises(ValueError, match="http://host:port"):
        StaticWorkers(["a:8000"])


def test_a_worker_file_has_one_url_a_line_with_comments() -> None:
    text = "# the chat pool\nhttp://10.0.0.5:8000/\n\n  http://10.0.0.6:8000  # spare\n"
    text += "http://10.0.0.5:8000\n"
    assert parse_worker_file(text, "w.txt") == ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]
    with pytest.raises(ValueError, match=r"^w\.txt:2: worker URL must look like"):
        parse_worker_file("http://a:1\n10.0.0.5:8000\n", "w.txt")
    with pytest.raises(ValueError, match=r"^w\.txt:1: expected one URL"):
        parse_worker_file("http://a:1 http://b:2\n", "w.txt")


def write_atomically(path: Path, text: str) -> None:
    """Replace a file by renaming a complete new one over it, as editors and ConfigMap
    volumes do (a reader never sees half a file; the new file has a new inode)."""
    new = path.with_suffix(".new")
    new.write_text(text)
    new.rename(path)


def test_file_workers_follow_edits_and_keep_the_last_good_list(tmp_path: Path, caplog) -> None:
    path = tmp_path / "workers.txt"
    a, b, c = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"

    def warned(text: str) -> Callable[[], bool]:
        return lambda: any(text in record.getMessage() for record in caplog.records)

    async def scenario() -> list[list[str]]:
        write_atomically(path, f"# pool\n{a}\n{b}\n")
        async with following(FileWorkers(path, interval=0.02)) as published:
            await eventually(lambda: published == [[a, b]])
            write_atomically(path, f"{a}\n{b}\n{c}\n")
            await eventually(lambda: published[-1] == [a, b, c])

            write_atomically(path, f"{a}\nnot-a-url\n")
            await eventually(warned(f"{path}:2: worker URL must look like"))
            write_atomically(path, f"{c}\n")
            await eventually(lambda: published[-1] == [c])

            path.unlink()
            await eventually(warned("No such file"))
            write_atomically(path, f"{b}\n")  # the same size as before: the inode tells
            await eventually(lambda: published[-1] == [b])
        return published

    with caplog.at_level(logging.INFO, logger="fairpool.gateway"):
        assert asyncio.run(scenario()) == [[a, b], [a, b, c], [c], [b]]
    assert warned("keeping the last good list of 3 workers")()


def test_file_workers_start_empty_without_a_file_and_pick_it_up(tmp_path: Path) -> None:
    path = tmp_path / "later.txt"

    async def scenario() -> list[list[str]]:
        async with following(FileWorkers(path, interval=0.02)) as published:
            await eventually(lambda: published == [[]])
            write_atomically(path, "http://10.0.0.1:8000\n")
            await eventually(lambda: len(published) == 2)
        return published

    assert asyncio.run(scenario()) == [[], ["http://10.0.0.1:8000"]]


def test_discovery_for_each_kind_of_source() -> None:
    static = discovery_for(WorkerSource(urls=["http://a:1"]))
    assert isinstance(static, StaticWorkers) and static.urls == ["http://a:1"]
    file = discovery_for(WorkerSource(file="/etc/fairpool/workers.txt"))
    assert isinstance(file, FileWorkers) and file.path == Path("/etc/fairpool/workers.txt")
    spec = KubernetesWorkersSpec(namespace="llm", service="chat-workers", portName="api")
    kubernetes = discovery_for(WorkerSource(kubernetes=spec))
    assert isinstance(kubernetes, KubernetesWorkers)
    assert (kubernetes.namespace, kubernetes.service, kubernetes.port_name) == (
        "llm",
        "chat-workers",
        "api",
    )


# --- Kubernetes, through kmock ----------------------------------------------------------------

SLICES = "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
# kmock 0.8 reads its bundled resource list with a deprecated importlib call.
kmock_warning = pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning")


def endpoint_slice(name: str, service: str, endpoints: list[Any], **fields: Any) -> dict[str, Any]:
    """An EndpointSlice as the EndpointSlice controller writes it, ports http and metrics."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [
            {"name": "metrics", "port": 9090, "protocol": "TCP"},
            {"name": "http", "port": 8000, "protocol": "TCP"},
        ],
        **fields,
    }


def endpoint(address: str, ready: bool | None = True) -> dict[str, Any]:
    conditions = {} if ready is None else {"ready": ready}
    return {"addresses": [address], "conditions": conditions}


class Api:
    """A kmock Kubernetes emulator on loopback and an httpx client to change its objects."""

    def __init__(self, library: Any, kmock: Any, url: str, http: httpx.AsyncClient) -> None:
        self.kmock_module = library
        self.kmock = kmock
        self.url = url
        self.http = http

    async def create(self, body: dict[str, Any], namespace: str = "llm") -> None:
        # kmock leaves metadata.namespace as sent (the API server sets it), and its watches
        # match events by that field: send it, as kubectl does.
        body = {**body, "metadata": {**body["metadata"], "namespace": namespace}}
        path = SLICES.format(namespace=namespace)
        (await self.http.post(path, json=body)).raise_for_status()

    async def patch(self, name: str, change: dict[str, Any], namespace: str = "llm") -> None:
        path = f"{SLICES.format(namespace=namespace)}/{name}"
        headers = {"Content-Type": "application/merge-patch+json"}
        (await self.http.patch(path, json=change, headers=headers)).raise_for_status()

    async def delete(self, name: str, namespace: str = "llm") -> None:
        path = f"{SLICES.format(namespace=namespace)}/{name}"
        (await self.http.delete(path)).raise_for_status()

    def client(self) -> Any:
        from kubernetes import client

        return client.ApiClient(client.Configuration(host=self.url))

    def requests(self, action: str) -> int:
        """How many requests of an action ("list", "watch") the API has served."""
        return len(self.kmock[getattr(self.kmock_module.action, action.upper())])


@contextlib.asynccontextmanager
async def kubernetes_api() -> AsyncIterator[Api]:
    kmock = pytest.importorskip("kmock", reason="kmock (the dev extra) emulates the API")
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator):
        emulator.resources.load_bundled()  # the built-in resources of a real cluster
        url = str(emulator.url).rstrip("/")
        async with httpx.AsyncClient(base_url=url) as http:
            yield Api(kmock, emulator, url, http)


def follower_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("endpointslices")]


@kmock_warning
def test_kubernetes_workers_follow_endpoint_slices() -> None:
    pytest.importorskip("kubernetes")

    async def scenario() -> list[list[str]]:
        async with kubernetes_api() as api:
            chat_a = [endpoint("10.0.0.1"), endpoint("10.0.0.2", ready=False)]
            chat_a.append(endpoint("10.0.0.3", ready=None))  # unknown counts as ready
            await api.create(endpoint_slice("chat-a", "chat", chat_a))
            await api.create(endpoint_slice("other-a", "other", [endpoint("10.0.9.1")]))
            await api.create(endpoint_slice("chat-x", "chat", [endpoint("10.9.0.1")]), "elsewhere")
            source = KubernetesWorkers("llm", "chat", "http", api_client=api.client())
            async with following(source) as published:
                await eventually(lambda: len(published) == 1)
                ipv6 = endpoint_slice("chat-b", "chat", [endpoint("fd00::7")], addressType="IPv6")
                await api.create(ipv6)
                await eventually(lambda: len(published) == 2)
                await api.patch("other-a", {"endpoints": [endpoint("10.0.9.2")]})  # not ours
                await api.patch(
                    "chat-a", {"endpoints": [endpoint("10.0.0.1"), endpoint("10.0.0.2")]}
                )
                await eventually(lambda: len(published) == 3)
                await api.delete("chat-b")
                await eventually(lambda: len(published) == 4)
                await api.patch("chat-a", {"ports": [{"name": "grpc", "port": 9000}]})
                await eventually(lambda: len(published) == 5)
            # Stopped by the cancel, not by the server ending its watch after 300 s.
            await eventually(lambda: not follower_threads())
        return published

    assert asyncio.run(scenario()) == [
        ["http://10.0.0.1:8000", "http://10.0.0.3:8000"],
        ["http://10.0.0.1:8000", "http://10.0.0.3:8000", "http://[fd00::7]:8000"],
        ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://[fd00::7]:8000"],
        ["http://10.0.0.1:8000", "http://10.0.0.2:8000"],
        [],  # no port named http any more
    ]


@kmock_warning
def test_kubernetes_workers_relist_after_410_gone_and_retry_api_errors(caplog) -> None:
    pytest.importorskip("kubernetes")
    gone = b'{"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "code": 410, '
    gone += b'"status": "Failure", "reason": "Expired", "message": "too old resource version"}}\n'

    async def scenario() -> list[list[str]]:
        async with kubernetes_api() as api:
            api.kmock["list"][:2] << 500  # the API server fails twice
            api.kmock["watch"][:1] << (gone,)  # the first watch has expired
            await api.create(endpoint_slice("chat-a", "chat", [endpoint("10.0.0.1")]))
            source = KubernetesWorkers("llm", "chat", api_client=api.client(), backoff=(0.01, 0.02))
            async with following(source) as published:
                await eventually(lambda: api.requests("watch") >= 2)
                assert api.requests("list") == 4  # 2 failed, 1 before the 410, 1 after
                await api.create(endpoint_slice("chat-b", "chat", [endpoint("10.0.0.2")]))
                await eventually(lambda: len(published) == 2)
        return published

    with caplog.at_level(logging.INFO, logger="fairpool.gateway"):
        published = asyncio.run(scenario())
    assert published == [
        ["http://10.0.0.1:8000"],
        ["http://10.0.0.1:8000", "http://10.0.0.2:8000"],
    ]
    messages = [record.getMessage() for record in caplog.records]
    assert sum("API answered 500" in message for message in messages) == 2
    assert any("410 Gone" in message for message in messages)


@kmock_warning
def test_kubernetes_workers_read_the_kubeconfig(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("kubernetes")

    async def scenario() -> tuple[list[list[str]], str]:
        async with kubernetes_api() as api:
            kubeconfig = tmp_path / "kubeconfig"
            kubeconfig.write_text(
                "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
                f"clusters: [{{name: kmock, cluster: {{server: '{api.url}'}}}}]\n"
                "users: [{name: gateway, user: {token: not-a-real-token}}]\n"
                "contexts: [{name: test, context: {cluster: kmock, user: gateway}}]\n"
            )
            monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
            monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod
            await api.create(endpoint_slice("chat-a", "chat", [endpoint("10.0.0.1")]))
            async with following(KubernetesWorkers("llm", "chat")) as published:
                await eventually(lambda: len(published) == 1)
            authorization = api.kmock[api.kmock_module.action.LIST][0].headers["Authorization"]
        return published, authorization

    published, authorization = asyncio.run(scenario())
    assert published == [["http://10.0.0.1:8000"]]
    assert authorization == "Bearer not-a-real-token"
