"""etcd discovery: register under a key prefix with a lease, watch the prefix.

Wire-compatible with Gubernator's etcd pool, so smockron and Gubernator nodes can share a
prefix: the key is ``prefix + address`` and the value is Gubernator's PeerInfo JSON
(``{"data-center": .., "http-address": .., "grpc-address": ..}``).

One session = grant lease, put our key, list the prefix, watch from the listed revision,
refresh the lease every ttl/3. Any failure (etcd down, lease expired or revoked, our key
deleted, watch cancelled) ends the session; the loop backs off and starts a new one,
which re-grants a lease and re-registers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from typing import Any

import aetcd

from smockron.cluster.discovery._common import (
    ERRORS,
    MALFORMED,
    Publisher,
    RateLimitedLog,
    as_peer,
    log,
    split_host_port,
)
from smockron.cluster.discovery.base import OnChange, PeerInfo

DEFAULT_KEY_PREFIX = "/gubernator-peers"
"""Gubernator's default (``GUBER_ETCD_KEY_PREFIX``); keys are this plus the address."""


class LeaseLost(Exception):
    """Our lease expired or was revoked, or our key vanished: register again."""


def encode_peer(peer: PeerInfo) -> bytes:
    """Gubernator's PeerInfo JSON field names, so Gubernator nodes can read us."""
    return json.dumps(
        {
            "data-center": peer.data_center,
            "http-address": peer.http_address,
            "grpc-address": peer.grpc_address,
        }
    ).encode()


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
    return PeerInfo(
        grpc_address=grpc_address,
        http_address=http if isinstance(http, str) else "",
        data_center=dc if isinstance(dc, str) else "",
    )


class EtcdDiscovery:
    """Registers ``advertise`` in etcd and reports every registered peer."""

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
    ) -> None:
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
        self._lease_id: int | None = None
        self._old_leases: list[int] = []
        self._listed = asyncio.Event()
        self._rlog = RateLimitedLog()
        self.registrations = 0
        """How many times a lease was granted and our key put (1 + re-registrations)."""
        self.malformed = 0

    @property
    def lease_id(self) -> int | None:
        return self._lease_id

    async def start(self, on_change: OnChange) -> None:
        self._publisher = Publisher(on_change, self.me)
        self._task = asyncio.create_task(self._run(), name="etcd-discovery")
        try:
            await asyncio.wait_for(self._listed.wait(), self._start_timeout)
        except TimeoutError:
            log.warning("etcd not reachable within %.1fs; serving alone", self._start_timeout)
            self._publisher.publish([])

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._withdraw()

    def _client(self, attempt: int) -> aetcd.Client:
        host, port = self._endpoints[attempt % len(self._endpoints)]
        username, password = self._auth
        return aetcd.Client(
            host=host, port=port, username=username, password=password,
            timeout=self._timeout,
        )  # fmt: skip

    async def _run(self) -> None:
        attempt = 0
        while True:
            client = self._client(attempt)
            try:
                await self._session(client)
            except (LeaseLost, aetcd.ClientError, OSError, TimeoutError) as exc:
                ERRORS.labels("etcd").inc()
                self._rlog.warning("etcd", "etcd discovery session ended: %r; retrying", exc)
            except Exception:
                ERRORS.labels("etcd").inc()
                log.exception("etcd discovery session failed; retrying")
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.close(), self._timeout)
            attempt += 1
            await asyncio.sleep(self._backoff)

    async def _session(self, client: aetcd.Client) -> None:
        await client.connect()
        await self._register(client)
        watch = await client.watch_prefix(
            self.key_prefix.encode(), start_revision=await self._list(client) + 1
        )
        self._listed.set()
        tasks = [
            asyncio.create_task(self._keepalive(client)),
            asyncio.create_task(self._watch(watch)),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # re-raise the failure that ended the session
            raise LeaseLost("watch ended")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(watch.cancel(), 1.0)

    async def _register(self, client: aetcd.Client) -> None:
        lease = await client.lease(self._ttl)
        await client.put(self.key.encode(), encode_peer(self.me), lease=lease)
        if self._lease_id is not None:
            self._old_leases.append(self._lease_id)
        self._lease_id = lease.id
        self.registrations += 1
        log.info("registered %s in etcd under %s (lease %x)", self.me, self.key, lease.id)
        # A lease from before an outage may still hold nothing; drop it rather than wait.
        while self._old_leases:
            with contextlib.suppress(aetcd.ClientError):
                await client.revoke_lease(self._old_leases[-1])
            self._old_leases.pop()

    async def _list(self, client: aetcd.Client) -> int:
        result = await client.get_prefix(self.key_prefix.encode())
        self._peers = {}
        for kv in result:
            self._accept(kv.key, kv.value)
        self._publish()
        return int(result.header.revision)

    async def _keepalive(self, client: aetcd.Client) -> None:
        assert self._lease_id is not None
        while True:
            await asyncio.sleep(max(self._ttl / 3, 0.2))
            reply = await client.refresh_lease(self._lease_id)
            if reply is None or reply.TTL <= 0:
                raise LeaseLost(f"lease {self._lease_id:x} expired or revoked")

    async def _watch(self, watch: Any) -> None:
        own_key = self.key.encode()
        async for event in watch:
            if event.kind == "DELETE":
                self._peers.pop(event.kv.key, None)
                if event.kv.key == own_key:
                    self._publish()
                    raise LeaseLost(f"our key {self.key} was deleted")
            else:
                self._accept(event.kv.key, event.kv.value)
            self._publish()

    def _accept(self, key: bytes, value: bytes) -> None:
        try:
            self._peers[key] = decode_peer(value)
        except ValueError as exc:
            self._peers.pop(key, None)
            self.malformed += 1
            MALFORMED.labels("etcd").inc()
            self._rlog.warning("etcd-value", "ignoring etcd peer %r: %s", key[:120], exc)

    def _publish(self) -> None:
        if self._publisher is not None:
            self._publisher.publish(self._peers.values())

    async def _withdraw(self) -> None:
        """Delete our key and revoke our lease so peers see us leave at once."""
        lease_id, self._lease_id = self._lease_id, None
        if lease_id is None:
            return
        client = self._client(0)
        try:
            await asyncio.wait_for(self._delete(client, lease_id), self._timeout)
        except Exception as exc:
            log.warning("could not withdraw %s from etcd (lease will expire): %r", self.key, exc)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), self._timeout)

    async def _delete(self, client: aetcd.Client, lease_id: int) -> None:
        await client.delete(self.key.encode())
        await client.revoke_lease(lease_id)
