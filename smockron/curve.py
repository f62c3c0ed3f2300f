"""The control plane's authentication: CURVE keys, the ZAP allow-list, protected binds.

Who holds what (ZeroMQ's CURVE, key files in zmq.auth's certificate format):

* the master, and a router towards its gatekeepers, is the CURVE *server*: its secret
  key proves to every gatekeeper that it is the master, and a ZAP handler
  (:class:`AllowList`) lets in only the gatekeepers whose public key is in a directory;
* a gatekeeper, and a router towards its masters, is a CURVE *client* that pins the
  master's public key: a process that takes the control port without the master's
  secret key completes no handshake, so it feeds the gatekeeper nothing.

Without keys the sockets speak the original protocol unchanged, and the master and the
router bind loopback addresses only unless told ``insecure_bind`` (as Redis' protected
mode): an open control plane is something the operator writes down, not a default.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from smockron.errors import ConfigError
from smockron.ratelog import RateLimitedLog

log = logging.getLogger("smockron.curve")

ZAP_DOMAIN = "smockron"
"""The ZAP domain of every CURVE server socket (ZeroMQ asks the handler only with one)."""


HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
"""Monitor events of a handshake that failed (a wrong key, or no CURVE on the other end)."""

REDIAL_S = 1.0
"""After a failed handshake libzmq gives the connecting socket up for good; a connecting
side dials again this much later, so a process squatting the master's port (or a key
the master allows only later) cannot cut it off until it restarts."""


class InsecureBindError(ConfigError):
    """A master or router asked to bind a non-loopback address with no keys configured."""


@dataclass(frozen=True, slots=True)
class Keypair:
    """A CURVE key pair, each key Z85-encoded (40 bytes) as libzmq takes it."""

    public: bytes
    secret: bytes


def keygen(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write ``NAME.key`` (public) and ``NAME.key_secret`` (secret, mode 0600) in
    ``directory`` (created, mode 0700, when missing); an existing pair is never
    overwritten: a replaced key would lock out whoever holds the old one."""
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"bad key name {name!r}: expected a plain file name such as 'master'")
    folder = Path(directory)
    public, secret = folder / f"{name}.key", folder / f"{name}.key_secret"
    for path in (public, secret):
        if path.exists():
            raise ConfigError(f"{str(path)!r} exists: remove it first to make a new key pair")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        old = os.umask(0o077)  # the secret file is never readable by others, not even briefly
        try:
            zmq.auth.create_certificates(folder, name)
        finally:
            os.umask(old)
        public.chmod(0o644)
        secret.chmod(0o600)
    except OSError as exc:
        raise ConfigError(f"cannot write keys in {str(folder)!r}: {exc.strerror or exc}") from None
    return public, secret


def load_keypair(path: str | Path) -> Keypair:
    """Own keys from a ``.key_secret`` file; warns when others may read it."""
    public, secret = _load(path)
    if secret is None:
        raise ConfigError(f"{str(path)!r} holds no secret key: give the .key_secret file")
    with contextlib.suppress(OSError):
        if stat.S_IMODE(os.stat(path).st_mode) & 0o077:
            log.warning("%s is readable by other users: chmod 600 it", path)
    return Keypair(public, secret)


def load_public(path: str | Path) -> bytes:
    """A peer's public key from its ``.key`` (or ``.key_secret``) file."""
    return _load(path)[0]


def load_allowed(directory: str | Path) -> frozenset[bytes]:
    """Every public key in the ``*.key`` files of ``directory`` (secret files ignored)."""
    try:
        is_dir = Path(directory).is_dir()
    except OSError as exc:  # a parent this user may not enter (a root-only key folder)
        raise ConfigError(f"cannot read public keys in {str(directory)!r}: {exc}") from None
    if not is_dir:
        raise ConfigError(f"{str(directory)!r} is not a directory of public keys (*.key)")
    try:
        return frozenset(zmq.auth.load_certificates(directory))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read public keys in {str(directory)!r}: {exc}") from None


