"""Kubernetes discovery: list and watch the EndpointSlices of the service.

Uses the official ``kubernetes`` client (synchronous), so list + watch runs in a thread;
every new peer list hops to the event loop with ``call_soon_threadsafe``. Like
Gubernator's ``endpointslices`` mechanism: slices are selected by label (by default
``kubernetes.io/service-name=<service>``), only ready endpoints count (a missing ``ready``
condition means ready), the first address of an endpoint is its pod IP, and the peer is
``pod_ip:pod_port``. Our own pod is always included, ready or not. When the slice lists
a port named ``peers`` (the Service's port for the PeersV1 listener, named so in the pod
spec), the peer is called there; otherwise at the gRPC port + 1 (or the gRPC port).

The watch resumes from the last seen ``resourceVersion``; ``410 Gone`` or any malformed
event leads to a fresh list.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import kubernetes.client
import kubernetes.config
import kubernetes.watch
from prometheus_client import CollectorRegistry

from smockron.cluster.discovery._common import (
    DiscoveryMetrics,
    Publisher,
    join_host_port,
    log,
)
from smockron.cluster.discovery.base import DISCOVERY, OnChange, PeerInfo
from smockron.errors import MalformedEvent
from smockron.ratelog import RateLimitedLog

# The client is only partly typed (untyped Watch, config loaders, raw responses): use it as Any.
k8s_client: Any = kubernetes.client
k8s_config: Any = kubernetes.config
k8s_watch: Any = kubernetes.watch

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
PEER_PORT_NAME = "peers"
"""The port name that carries the PeersV1 port in a slice (and in the pod spec)."""


def named_port(obj: Mapping[str, Any], name: str) -> int | None:
    """The number of the slice port called ``name``, if it lists one."""
    ports = obj.get("ports")
    if not isinstance(ports, list):
        return None
    for item in ports:
        if isinstance(item, dict) and item.get("name") == name:
            number = item.get("port")
            if isinstance(number, int) and not isinstance(number, bool) and 0 < number < 65536:
                return number
            raise MalformedEvent(f"EndpointSlice port {name!r} is not a port: {number!r:.40}")
    return None


def peers_from_slice(
    obj: Mapping[str, Any], port: int, pod_ip: str = "", peer_port_name: str = PEER_PORT_NAME
) -> list[PeerInfo]:
    """Ready endpoints of one EndpointSlice (raw API JSON) as peers; ours always included.

    Raises MalformedEvent when the object does not have the EndpointSlice shape.
    """
    address_type = obj.get("addressType")
    endpoints = obj.get("endpoints") or []
    if not isinstance(address_type, str) or not isinstance(endpoints, list):
        raise MalformedEvent(f"not an EndpointSlice: {str(obj)[:120]}")
    if address_type not in ("IPv4", "IPv6"):
        return []  # FQDN slices name hosts, not pods
    peer_port = named_port(obj, peer_port_name) if peer_port_name else None
    peers = []
    for endpoint in endpoints:
        addresses = endpoint.get("addresses") if isinstance(endpoint, dict) else None
        if not isinstance(addresses, list) or not addresses or not isinstance(addresses[0], str):
            continue
        ip = addresses[0]
        conditions = endpoint.get("conditions") or {}
        ready = conditions.get("ready") if isinstance(conditions, dict) else None
        if ready is False and ip != pod_ip:
            continue
        peer_address = join_host_port(ip, peer_port) if peer_port is not None else ""
        peers.append(PeerInfo(join_host_port(ip, port), peer_address=peer_address))
    return peers


def slice_name(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str):
        raise MalformedEvent(f"EndpointSlice without metadata.name: {str(obj)[:120]}")
    return name


def make_configuration(
    api_host: str | None = None,
    token: str | None = None,
    kubeconfig: str | None = None,
) -> Any:
    """An explicit host (tests, proxies), else in-cluster service account, else kubeconfig.

    Raises ValueError naming the problem, so a bad setup fails at start-up, not in the
    watcher thread.
    """
    configuration = k8s_client.Configuration()
    if api_host is not None:
        configuration.host = api_host
        if token:
            configuration.api_key = {"BearerToken": token}
            configuration.api_key_prefix = {"BearerToken": "Bearer"}
        return configuration
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)
    except k8s_config.ConfigException:
        try:
            k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        except (k8s_config.ConfigException, OSError) as exc:
            message = f"no in-cluster service account and no usable kubeconfig: {exc}"
            raise ValueError(message) from exc
    return configuration


@DISCOVERY.register
class KubernetesDiscovery:
    """Watches the EndpointSlices selected by ``selector`` (or ``service_name``)."""

    schemes = ("kubernetes", "k8s")

    def __init__(
        self,
        *,
        namespace: str = "default",
        service_name: str | None = None,
        selector: str | None = None,
        pod_ip: str = "",
        pod_port: int = 1051,
        peer_port_name: str = PEER_PORT_NAME,
        api_host: str | None = None,
        token: str | None = None,
        kubeconfig: str | None = None,
        watch_timeout: int = 300,
        backoff: float = 1.0,
        start_timeout: float = 10.0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """``peer_port_name``: the slice port naming each pod's PeersV1 port ("" to
        ignore); ``registry``: where the discovery counters go (the node's)."""
        if selector is None:
            if not service_name:
                raise ValueError("kubernetes discovery needs service_name or selector")
            selector = f"{SERVICE_NAME_LABEL}={service_name}"
        self.namespace = namespace
        self.selector = selector
        self.pod_ip = pod_ip
        self.pod_port = int(pod_port)
        self.peer_port_name = peer_port_name
        self.me = PeerInfo(join_host_port(pod_ip, self.pod_port)) if pod_ip else None
        self._configuration = make_configuration(api_host, token, kubeconfig)
        self._watch_timeout = watch_timeout
        self._backoff = backoff
        self._start_timeout = start_timeout
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._publisher: Publisher | None = None
        self._listed = asyncio.Event()
        self._slices: dict[str, list[PeerInfo]] = {}
        self._rlog = RateLimitedLog(log)
        self.metrics = DiscoveryMetrics("kubernetes", registry)
        self.lists = 0
        self.malformed = 0

    async def start(self, on_change: OnChange) -> None:
        self._loop = asyncio.get_running_loop()
        self._publisher = Publisher(on_change, self.me)
        self._stopping.clear()
        self._thread = threading.Thread(target=self._thread_main, name="k8s-discovery", daemon=True)
        self._thread.start()
        try:
            await asyncio.wait_for(self._listed.wait(), self._start_timeout)
        except TimeoutError:
            log.warning(
                "Kubernetes API not reachable within %.1fs; serving alone", self._start_timeout
            )
            self._publisher.publish([])

    async def stop(self) -> None:
        self._stopping.set()
        thread, self._thread = self._thread, None
        deadline = time.monotonic() + 10
        # Watch.stop() shuts the socket down, unblocking the thread's read. Repeat it:
        # a stop that lands before the watch request is sent is forgotten by stream().
        while thread is not None and thread.is_alive() and time.monotonic() < deadline:
            watch = self._watch
            if watch is not None:
                watch.stop()
            await asyncio.sleep(0.05)
        self._publisher = None

    # --- the watcher thread -------------------------------------------------------

    def _thread_main(self) -> None:
        api_client = k8s_client.ApiClient(self._configuration)
        api = k8s_client.DiscoveryV1Api(api_client)
        try:
            while not self._stopping.is_set():
                try:
                    self._watch_from(api, self._list(api))
                except k8s_client.ApiException as exc:
                    if exc.status == 410 and not self._stopping.is_set():
                        log.info("EndpointSlice watch expired (410 Gone); relisting")
                        continue
                    self._count_failure(exc)
                    self._stopping.wait(self._backoff)
                except Exception as exc:
                    if self._stopping.is_set():
                        break
                    self._count_failure(exc)
                    self._stopping.wait(self._backoff)
        finally:
            api_client.close()

    def _list(self, api: Any) -> str:
        response = api.list_namespaced_endpoint_slice(
            self.namespace,
            label_selector=self.selector,
            _preload_content=False,
            _request_timeout=(5, 30),
        )
        try:
            body = json.loads(response.data)
        except ValueError as exc:
            raise MalformedEvent(f"EndpointSlice list is not JSON: {exc}") from exc
        finally:
            response.release_conn()
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise MalformedEvent("EndpointSlice list without items")
        slices = {slice_name(item): self._peers(item) for item in items}
        self._slices = slices
        self.lists += 1
        self._emit(first=True)
        version = body.get("metadata", {}).get("resourceVersion", "")
        return str(version)

    def _watch_from(self, api: Any, resource_version: str) -> None:
        """Follow changes, re-watching from the last version whenever the server ends a
        watch; returns only when stopping, raises on any failure (the caller relists)."""
        while not self._stopping.is_set():
            resource_version = self._watch_once(api, resource_version)

    def _watch_once(self, api: Any, resource_version: str) -> str:
        watch = k8s_watch.Watch()
        self._watch = watch
        if self._stopping.is_set():  # stop() ran before self._watch was visible
            return resource_version
        try:
            stream = watch.stream(
                api.list_namespaced_endpoint_slice,
                self.namespace,
                label_selector=self.selector,
                resource_version=resource_version,
                timeout_seconds=self._watch_timeout,
                allow_watch_bookmarks=True,
                _request_timeout=(5, self._watch_timeout + 30),
            )
            for event in stream:
                if self._stopping.is_set():
                    break
                self._apply(event)
            return str(watch.resource_version or resource_version)
        finally:
            self._watch = None
            watch.stop()

    def _apply(self, event: Any) -> None:
        if not isinstance(event, dict) or not isinstance(event.get("raw_object"), dict):
            raise MalformedEvent(f"watch line is not an event: {str(event)[:120]}")
        kind, obj = event.get("type"), event["raw_object"]
        if kind == "BOOKMARK":
            return
        if kind in ("ADDED", "MODIFIED"):
            self._slices[slice_name(obj)] = self._peers(obj)
        elif kind == "DELETED":
            self._slices.pop(slice_name(obj), None)
        else:
            raise MalformedEvent(f"unknown watch event type {kind!r}")
        self._emit()

    def _peers(self, obj: Mapping[str, Any]) -> list[PeerInfo]:
        return peers_from_slice(obj, self.pod_port, self.pod_ip, self.peer_port_name)

    def _count_failure(self, exc: Exception) -> None:
        # ValueError covers MalformedEvent, JSON errors and the client model validation
        if isinstance(exc, ValueError | KeyError | TypeError):
            self.malformed += 1
            self.metrics.malformed.inc()
        self.metrics.errors.inc()
        self._rlog.warning("Kubernetes discovery: %r; relisting", exc, key="k8s")

    def _emit(self, first: bool = False) -> None:
        peers = [p for group in self._slices.values() for p in group]
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed since the check
            loop.call_soon_threadsafe(self._deliver, peers, first)

    def _deliver(self, peers: Iterable[PeerInfo], first: bool) -> None:
        """Runs on the event loop: the only place that calls ``on_change``."""
        if self._publisher is None:
            return
        self._publisher.publish(peers)
        if first:
            self._listed.set()
