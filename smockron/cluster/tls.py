"""TLS for a cluster node, as Gubernator's tls.go sets it up from GUBER_TLS_*.

``load`` reads the files of a ``ClusterConfig`` (generating a CA and a server certificate
when GUBER_TLS_AUTO asks for them) into ``TLSMaterial``: PEM bytes that every transport
turns into its own credentials. The server certificate is also what this node shows its
peers when they ask for a client certificate, unless GUBER_TLS_CLIENT_AUTH_CERT/KEY name
another one (as upstream).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import ssl
import tempfile
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import Counter

from smockron.cluster import san
from smockron.cluster.config import ClusterConfig
from smockron.errors import ConfigError
from smockron.ratelog import RateLimitedLog
from smockron.settings import WILDCARD_HOSTS

log = logging.getLogger("smockron.cluster")

REQUIRE_MODES = ("require-any-cert", "require-and-verify")
VERIFY_MODES = ("verify-cert", "require-and-verify")
# GUBER_TLS_CLIENT_AUTH -> grpc_ssl_client_certificate_request_type (grpc_security_constants.h)
NATIVE_CLIENT_AUTH = {
    "": 0,  # GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
    "request-cert": 1,  # ..._REQUEST_CLIENT_CERTIFICATE_BUT_DONT_VERIFY
    "verify-cert": 2,  # ..._REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
    "require-any-cert": 3,  # ..._REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_BUT_DONT_VERIFY
    "require-and-verify": 4,  # ..._REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
}


MIN_VERSIONS = {
    "1.0": ssl.TLSVersion.TLSv1,
    "1.1": ssl.TLSVersion.TLSv1_1,
    "1.2": ssl.TLSVersion.TLSv1_2,
    "1.3": ssl.TLSVersion.TLSv1_3,
}


@dataclass(frozen=True, slots=True)
class TLSMaterial:
    cert: bytes
    key: bytes
    ca: bytes | None
    """Trusted CA: peers' server certificates are checked against it (system roots if None)."""
    client_auth: str
    client_ca: bytes | None
    """CA that client certificates must chain to, when ``client_auth`` verifies them."""
    client_cert: bytes
    client_key: bytes
    server_name: str
    skip_verify: bool
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
    """Least TLS version of the HTTP gateway (GUBER_TLS_MIN_VERSION; upstream's 1.3)."""

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca,
            private_key=self.client_key,
            certificate_chain=self.client_cert,
        )

    def channel_options(self) -> list[tuple[str, Any]]:
        if self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name)]
        return []

    def http_context(self, client_auth: bool = True) -> ssl.SSLContext:
        """The HTTP gateway's context: verify-cert/request-cert check a certificate that is
        shown; the require modes refuse a connection without one. Without ``client_auth``
        (the status listener) no certificate is asked for."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = self.min_version
        self.load_into(context, client_auth)
        return context

    def load_into(self, context: ssl.SSLContext, client_auth: bool = True) -> None:
        """Put the certificate (and the client CA) into ``context``; later handshakes use
        them, which is how a reload reaches the HTTP gateway."""
        with tempfile.TemporaryDirectory(prefix="smockron-tls-") as tmp:
            cert, key = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
            cert.write_bytes(self.cert)
            key.touch(0o600)
            key.write_bytes(self.key)
            context.load_cert_chain(cert, key)
        if client_auth and self.client_auth and self.client_ca:
            context.load_verify_locations(cadata=self.client_ca.decode())
            required = self.client_auth in REQUIRE_MODES
            context.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL


class ServerCertificates:
    """The gRPC credentials of the grpc.server/grpc.aio transports, which take a new
    certificate at the next handshake after ``update``. They can require and verify a
    client certificate or not ask for one: request-cert and verify-cert do not ask."""

    def __init__(self, material: TLSMaterial) -> None:
        self._material = material
        self._changed = False
        self._lock = threading.Lock()

    def credentials(self) -> grpc.ServerCredentials:
        require = self._material.client_auth in REQUIRE_MODES
        # the fetcher returns None for "no change", as grpc documents (not its stubs)
        return grpc.dynamic_ssl_server_credentials(
            self._configuration(self._material),
            self._fetch,  # type: ignore[arg-type]
            require,
        )

    def update(self, material: TLSMaterial) -> None:
        with self._lock:
            self._material, self._changed = material, True

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            if not self._changed:
                return None
            self._changed = False
            return self._configuration(self._material)

    @staticmethod
    def _configuration(material: TLSMaterial) -> grpc.ServerCertificateConfiguration:
        require = material.client_auth in REQUIRE_MODES
        return grpc.ssl_server_certificate_configuration(
            [(material.key, material.cert)], material.client_ca if require else None
        )


class CertDir:
    """The native server's certificate files: libgrpc++ watches them (every second), and
    ``write`` replaces them all at once (a new directory, then the ``current`` link)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="smockron-tls-"))
        self._generation = 0

    def write(self, material: TLSMaterial) -> tuple[str, str, str | None]:
        """Key, certificate and client CA paths (the CA None without client auth)."""
        self._generation += 1
        target = self.root / f"gen-{self._generation}"
        target.mkdir(mode=0o700)
        (target / "key.pem").touch(0o600)
        (target / "key.pem").write_bytes(material.key)
        (target / "cert.pem").write_bytes(material.cert)
        (target / "ca.pem").write_bytes(material.client_ca or b"")
        link = self.root / "current.new"
        link.unlink(missing_ok=True)
        link.symlink_to(target.name)
        link.replace(self.root / "current")
        shutil.rmtree(self.root / f"gen-{self._generation - 2}", ignore_errors=True)
        current = self.root / "current"
        ca = str(current / "ca.pem") if material.client_auth and material.client_ca else None
        return str(current / "key.pem"), str(current / "cert.pem"), ca

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _read(path: str, what: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"while reading {what} '{path}': {exc.strerror}") from None


