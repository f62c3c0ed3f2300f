"""Member-list discovery: hashicorp/memberlist's bytes, and real nodes finding each other.

The expected bytes are written out from memberlist's Go structs (net.go) and the rules of
its encoder (hashicorp/go-msgpack, ``MsgpackHandle{}``): a struct is a map whose keys are
the field names sorted bytewise; strings and ``[]byte`` are old-spec raw strings (fixstr
0xa0|n, else str16 0xda, never str8); a nil ``[]byte`` is nil (0xc0); ``omitempty`` fields
that are empty are left out; unsigned ints take their smallest unsigned form (0xcc, 0xcd,
0xce); a Go ``int`` above 127 is int16 (0xd1), not uint8.
"""

from __future__ import annotations

import asyncio
import json
import random
import struct
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from smockron.cluster.discovery import make_discovery, options_from_env
from smockron.cluster.discovery import memberlist_wire as wire
from smockron.cluster.discovery.base import PeerInfo
from smockron.cluster.discovery.memberlist import MemberListDiscovery
from smockron.cluster.discovery.memberlist_lzw import LzwError, lzw_decode
from tests.support import Proc, free_ports, run_smockron, stopping, wait_for, wait_port


def s(text: str | bytes) -> bytes:
    """A Go string or []byte, as go-msgpack writes it (raw, no str8)."""
    raw = text.encode() if isinstance(text, str) else text
    if len(raw) < 32:
        return bytes([0xA0 | len(raw)]) + raw
    return b"\xda" + struct.pack(">H", len(raw)) + raw


LOCALHOST = bytes([127, 0, 0, 1])


def test_ping_bytes() -> None:
    # type ping struct {SeqNo uint32; Node string; SourceAddr []byte `codec:",omitempty"`;
    #   SourcePort uint16 `codec:",omitempty"`; SourceNode string `codec:",omitempty"`}
    expected = (
        b"\x00\x85"
        + s("Node")
        + s("b")
        + s("SeqNo")
        + b"\x01"
        + s("SourceAddr")
        + s(LOCALHOST)
        + s("SourceNode")
        + s("a")
        + s("SourcePort")
        + b"\xcd\x1f\x0a"  # 7946
    )
    values = {
        "SeqNo": 1,
        "Node": "b",
        "SourceAddr": LOCALHOST,
        "SourcePort": 7946,
        "SourceNode": "a",
    }
    assert wire.encode(wire.PING, "ping", values) == expected
    assert wire.decode("ping", expected[1:]) == values
    # the omitempty fields left out when empty; a SeqNo of 300 as uint16
    bare = wire.encode(wire.PING, "ping", {"SeqNo": 300, "Node": ""})
    assert bare == b"\x00\x82" + s("Node") + s("") + s("SeqNo") + b"\xcd\x01\x2c"


def test_indirect_ping_ack_nack_and_err_bytes() -> None:
    ind = {
        "SeqNo": 70_000,
        "Target": LOCALHOST,
        "Port": 7947,
        "Node": "c",
        "Nack": True,
        "SourceAddr": LOCALHOST,
        "SourcePort": 7946,
        "SourceNode": "a",
    }
    expected = (
        b"\x01\x88"
        + s("Nack")
        + b"\xc3"
        + s("Node")
        + s("c")
        + s("Port")
        + b"\xcd\x1f\x0b"
        + s("SeqNo")
        + b"\xce\x00\x01\x11\x70"
        + s("SourceAddr")
        + s(LOCALHOST)
        + s("SourceNode")
        + s("a")
        + s("SourcePort")
        + b"\xcd\x1f\x0a"
        + s("Target")
        + s(LOCALHOST)
    )
    assert wire.encode(wire.INDIRECT_PING, "indirect_ping", ind) == expected
    assert wire.decode("indirect_ping", expected[1:]) == ind
    # ackResp{SeqNo uint32; Payload []byte}: memberlist acks with a nil payload
    ack = wire.encode(wire.ACK, "ack", {"SeqNo": 5})
    assert ack == b"\x02\x82" + s("Payload") + b"\xc0" + s("SeqNo") + b"\x05"
    assert wire.decode("ack", ack[1:]) == {"SeqNo": 5, "Payload": None}
    assert wire.encode(wire.NACK, "nack", {"SeqNo": 5}) == b"\x0b\x81" + s("SeqNo") + b"\x05"
    err = wire.encode(wire.ERR, "err", {"Error": "boom"})
    assert err == b"\x0d\x81" + s("Error") + s("boom")


