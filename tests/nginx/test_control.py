"""The nginx module against a master the test drives: the control messages it obeys,
the hostile ones it survives, RESYNC, the publish counter, the rules offer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import zmq

from smockron.wire.codec import ACCEPTED, DELAYED, REJECTED, RESYNC
from tests.gatekeeper.conftest import MasterSockets, delayed_by_master, master_sockets, wall_ms
from tests.nginx.servers import front, require_module, stats_of
from tests.support import Proc, wait_for


@pytest.fixture
def master() -> Iterator[MasterSockets]:
    require_module()
    with master_sockets() as m:
        yield m


def ports(m: MasterSockets) -> tuple[int, int]:
    return int(m.accounting_addr.rsplit(":", 1)[1]), int(m.control_addr.rsplit(":", 1)[1])


def stats(client: httpx.Client) -> dict[str, int]:
    return stats_of(client.get("/smockron").text)


def connected(client: httpx.Client, master: MasterSockets) -> None:
    wait_for(lambda: master.accepting() and stats(client)["master_connected"] == 1)
    wait_for(lambda: stats(client)["control_connected"] == 1)


@pytest.fixture
def gate(master: MasterSockets, tmp_path: Path) -> Iterator[tuple[httpx.Client, Proc, Path]]:
    acc, ctl = ports(master)
    with front(
        tmp_path / "nginx",
        acc=acc,
        ctl=ctl,
        location="smockron_max_delay 1s; smockron_status_code 429;\n"
        'smockron_log_info "ua=$http_user_agent";',
    ) as f:
        connected(f.client, master)
        yield f.client, f.nginx, tmp_path / "nginx" / "error.log"


def test_delays_rejects_and_accounts(
    gate: tuple[httpx.Client, Proc, Path], master: MasterSockets
) -> None:
    client, _proc, _log = gate
    master.drain(0.1)
    client.get("/", headers={"x-client": "alice", "user-agent": "ua-test"})
    msg = master.recv()
    assert msg.status == ACCEPTED and msg.identifier == b"alice"
    assert msg.domain == b"api" and msg.loginfo == b"ua=ua-test"
    assert abs(msg.received_ms - wall_ms()) < 1000
    delayed_by_master(client, master)
    # no first line (this master offers no rules): DELAYED when decided, as the original
    delayed = master.recv()
    assert delayed.status == DELAYED and delayed.identifier == b"bob"
    master.publish("api", b"eve", wall_ms() + 1800)
    time.sleep(0.1)
    r = client.get("/", headers={"x-client": "eve", "accept": "application/problem+json"})
    assert r.status_code == 429 and r.headers["retry-after"] == "2"
    assert r.headers["x-smockron-decision"] == "reject"
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json() == {
        "type": "about:blank",
        "title": "Too Many Requests",
        "status": 429,
        "detail": "rate limited: retry after 2 s",
    }
    for accept, json in [("application/json;q=0", False), ("text/html, application/json", True)]:
        r = client.get("/", headers={"x-client": "eve", "accept": accept})
        assert r.status_code == 429
        assert r.headers["content-type"].startswith("application/problem+json") == json
    assert REJECTED in [m.status for m in master.drain(0.2)]
    # a DELAY_UNTIL for another domain is not ours
    master.publish("other", b"alice", wall_ms() + 1800)
    # a long identifier is decided and reported by its digest, as every gatekeeper does
    client.get("/", headers={"x-client": "k" * 2000})
    (long,) = master.drain(0.2)
    assert long.identifier.startswith(b"blake2b:") and len(long.identifier) == 72
    counters = stats(client)
    assert counters['decisions_total{verdict="delayed"}'] == 1
    assert counters["identifiers_hashed_total"] == 1


GARBAGE: list[list[bytes]] = [
    [b"api\0", b"DELAY_UNTIL", b"x", b"not-a-number"],
    [b"api\0"],
    [b"api\0", b"DELAY_UNTIL", b"x", b"1" * 17],
    [b"api\0", b"DELAY_UNTIL", b"x" * 1025, b"1"],
    [b"api\0", b"DELAY_UNTIL", b"x"],
    [b"api\0", b"FLOOD\xff\x00\x1b[31m", b"x", b"1"],
    [b"api\0", b"RESYNCSTART", b"extra"],
    [b"api\0", b"DELAY_UNTIL", *(b"%d" % i for i in range(198))],
    [b"\0smockron\0", b"RULES", b"api", b"history", b"10.0"],
    [b"\0smockron\0", b"RULES", b"api", b"fifo", b"10.0 20"],
    [b"\0smockron\0", b"RULES", b"api", b"history", b"1e12 20"],
    [b"\0smockron\0", b"RULES", b"api", b"history", b"nan 20"],
    [b"\0smockron\0", b"PUBLISHED", b"api", b"-1"],
    [b"\0smockron\0", b"PUBLISHED", b"api", b"1" * 21],
    [b"\0smockron\0", b"WHAT"],
]


def test_garbage_on_the_control_socket_is_counted_logged_once_and_survived(
    gate: tuple[httpx.Client, Proc, Path], master: MasterSockets
) -> None:
    client, proc, log = gate
    for _ in range(50):
        master.publish_raw(GARBAGE[0])
    for frames in GARBAGE[1:]:
        master.publish_raw(frames)
    wait_for(lambda: stats(client)["control_malformed_total"] == 50 + len(GARBAGE) - 1)
    assert client.get("/", headers={"x-client": "alice"}).status_code == 200
    assert proc.alive()
    text = log.read_text(errors="replace")
    lines = [line for line in text.splitlines() if "malformed control message" in line]
    assert len(lines) == 1, lines  # at most one line per 10 s
    assert lines[0].isascii() and "more since the last such line" in lines[0]
    # a DELAY_UNTIL further ahead than a day is refused: nobody blocks a client for ever
    master.publish("api", b"mallory", wall_ms() + 2 * 86_400_000)
    wait_for(lambda: stats(client)["control_refused_total"] == 1)
    assert client.get("/", headers={"x-client": "mallory"}).status_code == 200


def test_escapes_hostile_bytes_in_its_log(master: MasterSockets, tmp_path: Path) -> None:
    acc, ctl = ports(master)
    with front(tmp_path / "n", acc=acc, ctl=ctl) as f:
        client = f.client
        connected(client, master)
        master.publish_raw([b"api\0", b"\x1b[31mEVIL\n\x00\xff", b"x", b"1"])
        wait_for(lambda: stats(client)["control_malformed_total"] == 1)
        (line,) = [
            line
            for line in (tmp_path / "n" / "error.log").read_text().splitlines()
            if "malformed" in line
        ]
        assert "\\x1b[31mEVIL\\x0a\\x00\\xff" in line, line


def test_resync_on_connect_and_after_the_master_returns(
    gate: tuple[httpx.Client, Proc, Path], master: MasterSockets
) -> None:
    client, _proc, _log = gate
    wait_for(lambda: (master.drain(0.05), b"api\0" in master.resyncs)[1], 5)
    # asked again until answered (every 250 ms, 8 times at most), then no more
    first = len(master.resyncs)
    master.publish_raw([b"api\0", b"RESYNCSTART"])
    master.publish("api", b"carol", wall_ms() + 600)
    master.publish_raw([b"api\0", b"RESYNCDONE"])
    wait_for(lambda: stats(client)["control_received_total"] == 1)
    r = client.get("/", headers={"x-client": "carol"})
    assert r.headers["x-smockron-decision"] == "delay"
    master.drain(0.6)
    assert len(master.resyncs) - first <= 1, master.resyncs
    # the master's control socket goes away and comes back: a new RESYNC
    master.pub.close(0)
    wait_for(lambda: stats(client)["control_connected"] == 0)
    master.resyncs.clear()
    master.pub = master.ctx.socket(zmq.PUB)
    master.pub.bind(master.control_addr)
    wait_for(lambda: stats(client)["control_connected"] == 1)
    wait_for(lambda: (master.drain(0.05), b"api\0" in master.resyncs)[1], 5)


def test_publish_counter_shows_a_loss_and_asks_for_a_resync(
    gate: tuple[httpx.Client, Proc, Path], master: MasterSockets
) -> None:
    client, _proc, log = gate
    master.publish_raw([b"api\0", b"RESYNCSTART"])  # stop the connection's own resyncs
    time.sleep(0.3)
    master.drain(0.3)
    master.resyncs.clear()
    master.publish_raw([b"\0smockron\0", b"PUBLISHED", b"api", b"100"])
    for i in range(3):
        master.publish("api", b"id%d" % i, wall_ms() + 5000)
    master.publish_raw([b"\0smockron\0", b"PUBLISHED", b"api", b"110"])
    wait_for(lambda: stats(client)["control_lost_total"] == 7)
    wait_for(lambda: (master.drain(0.05), b"api\0" in master.resyncs)[1], 5)
    assert '7 DELAY_UNTILs for "api" lost' in log.read_text()


def test_rules_offer_sets_the_first_line(
    gate: tuple[httpx.Client, Proc, Path], master: MasterSockets
) -> None:
    client, _proc, _log = gate
    master.publish_raw([b"\0smockron\0", b"RULES", b"api", b"history", b"2.0 3"])
    wait_for(lambda: stats(client)["rules_received_total"] == 1)
    seen = [
        client.get("/", headers={"x-client": "dave"}).headers["x-smockron-decision"]
        for _ in range(5)
    ]
    # three at once (the burst), then one each 500 ms: each waits its turn (max 1 s)
    assert seen[:3] == ["accept"] * 3 and seen[3] == "delay", seen
    statuses = [m.status for m in master.drain(0.6) if m.identifier == b"dave"]
    # with a first line, DELAYED is sent when the request goes, with the time it went
    assert statuses == [{"accept": ACCEPTED, "delay": DELAYED}[x] for x in seen], statuses
    assert RESYNC not in statuses


def test_private_resync_answer(
    gate: tuple[httpx.Client, Proc, Path], master: MasterSockets
) -> None:
    """The first RESYNCs carry a reply topic of the module's own; the master's answer
    there (only this gatekeeper receives it) is applied as on the domain's topic."""
    client, _proc, _log = gate
    reply = None
    deadline = time.monotonic() + 5
    while reply is None and time.monotonic() < deadline:
        if master.sub.poll(100):
            frames = master.sub.recv_multipart()
            if frames[1:2] == [RESYNC] and len(frames) == 3:
                reply = frames[2]
    assert reply is not None and reply.startswith(b"\0smockron-resync\0"), reply
    master.publish_raw([reply, b"RESYNCSTART"])
    master.publish_raw([reply, b"DELAY_UNTIL", b"frank", b"%d" % (wall_ms() + 800)])
    master.publish_raw([reply, b"RESYNCDONE"])
    wait_for(lambda: stats(client)["control_received_total"] == 1)
    r = client.get("/", headers={"x-client": "frank"})
    assert r.headers["x-smockron-decision"] == "delay"
    # answered: no more RESYNCs
    master.drain(0.6)
    master.resyncs.clear()
    master.drain(0.6)
    assert master.resyncs == []
    # someone else's reply topic is not ours: not even received (not subscribed)
    master.publish_raw([b"\0smockron-resync\0other", b"DELAY_UNTIL", b"x", b"1"])
    time.sleep(0.2)
    assert stats(client)["control_malformed_total"] == 0