def load(config: ClusterConfig) -> TLSMaterial | None:
    """The node's TLS material, or None when TLS is off."""
    if not config.tls:
        return None
    log.info("Detected TLS Configuration")
    ca = _read(config.tls_ca, "GUBER_TLS_CA")
    ca_key = _read(config.tls_ca_key, "GUBER_TLS_CA_KEY")
    cert = _read(config.tls_cert, "GUBER_TLS_CERT")
    key = _read(config.tls_key, "GUBER_TLS_KEY")
    if config.tls_auto:
        log.info("AutoTLS Enabled")
        cert, key, ca = _auto(config, cert, key, ca, ca_key)
    assert cert is not None and key is not None  # validate() saw to it
    client_cert = _read(config.tls_client_auth_cert, "GUBER_TLS_CLIENT_AUTH_CERT")
    client_key = _read(config.tls_client_auth_key, "GUBER_TLS_CLIENT_AUTH_KEY")
    if client_cert is None or client_key is None:
        client_cert, client_key = cert, key
    client_ca = _read(config.tls_client_auth_ca_cert, "GUBER_TLS_CLIENT_AUTH_CA_CERT") or ca
    material = TLSMaterial(
        cert=cert,
        key=key,
        ca=ca,
        client_auth=config.tls_client_auth,
        client_ca=client_ca,
        client_cert=client_cert,
        client_key=client_key,
        server_name=config.tls_client_auth_server_name,
        skip_verify=config.tls_insecure_skip_verify,
        min_version=MIN_VERSIONS[config.tls_min_version],
    )
    _check(material)
    if material.skip_verify:
        log.warning(
            "GUBER_TLS_INSECURE_SKIP_VERIFY: peer calls still verify the peers' "
            "certificates (gRPC's Python client cannot skip it); give every node "
            "the same GUBER_TLS_CA"
        )
    return material