def test_alive_suspect_dead_bytes() -> None:
    meta = wire.encode_meta(PeerInfo("10.0.0.1:1051", "10.0.0.1:1050"))
    # Gubernator's json.Marshal(&PeerInfo{...}): its field order, compact
    assert meta == (
        b'{"data-center":"","http-address":"10.0.0.1:1050","grpc-address":"10.0.0.1:1051"}'
    )
    alive = {
        "Incarnation": 2,
        "Node": "node-a",
        "Addr": bytes([10, 0, 0, 1]),
        "Port": 7946,
        "Meta": meta,
        "Vsn": wire.VSN,
    }
    expected = (
        b"\x04\x86"
        + s("Addr")
        + s(bytes([10, 0, 0, 1]))
        + s("Incarnation")
        + b"\x02"
        + s("Meta")
        + b"\xda\x00"
        + bytes([len(meta)])
        + meta  # 81 bytes: str16
        + s("Node")
        + s("node-a")
        + s("Port")
        + b"\xcd\x1f\x0a"
        + s("Vsn")
        + b"\xa6\x01\x02\x02\x00\x00\x00"
    )
    assert wire.encode(wire.ALIVE, "alive", alive) == expected
    assert wire.decode("alive", expected[1:]) == alive
    assert wire.decode_meta(meta) == PeerInfo("10.0.0.1:1051", "10.0.0.1:1050")
    for kind, msg_type, first in (("suspect", wire.SUSPECT, 3), ("dead", wire.DEAD, 5)):
        values = {"Incarnation": 200, "Node": "b", "From": "a"}
        encoded = wire.encode(msg_type, kind, values)
        assert encoded == bytes([first, 0x83]) + s("From") + s("a") + s("Incarnation") + (
            b"\xcc\xc8" + s("Node") + s("b")
        )
        assert wire.decode(kind, encoded[1:]) == values


def test_push_pull_bytes() -> None:
    node = {
        "Name": "a",
        "Addr": LOCALHOST,
        "Port": 7946,
        "Meta": None,
        "Incarnation": 1,
        "State": wire.STATE_LEFT,
        "Vsn": wire.VSN,
    }
    state = wire.PushPull(join=True, nodes=[node] * 200)
    encoded = wire.encode_push_pull(state)
    # pushPullHeader{Nodes int; UserStateLen int; Join bool}: Nodes=200 is a Go int: int16
    header = b"\x06\x83" + s("Join") + b"\xc3" + s("Nodes") + b"\xd1\x00\xc8"
    header += s("UserStateLen") + b"\x00"
    one = (
        b"\x87"
        + s("Addr")
        + s(LOCALHOST)
        + s("Incarnation")
        + b"\x01"
        + s("Meta")
        + b"\xc0"
        + s("Name")
        + s("a")
        + s("Port")
        + b"\xcd\x1f\x0a"
        + s("State")
        + b"\x03"
        + s("Vsn")
        + s(wire.VSN)
    )
    assert encoded == header + one * 200
    kind, decoded = wire.read_stream(encoded)
    assert kind == wire.PUSH_PULL and decoded.join and decoded.nodes == [node] * 200
    with pytest.raises(wire.Truncated):
        wire.read_stream(encoded[:-3])  # a stream reader reads on


def test_compound_crc_and_labels() -> None:
    ping = wire.encode(wire.PING, "ping", {"SeqNo": 1, "Node": "n"})
    ack = wire.encode(wire.ACK, "ack", {"SeqNo": 1})
    compound = wire.make_compound([ping, ack])
    # util.go makeCompoundMessage: type 7, count, big-endian uint16 lengths, messages
    assert compound == b"\x07\x02" + struct.pack(">HH", len(ping), len(ack)) + ping + ack
    assert list(wire.messages(compound)) == [(wire.PING, ping[1:]), (wire.ACK, ack[1:])]
    crc = bytes([wire.HAS_CRC]) + struct.pack(">I", zlib.crc32(compound)) + compound
    assert wire.unwrap_packet(crc) == compound
    with pytest.raises(wire.Malformed, match="checksum"):
        wire.unwrap_packet(crc[:5] + b"\x00" + crc[6:])
    with pytest.raises(wire.Malformed, match="truncated"):
        list(wire.messages(compound[:-2]))
    with pytest.raises(wire.Malformed, match="label"):
        wire.unwrap_packet(bytes([244, 1]) + b"x" + ping)


