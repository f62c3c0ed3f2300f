"""etcd discovery: register under a key prefix with a lease, watch the prefix.

Wire-compatible with Gubernator's etcd pool, so smockron and Gubernator nodes can share a
prefix: the key is ``prefix + address`` and the value is Gubernator's PeerInfo JSON
(``{"data-center": .., "http-address": .., "grpc-address": ..}``), plus smockron's
``"peer-address"`` (where the node serves PeersV1) when known. Gubernator's JSON decoder
ignores fields it does not know, and a record without it (a Gubernator node's) leaves the
peer address to the reader's default (gRPC port + 1, or the gRPC port).

One session = grant lease, put our key, list the prefix, watch from the listed revision,
refresh the lease every ttl/3. Any failure (etcd down, lease expired or revoked, our key
deleted, watch cancelled) ends the session; the loop backs off and starts a new one,
which re-grants a lease and re-registers.

aetcd is used for the connection and the unary calls; the watch and keepalive streams are
driven directly on its gRPC channel, so that each is one stream we open, read and cancel
ourselves (aetcd's watcher and ``refresh_lease`` keep streams and tasks of their own that
can outlive a broken connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aetcd
import grpc
from aetcd import rpc
from aetcd.utils import prefix_range_end
from prometheus_client import CollectorRegistry

from smockron.cluster.discovery._common import (
    DiscoveryMetrics,
    Publisher,
    as_peer,
    cancel_task,
    log,
    split_host_port,
)
from smockron.cluster.discovery.base import DISCOVERY, OnChange, PeerInfo
from smockron.errors import LeaseLost
from smockron.ratelog import RateLimitedLog

DEFAULT_KEY_PREFIX = "/gubernator-peers"
"""Gubernator's default (``GUBER_ETCD_KEY_PREFIX``); keys are this plus the address."""


def encode_peer(peer: PeerInfo) -> bytes:
    """Gubernator's PeerInfo JSON field names, so Gubernator nodes can read us; the peer
    address only when there is one, so a record without it is byte-for-byte Gubernator's."""
    fields = {
        "data-center": peer.data_center,
        "http-address": peer.http_address,
        "grpc-address": peer.grpc_address,
    }
    if peer.peer_address:
        fields["peer-address"] = peer.peer_address
    return json.dumps(fields).encode()


def decode_peer(value: bytes) -> PeerInfo:
    """Parse a registration value; ValueError for anything that is not a usable peer.

    Besides the JSON form, a bare ``host:port`` is accepted as a gRPC address (the value
    format of old Gubernator releases).
    """
    text = value.decode("utf-8")  # UnicodeDecodeError is a ValueError
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError:
        split_host_port(text.strip())
        return PeerInfo(grpc_address=text.strip())
    if not isinstance(data, dict):
        raise ValueError(f"peer value is JSON but not an object: {text[:80]!r}")
    grpc_address = data.get("grpc-address")
    if not isinstance(grpc_address, str):
        raise ValueError(f"peer value has no grpc-address string: {text[:80]!r}")
    split_host_port(grpc_address)
    http = data.get("http-address", "")
    dc = data.get("data-center", "")
    peer = data.get("peer-address", "")
    if not isinstance(peer, str):
        raise ValueError(f"peer value has a peer-address that is not a string: {text[:80]!r}")
    if peer:
        split_host_port(peer)
    return PeerInfo(
        grpc_address=grpc_address,
        http_address=http if isinstance(http, str) else "",
        data_center=dc if isinstance(dc, str) else "",
        peer_address=peer,
    )


