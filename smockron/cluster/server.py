"""One running node: gRPC server (V1 + PeersV1), HTTP gateway and peer discovery.

Used by ``smockron cluster`` and by tests that want a real node in-process. The start-up
lines and listen errors use Gubernator's words (``GRPC Listening on <addr> ...``,
``HTTP Gateway Listening on <addr> ...``, ``while starting GRPC listener: ...``), which
operators and scripts wait or grep for.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import ssl
from collections.abc import Callable

import grpc
from aiohttp import web

from smockron import httpguard
from smockron.cluster import service, tls
from smockron.cluster.config import ClusterConfig
from smockron.cluster.discovery.base import Discovery
from smockron.cluster.metrics import ClusterMetrics
from smockron.cluster.node import Node
from smockron.cluster.peergate import MemberGate
from smockron.cluster.transports import GrpcServer as GrpcServer  # for cli.py
from smockron.cluster.transports import make_grpc_server, native
from smockron.cluster.transports.http import make_app, make_status_app, server_log
from smockron.cluster.transports.native import NativeServer
from smockron.cluster.transports.threaded import ThreadedServer
from smockron.errors import ConfigError
from smockron.settings import parse_listen

log = logging.getLogger("smockron.cluster")

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]

Extension = Callable[[GrpcServer, Node], None]
"""Adds another service to the gRPC server (the Envoy front)."""


def bind_error(address: str) -> str:
    """Why ``address`` cannot be listened on, worded like Go's net.Listen error (which
    Gubernator prints): ``listen tcp 127.0.0.1:1051: bind: address already in use``."""
    try:
        host, port = parse_listen(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, port))
    except (OSError, ConfigError) as exc:
        return _go_listen_error(address, exc)
    return f"listen tcp {address}: cannot bind"


def _go_listen_error(address: str, exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        reason = exc.strerror[0].lower() + exc.strerror[1:]
        return f"listen tcp {address}: bind: {reason}"
    return f"listen tcp {address}: {exc}"


def _runnable(config: ClusterConfig) -> ClusterConfig:
    """``config`` with the gRPC server that will run: ``native`` without its extension
    is ``threads``, said once here (not once per listener), and ``config.grpc_server``
    (the startup line's ``server=``) names what runs."""
    if config.grpc_server == "native" and not native.AVAILABLE:
        log.warning("gRPC server: native extension not built (no libgrpc++); using threads")
        return dataclasses.replace(config, grpc_server="threads")
    return config


class ClusterServer:
    def __init__(
        self,
        config: ClusterConfig,
        discovery: Discovery | None = None,
        extensions: tuple[Extension, ...] = (),
        metrics: ClusterMetrics | None = None,
    ) -> None:
        """``metrics``: the node's counters, on a registry of its own unless given one."""
        self.config = _runnable(config.validate())
        self.tls = tls.load(self.config)
        self.node = Node(self.config, tls=self.tls, metrics=metrics)
        self._client_san = tls.client_san_check(
            self.config, self.tls, self.node.metrics.tls_client_san_refused
        )
        self._peer_names = tls.peer_names_check(
            self.config, self.tls, self.node.metrics.peer_tls_names_refused
        )
        self._discovery = discovery
        self._extensions = extensions
        self._grpc: GrpcServer | None = None
        self._peer_grpc: GrpcServer | None = None
        self._http: list[web.AppRunner] = []
        self._contexts: list[tuple[ssl.SSLContext, bool]] = []
        self._certificates: list[tls.ServerCertificates] = []

    async def start(self) -> None:
        # Peers first: a node that took calls before it knew its peers would count keys
        # it does not own (a static list is known at once; etcd waits its start timeout).
        if self._discovery is not None:
            await self._discovery.start(self.node.set_peers)
        try:
            await self._listen()
        except BaseException:
            await self.stop()
            raise
        self.node.start_reclaiming()
        log.info(
            "cluster node %s: gRPC %s, peers %s, HTTP %s",
            self.node.address,
            self.config.grpc_address,
            self.config.peer_listen_address or "on the gRPC port",
            self.config.http_address or "off",
        )

    async def _listen(self) -> None:
        shared = self.config.peers_on_grpc_port
        server, threaded = make_grpc_server(
            self.config.grpc_server,
            asyncio.get_running_loop(),
            GRPC_OPTIONS,
            self.node.metrics,
            self._client_san,
        )
        guard = self._member_gate() if shared else None
        if threaded is not None:
            service.add_threaded_fast_paths(threaded, self.node, peers=shared, guard=guard)
        service.add_to_server(server, self.node, peers=shared, guard=guard)
        for extend in self._extensions:
            extend(server, self.node)
        await self._start_grpc(server, self.config.grpc_address, "GRPC")
        self._grpc = server
        if self.tls is not None:
            log.info("gRPC and HTTP on TLS (client auth: %s)", self.tls.client_auth or "none")
        if self._client_san is not None:
            log.info(
                "gRPC clients' certificates must be valid for %s (GRPC_CLIENT_TLS_SAN)",
                self._client_san.wanted,
            )
        log.info("GRPC Listening on %s ...", self.config.grpc_address)
        if shared:
            log.warning(
                "PeersV1 is served on the gRPC port (peers_on_grpc_port): any client "
                "that reaches %s can set GLOBAL state, unless TLS client "
                "certificates keep it out",
                self.config.grpc_address,
            )
        else:
            await self._listen_peers()
        if self.config.http_address:
            await self._serve_http(make_app(self.node), self.config.http_address, "HTTP")
            gateway = "HTTPS Gateway" if self.tls else "HTTP Gateway"
            log.info("%s Listening on %s ...", gateway, self.config.http_address)
        if self.config.status_http_address and self.tls is not None:
            # Gubernator's status listener: HealthCheck over TLS without client certificates,
            # for probes that have none when clients must show one
            app = make_status_app(self.node)
            await self._serve_http(app, self.config.status_http_address, "status HTTP", False)
            log.info("HTTPS Status Handler Listening on %s ...", self.config.status_http_address)

    async def _listen_peers(self) -> None:
        """PeersV1 on a listener of its own, so that clients of the gRPC port cannot
        reach it (firewall it to the nodes; with TLS, it asks what the gRPC port asks)."""
        address = self.config.peer_listen_address
        server, threaded = make_grpc_server(
            self.config.grpc_server,
            asyncio.get_running_loop(),
            GRPC_OPTIONS,
            self.node.metrics,
            self._peer_names,
        )
        guard = self._member_gate()
        if threaded is not None:
            service.add_threaded_fast_paths(threaded, self.node, client=False, guard=guard)
        service.add_peer_service(server, self.node, guard)
        await self._start_grpc(server, address, "peer GRPC")
        self._peer_grpc = server
        log.info("Peer GRPC Listening on %s ...", address)

    def _member_gate(self) -> service.Guard | None:
        if not self.config.peer_check_address:
            return None
        return MemberGate(self.node, self.node.metrics.peer_calls_not_member).guard

    async def _start_grpc(self, server: GrpcServer, address: str, what: str) -> None:
        try:
            bound = self._bind(server, address)
        except RuntimeError:
            bound = 0
        if bound == 0:
            reason = bind_error(address)
            raise OSError(f"while starting {what} listener: {reason}")
        await server.start()

    async def _serve_http(
        self, app: web.Application, address: str, what: str, client_auth: bool = True
    ) -> None:
        guard = httpguard.ConnectionGuard(
            log,
            header_timeout_s=httpguard.HEADER_TIMEOUT_S,
            counted=lambda event: self.node.metrics.http_connections_closed.labels(event).inc(),
        )
        app.middlewares.insert(0, guard.middleware)
        runner = web.AppRunner(app, access_log=None, logger=server_log(self.node))
        await runner.setup()
        self._http.append(runner)
        host, port = parse_listen(address)
        context = None
        if self.tls is not None:
            context = self.tls.http_context(client_auth)
            self._contexts.append((context, client_auth))
        try:
            await httpguard.GuardedSite(runner, host, port, guard, ssl_context=context).start()
        except OSError as exc:
            reason = _go_listen_error(address, exc)
            raise OSError(f"while starting {what} listener: {reason}") from None

    def _bind(self, server: GrpcServer, address: str) -> int:
        if self.tls is None:
            return server.add_insecure_port(address)
        if isinstance(server, NativeServer):  # TLS inside libgrpc++, set before binding
            server.use_tls(self.tls)
            return server.add_insecure_port(address)
        if self.tls.client_auth in ("request-cert", "verify-cert"):
            log.warning(
                "GUBER_TLS_CLIENT_AUTH=%s: the %s gRPC server cannot ask for a client "
                "certificate without requiring one, so it asks for none (the native "
                "server and the HTTP gateway do ask)",
                self.tls.client_auth,
                self.config.grpc_server,
            )
        assert isinstance(server, grpc.aio.Server | ThreadedServer)
        certificates = tls.ServerCertificates(self.tls)
        self._certificates.append(certificates)
        return server.add_secure_port(address, certificates.credentials())

    def reload_tls(self) -> bool:
        """SIGHUP: read the certificate and key files again (upstream's keypairReloader);
        new connections get them. A file that does not load keeps the old ones."""
        if self.tls is None or not self.config.tls_cert:
            log.info("no TLS certificate files to reload")
            return False
        log.info(
            "Caught SIGHUP, reloading TLS certificate and key from %r and %r",
            self.config.tls_cert,
            self.config.tls_key,
        )
        try:
            material = tls.load(self.config)
        except ConfigError as exc:
            log.error(
                "Keeping old TLS certificate because the new one could not be loaded: %s", exc
            )
            return False
        assert material is not None
        self.tls = material
        self.node.use_tls(material)
        for context, client_auth in self._contexts:
            material.load_into(context, client_auth)
        for server in (self._grpc, self._peer_grpc):
            if isinstance(server, NativeServer):
                server.reload_tls(material)
        for certificates in self._certificates:
            certificates.update(material)
        return True

    async def stop(self) -> None:
        if self._discovery is not None:
            await self._discovery.stop()
        for runner in self._http:
            await runner.cleanup()
        for server in (self._grpc, self._peer_grpc):
            if server is not None:
                await server.stop(grace=1.0)
        await self.node.close()