def lsb_codes(codes: list[int], width: int = 9) -> bytes:
    """Codes packed least significant bit first, as compress/lzw's LSB writer does."""
    bits = sum(code << (i * width) for i, code in enumerate(codes))
    return bits.to_bytes((len(codes) * width + 7) // 8, "little")


def go_lzw(data: bytes) -> bytes:
    """compress/lzw's Writer (LSB, 8-bit literals), line by line from writer.go: the
    reference the decoder is checked against."""
    out = bytearray()
    state = {"bits": 0, "nbits": 0, "width": 9, "hi": 257, "overflow": 512}
    table: dict[int, int] = {}

    def write(code: int) -> None:
        state["bits"] |= code << state["nbits"]
        state["nbits"] += state["width"]
        while state["nbits"] >= 8:
            out.append(state["bits"] & 0xFF)
            state["bits"] >>= 8
            state["nbits"] -= 8

    def inc_hi() -> bool:
        state["hi"] += 1
        if state["hi"] == state["overflow"]:
            state["width"] += 1
            state["overflow"] <<= 1
        if state["hi"] == 4095:
            write(256)
            state.update(width=9, hi=257, overflow=512)
            table.clear()
            return False
        return True

    write(256)
    code = data[0]
    for x in data[1:]:
        key = code << 8 | x
        if key in table:
            code = table[key]
            continue
        write(code)
        code = x
        if inc_hi():
            table[key] = state["hi"]
    write(code)
    inc_hi()
    write(257)
    if state["nbits"]:
        out.append(state["bits"] & 0xFF)
    return bytes(out)


LIMIT = 1 << 20


def test_lzw_as_go_writes_it() -> None:
    # "a": clear, 'a', eof, nine bits each; "aaaa": clear, 'a', 258 ("aa", the code
    # being defined), 'a', eof
    assert lsb_codes([256, 97, 257]) == b"\x00\xc3\x04\x04"
    assert lzw_decode(b"\x00\xc3\x04\x04", LIMIT) == b"a"
    assert go_lzw(b"aaaa") == lsb_codes([256, 97, 258, 97, 257])
    assert lzw_decode(lsb_codes([256, 97, 258, 97, 257]), LIMIT) == b"aaaa"
    rng = random.Random(7)
    for size in (1, 2, 300, 5000, 60_000):  # widths 9 to 12, and the table reset
        data = bytes(
            rng.choice(b"abcdefgh") if size < 5000 else rng.randrange(256) for _ in range(size)
        )
        assert lzw_decode(go_lzw(data), LIMIT) == data
    with pytest.raises(LzwError, match="invalid code"):
        lzw_decode(lsb_codes([256, 97, 300, 257]), LIMIT)
    with pytest.raises(LzwError, match="end of data"):
        lzw_decode(b"\x00", LIMIT)
    bomb = go_lzw(b"a" * 5000)
    with pytest.raises(LzwError, match="larger than limit"):
        lzw_decode(bomb, 4999)
    assert len(lzw_decode(bomb, 5000)) == 5000
    with pytest.raises(wire.Malformed, match="unknown algorithm"):
        wire.decompress({"Algo": 1, "Buf": bomb})


def test_compressed_messages_are_read() -> None:
    """EnableCompression (on in Gubernator): compress{Algo uint8; Buf []byte} around a
    message, in a packet or a stream."""
    values = {
        "Incarnation": 1,
        "Node": "z",
        "Addr": LOCALHOST,
        "Port": 1,
        "Meta": b"{}",
        "Vsn": wire.VSN,
    }
    alive = wire.encode(wire.ALIVE, "alive", values)
    packed = wire.encode(wire.COMPRESS, "compress", {"Algo": 0, "Buf": go_lzw(alive)})
    assert packed.startswith(b"\x09\x82" + s("Algo") + b"\x00" + s("Buf"))
    assert list(wire.messages(packed)) == [(wire.ALIVE, alive[1:])]
    state = wire.encode_push_pull(wire.PushPull(join=False))
    stream = wire.encode(wire.COMPRESS, "compress", {"Algo": 0, "Buf": go_lzw(state)})
    kind, decoded = wire.read_stream(stream)
    assert kind == wire.PUSH_PULL and decoded.nodes == [] and not decoded.join


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00",  # a ping without its struct
        b"\x00\x91\x01",  # an array, not a map
        b"\x00\x81" + s("SeqNo") + s("x"),  # a string where an integer goes
        b"\x04\x81" + s("Node") + b"\xa2\xff\xfe",  # not UTF-8
        b"\x07\x05\x00",  # compound with fewer lengths than it says
        b"\x09\x81" + s("Algo") + b"\x01",  # unknown compression
        b"\x63",  # unknown message type
        b"\x04\x82" + s("Addr") + s(b"\x01\x02\x03") + s("Node") + s("x"),  # 3-byte address
    ],
)
async def test_hostile_packets_are_counted_and_survived(data: bytes) -> None:
    node = MemberListDiscovery(
        PeerInfo("127.0.0.1:1051"), f"127.0.0.1:{free_ports(1)[0]}", node_name="me"
    )
    await node.start(lambda peers: None)
    try:
        node.packet(data, ("127.0.0.1", 9))
        node.packet(wire.encode(wire.PING, "ping", {"SeqNo": 1, "Node": "me"}), ("127.0.0.1", 9))
    finally:
        await node.stop()
    counted = node.metrics.registry.get_sample_value(
        "smockron_discovery_malformed_total", {"mechanism": "member-list"}
    )
    assert counted == 1  # the ping after it was answered, not counted