def _auto(
    config: ClusterConfig,
    cert: bytes | None,
    key: bytes | None,
    ca: bytes | None,
    ca_key: bytes | None,
) -> tuple[bytes, bytes, bytes]:
    """GUBER_TLS_AUTO: a CA unless one was given with its key, a server certificate
    unless one was given; (cert, key, CA)."""
    try:
        from smockron.cluster import tlsgen
    except ImportError:
        raise ConfigError(
            "GUBER_TLS_AUTO needs the cryptography package (pip install 'smockron[cluster]')"
        ) from None
    try:
        if ca is None or ca_key is None:
            log.info("Generating CA Certificates....")
            ca, ca_key = tlsgen.make_ca()
        if cert is None or key is None:
            log.info("Generating Server Private Key and Certificate....")
            log.info("Cert names: (%s)", ",".join(names(config)))
            cert, key = tlsgen.make_cert(ca, ca_key, names(config))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"while generating self signed server certs: {exc}") from None
    return cert, key, ca


def _check(material: TLSMaterial) -> None:
    """A bad certificate or key stops the command at start, naming the problem."""
    try:
        material.http_context()
    except ssl.SSLError as exc:
        raise ConfigError(f"while parsing server certificate and private key: {exc}") from None


def names(config: ClusterConfig) -> list[str]:
    """DNS names and IPs an auto-generated certificate is valid for: localhost, 127.0.0.1,
    this host's name and address, and the hosts of the gRPC and advertise addresses."""
    found = ["localhost", "127.0.0.1", socket.gethostname()]
    for address in (config.grpc_address, config.advertise, config.http_address):
        host = address.rpartition(":")[0].strip("[]")
        if host not in WILDCARD_HOSTS:
            found.append(host)
    with contextlib.suppress(OSError):
        found.append(socket.gethostbyname(socket.gethostname()))
    return list(dict.fromkeys(found))


REFUSED = "tls: bad certificate"
"""What a client refused for GRPC_CLIENT_TLS_SAN is told (with UNAVAILABLE): upstream's
handshake ends with that alert, and the reason is only logged on the server."""

_Behavior = Callable[[Any, Any], Any]


