"""The metric names of every daemon but the master and the cluster (whose collectors are
their own: smockron/master/metrics.py, smockron/cluster/). One place, so the names in
docs/monitoring.md can be checked against it."""

from __future__ import annotations

from smockron.observe.collect import Layout

_DECISIONS = {"decisions": ("verdict", ("accepted", "delayed", "rejected"))}

GATEKEEPER = Layout(
    "smockron_gatekeeper",
    gauges=frozenset(
        {
            "waiting",
            "delay_entries",
            "first_lines",
            "master_connected",
            "control_connected",
            "auth_problem",
        }
    ),
    groups=_DECISIONS,
    docs={
        "decisions": "Requests decided, by verdict",
        "control_received": "DELAY_UNTIL messages received from the master",
        "control_malformed": "Malformed control messages or rules offers (ignored)",
        "control_ignored": "Well-formed DELAY_UNTIL for a domain this gatekeeper does not serve",
        "control_refused": "DELAY_UNTIL refused for being too far ahead",
        "control_lost": "DELAY_UNTILs the master published for our domains that never arrived",
        "accounting_sent": "Accounting messages sent to the master",
        "accounting_dropped": "Accounting messages dropped (no master connected, or full queue)",
        "accounting_sampled_out": "Rejections not reported to the master (reject sampling)",
        "rules_received": "Rules offers received from the master",
        "fail_open_errors": "Requests let through because deciding raised an error",
        "bad_requests": "Malformed HTTP requests received",
        "abandoned": "Delayed requests whose client went away during the delay",
        "waiting": "Requests waiting out a delay now",
        "delay_entries": "Identifiers with a pending DELAY_UNTIL",
        "first_lines": "Domains with rules of their own (the first line)",
        "master_connected": "1 while a master is connected to the accounting socket, subscribed",
        "control_connected": "1 while the control socket is connected to a master",
        "handshakes_failed": "Handshakes with the master that failed (no keys here, a wrong key)",
        "auth_problem": "1 while the last handshake with a master failed (see the log's reason)",
        "header_timeouts": "Connections closed for not sending complete request headers in time",
        "connections_evicted": "Idle connections closed to make room at the connection cap",
        "connections_refused": "Connections refused (503) at the cap, every one busy",
    },
)

ROUTER = Layout(
    "smockron_router",
    docs={
        "forwarded": "Accounting messages forwarded to the owning master",
        "relayed": "Control messages relayed from the masters to the gatekeepers",
        "discarded": "Malformed accounting messages (no domain) discarded",
        "denied": "Gatekeeper connections refused by the CURVE allow-list",
        "control_lost": "DELAY_UNTILs a master published that never reached the router",
    },
)

JARL = Layout(
    "smockron_jarl",
    groups={"decisions": ("verdict", ("accepted", "delayed"))},
    docs={
        "decisions": "Connections answered: accepted (0.000) or delayed (told to wait)",
        "accept_errors": "Failures to accept a connection (out of descriptors, ...)",
    },
)

DTHROTTLE = Layout(
    "smockron_dthrottle",
    gauges=frozenset({"open_connections", "buckets", "peers"}),
    groups={"decisions": ("verdict", ("accepted", "refused"))},
    docs={
        "decisions": "Tags answered: accepted (OK) or refused (NO)",
        "connections": "Client connections accepted",
        "open_connections": "Client connections open now",
        "overlong": "Connections closed for a line longer than the tag limit (malformed)",
        "malformed": "Peer report datagrams dropped as malformed",
        "reports_sent": "Reports published to the peers",
        "datagrams_sent": "Report datagrams sent",
        "datagrams_received": "Report datagrams received",
        "parts_applied": "Peer report parts applied",
        "own_echoes": "Own reports received back (multicast loop)",
        "duplicates": "Peer report parts received twice",
        "buckets": "Throttling tags with a bucket now",
        "evicted": "Buckets evicted at max_entries (the fullest of the oldest)",
        "peers": "Peers heard from",
    },
)