def test_options_from_gubernators_variables() -> None:
    me = PeerInfo("10.0.0.1:1051", "10.0.0.1:1050")
    env = {
        "GUBER_MEMBERLIST_KNOWN_NODES": "gubernator-0,10.0.0.2:7946",
        "GUBER_MEMBERLIST_NODE_NAME": "pod-1",
    }
    found = options_from_env(env, me)
    assert found == (
        "member-list",
        {
            "advertise": PeerInfo("10.0.0.1:1051", "10.0.0.1:1050", "", ""),
            "address": "10.0.0.1:7946",
            "bind_address": "",
            "known_nodes": ["gubernator-0", "10.0.0.2:7946"],
            "node_name": "pod-1",
        },
    )
    disc = make_discovery(found[0], **found[1])
    assert isinstance(disc, MemberListDiscovery) and disc.name == "pod-1"


async def test_nodes_join_gossip_leave_and_fail() -> None:
    """Three members in one process: each learns the others (the third only through the
    first's gossip), a leaving one is dropped at once, a silent one after suspicion, and
    both are forgotten once news of them has been gossiped long enough."""
    ports = free_ports(3)
    seen: dict[int, list[str]] = {}
    nodes = []
    for i, port in enumerate(ports):
        node = MemberListDiscovery(
            PeerInfo(f"127.0.0.1:{2000 + i}"),
            f"127.0.0.1:{port}",
            node_name=f"n{i}",
            known_nodes=[f"127.0.0.1:{ports[0]}"],
            probe_interval=0.2,
            probe_timeout=0.05,
            gossip_interval=0.02,
            push_pull_interval=5.0,
            gossip_to_the_dead=1.5,
        )

        def record(peers: list[PeerInfo], i: int = i) -> None:
            seen[i] = [p.grpc_address for p in peers]

        await node.start(record)
        nodes.append(node)
    everyone = ["127.0.0.1:2000", "127.0.0.1:2001", "127.0.0.1:2002"]
    try:
        await until(lambda: all(seen.get(i) == everyone for i in range(3)))
        await nodes[2].stop()
        await until(lambda: seen[0] == everyone[:2] and seen[1] == everyone[:2], 2.0)
        assert nodes[0].members["n2"].state == wire.STATE_LEFT
        silent = nodes[1]  # stops answering without leaving
        for task in silent._tasks:
            task.cancel()
        assert silent._udp is not None and silent._tcp is not None
        silent._udp.close()
        silent._tcp.close()
        await until(lambda: seen[0] == everyone[:1], 10.0)
        assert nodes[0].members["n1"].state == wire.STATE_DEAD
        await until(lambda: "n2" not in nodes[0].members, 5.0)  # forgotten once gossiped
    finally:
        await nodes[0].stop()


async def until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def _post(http: int, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{http}{path}", json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def _health(http: int) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/v1/HealthCheck", timeout=5) as resp:
        return json.loads(resp.read())