class ClientSanCheck:
    """GRPC_CLIENT_TLS_SAN (envoyproxy/ratelimit): a client certificate the gRPC port
    verified must also be valid for this name (``san.mismatch``), or the client is refused.

    The native server asks ``verify`` once per connection, in the handshake, as upstream
    does. ``grpc.server`` and ``grpc.aio`` have no such hook, so their ``interceptor``
    asks the call's auth context on every call and ends a refused one with UNAVAILABLE,
    the code a client of a refused handshake gets. Either way a refusal is counted and
    logged (rate-limited) with Go's reason."""

    def __init__(
        self, wanted: str | tuple[str, ...], refused: Counter, required: bool = True
    ) -> None:
        """``wanted``: the name, or names of which the certificate must carry one (the
        peer listener's ``peer_tls_names``); ``required``: client certificates are
        required (not only verified when shown)."""
        self.names = (wanted,) if isinstance(wanted, str) else wanted
        self.wanted = ", ".join(self.names)
        self.required = required
        self._refused = refused
        self._log = RateLimitedLog(log)
        self._guarded: dict[Any, Any] = {}

    def verify(self, dns_names: list[str], ip_names: list[str]) -> str | None:
        """None when a certificate with these SANs may connect; else why not."""
        error = None
        for name in self.names:
            error = san.mismatch(name, dns_names, ip_names)
            if error is None:
                break
        if error is not None:
            self._refused.inc()
            self._log.warning("error validating client: %s", error)
        return error

    def refuses(self, context: grpc.ServicerContext | grpc.aio.ServicerContext[Any, Any]) -> bool:
        """Is this call's client certificate without the name? (No certificate is
        refused too: the transports that ask here require one.)"""
        auth = context.auth_context()
        dns, ips = ([_text(v) for v in auth.get(k, ())] for k in ("peer_dns", "peer_ip"))
        return self.verify(dns, ips) is not None

    def interceptor(self, aio: bool) -> Any:
        """The server interceptor of ``grpc.server`` (or of ``grpc.aio.server``); None
        when certificates are not required, as these servers then ask for none (and a
        client that shows none passes upstream's check too)."""
        if not self.required:
            return None
        return _AioSanInterceptor(self) if aio else _SanInterceptor(self)

    def guard(self, handler: Any, aio: bool) -> Any:
        """``handler`` with every behavior refusing calls that ``refuses``."""
        key = (handler, aio)
        guarded = self._guarded.get(key)
        if guarded is None:
            wrap = self._wrap_aio if aio else self._wrap
            guarded = handler._replace(
                **{kind: wrap(kind, getattr(handler, kind)) for kind in _KINDS}
            )
            if len(self._guarded) < 1024:
                self._guarded[key] = guarded
        return guarded

    def _wrap(self, kind: str, behavior: _Behavior | None) -> _Behavior | None:
        if behavior is None:
            return None
        inner = behavior

        def call(request: Any, context: grpc.ServicerContext) -> Any:
            if self.refuses(context):
                context.abort(grpc.StatusCode.UNAVAILABLE, REFUSED)
            return inner(request, context)

        return call

    def _wrap_aio(self, kind: str, behavior: _Behavior | None) -> _Behavior | None:
        if behavior is None:
            return None
        inner = behavior

        if kind.endswith("_stream"):  # an async generator of responses

            async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                if self.refuses(context):
                    await context.abort(grpc.StatusCode.UNAVAILABLE, REFUSED)
                async for response in inner(request, context):
                    yield response

            return stream

        async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if self.refuses(context):
                await context.abort(grpc.StatusCode.UNAVAILABLE, REFUSED)
            result = inner(request, context)
            return await result if isinstance(result, Awaitable) else result

        return call


_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def _text(value: bytes | int) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


class _SanInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, check: ClientSanCheck) -> None:
        self._check = check

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = continuation(details)
        return None if handler is None else self._check.guard(handler, aio=False)


class _AioSanInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, check: ClientSanCheck) -> None:
        self._check = check

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        return None if handler is None else self._check.guard(handler, aio=True)


def peer_names_check(
    config: ClusterConfig, material: TLSMaterial | None, refused: Counter
) -> ClientSanCheck | None:
    """The peer listener's ``peer_tls_names`` check, or None: a peer's client certificate
    must carry one of the names. Only certificates the handshake required and verified
    can be checked; with another GUBER_TLS_CLIENT_AUTH mode the names are refused at
    start, as a check that does not happen must not look configured."""
    names = tuple(n.strip() for n in config.peer_tls_names.split(",") if n.strip())
    if not names:
        return None
    if material is None or material.client_auth != "require-and-verify":
        raise ConfigError(
            "peer_tls_names needs TLS with GUBER_TLS_CLIENT_AUTH="
            "require-and-verify (peers' certificates verified by the CA)"
        )
    return ClientSanCheck(names, refused, required=True)


def client_san_check(
    config: ClusterConfig, material: TLSMaterial | None, refused: Counter
) -> ClientSanCheck | None:
    """The gRPC port's GRPC_CLIENT_TLS_SAN check, or None. As upstream, the name is
    looked for only in certificates the handshake verified: with another
    GUBER_TLS_CLIENT_AUTH mode it has nothing to check, and says so."""
    if not config.tls_client_san or material is None:
        return None
    if material.client_auth not in VERIFY_MODES:
        log.warning(
            "GRPC_CLIENT_TLS_SAN=%s is not checked: client certificates are not "
            "verified (GUBER_TLS_CLIENT_AUTH=%s)",
            config.tls_client_san,
            material.client_auth or "none",
        )
        return None
    return ClientSanCheck(config.tls_client_san, refused, material.client_auth in REQUIRE_MODES)
