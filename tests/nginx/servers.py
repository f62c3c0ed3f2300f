"""nginx with smockron's module, as a real process: built once per session, one config
per test (everything on 127.0.0.1, every file under the test's own directory)."""

from __future__ import annotations

import contextlib
import functools
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.gatekeeper.backend import Seen, backend
from tests.support import (
    REPO_ROOT,
    Proc,
    free_ports,
    master_args,
    run_smockron,
    stopping,
    wait_port,
)

CONF = """
load_module {module};
worker_processes {workers};
daemon off;
master_process on;
pid {dir}/nginx.pid;
error_log {dir}/error.log {log_level};
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fcgi; uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
    smockron_master tcp://127.0.0.1:{acc};
    smockron_control tcp://127.0.0.1:{ctl};
{http}
    server {{
        listen 127.0.0.1:{port}{reuseport};
        location = /smockron {{ smockron_stats; }}
        location / {{
            smockron on;
            smockron_domain {domain};
            smockron_identifier $http_x_client;
{location}
            add_header X-Smockron-Decision $smockron_decision always;
            add_header X-Worker $pid always;
            proxy_pass http://127.0.0.1:{upstream};
        }}
    }}
}}
"""


@functools.cache
def module_path() -> Path | None:
    """The module, built against this machine's nginx (None: no nginx-dev to build it)."""
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        return None
    if not Path("/usr/share/nginx/src/conf_flags").exists():
        return None
    out = subprocess.run(
        [str(REPO_ROOT / "scripts" / "build-nginx-module")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, f"the nginx module did not build:\n{out.stderr}"
    return Path(out.stdout.strip().splitlines()[-1])


def require_module() -> Path:
    path = module_path()
    if path is None:
        pytest.skip("nginx and nginx-dev are not installed (scripts/test installs them)")
    return path


def nginx_binary() -> str:
    return shutil.which("nginx") or "/usr/sbin/nginx"


def stats_of(text: str) -> dict[str, int]:
    """The counters of a smockron_stats page."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        out[name.removeprefix("smockron_gatekeeper_")] = int(value)
    return out


@contextlib.contextmanager
def nginx(
    workdir: Path,
    *,
    port: int,
    upstream: int,
    acc: int,
    ctl: int,
    domain: str = "api",
    http: str = "",
    location: str = "",
    workers: int = 1,
    log_level: str = "notice",
) -> Iterator[Proc]:
    """nginx with the module in front of ``upstream``, following the master at
    ``acc``/``ctl``; identified by the X-Client header."""
    module = require_module()
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "nginx.conf"
    conf.write_text(
        CONF.format(
            module=module,
            workers=workers,
            dir=workdir,
            log_level=log_level,
            acc=acc,
            ctl=ctl,
            http=http,
            port=port,
            domain=domain,
            location=location,
            upstream=upstream,
            # several workers: new connections spread over them by their ports
            reuseport=" reuseport" if workers > 1 else "",
        )
    )
    check = subprocess.run(
        [nginx_binary(), "-t", "-q", "-c", str(conf), "-e", str(workdir / "error.log")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr + (workdir / "error.log").read_text()
    proc = Proc(
        [nginx_binary(), "-c", str(conf), "-e", str(workdir / "error.log")], workdir / "nginx.out"
    )
    try:
        wait_port(port)
        yield proc
    finally:
        proc.stop()


@dataclass
class Front:
    """nginx with the module in front of a backend, and a client of that nginx."""

    client: httpx.Client
    nginx: Proc
    seen: Seen
    port: int
    upstream: int

    def stats(self) -> dict[str, int]:
        return stats_of(self.client.get("/smockron").text)


@dataclass
class Gate(Front):
    """A Front that follows a real ``smockron master``."""

    master: Proc
    acc: int
    ctl: int


@contextlib.contextmanager
def front(
    workdir: Path,
    *,
    acc: int,
    ctl: int,
    http: str = "",
    location: str = "",
    workers: int = 1,
) -> Iterator[Front]:
    """A backend and nginx in front of it (its files under ``workdir``), following the
    master at ``acc``/``ctl``; all stopped at the end."""
    (port,) = free_ports(1)
    with (
        backend() as (up, seen),
        nginx(
            workdir,
            port=port,
            upstream=up,
            acc=acc,
            ctl=ctl,
            http=http,
            location=location,
            workers=workers,
        ) as proc,
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client,
    ):
        yield Front(client, proc, seen, port, up)


@contextlib.contextmanager
def gate(
    tmp_path: Path,
    *master_extra: str,
    rules: Sequence[str] = ("api:5/s:5",),
    http: str = "",
    location: str = "",
    workers: int = 1,
) -> Iterator[Gate]:
    """A master with ``rules`` (and ``master_extra`` flags; its log master.log) and a
    front() following it (nginx's files under nginx/), all stopped at the end."""
    acc, ctl = free_ports(2)
    master = run_smockron(
        master_args(acc, ctl, *master_extra, rules=rules), tmp_path / "master.log"
    )
    with (
        stopping([master]),
        front(
            tmp_path / "nginx", acc=acc, ctl=ctl, http=http, location=location, workers=workers
        ) as f,
    ):
        yield Gate(f.client, f.nginx, f.seen, f.port, f.upstream, master, acc, ctl)