def test_two_real_nodes_find_each_other_by_gubernators_variables_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``smockron cluster`` processes configured as a Gubernator member-list
    deployment (no GUBER_PEER_DISCOVERY_TYPE): they form one cluster, a limit of 5 admits
    5 hits spread over both nodes, not 5 at each, and a node that stops leaves."""
    g1, h1, m1, g2, h2, m2 = free_ports(6)
    procs: list[Proc] = []
    with stopping(procs):
        for g, h, m, other, name in ((g1, h1, m1, m2, "a"), (g2, h2, m2, m1, "b")):
            for var, value in {
                "GUBER_GRPC_ADDRESS": f"127.0.0.1:{g}",
                "GUBER_HTTP_ADDRESS": f"127.0.0.1:{h}",
                "GUBER_MEMBERLIST_ADDRESS": f"127.0.0.1:{m}",
                "GUBER_MEMBERLIST_KNOWN_NODES": f"127.0.0.1:{other}",
                "GUBER_MEMBERLIST_NODE_NAME": f"node-{name}",
            }.items():
                monkeypatch.setenv(var, value)
            procs.append(run_smockron(["cluster"], tmp_path / f"{name}.log"))
        for port in (h1, h2):
            wait_port(port)
        wait_for(lambda: _health(h1)["peer_count"] == 2 and _health(h2)["peer_count"] == 2)
        item = {"name": "ml", "unique_key": "k", "hits": 1, "limit": 5, "duration": 60_000}
        statuses = [
            _post(http, "/v1/GetRateLimits", {"requests": [item]})["responses"][0].get("status")
            for http in (h1, h2) * 5
        ]
        procs[1].stop()  # SIGTERM: it leaves the member list, and is dropped at once
        wait_for(lambda: _health(h1)["peer_count"] == 1, 5.0)
    assert statuses.count("OVER_LIMIT") == 5, statuses
    assert "member-list" in procs[0].log()


async def test_announced_members_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anyone who can send a packet can announce members: past the bound they are
    refused and counted, not stored."""
    from smockron.cluster.discovery import memberlist_members

    monkeypatch.setattr(memberlist_members, "MAX_MEMBERS", 3)
    node = MemberListDiscovery(
        PeerInfo("127.0.0.1:1051"), f"127.0.0.1:{free_ports(1)[0]}", node_name="me"
    )
    await node.start(lambda peers: None)
    try:
        for i in range(4):
            meta = wire.encode_meta(PeerInfo(f"127.0.0.2:{1000 + i}"))
            alive = {
                "Incarnation": 1,
                "Node": f"n{i}",
                "Addr": bytes([127, 0, 0, 2]),
                "Port": 9,
                "Meta": meta,
                "Vsn": wire.VSN,
            }
            node.packet(wire.encode(wire.ALIVE, "alive", alive), ("127.0.0.2", 9))
    finally:
        await node.stop()
    assert sorted(node.members) == ["me", "n0", "n1"]
    counted = node.metrics.registry.get_sample_value(
        "smockron_discovery_malformed_total", {"mechanism": "member-list"}
    )
    assert counted == 2


# AES-GCM test case 4 of McGrew and Viega's GCM specification (AES-128, with data)
GCM_KEY = bytes.fromhex("feffe9928665731c6d6a8f9467308308")
GCM_NONCE = bytes.fromhex("cafebabefacedbaddecaf888")
GCM_PLAIN = bytes.fromhex(
    "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
    "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39"
)
GCM_DATA = bytes.fromhex("feedfacedeadbeeffeedfacedeadbeefabaddad2")
GCM_SEALED = bytes.fromhex(
    "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e"
    "21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091"
    "5bc94fbc3221a5db94fae95ae7121a47"  # the tag
)


def test_encryption_bytes() -> None:
    """security.go encryptPayload, version 1: version byte, nonce, ciphertext, tag."""
    sealed = wire.encrypt(GCM_KEY, GCM_PLAIN, GCM_DATA, nonce=GCM_NONCE)
    assert sealed == b"\x01" + GCM_NONCE + GCM_SEALED
    other = bytes(16)
    assert wire.decrypt([other, GCM_KEY], sealed, GCM_DATA) == GCM_PLAIN  # every key tried
    with pytest.raises(wire.Malformed, match="no installed keys"):
        wire.decrypt([other], sealed, GCM_DATA)
    with pytest.raises(wire.Malformed, match="no installed keys"):
        wire.decrypt([GCM_KEY], sealed, b"other data")
    # version 0: the message PKCS7-padded to 16 bytes before sealing
    padded = GCM_PLAIN + bytes([4]) * 4
    v0 = b"\x00" + GCM_NONCE + AESGCM(GCM_KEY).encrypt(GCM_NONCE, padded, b"")
    assert wire.decrypt([GCM_KEY], v0) == GCM_PLAIN
    # a stream: type 10, the sealed length (big-endian uint32), authenticated with the payload
    stream = wire.encrypt_stream(GCM_KEY, wire.encode_push_pull(wire.PushPull(join=True)))
    assert stream[:5] == b"\x0a" + struct.pack(">I", len(stream) - 5)
    kind, state = wire.read_stream(stream, [GCM_KEY])
    assert kind == wire.PUSH_PULL and state.join
    with pytest.raises(wire.Malformed, match="not encrypted"):
        wire.read_stream(wire.encode_push_pull(wire.PushPull(join=True)), [GCM_KEY])
    with pytest.raises(wire.Malformed, match="encryption is not configured"):
        wire.read_stream(stream)
    with pytest.raises(wire.Malformed, match="no installed keys"):
        wire.read_stream(stream[:-1] + bytes([stream[-1] ^ 1]), [GCM_KEY])  # a bad tag


