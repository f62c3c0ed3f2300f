"""A node's life once built: the Envoy front chosen and reloaded, ``serve`` (start, run
until SIGTERM, drain, stop) and SIGHUP's reload. ``smockron cluster``
(smockron.cluster.cli) builds the objects and hands them to smockron.runtime."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import click

from smockron import runtime
from smockron.cluster.build import listen_everywhere
from smockron.cluster.config import ClusterConfig
from smockron.cluster.discovery.base import Discovery
from smockron.cluster.node import Node
from smockron.cluster.server import ClusterServer, GrpcServer
from smockron.cluster.transports.http import observe
from smockron.errors import ConfigError

log = logging.getLogger("smockron.cluster")


class EnvoyFront:
    """The Envoy RLS front on the node's gRPC server; its descriptor files are reloaded
    when they change (as envoyproxy/ratelimit does), every ``reload_interval`` seconds."""

    def __init__(self, paths: str, reload_interval: float, headers: bool = False) -> None:
        from smockron.cluster import envoy

        self._envoy = envoy
        self.paths = paths
        self.loaded = envoy.load_config(paths)  # a bad file stops the command at start
        self.reload_interval = reload_interval
        self.headers = headers
        self._task: asyncio.Task[None] | None = None
        self._reloader: Any = None

    def __call__(self, server: GrpcServer, node: Node) -> None:
        servicer = self._envoy.add_to_server(
            server, node, self.loaded, response_headers=self.headers
        )
        self._reloader = self._envoy.ConfigReloader(servicer, self.paths, self.reload_interval)
        if self.reload_interval > 0:
            self._task = asyncio.get_running_loop().create_task(self._reloader.run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def reload(self) -> None:
        """SIGHUP: check the descriptor files now rather than at the next poll."""
        if self._reloader is not None and not self._reloader.check():
            log.info("envoy: SIGHUP: the descriptor files are unchanged")

    async def start(self) -> None:
        """Nothing beyond the gRPC port (UpstreamFront starts its listeners here)."""


def envoy_front(
    config: ClusterConfig, env: Mapping[str, str], given: Mapping[str, Any]
) -> tuple[ClusterConfig, Any]:
    """The Envoy front, if any: ``--envoy-config``'s, or envoyproxy/ratelimit mode's
    (envoy/upstream_env.py), whose GRPC_HOST:GRPC_PORT is the gRPC address unless one was
    given (flag, SMOCKRON_CLUSTER_GRPC_ADDRESS, GUBER_GRPC_ADDRESS, the --config file)."""
    from smockron.cluster.envoy.upstream_env import upstream_mode

    if upstream_mode(env, config.envoy_config):
        from smockron.cluster.envoy.upstream import UpstreamFront, apply_logging
        from smockron.cluster.envoy.upstream_env import UpstreamSettings

        settings = UpstreamSettings.from_env(env)
        apply_logging(settings, env)
        if given.get("grpc_address") is None and not env.get("GUBER_GRPC_ADDRESS"):
            config = replace(config, grpc_address=settings.grpc_address)
            config = replace(config, **listen_everywhere(config)).validate()
        interval = config.envoy_reload_interval_ms / 1000
        front = UpstreamFront(settings, interval, env, config.envoy_response_headers)
        return config, front
    if not config.envoy_config:
        return config, None
    return config, EnvoyFront(
        config.envoy_config,
        config.envoy_reload_interval_ms / 1000,
        headers=config.envoy_response_headers,
    )


async def serve(
    server: ClusterServer,
    front: Any = None,
    stop: asyncio.Event | None = None,
    facts: Mapping[str, Any] | None = None,
    metrics: str | None = None,
) -> None:
    """Start, serve until ``stop`` (the runtime's SIGTERM/SIGINT), then stop cleanly."""
    stop = stop or asyncio.Event()
    try:
        await server.start()
    except OSError as exc:
        if front is not None:
            await front.close()
        await server.stop()
        raise click.ClickException(str(exc)) from None
    runtime.startup_line("cluster", **(facts or {}))
    listener = None
    try:
        if front is not None:
            try:
                await front.start()
            except OSError as exc:
                raise click.ClickException(str(exc)) from None
        runtime.announce(f"smockron cluster: node {server.node.address} serving")
        if metrics:
            try:
                listener = observe(server.node, metrics)
            except ConfigError as exc:
                raise click.ClickException(str(exc)) from None
        await stop.wait()
        if hasattr(front, "stopping"):
            front.stopping()  # envoyproxy/ratelimit's health check fails from SIGTERM on
        await _drain(server.config.graceful_termination_delay_ms / 1000)
    finally:
        log.info("shutting down")
        if listener is not None:
            listener.close()
        if front is not None:
            await front.close()
        await server.stop()


async def _drain(delay: float) -> None:
    """GUBER_GRACEFUL_TERMINATION_DELAY_SEC: keep serving a while after SIGTERM."""
    if delay > 0:
        log.info("graceful termination: serving %.0f s more before stopping", delay)
        await asyncio.sleep(delay)


def reload(server: ClusterServer, front: Any, discovery: Discovery) -> None:
    """SIGHUP: the TLS certificate and key files, the Envoy descriptor files, and the
    peers file."""
    server.reload_tls()
    if front is not None:
        front.reload()
    reload = getattr(discovery, "reload", None)
    if reload is not None:
        reload()