@DISCOVERY.register
class EtcdDiscovery:
    """Registers ``advertise`` in etcd and reports every registered peer."""

    schemes = ("etcd",)

    def __init__(
        self,
        advertise: PeerInfo | str,
        endpoints: Sequence[str] | str = "127.0.0.1:2379",
        *,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        lease_ttl: int = 30,
        timeout: float = 5.0,
        backoff: float = 1.0,
        start_timeout: float = 10.0,
        username: str | None = None,
        password: str | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """``registry``: where the discovery counters go (the node's)."""
        self.me = as_peer(advertise)
        text = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        self._endpoints = [
            split_host_port(e.strip().removeprefix("http://"))
            for item in text
            for e in item.split(",")
            if e.strip()
        ]
        if not self._endpoints:
            raise ValueError("etcd discovery needs at least one endpoint")
        if lease_ttl < 1:
            raise ValueError(f"lease_ttl must be >= 1 second, got {lease_ttl}")
        self.key_prefix = key_prefix
        # Gubernator keys by the HTTP address; fall back to gRPC when we have no HTTP one.
        self.key = key_prefix + (self.me.http_address or self.me.grpc_address)
        self._ttl = lease_ttl
        self._timeout = timeout
        self._backoff = backoff
        self._start_timeout = start_timeout
        self._auth = (username, password)
        self._publisher: Publisher | None = None
        self._task: asyncio.Task[None] | None = None
        self._peers: dict[bytes, PeerInfo] = {}
        self._leases: list[int] = []
        """Every lease granted and not yet revoked; the newest holds our key."""
        self._listed = asyncio.Event()
        self._rlog = RateLimitedLog(log)
        self.metrics = DiscoveryMetrics("etcd", registry)
        self.registrations = 0
        """How many times a lease was granted and our key put (1 + re-registrations)."""
        self.malformed = 0

    @property
    def lease_id(self) -> int | None:
        return self._leases[-1] if self._leases else None

    async def start(self, on_change: OnChange) -> None:
        self._publisher = Publisher(on_change, self.me)
        self._task = asyncio.create_task(self._run(), name="etcd-discovery")
        try:
            await asyncio.wait_for(self._listed.wait(), self._start_timeout)
        except TimeoutError:
            log.warning("etcd not reachable within %.1fs; serving alone", self._start_timeout)
            self._publisher.publish([])

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_task(task)
        await self._withdraw()

    def _client(self, attempt: int) -> aetcd.Client:
        host, port = self._endpoints[attempt % len(self._endpoints)]
        username, password = self._auth
        return aetcd.Client(
            host=host,
            port=port,
            username=username,
            password=password,
            timeout=self._timeout,
        )

    async def _run(self) -> None:
        attempt = 0
        me = asyncio.current_task()
        assert me is not None
        while True:
            client = self._client(attempt)
            try:
                await self._session(client)
            except (LeaseLost, aetcd.ClientError, grpc.RpcError, OSError, TimeoutError) as exc:
                self.metrics.errors.inc()
                self._rlog.warning("etcd discovery session ended: %r; retrying", exc, key="etcd")
            except Exception as exc:  # a bug or a surprise from the client: keep trying
                self.metrics.errors.inc()
                self._rlog.warning("etcd discovery failed unexpectedly: %r", exc, key="etcd-bug")
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.close(), self._timeout)
            # aetcd's close() can swallow our cancellation; never loop on after a cancel
            if me.cancelling():
                raise asyncio.CancelledError
            attempt += 1
            await asyncio.sleep(self._backoff)

    async def _session(self, client: aetcd.Client) -> None:
        await client.connect()
        await self._register(client)
        revision = await self._list(client)
        self._listed.set()
        tasks = [
            asyncio.create_task(self._keepalive(client)),
            asyncio.create_task(self._watch(client, revision + 1)),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # re-raise the failure that ended the session
            raise LeaseLost("etcd stream ended")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _register(self, client: aetcd.Client) -> None:
        lease = await client.lease(self._ttl)
        # Known before the put, so a stop() that interrupts us still revokes it.
        self._leases.append(lease.id)
        await client.put(self.key.encode(), encode_peer(self.me), lease=lease)
        self.registrations += 1
        log.info("registered %s in etcd under %s (lease %x)", self.me, self.key, lease.id)
        # Leases from before an outage may still exist; drop them rather than wait.
        for old in self._leases[:-1]:
            with contextlib.suppress(aetcd.ClientError):
                await client.revoke_lease(old)
        del self._leases[:-1]

    async def _list(self, client: aetcd.Client) -> int:
        result = await client.get_prefix(self.key_prefix.encode())
        self._peers = {}
        for kv in result:
            self._accept(kv.key, kv.value)
        self._publish()
        return int(result.header.revision)

    async def _keepalive(self, client: aetcd.Client) -> None:
        """One LeaseKeepAlive stream: a refresh every ttl/3, each answered with the TTL."""
        lease_id = self._leases[-1]
        interval = max(self._ttl / 3, 0.2)

        async def refreshes() -> AsyncIterator[Any]:
            while True:
                yield rpc.LeaseKeepAliveRequest(ID=lease_id)
                await asyncio.sleep(interval)

        call = rpc.LeaseStub(client.channel).LeaseKeepAlive(refreshes(), metadata=client.metadata)
        try:
            async for reply in call:
                if reply.TTL <= 0:
                    raise LeaseLost(f"lease {lease_id:x} expired or revoked")
        finally:
            call.cancel()

    async def _watch(self, client: aetcd.Client, start_revision: int) -> None:
        """One Watch stream over the prefix, from ``start_revision``; kept open until a
        failure or cancellation (closing the request side would end the watch)."""
        prefix = self.key_prefix.encode()
        create = rpc.WatchRequest(
            create_request=rpc.WatchCreateRequest(
                key=prefix, range_end=prefix_range_end(prefix), start_revision=start_revision
            )
        )
        forever = asyncio.Event()

        async def requests() -> AsyncIterator[Any]:
            yield create
            await forever.wait()

        call = rpc.WatchStub(client.channel).Watch(requests(), metadata=client.metadata)
        try:
            async for response in call:
                if response.canceled or response.compact_revision:
                    raise LeaseLost(f"watch cancelled: {response.cancel_reason or 'compacted'}")
                for event in response.events:
                    self._event(event)
        finally:
            call.cancel()

    def _event(self, event: Any) -> None:
        key = bytes(event.kv.key)
        if event.type == rpc.Event.DELETE:
            self._peers.pop(key, None)
            self._publish()
            if key == self.key.encode():
                raise LeaseLost(f"our key {self.key} was deleted")
            return
        self._accept(key, bytes(event.kv.value))
        self._publish()

    def _accept(self, key: bytes, value: bytes) -> None:
        try:
            self._peers[key] = decode_peer(value)
        except ValueError as exc:
            self._peers.pop(key, None)
            self.malformed += 1
            self.metrics.malformed.inc()
            self._rlog.warning("ignoring etcd peer %r: %s", key[:120], exc, key="etcd-value")

    def _publish(self) -> None:
        if self._publisher is not None:
            self._publisher.publish(self._peers.values())

    async def _withdraw(self) -> None:
        """Delete our key and revoke our leases so peers see us leave at once."""
        leases, self._leases = self._leases, []
        if not leases:
            return
        client = self._client(0)
        try:
            await asyncio.wait_for(self._delete(client, leases), self._timeout)
        except Exception as exc:
            log.warning("could not withdraw %s from etcd (lease will expire): %r", self.key, exc)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), self._timeout)

    async def _delete(self, client: aetcd.Client, leases: list[int]) -> None:
        await client.delete(self.key.encode())
        for lease_id in leases:
            with contextlib.suppress(aetcd.ClientError):
                await client.revoke_lease(lease_id)