async def test_encrypted_members_meet_and_keep_others_out() -> None:
    key = "MDEyMzQ1Njc4OWFiY2RlZg=="  # GUBER_MEMBERLIST_SECRET_KEYS, base64
    ports = free_ports(3)
    seen: dict[int, list[str]] = {}
    nodes = []
    for i, (port, keys) in enumerate(zip(ports, ([key], [key], []), strict=True)):
        node = MemberListDiscovery(
            PeerInfo(f"127.0.0.1:{3000 + i}"),
            f"127.0.0.1:{port}",
            node_name=f"e{i}",
            known_nodes=[f"127.0.0.1:{ports[0]}"],
            secret_keys=keys,
            probe_interval=0.2,
            probe_timeout=0.05,
            gossip_interval=0.02,
        )

        def record(peers: list[PeerInfo], i: int = i) -> None:
            seen[i] = [p.grpc_address for p in peers]

        await node.start(record)
        nodes.append(node)
    try:
        both = ["127.0.0.1:3000", "127.0.0.1:3001"]
        await until(lambda: seen.get(0) == both and seen.get(1) == both)
        await asyncio.sleep(0.3)  # pings went both ways, encrypted
        assert seen[0] == both and seen[2] == ["127.0.0.1:3002"]  # no key: kept out
        refused = nodes[0].metrics.registry.get_sample_value(
            "smockron_discovery_malformed_total", {"mechanism": "member-list"}
        )
        assert refused is not None and refused >= 1  # its plaintext join, counted
    finally:
        for node in nodes:
            await node.stop()


async def test_a_bad_entry_in_a_push_pull_spoils_only_itself() -> None:
    node = MemberListDiscovery(
        PeerInfo("127.0.0.1:1051"), f"127.0.0.1:{free_ports(1)[0]}", node_name="me"
    )
    await node.start(lambda peers: None)
    good = {
        "Name": "ok",
        "Addr": bytes([127, 0, 0, 3]),
        "Port": 9,
        "Incarnation": 1,
        "Meta": wire.encode_meta(PeerInfo("127.0.0.3:1051")),
        "State": wire.STATE_ALIVE,
        "Vsn": wire.VSN,
    }
    bad = {**good, "Name": "bad", "Addr": b"\x01\x02"}  # a 2-byte address
    try:
        node._merge([bad, good])
    finally:
        await node.stop()
    assert sorted(node.members) == ["me", "ok"]


async def test_a_second_node_with_a_taken_name_is_ignored_until_the_first_has_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    node = MemberListDiscovery(
        PeerInfo("127.0.0.1:1051"), f"127.0.0.1:{free_ports(1)[0]}", node_name="me"
    )
    await node.start(lambda peers: None)

    def alive(incarnation: int, last_octet: int) -> dict[str, object]:
        return {
            "Incarnation": incarnation,
            "Node": "twin",
            "Port": 9,
            "Vsn": wire.VSN,
            "Addr": bytes([127, 0, 0, last_octet]),
            "Meta": wire.encode_meta(PeerInfo(f"127.0.0.{last_octet}:1051")),
        }

    try:
        node.packet(wire.encode(wire.ALIVE, "alive", alive(1, 4)), ("127.0.0.4", 9))
        node.packet(wire.encode(wire.ALIVE, "alive", alive(5, 5)), ("127.0.0.5", 9))
        first = node.members["twin"]
        assert (first.addr, first.incarnation) == (bytes([127, 0, 0, 4]), 1)
        assert "two nodes are named twin" in caplog.text
        first.state = wire.STATE_LEFT  # the first one left: the name is free again
        node.packet(wire.encode(wire.ALIVE, "alive", alive(1, 5)), ("127.0.0.5", 9))
    finally:
        await node.stop()
    moved = node.members["twin"]
    assert (moved.addr, moved.state) == (bytes([127, 0, 0, 5]), wire.STATE_ALIVE)