def _load(path: str | Path) -> tuple[bytes, bytes | None]:
    try:  # zmq.auth calls a missing or unreadable file an "Invalid certificate file"
        open(path, "rb").close()
    except FileNotFoundError:
        raise ConfigError(
            f"key file {str(path)!r} does not exist (`smockron keygen` makes one)"
        ) from None
    except OSError as exc:  # a root-only key folder, for a daemon's own user
        raise ConfigError(f"cannot read key file {str(path)!r}: {exc}") from None
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read key file {str(path)!r}: {exc}") from None
    return public, secret


@dataclass(frozen=True, slots=True)
class CurveServer:
    """What a binding side (master, router) needs: its keys and the allow-list folder."""

    keypair: Keypair
    clients: Path

    def secure(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` a CURVE server (before it binds)."""
        sock.curve_server = True
        sock.curve_secretkey = self.keypair.secret
        sock.curve_publickey = self.keypair.public
        sock.zap_domain = ZAP_DOMAIN.encode()

    def allow_list(
        self, context: zmq.Context[Any], on_denied: Callable[[], None] | None = None
    ) -> AllowList:
        """The ZAP handler for ``context``, started: start it before anything binds."""
        auth = AllowList(context, self.clients, on_denied)
        auth.start()
        return auth


@dataclass(frozen=True, slots=True)
class CurveClient:
    """What a connecting side (gatekeeper, router) needs: its keys, the master's key."""

    keypair: Keypair
    server_key: bytes

    def secure(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` a CURVE client pinning the master's key (before it connects)."""
        sock.curve_secretkey = self.keypair.secret
        sock.curve_publickey = self.keypair.public
        sock.curve_serverkey = self.server_key


def _both_or_none(secret: str | Path | None, other: str | Path | None, needs: str) -> bool:
    """Whether CURVE is on: both files given (True), neither (False), else an error."""
    if secret is None and other is None:
        return False
    if secret is None or other is None:
        raise ConfigError(f"CURVE needs both {needs}")
    return True


def curve_server(secret: str | Path | None, clients: str | Path | None) -> CurveServer | None:
    """The master's CURVE from ``--curve-secret`` and ``--curve-clients`` (both or none)."""
    needs = (
        "--curve-secret (this master's .key_secret) and --curve-clients (a directory "
        "of allowed gatekeepers' .key files)"
    )
    if not _both_or_none(secret, clients, needs):
        return None
    assert secret is not None and clients is not None
    load_allowed(clients)  # fails now, not at the first connection
    return CurveServer(load_keypair(secret), Path(clients))


def curve_client(secret: str | Path | None, server: str | Path | None) -> CurveClient | None:
    """A gatekeeper's CURVE from ``--curve-secret`` and ``--curve-server`` (both or none)."""
    needs = (
        "--curve-secret (this gatekeeper's .key_secret) and --curve-server (the "
        "master's public .key)"
    )
    if not _both_or_none(secret, server, needs):
        return None
    assert secret is not None and server is not None
    return CurveClient(load_keypair(secret), load_public(server))


class AllowList(ThreadAuthenticator):
    """pyzmq's ZAP handler (in its own thread) with an allow-list of public keys.

    A denied handshake is counted (``denied``, and ``on_denied``) and logged at most
    once per 10 s with the peer's address escaped, so a scan cannot flood the log."""

    def __init__(
        self,
        context: zmq.Context[Any],
        clients: str | Path,
        on_denied: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(context, log=logging.getLogger("smockron.curve.zap"))
        self.clients = Path(clients)
        self.keys = load_allowed(clients)
        _warn_if_empty(self.clients, self.keys)
        self.denied = 0
        self.on_denied = on_denied
        self._verdict: bool | None = None
        self._denied_log = RateLimitedLog(log, burst=5)
        self.configure_curve_callback(ZAP_DOMAIN, self)

    def callback(self, domain: str, key: bytes) -> bool:
        """zmq.auth's credentials provider: ``key`` (Z85) is allowed."""
        self._verdict = key in self.keys
        return self._verdict

    def reload(self, *sockets: zmq.Socket[Any]) -> int:
        """Read the directory again (SIGHUP); on error the current list stays. Returns
        how many keys are allowed.

        ZAP is asked once per connection, at its handshake, so a removed key would keep
        its open connections. When a key was removed, each of ``sockets`` (the bound
        CURVE server sockets) is therefore unbound and bound again: libzmq closes a
        listener's connections with it, and has no way to close one connection of a PUB
        or SUB. Every gatekeeper is cut; the allowed ones reconnect within libzmq's
        reconnect interval (and RESYNC, as after any reconnection), the revoked one's
        handshake is refused."""
        try:
            keys = load_allowed(self.clients)
        except ConfigError as exc:
            log.error("keeping the current %d allowed key(s): %s", len(self.keys), exc)
            return len(self.keys)
        revoked = self.keys - keys
        self.keys = keys  # before the cut: the reconnections are judged by the new list
        _warn_if_empty(self.clients, keys)
        if revoked and sockets:
            log.warning(
                "%d key(s) revoked: closing every gatekeeper connection; the "
                "allowed ones reconnect",
                len(revoked),
            )
            for sock in sockets:
                rebind(sock)
        return len(keys)

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        """zmq.auth's handler; a request our callback did not allow is a denial (a
        malformed request or another ZAP domain never reaches the callback)."""
        self._verdict = False
        await super().handle_zap_message(msg)
        if not self._verdict:
            self.denied += 1
            if self.on_denied is not None:
                self.on_denied()
            peer = msg[3] if len(msg) > 3 else b"?"
            key = msg[6] if len(msg) > 6 else b""
            self._denied_log.warning(
                "CURVE handshake denied: %s is not an allowed key (peer %s)",
                z85.encode(key).decode() if len(key) == 32 else key[:64],
                peer[:64].decode("utf-8", "replace"),
            )


def _warn_if_empty(clients: Path, keys: frozenset[bytes]) -> None:
    if not keys:
        log.warning("%s holds no public key (*.key): every gatekeeper will be refused", clients)


REBIND_WAIT_S = 2.0
"""How long a rebind retries while the closed listener still holds its port."""


def rebind(sock: zmq.Socket[Any]) -> None:
    """Unbind ``sock``'s endpoint (the last it bound) and bind it again, which closes
    every connection accepted on it. libzmq closes the listener in its I/O thread, so
    the port may still be taken for a moment: the bind is retried for REBIND_WAIT_S."""
    endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    sock.unbind(endpoint)
    deadline = time.monotonic() + REBIND_WAIT_S
    while True:
        try:
            sock.bind(endpoint)
            return
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _tcp_host(endpoint: str) -> str | None:
    """The host of a ``tcp://``, ``ws://`` or ``wss://`` endpoint, brackets removed."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("tcp", "ws", "wss"):
        return None
    hostport = rest.split("/", 1)[0].rpartition(";")[2]  # "eth0;host:port" connects
    host = hostport.rpartition(":")[0] if ":" in hostport else hostport
    return host.strip("[]")


def allow_ipv6(sock: zmq.Socket[Any], *endpoints: str) -> None:
    """Set ZMQ_IPV6 on ``sock`` when one of ``endpoints`` (it will bind or connect) is
    an IPv6 address such as ``tcp://[::1]:10004``: without it libzmq fails to bind one
    ("No such device") and silently never connects to one. Only then: with ZMQ_IPV6 a
    name such as ``localhost`` may resolve to ::1 while the peer listens on 127.0.0.1."""
    for endpoint in endpoints:
        host = _tcp_host(endpoint)
        if host and ":" in host:
            sock.setsockopt(zmq.IPV6, 1)
            return


HEARTBEAT_IVL_MS = 500
HEARTBEAT_TIMEOUT_MS = 2000


def keep_alive(sock: zmq.Socket[Any], *, ttl: bool = True) -> None:
    """ZMTP heartbeats on ``sock``'s connections: a peer that answers nothing for
    ``HEARTBEAT_TIMEOUT_MS`` (a partition: no reset, the TCP connection looks open) is
    dropped and dialled again. Without them such a connection queues what is sent to it
    and delivers it all when the network heals, old, on the same connection. Peers that
    speak an older ZMTP (the original programs' libzmq) are never sent a PING.

    ``ttl``: also tell the peer to drop the connection after that long without hearing
    from us. Never towards a socket that may stop reading (:func:`tcp_keepalive`): a
    master's accounting SUB, a gatekeeper's control SUB. Nor from a master: a peer
    that configured no heartbeats of its own (a load generator, an original gatekeeper)
    keeps its connection to a master that is stopped for a while (a debugger, SIGSTOP)
    as it always did; smockron gatekeepers time a silent master out themselves."""
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    if ttl:
        sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)


KEEPALIVE_IDLE_S = 1
KEEPALIVE_INTVL_S = 1
KEEPALIVE_CNT = 2


def tcp_keepalive(sock: zmq.Socket[Any]) -> None:
    """The kernel's TCP keepalive, not ZMTP heartbeats, on both ends of the control link
    (a master's control PUB, a gatekeeper's control SUB) and on a master's accounting
    SUB: sockets whose reader may be behind, its queue full and its input stopped.
    libzmq 4.3.5 aborts the process (``Assertion failed: _input_stopped``) when a
    connecting socket's connection fails while its input is stopped and it reconnects;
    heartbeats make exactly that happen to a reader that is only behind, as the side
    that is not read from times it out. The kernel answers keepalive probes whether the
    process reads or not, so only a connection that hears nothing at all (a partition,
    a peer gone without a reset) is dropped, after
    ``KEEPALIVE_IDLE_S + KEEPALIVE_INTVL_S * KEEPALIVE_CNT`` seconds; a slow reader
    loses what overflows its queues, which the master's published counts show, and the
    gatekeeper asks for a RESYNC. A gatekeeper's accounting PUB keeps its heartbeats
    (:func:`keep_alive` without TTL): it must see a partitioned master within
    ``HEARTBEAT_TIMEOUT_MS`` to send that master's share to the others, and its own
    input never stops."""
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, KEEPALIVE_IDLE_S)
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, KEEPALIVE_INTVL_S)
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, KEEPALIVE_CNT)


def is_loopback(endpoint: str) -> bool:
    """Whether binding ``endpoint`` is reachable from this host only: ``ipc://`` and
    ``inproc://``, or TCP (or WebSocket) on 127.0.0.0/8, ::1 or ``localhost``. A wildcard,
    an interface name or any other name counts as reachable from the network."""
    scheme, sep, _ = endpoint.partition("://")
    if not sep:
        return False
    if scheme in ("ipc", "inproc"):
        return True
    host = _tcp_host(endpoint)
    if host is None:
        return False  # pgm, epgm, vmci...: network transports
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_mode(
    endpoints: Sequence[str], allowed: int | None, insecure_bind: bool
) -> tuple[int, str]:
    """The startup line (level, text) of a master or router about to bind ``endpoints``
    with CURVE and ``allowed`` gatekeeper keys, or without keys (``allowed`` None).
    Raises :class:`InsecureBindError` for a non-loopback address without keys, unless
    ``insecure_bind``."""
    if allowed is not None:
        plural = "" if allowed == 1 else "s"
        return logging.INFO, f"control plane: CURVE, {allowed} allowed gatekeeper{plural}"
    exposed = [e for e in endpoints if not is_loopback(e)]
    if not exposed:
        return logging.INFO, "control plane: no authentication, loopback only"
    if not insecure_bind:
        raise InsecureBindError(
            f"refusing to bind {', '.join(exposed)} without authentication: give "
            "--curve-secret and --curve-clients (keys from `smockron keygen`), bind a "
            "loopback address such as tcp://127.0.0.1:10004, or pass --insecure-bind"
        )
    return logging.WARNING, (
        f"control plane: NO AUTHENTICATION on {', '.join(exposed)} (--insecure-bind)"
    )
