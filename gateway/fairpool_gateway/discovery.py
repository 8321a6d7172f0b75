"""Where a pool's workers come from: a fixed list, a file, or a Kubernetes Service.

Each source is a `WorkerDiscovery`: `await source.run(update)` calls `update` on the event
loop with the pool's full list of worker base URLs whenever that list changes, and runs
until cancelled. `discovery_for` builds the source a `WorkerSource` (the gateway
configuration's `workers:` of a pool) describes.

A source that cannot read its workers for a while (a broken file, an unreachable API
server) keeps the last list it had and logs why, to the logger "fairpool.gateway": the
health monitor, not discovery, decides whether those workers still answer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fairpool.api.gateway_config import WorkerSource, check_worker_url
from fairpool.files import FileWatch

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger("fairpool.gateway")

Update = Callable[[list[str]], None]
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


class WorkerDiscovery(Protocol):
    async def run(self, update: Update) -> None:
        """Call `update` with the full list of worker URLs at start (once known) and whenever
        it changes; run until cancelled."""
        ...


async def forever() -> None:
    """Wait until cancelled."""
    await asyncio.Event().wait()


def unique(urls: Iterable[str]) -> list[str]:
    """`urls` without repeats, in their first order."""
    return list(dict.fromkeys(urls))


class StaticWorkers:
    """A fixed list of base URLs, from the configuration."""

    def __init__(self, urls: Iterable[str]) -> None:
        self.urls = unique(check_worker_url(url) for url in urls)

    async def run(self, update: Update) -> None:
        update(list(self.urls))
        await forever()


def parse_worker_file(text: str, source: str) -> list[str]:
    """The base URLs in a worker file: one per line; blank lines and everything after a '#'
    are ignored. Raises ValueError naming `source` and the line of the first bad entry."""
    urls = []
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            if len(entry.split()) > 1:
                raise ValueError(f"expected one URL, got {entry!r}")
            urls.append(check_worker_url(entry))
        except ValueError as error:
            raise ValueError(f"{source}:{number}: {error}") from None
    return unique(urls)


class FileWorkers:
    """Base URLs from a file, one per line with '#' comments, re-read when it changes.

    The file is looked at every `interval` seconds (its inode, size and modification time,
    so that a ConfigMap volume's swap of links counts as a change too). A file that cannot
    be read, or that has a bad line, leaves the last good list in place; the reason is
    logged once per version of the file. Replace the file by renaming a complete new one
    over it: a reader may see a file that is still being written.
    """

    def __init__(self, path: str | Path, interval: float = 1.0) -> None:
        self.path = Path(path)
        self.interval = interval

    async def run(self, update: Update) -> None:
        published: list[str] | None = None
        watch = await asyncio.to_thread(FileWatch, self.path)
        while True:
            changed = await asyncio.to_thread(watch.changed)
            if published is None or changed:
                urls = await asyncio.to_thread(self._read, published or [])
                if urls is not None and urls != published:
                    log.info("worker file %s lists %d workers", self.path, len(urls))
                    published = urls
                    update(list(urls))
                elif published is None:
                    published = []
                    update([])
            await asyncio.sleep(self.interval)

    def _read(self, last_good: list[str]) -> list[str] | None:
        """The file's URLs, or None (logged) when it cannot be used."""
        try:
            text = self.path.read_text(encoding="utf-8")
            return parse_worker_file(text, str(self.path))
        except (OSError, ValueError) as error:
            log.warning(
                "worker file %s unusable, keeping the last good list of %d workers: %s",
                self.path,
                len(last_good),
                error,
            )
            return None


def endpoint_slice_urls(endpoint_slice: Any, port_name: str) -> list[str]:
    """`http://address:port` of each endpoint of a `V1EndpointSlice` that is not marked
    unready, with the port named `port_name` (none when the slice has no such port)."""
    ports = [
        port.port
        for port in endpoint_slice.ports or ()
        if (port.name or "") == port_name and port.port is not None
    ]
    if not ports:
        return []
    urls = []
    for endpoint in endpoint_slice.endpoints or ():
        ready = endpoint.conditions.ready if endpoint.conditions is not None else None
        if ready is False or not endpoint.addresses:
            continue
        address = endpoint.addresses[0]  # the API: all of them are the same endpoint
        host = f"[{address}]" if ":" in address else address
        urls.append(f"http://{host}:{ports[0]}")
    return urls


def api_error(error: Exception) -> str:
    """An error of the Kubernetes client in a few words: status and reason, not the body."""
    status = getattr(error, "status", None)
    if status is not None:
        return f"API answered {status} {getattr(error, 'reason', '')}".rstrip()
    return f"{type(error).__name__}: {error}"


def kubernetes_api_client() -> ApiClient:
    """An API client for the service account when running in a pod, else for the kubeconfig
    ($KUBECONFIG, else ~/.kube/config, read now)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    except config.ConfigException:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration
        )
    return client.ApiClient(configuration)


class KubernetesWorkers:
    """The ready endpoints of a Service, from its EndpointSlices (discovery.k8s.io/v1).

    Follows the slices labelled `kubernetes.io/service-name=<service>` in `namespace` as an
    informer does: list, then watch from the list's resourceVersion; a watch the server
    ends is resumed from the last version seen; an expired one (410 Gone) is followed by a
    new list; any other error by a new list after a back-off (doubling from `backoff[0]` up
    to `backoff[1]` seconds) while the last list stays published.

    The official client is blocking, so it runs in a thread of its own (a daemon), which
    hands each new list to the event loop. Not `asyncio.to_thread`: a watch blocks for
    minutes, and the loop's default executor is joined at shutdown. Cancelling `run` stops
    the watch by shutting its socket down.
    """

    def __init__(
        self,
        namespace: str,
        service: str,
        port_name: str = "http",
        *,
        api_client: ApiClient | None = None,
        watch_seconds: int = 300,
        backoff: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        self.namespace = namespace
        self.service = service
        self.port_name = port_name
        self.api_client = api_client
        self.watch_seconds = watch_seconds
        self.backoff = backoff

    async def run(self, update: Update) -> None:
        loop = asyncio.get_running_loop()
        published: list[str] | None = None

        def publish(urls: list[str]) -> None:
            nonlocal published
            if urls != published:
                published = urls
                update(list(urls))

        def publish_from_thread(urls: list[str]) -> None:
            loop.call_soon_threadsafe(publish, urls)

        follower = SliceFollower(self, publish_from_thread)
        name = f"endpointslices {self.namespace}/{self.service}"
        thread = threading.Thread(target=follower.follow, name=name, daemon=True)
        thread.start()
        try:
            await forever()
        finally:
            follower.stop()


class SliceFollower:
    """The thread side of `KubernetesWorkers`: list and watch, hand each list to `publish`."""

    def __init__(self, source: KubernetesWorkers, publish: Update) -> None:
        self.source = source
        self._publish = publish
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._watch: Any = None
        self._slices: dict[str, Any] = {}  # by name
        self._version: str | None = None  # resourceVersion to watch from
        self._sent: list[str] | None = None
        self._gone_again = False  # a 410 came, and no event since
        self._where = f"EndpointSlices of Service {source.namespace}/{source.service}"
        self._selector = f"{SERVICE_NAME_LABEL}={source.service}"

    def stop(self) -> None:
        """End `follow` soon: now if it is waiting for an event."""
        with self._lock:
            self._stopped.set()
            if self._watch is not None:
                self._watch.stop()

    def follow(self) -> None:
        """List, watch, repeat, until stopped."""
        from kubernetes import client

        delay = self.source.backoff[0]
        api_client = self.source.api_client
        while not self._stopped.is_set():
            try:
                if api_client is None:
                    api_client = kubernetes_api_client()
                api = client.DiscoveryV1Api(api_client)
                self._list(api)
                delay = self.source.backoff[0]
                while not self._stopped.is_set():
                    self._watch_once(api)
            except Exception as error:
                if self._stopped.is_set():
                    break
                if getattr(error, "status", None) == 410 and not self._gone_again:
                    log.info("%s: watch expired (410 Gone), listing again", self._where)
                    self._gone_again = True  # until an event arrives: no tight loop of 410s
                    continue
                log.warning(
                    "%s: %s; keeping the last list (%d workers), retrying in %g s",
                    self._where,
                    api_error(error),
                    len(self._sent or ()),
                    delay,
                )
                self._stopped.wait(delay)
                delay = min(delay * 2, self.source.backoff[1])

    def _list(self, api: Any) -> None:
        """List the slices, replacing what was known, and publish."""
        result = api.list_namespaced_endpoint_slice(
            self.source.namespace, label_selector=self._selector, _request_timeout=30
        )
        self._slices = {item.metadata.name: item for item in result.items if self._ours(item)}
        self._version = result.metadata.resource_version
        self._send()

    def _watch_once(self, api: Any) -> None:
        """One watch request, until the server ends it (after about `watch_seconds`)."""
        from kubernetes import watch

        with self._lock:
            if self._stopped.is_set():
                return
            self._watch = watch.Watch()  # type: ignore[no-untyped-call]
        stream = self._watch.stream(
            api.list_namespaced_endpoint_slice,
            self.source.namespace,
            label_selector=self._selector,
            resource_version=self._version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.source.watch_seconds,
            _request_timeout=(10, self.source.watch_seconds + 30),
        )
        for event in stream:
            if self._stopped.is_set():
                return
            self._apply(event)

    def _apply(self, event: dict[str, Any]) -> None:
        """Fold one watch event into the known slices; publish if the URLs changed."""
        self._gone_again = False
        kind = event["type"]
        if kind == "BOOKMARK":
            version = event["raw_object"].get("metadata", {}).get("resourceVersion")
            self._version = version or self._version
            return
        item = event["object"]
        self._version = item.metadata.resource_version or self._version
        if not self._ours(item):
            return
        if kind == "DELETED":
            self._slices.pop(item.metadata.name, None)
        else:  # ADDED, MODIFIED
            self._slices[item.metadata.name] = item
        self._send()

    def _ours(self, item: Any) -> bool:
        """Whether a slice belongs to the Service (checked here too: the selector is the
        server's to apply, and not every server does)."""
        labels = item.metadata.labels or {}
        namespace = item.metadata.namespace
        return bool(
            labels.get(SERVICE_NAME_LABEL) == self.source.service
            and namespace in (None, self.source.namespace)
        )

    def _send(self) -> None:
        port_name = self.source.port_name
        urls = sorted(
            {url for item in self._slices.values() for url in endpoint_slice_urls(item, port_name)}
        )
        if urls == self._sent or self._stopped.is_set():
            return
        self._sent = urls
        try:
            self._publish(urls)
        except RuntimeError:  # the event loop has closed
            self._stopped.set()


def discovery_for(source: WorkerSource) -> WorkerDiscovery:
    """The discovery a pool's `workers:` configuration describes."""
    if source.urls is not None:
        return StaticWorkers(source.urls)
    if source.file is not None:
        return FileWorkers(source.file)
    if source.kubernetes is None:
        raise ValueError("a worker source names none of urls, file, kubernetes")
    spec = source.kubernetes
    return KubernetesWorkers(spec.namespace, spec.service, spec.port_name)
