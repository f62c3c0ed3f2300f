"""The deployment files in deploy/ and the user docs, checked by the tools made for them.

- Kubernetes manifests: ``kubernetes-validate`` (the Kubernetes OpenAPI schemas, shipped in
  the package, strict: unknown fields are errors), plus what the cluster's Kubernetes
  discovery needs (RBAC on EndpointSlices, a headless Service, the GUBER_* variables).
- Grafana dashboard: its structure, and every metric it queries exists in smockron's code.
- systemd units: ``systemd-analyze verify`` (skipped where systemd-analyze is missing).
- Dockerfile: built with ``docker build`` where a Docker daemon answers (skipped otherwise,
  with the reason); its shape, and what its RUN and COPY lines check, everywhere.
- Prometheus: ``promtool check config`` / ``check rules`` where promtool is installed, else
  a structure check of the YAML.
- The example config files start the real daemons; README's commands parse.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from smockron import compiled
from smockron.curve import keygen
from tests.support import (
    REPO_ROOT,
    free_ports,
    port_open,
    smockron_env,
    smockron_proc,
    smockron_run,
    wait_for,
    wait_port,
)

DEPLOY = REPO_ROOT / "deploy"
DOCS = REPO_ROOT / "docs"
K8S_VERSION = "1.30"


def k8s_documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return docs


K8S = k8s_documents()


def by_kind(kind: str, name: str) -> dict[str, Any]:
    return next(d for _, d in K8S if d["kind"] == kind and d["metadata"]["name"] == name)


# ---------------------------------------------------------------- Kubernetes


@pytest.mark.parametrize("doc", [d for _, d in K8S], ids=[i for i, _ in K8S])
def test_kubernetes_manifest_is_valid(doc: dict[str, Any]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kubernetes_validator_catches_a_wrong_field() -> None:
    """The check above can fail: a misspelt field in a container is refused."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    broken = json.loads(json.dumps(by_kind("Deployment", "smockron-master")))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def smockron_containers() -> Iterator[tuple[str, dict[str, Any]]]:
    for ident, doc in K8S:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                if container["image"].startswith("smockron"):
                    yield ident, container


def test_every_smockron_container_is_probed_on_its_health_endpoints() -> None:
    seen = 0
    for ident, container in smockron_containers():
        seen += 1
        ports = {p["name"] for p in container["ports"]}
        live = container["livenessProbe"]["httpGet"]
        assert live["path"] == "/healthz", ident
        assert live["port"] in ports, ident
        ready = container.get("readinessProbe")
        if ready is not None:  # the proxy sidecar fails open: see docs/deployment.md
            assert ready["httpGet"]["path"] == "/readyz", ident
            assert ready["httpGet"]["port"] in ports, ident
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, ident
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, ident
    assert seen == 4
    for name in ("smockron-master",):
        container = by_kind("Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_master_fleet_is_a_statefulset_whose_pods_find_each_other(tmp_path: Path) -> None:
    """The fleet manifest: each pod's own settings (its config map's file with its
    --advertise) name the other two as peers; a disruption takes one master at a time."""
    from smockron.master.config import load_settings

    fleet = by_kind("StatefulSet", "smockron-master-fleet")
    assert fleet["spec"]["replicas"] == 3
    pdb = by_kind("PodDisruptionBudget", "smockron-master-fleet")
    assert pdb["spec"]["maxUnavailable"] == 1
    config = by_kind("ConfigMap", "smockron-master-fleet")["data"]["master.toml"]
    (tmp_path / "master.toml").write_text(config)
    args = fleet["spec"]["template"]["spec"]["containers"][0]["args"]
    advertise = args[args.index("--advertise") + 1]
    for pod in range(3):
        name = f"smockron-master-fleet-{pod}"
        settings = load_settings(
            tmp_path / "master.toml",
            overrides={"advertise": advertise.replace("$(POD_NAME)", name), "insecure_bind": True},
        )
        assert len(settings.peers) == 2 and not any(name + "." in p for p in settings.peers)


def test_master_runs_alone() -> None:
    """Two masters behind one Service would split a domain's accounting between them."""
    spec = by_kind("Deployment", "smockron-master")["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"]["type"] == "Recreate"


def resolved_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment with fieldRefs filled in and $(VAR) expanded, as the
    kubelet would (a made-up pod IP and namespace)."""
    fields = {"status.podIP": "10.1.2.3", "metadata.namespace": "rate"}
    env: dict[str, str] = {}
    for var in container["env"]:
        if "valueFrom" in var:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], var["value"])
    return env


def test_cluster_statefulset_has_what_kubernetes_discovery_needs() -> None:
    from smockron.cluster.discovery import PeerInfo, options_from_env

    sts = by_kind("StatefulSet", "smockron-cluster")
    pod = sts["spec"]["template"]["spec"]
    env = resolved_env(pod["containers"][0])
    found = options_from_env(env, PeerInfo(env["GUBER_ADVERTISE_ADDRESS"]))
    assert found is not None
    kind, options = found
    assert kind == "k8s"
    assert options["namespace"] == "rate"
    assert options["pod_ip"] == "10.1.2.3"
    assert env["GUBER_ADVERTISE_ADDRESS"] == "10.1.2.3:1051"

    # The service name is the headless Service whose EndpointSlices list the pods.
    headless = by_kind("Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert options["service_name"] == headless["metadata"]["name"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert headless["spec"]["selector"].items() <= labels.items()

    # The pod's service account may list and watch EndpointSlices in its namespace.
    account = pod["serviceAccountName"]
    binding = next(
        d
        for _, d in K8S
        if d["kind"] == "RoleBinding"
        and {"kind": "ServiceAccount", "name": account} in d["subjects"]
    )
    role = by_kind("Role", binding["roleRef"]["name"])
    assert any(
        "discovery.k8s.io" in rule["apiGroups"]
        and "endpointslices" in rule["resources"]
        and {"list", "watch"} <= set(rule["verbs"])
        for rule in role["rules"]
    )


def test_proxy_sidecar_forwards_to_its_app_and_reports_to_the_master_service() -> None:
    config = tomllib_loads(by_kind("ConfigMap", "api-smockron-proxy")["data"]["proxy.toml"])
    master = by_kind("Service", "smockron-master")
    ports = {p["name"]: p["port"] for p in master["spec"]["ports"]}
    name = master["metadata"]["name"]
    assert config["accounting"] == f"tcp://{name}:{ports['accounting']}"
    assert config["control"] == f"tcp://{name}:{ports['control']}"
    app = by_kind("Deployment", "api")["spec"]["template"]["spec"]["containers"][0]
    assert "9000" in app["command"] and config["upstream"] == "http://127.0.0.1:9000"
    assert_keys_are_options("proxy", config)


# ---------------------------------------------------------------- metric names

SOURCES = {p: p.read_text() for p in (REPO_ROOT / "smockron").rglob("*.py")}
METRIC = re.compile(r"\b((?:smockron|ratelimit_service)_[a-z0-9_]+)")
SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def defined_in_source(metric: str) -> bool:
    """The name, less a Prometheus suffix, is a literal in smockron's code, or is made there
    from a literal prefix and a quoted key in the same module (``f"prefix_{key}"``, or a
    ``Layout("prefix", ...)`` with ``"key"``), or a counter class's field of that name."""
    bases = {metric} | {metric[: -len(s)] for s in SUFFIXES if metric.endswith(s)}
    for text in SOURCES.values():
        for base in bases:
            if base in text:
                return True
            parts = base.split("_")
            for i in range(2, len(parts)):
                prefix, key = "_".join(parts[:i]), "_".join(parts[i:])
                made = f'"{prefix}"' in text or f'"{prefix}_{{' in text
                field = f"\n    {key}: int" in text  # a counter class's field, named by it
                if made and (f'"{key}"' in text or field):
                    return True
    return False


# Metrics of daemons whose exporters come with the observability work: checked strictly
# as soon as the code exports anything under the prefix.
def prefix_in_source(metric: str) -> bool:
    prefix = "_".join(metric.split("_")[:2])
    return any(f'"{prefix}' in text for text in SOURCES.values())


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DEPLOY / "grafana" / "smockron-dashboard.json").read_text())
    return data


def dashboard_metrics() -> list[str]:
    names = set()
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            names.update(METRIC.findall(target["expr"]))
    return sorted(names)


def rule_metrics() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "smockron-rules.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    return sorted({m for e in exprs for m in METRIC.findall(e)})


def test_dashboard_structure() -> None:
    dash = dashboard()
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(graphs) >= 15
    for panel in graphs:
        assert panel["type"] == "timeseries" and panel["title"], panel
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
    # panels do not overlap
    cells = set()
    for panel in dash["panels"]:
        g = panel["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, panel["title"]
                cells.add((x, y))


@pytest.mark.parametrize("metric", sorted(set(dashboard_metrics()) | set(rule_metrics())))
def test_dashboard_and_alert_metrics_exist_in_the_code(metric: str) -> None:
    if not defined_in_source(metric) and not prefix_in_source(metric):
        pytest.skip(f"{metric}: this build exports no {metric.split('_')[1]} metrics yet")
    assert defined_in_source(metric), f"{metric} is queried but smockron does not export it"


def test_metric_check_can_fail() -> None:
    assert defined_in_source("smockron_master_messages_total")
    assert defined_in_source("smockron_cluster_request_duration_seconds_bucket")
    assert defined_in_source("ratelimit_service_rate_limit_over_limit_total")
    assert not defined_in_source("smockron_master_messagez_total")
    assert not defined_in_source("smockron_cluster_checkz_total")


# ---------------------------------------------------------------- systemd

UNITS = sorted((DEPLOY / "systemd").glob("*.service"))


def smockron_executable() -> str:
    candidate = Path(sys.executable).parent / "smockron"
    return str(candidate if candidate.exists() else sys.executable)


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_systemd_unit_is_hardened(unit: Path) -> None:
    text = unit.read_text()
    for line in (
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "Restart=on-failure",
        "CapabilityBoundingSet=\n",
        "ExecStart=/opt/smockron/bin/smockron ",
    ):
        assert line in text, f"{unit.name}: {line.strip()}"
    assert "DynamicUser=yes" in text or "User=smockron" in text


def test_systemd_units_verify(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed here")
    for unit in UNITS:  # the path the guide installs to does not exist on a test machine
        text = unit.read_text().replace("/opt/smockron/bin/smockron", smockron_executable())
        (tmp_path / unit.name).write_text(text)
    result = subprocess.run(
        [tool, "verify", *[str(tmp_path / u.name) for u in UNITS]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # verify exits 0 on unknown keys and only warns: any output is a finding
    assert result.returncode == 0 and not result.stderr.strip() and not result.stdout.strip(), (
        result.stdout + result.stderr
    )


def test_systemd_verify_can_fail(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed here")
    bad = tmp_path / "bad.service"
    bad.write_text(f"[Service]\nExecStart={smockron_executable()} master\nProtectSystem=strikt\n")
    result = subprocess.run([tool, "verify", str(bad)], capture_output=True, text=True, timeout=60)
    assert "strikt" in result.stderr


def guide_commands(guide: Path, heading: str) -> list[str]:
    """The commands of the first ``sh`` block after ``heading`` in ``guide``."""
    text = guide.read_text()
    section = text[text.index(heading) :]
    block = section[section.index("```sh\n") + 6 :]
    return [ln for ln in block[: block.index("```")].splitlines() if ln.strip()]


def unit_settings(unit: Path) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


NOBODY = 65534
GUIDE_NOT_RUN = ("apt-get ", "python3 -m venv ", "/opt/smockron/bin/pip ", "systemctl ", "curl ")
"""What walking the guide leaves to the machine (packages, the venv, systemd): the test
runs this checkout's smockron, then what systemd would run, as systemd would run it."""


def test_the_systemd_guide_gives_a_master_that_starts_as_its_unit_runs_it() -> None:
    """Every file the guide has you create, created by its own commands (under a scratch
    /etc/smockron); then the unit's ExecStart as its dynamic user would run it: an
    unprivileged user (nobody), the LoadCredential= files copied for it alone into a
    credentials directory (%d). The master must serve /readyz. (The guide once left the
    keys its master.toml names uncreated, and keys made by keygen unreadable to the unit's
    user: exit 2, then a restart loop.)"""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the unit's command as another user")
    scratch = Path(tempfile.mkdtemp(prefix="smockron-guide-"))  # nobody may traverse it
    scratch.chmod(0o755)
    etc = scratch / "etc" / "smockron"
    smockron_cmd = f"{sys.executable} -m smockron"
    try:
        skipped = []
        for line in guide_commands(DOCS / "deployment.md", "## On hosts, with systemd"):
            command = line.replace("sudo ", "")
            if command.startswith(GUIDE_NOT_RUN) or "deploy/systemd" in command:
                skipped.append(command.split()[0])
                continue
            command = command.replace("/etc/smockron", str(etc))
            command = command.replace("/opt/smockron/bin/smockron", smockron_cmd)
            done = subprocess.run(
                ["bash", "-ec", command],
                cwd=REPO_ROOT,
                env=smockron_env(),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, f"{line}: {done.stderr}"
        assert sorted(set(skipped)) == [
            "/opt/smockron/bin/pip",
            "apt-get",
            "cp",
            "curl",
            "python3",
            "systemctl",
        ]
        for toml in etc.glob("*.toml"):  # the scratch directory stands for /etc/smockron
            toml.write_text(toml.read_text().replace("/etc/smockron", str(etc)))
        unit = unit_settings(DEPLOY / "systemd" / "smockron-master.service")
        assert unit["DynamicUser"] == ["yes"]
        credentials = scratch / "credentials"
        credentials.mkdir()
        for spec in unit.get("LoadCredential", []):
            name, _, source = spec.partition(":")
            copy = credentials / name
            shutil.copyfile(source.replace("/etc/smockron", str(etc)), copy)
            copy.chmod(0o400)
            os.chown(copy, NOBODY, NOBODY)
        credentials.chmod(0o500)
        os.chown(credentials, NOBODY, NOBODY)
        (exec_start,) = unit["ExecStart"]
        exec_start = exec_start.replace("%d", str(credentials)).replace("/etc/smockron", str(etc))
        argv = shlex.split(exec_start.replace("/opt/smockron/bin/smockron", smockron_cmd))
        acc, ctl, metrics = free_ports(3)
        env = {
            **smockron_env(),
            "HOME": "/nonexistent",
            "CREDENTIALS_DIRECTORY": str(credentials),
            "SMOCKRON_MASTER_ACCOUNTING": f"tcp://127.0.0.1:{acc}",  # loopback in a test
            "SMOCKRON_MASTER_CONTROL": f"tcp://127.0.0.1:{ctl}",
            "SMOCKRON_MASTER_METRICS": f"127.0.0.1:{metrics}",
        }
        as_nobody = [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            "--no-new-privs",
            *argv,
        ]
        log = scratch / "master.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                as_nobody, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            wait_for(lambda: port_open(metrics) or proc.poll() is not None, timeout=30)
            assert proc.poll() is None, log.read_text()
            status, body = http_get(metrics, "/readyz")
            assert status == 200 and json.loads(body)["ready"] is True, body
            assert "curve=on" in log.read_text()  # the keys the guide made are in use
        finally:
            proc.terminate()
            proc.wait(20)
        assert proc.returncode == 0, log.read_text()
    finally:
        shutil.rmtree(scratch)


def test_keys_the_daemons_user_cannot_read_are_one_line_not_a_traceback() -> None:
    """A unit whose user cannot read keygen's files (root's, 0600, in a 0700 folder):
    exit 2 with one line naming the file and why, as troubleshooting.md quotes it."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the master as another user")
    scratch = Path(tempfile.mkdtemp(prefix="smockron-keys-"))
    scratch.chmod(0o755)
    try:
        keygen(scratch / "keys", "master")
        keygen(scratch / "keys" / "gatekeepers", "gk1")
        public = scratch / "gatekeepers"
        public.mkdir()
        shutil.copy(scratch / "keys" / "gatekeepers" / "gk1.key", public)
        a, b = free_ports(2)
        base = [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            sys.executable,
            "-m",
            "smockron",
            "master",
            "--rule",
            "api:1/s:1",
            "--accounting",
            f"tcp://127.0.0.1:{a}",
            "--control",
            f"tcp://127.0.0.1:{b}",
            "--curve-secret",
            str(scratch / "keys" / "master.key_secret"),
        ]
        for clients, says in (
            (scratch / "keys" / "gatekeepers", "cannot read public keys in"),
            (public, "cannot read key file"),
        ):
            done = subprocess.run(
                [*base, "--curve-clients", str(clients)],
                env=smockron_env(),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 2, done.stderr
            assert "Traceback" not in done.stderr and "Permission denied" in done.stderr
            assert done.stderr.startswith(f"smockron master: error: {says}"), done.stderr
    finally:
        shutil.rmtree(scratch)


def test_the_protected_mode_refusal_is_quoted_as_the_master_prints_it() -> None:
    """One wording across the docs: every line of them quoting the refusal is the line
    the master prints (it refuses before binding anything)."""
    done = smockron_run(
        [
            "master",
            "--rule",
            "api:1/s:1",
            "--accounting",
            "tcp://0.0.0.0:10004",
            "--control",
            "tcp://127.0.0.1:10005",
        ]
    )
    assert done.returncode == 2
    printed = done.stderr.strip().splitlines()[-1]
    assert printed.startswith("smockron master: error: refusing to bind"), done.stderr
    quoted = []
    for guide in GUIDES:
        for line in guide.read_text().splitlines():
            if "refusing to bind" in line:
                quoted.append(line.strip().strip("*").strip("`"))
    assert quoted and all(q == printed for q in quoted), (printed, quoted)


# ---------------------------------------------------------------- Dockerfile

DOCKERFILE = DEPLOY / "Dockerfile"


def test_dockerfile_shape() -> None:
    lines = [ln for ln in DOCKERFILE.read_text().splitlines() if ln and not ln.startswith("#")]
    froms = [ln.split()[1] for ln in lines if ln.startswith("FROM ")]
    assert len(froms) == 2 and all(f.startswith("python:3.11-slim") for f in froms)
    text = "\n".join(lines)
    assert "libgrpc++-dev" in text and "pkg-config" in text and "g++" in text
    assert "COPY --from=build /opt/smockron /opt/smockron" in text
    user = next(ln.split()[1] for ln in lines if ln.startswith("USER "))
    assert not user.startswith(("0", "root"))
    # what is copied into the build must get past the .dockerignore
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text()
    for ln in lines:
        if ln.startswith("COPY ") and "--from" not in ln:
            for src in ln.split()[1:-1]:
                assert f"!{src.rstrip('/')}" in ignore, src


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined and comments dropped, as
    Docker reads the file."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            instruction, _, args = line.strip().partition(" ")
            out.append((instruction.upper(), args.strip()))
    return out


def _shell_commands(run: str) -> list[list[str]]:
    words = shlex.split(run)
    commands: list[list[str]] = [[]]
    for word in words:
        if word in ("&&", "||", ";"):
            commands.append([])
        else:
            commands[-1].append(word)
    return [c for c in commands if c]


def _importable(module: str) -> str | None:
    """None if ``module`` imports here, or is a compiled twin this machine did not build
    (and no run requires it); else why not."""
    twin = next((t for t in compiled.REGISTRY if t.module == module), None)
    try:
        importlib.import_module(module)
    except ImportError as exc:
        if twin is not None and not compiled.required():
            return None
        return f"import {module}: {exc}"
    return None


def dockerfile_problems(text: str) -> list[str]:
    """What the Dockerfile's own RUN and COPY lines would trip on, checked without a
    Docker daemon: every module a ``python -c`` imports must import (a compiled one must
    be in smockron.compiled's registry), every extra ``pip install`` names must exist,
    every path a COPY takes from the build context must exist, and each stage that checks
    imports must check every compiled twin."""
    problems = []
    extras = tomllib_loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    wanted = {t.module for t in compiled.REGISTRY}
    stage_checked: list[set[str]] = []
    for instruction, args in dockerfile_instructions(text):
        if instruction == "FROM":
            stage_checked.append(set())
        elif instruction == "COPY" and not args.startswith("--from"):
            for src in args.split()[:-1]:
                if not (REPO_ROOT / src).exists():
                    problems.append(f"COPY {src}: no such file in the build context")
        elif instruction == "RUN":
            for argv in _shell_commands(args):
                if Path(argv[0]).name.startswith("python") and "-c" in argv:
                    code = argv[argv.index("-c") + 1]
                    for node in ast.walk(ast.parse(code)):
                        if isinstance(node, ast.Import):
                            for alias in node.names:
                                stage_checked[-1].add(alias.name)
                                why = _importable(alias.name)
                                if why is not None:
                                    problems.append(f"RUN python -c: {why}")
                                elif alias.name.startswith("smockron.") and (
                                    alias.name.rsplit(".", 1)[-1].startswith("_")
                                    and alias.name not in wanted
                                ):
                                    problems.append(f"{alias.name}: not a compiled twin")
                if Path(argv[0]).name == "pip" and "install" in argv:
                    for spec in argv[argv.index("install") + 1 :]:
                        for extra in re.findall(r"\[([\w,]+)\]", spec):
                            problems += [
                                f"pip extra {e!r}: not in pyproject.toml"
                                for e in extra.split(",")
                                if e not in extras
                            ]
    for checked in stage_checked:
        if checked and not wanted <= checked:
            problems.append(f"an import check leaves out {sorted(wanted - checked)}")
    return problems


def test_dockerfile_run_lines_would_succeed() -> None:
    """Without a Docker daemon the build below is skipped: the RUN lines' own checks run
    here instead, so a line naming a module that moved fails every test run."""
    assert dockerfile_problems(DOCKERFILE.read_text()) == []


def test_dockerfile_checks_can_fail() -> None:
    text = DOCKERFILE.read_text()
    moved = text.replace("smockron.wire._zmqfast", "smockron._zmqfast")
    assert any("smockron._zmqfast" in p for p in dockerfile_problems(moved))
    dropped = text.replace("smockron.cluster._nativeclient'", "smockron.cluster._native'")
    assert any("leaves out" in p for p in dockerfile_problems(dropped))
    assert dockerfile_problems(text.replace("setup.py README", "setup.cfg README"))
    assert dockerfile_problems(text.replace(".[all]", ".[everything]"))


def docker_available() -> str | None:
    """None when `docker build` can run here, else why not."""
    if shutil.which("docker") is None:
        return "docker is not installed"
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"no Docker daemon answers `docker info`: {probe.stderr.strip()[:200]}"
    return None


@pytest.mark.slow
def test_dockerfile_builds_and_runs() -> None:
    reason = docker_available()
    if reason is not None:
        pytest.skip(f"the Dockerfile is not built here: {reason}")
    tag = "smockron-deploy-test:latest"
    build = subprocess.run(
        ["docker", "build", "-f", str(DOCKERFILE), "-t", tag, str(REPO_ROOT)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    run = subprocess.run(
        ["docker", "run", "--rm", tag, "master", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and "--accounting" in run.stdout, run.stderr
    user = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "id", tag, "-u"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert user.stdout.strip() == "10001"


# ---------------------------------------------------------------- Prometheus

PROMETHEUS = DEPLOY / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool is not None
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60, cwd=PROMETHEUS)


def promtool_knows_kubernetes(tmp_path: Path) -> bool:
    """Debian's promtool is built without Kubernetes service discovery."""
    probe = tmp_path / "probe.yml"
    probe.write_text(
        "scrape_configs:\n  - job_name: p\n    kubernetes_sd_configs:\n      - role: pod\n"
    )
    return promtool("check", "config", str(probe)).returncode == 0


def check_structure(config: dict[str, Any]) -> None:
    jobs = [job["job_name"] for job in config["scrape_configs"]]
    assert len(jobs) == len(set(jobs)) and all(j.startswith("smockron-") for j in jobs)
    for job in config["scrape_configs"]:
        assert job.get("static_configs") or job.get("kubernetes_sd_configs"), job["job_name"]
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                assert re.fullmatch(r"[\w.-]+:\d{2,5}", target), target
    assert (PROMETHEUS / config["rule_files"][0]).exists()


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus-kubernetes.yml"])
def test_prometheus_config(name: str, tmp_path: Path) -> None:
    config = yaml.safe_load((PROMETHEUS / name).read_text())
    check_structure(config)
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed: checked the YAML structure only")
    if "kubernetes_sd_configs" in (PROMETHEUS / name).read_text() and not (
        promtool_knows_kubernetes(tmp_path)
    ):
        pytest.skip("this promtool has no Kubernetes service discovery: structure checked only")
    result = promtool("check", "config", name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_kubernetes_job_keeps_the_annotated_smockron_pods() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus-kubernetes.yml").read_text())
    relabel = config["scrape_configs"][0]["relabel_configs"]
    keeps = {r["source_labels"][0]: r["regex"] for r in relabel if r.get("action") == "keep"}
    for _, doc in K8S:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            meta = doc["spec"]["template"]["metadata"]
            ann = meta["annotations"]
            assert (
                ann["prometheus.io/scrape"]
                == keeps["__meta_kubernetes_pod_annotation_prometheus_io_scrape"]
            )
            ports = [
                p["containerPort"]
                for c in doc["spec"]["template"]["spec"]["containers"]
                for p in c.get("ports", [])
            ]
            assert int(ann["prometheus.io/port"]) in ports


def test_prometheus_rules() -> None:
    if shutil.which("promtool") is None:
        rules = yaml.safe_load((PROMETHEUS / "smockron-rules.yml").read_text())
        assert all(r["alert"] and r["expr"] for g in rules["groups"] for r in g["rules"])
        pytest.skip("promtool is not installed: checked the YAML structure only")
    result = promtool("check", "rules", "smockron-rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- example configs

CONFIG = DEPLOY / "config"


def tomllib_loads(text: str) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(text)


def command(name: str) -> click.Command:
    from smockron.cli import main

    assert isinstance(main, click.Group)
    cmd = main.get_command(click.Context(main), name)
    assert cmd is not None, name
    return cmd


def assert_keys_are_options(name: str, config: dict[str, Any]) -> None:
    """Each key of a file read through the settings layer is one of the command's flags
    (``max_delay`` for ``--max-delay``); ``metrics`` comes with every daemon's listener."""
    options = {o.lstrip("-").replace("-", "_") for p in command(name).params for o in p.opts}
    unknown = set(config) - options - {"metrics", "log_format", "log_level"}
    assert not unknown, f"{name}: {sorted(unknown)} are not options of smockron {name}"


@pytest.mark.parametrize(
    ("name", "file"),
    [("proxy", "proxy-api.toml"), ("jarl", "jarl-payments.toml"), ("router", "router.toml")],
)
def test_example_config_keys_are_options(name: str, file: str) -> None:
    assert_keys_are_options(name, tomllib_loads((CONFIG / file).read_text()))


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_example_master_config_starts_a_master(tmp_path: Path) -> None:
    acc, ctl, metrics = free_ports(3)
    text = (CONFIG / "master.toml").read_text()
    text = text.replace("tcp://0.0.0.0:10004", f"tcp://127.0.0.1:{acc}")
    text = text.replace("tcp://0.0.0.0:10005", f"tcp://127.0.0.1:{ctl}")
    text = text.replace("0.0.0.0:9105", f"127.0.0.1:{metrics}")
    assert str(metrics) in text and str(ctl) in text
    keys = tmp_path / "keys"  # the example authenticates the control plane with CURVE
    keygen(keys, "master")
    keygen(tmp_path / "gatekeepers", "gk1")
    text = text.replace("/etc/smockron", str(tmp_path))
    assert str(keys) in text
    (tmp_path / "master.toml").write_text(text)
    with smockron_proc(
        ["master", "--config", str(tmp_path / "master.toml")], tmp_path / "master.log"
    ) as proc:
        wait_port(metrics)
        status, body = http_get(metrics, "/metrics")
        assert status == 200 and "smockron_master_queue_depth" in body
        wait_port(acc)
        assert proc.alive()


def test_example_dthrottle_config_starts_dthrottle(tmp_path: Path) -> None:
    tcp, udp, peer1, peer2 = free_ports(4)
    text = (CONFIG / "dthrottle.toml").read_text()
    text = text.replace("tcp:0.0.0.0:6969", f"tcp:127.0.0.1:{tcp}")
    text = text.replace(
        "unix:/run/smockron-dthrottle/dthrottle.sock", f"unix:{tmp_path}/dthrottle.sock"
    )
    text = text.replace('"0.0.0.0:6969"', f'"127.0.0.1:{udp}"')
    text = text.replace("10.0.0.11:6969", f"127.0.0.1:{peer1}")
    text = text.replace("10.0.0.12:6969", f"127.0.0.1:{peer2}")
    assert "6969" not in text.split("\n", 2)[2]
    (tmp_path / "dthrottle.toml").write_text(text)
    with smockron_proc(
        ["dthrottle", "--config", str(tmp_path / "dthrottle.toml")], tmp_path / "dthrottle.log"
    ) as proc:
        wait_port(tcp)
        with socket.create_connection(("127.0.0.1", tcp), timeout=5) as conn:
            conn.sendall(b"monitoring:probe\n")
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = conn.recv(16)
                assert chunk
                answer += chunk
        assert answer == b"OK\n"
        wait_for(lambda: (tmp_path / "dthrottle.sock").exists())
        assert proc.stop() == 0


def test_example_cluster_env_names_only_variables_smockron_reads() -> None:
    names = re.findall(r"^#?(\w+)=", (CONFIG / "cluster.env").read_text(), re.M)
    assert names
    for name in names:
        assert any(name in text for text in SOURCES.values()), name


# ---------------------------------------------------------------- README and docs


def readme_commands() -> list[list[str]]:
    """Every `smockron ...` command in README's shell blocks, continuation lines joined."""
    text = (REPO_ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith(("smockron ", ".venv/bin/smockron ")):
                commands.append(shlex.split(line)[1:])
    return commands


def test_readme_commands_parse() -> None:
    """Each command README shows is accepted by the CLI as written (flags and values)."""
    from smockron.cli import main

    commands = readme_commands()
    assert len(commands) >= 5
    for words in commands:
        if "--help" in words:  # run for real in test_every_command_explains_itself
            continue
        with main.make_context("smockron", list(words), resilient_parsing=False) as ctx:
            assert isinstance(main, click.Group)
            words_left = [*(getattr(ctx, "_protected_args", None) or []), *ctx.args]
            name, rest = words_left[0], words_left[1:]
            with command(name).make_context(name, rest, parent=ctx):
                pass


def test_every_command_explains_itself() -> None:
    for name in ("master", "router", "proxy", "cluster", "jarl", "dthrottle", "demo"):
        result = subprocess.run(
            [sys.executable, "-m", "smockron", name, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO_ROOT,
        )
        assert result.returncode == 0 and "Usage: " in result.stdout, name


def test_the_quick_start_installs_what_every_extension_is_built_with() -> None:
    """The README's first command installs every package smockron.compiled lists for the
    extensions (and CPython's headers), so the quick start builds all five and its
    startup lines say so."""
    readme = (REPO_ROOT / "README.md").read_text()
    quick = readme[readme.index("## Quick start") :]
    first_block = quick[quick.index("```sh\n") + 6 : quick.index("```", quick.index("```sh") + 5)]
    apt = next(line for line in first_block.splitlines() if "apt-get install" in line)
    packages = set(apt.split("install", 1)[1].split()) - {"-y"}
    needed = {p.strip() for twin in compiled.REGISTRY for p in twin.needs.split(",")}
    assert needed | {"python3-dev", "python3-venv"} <= packages, needed - packages


def test_help_names_the_originals_not_the_spec() -> None:
    """``--help`` speaks to operators: the original Smockron's history rule, never "the
    seed" (the project's name for its specification), and every algorithm a domain takes."""
    from smockron.cli import COMMANDS

    helps = {}
    for name in COMMANDS:
        result = subprocess.run(
            [sys.executable, "-m", "smockron", name, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO_ROOT,
        )
        assert result.returncode == 0, name
        helps[name] = " ".join(result.stdout.split())  # as one line: click wraps it
        assert "seed" not in helps[name].lower(), (name, result.stdout)
    for name in ("master", "proxy"):
        assert "history-literal" in helps[name] and "gcra" in helps[name], name
    assert "the original Smockron's history rule" in helps["master"]


GUIDES = [REPO_ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
GUIDES = [p for p in GUIDES if p.name != "benchmarks.md"]
# Written by other parts of the work; linked from these guides.
ELSEWHERE = {"configuration.md", "monitoring.md"}


@pytest.mark.parametrize("guide", GUIDES, ids=[p.name for p in GUIDES])
def test_guides_read_as_guides(guide: Path) -> None:
    """No lab notebook in the user docs: dates, issue numbers, the spec documents."""
    text = guide.read_text()
    for pattern in (
        r"\b20\d\d-\d\d-\d\d\b",
        r"\bissue \d+",
        r"\bseed\b",
        r"\.txt\b",
        r"\bbranch \w+",
    ):
        found = re.findall(pattern, text, re.I)
        assert not found, f"{guide.name}: {found}"


def test_links_between_docs_resolve() -> None:
    missing_elsewhere = set()
    for guide in GUIDES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", guide.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path = (guide.parent / target).resolve()
            if not path.exists() and path.name in ELSEWHERE:
                missing_elsewhere.add(path.name)
                continue
            assert path.exists(), f"{guide.name} links to {target}, which does not exist"
    if missing_elsewhere:
        pytest.skip(f"links to {sorted(missing_elsewhere)}, not in this build yet")


def test_only_gatekeepers_reach_the_master_control_plane() -> None:
    policy = by_kind("NetworkPolicy", "smockron-master")
    master = by_kind("Deployment", "smockron-master")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= master.items()
    control = next(r for r in policy["spec"]["ingress"] if {"port": 10004} in r["ports"])
    allowed = control["from"][0]["podSelector"]["matchLabels"]
    assert allowed, "the control plane must not be open to every pod"
    proxy_pod = by_kind("Deployment", "api")["spec"]["template"]["metadata"]["labels"]
    assert allowed.items() <= proxy_pod.items()


def _container_ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def _policy_ports(rule: dict[str, Any], named: dict[str, int]) -> set[int]:
    return {named.get(p["port"], p["port"]) for p in rule["ports"]}


def test_only_cluster_nodes_reach_the_peer_port() -> None:
    """PeersV1 takes forwarded checks and GLOBAL state: the other nodes may call it,
    no one else; clients keep the gRPC and HTTP ports."""
    sts = by_kind("StatefulSet", "smockron-cluster")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    ports = _container_ports(sts["spec"]["template"]["spec"]["containers"][0])
    policy = by_kind("NetworkPolicy", "smockron-cluster")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert "Ingress" in policy["spec"]["policyTypes"]
    rules = policy["spec"]["ingress"]
    opening_peers = [r for r in rules if ports["peers"] in _policy_ports(r, ports)]
    assert len(opening_peers) == 1, "exactly one rule may open the peer port"
    (peer_rule,) = opening_peers
    assert _policy_ports(peer_rule, ports) == {ports["peers"]}
    for source in peer_rule["from"]:  # this namespace's cluster pods, nothing wider
        assert set(source) == {"podSelector"}, source
        assert source["podSelector"]["matchLabels"].items() <= labels.items()
    client_ports = set().union(*(_policy_ports(r, ports) for r in rules if r is not peer_rule))
    assert {ports["grpc"], ports["http"]} <= client_ports


def test_cluster_nodes_advertise_the_peer_port_the_policy_opens() -> None:
    """The headless Service's port named "peers" reaches discovery in each EndpointSlice;
    it is where each node serves PeersV1 and what the policy admits."""
    from smockron.cluster.cli import build_config
    from smockron.cluster.discovery.kubernetes import PEER_PORT_NAME, peers_from_slice

    sts = by_kind("StatefulSet", "smockron-cluster")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    ports = _container_ports(container)
    headless = by_kind("Service", sts["spec"]["serviceName"])
    slice_ports = [  # as the EndpointSlice controller resolves a named targetPort
        {"name": p["name"], "port": ports[p["targetPort"]], "protocol": "TCP"}
        for p in headless["spec"]["ports"]
    ]
    assert PEER_PORT_NAME in {p["name"] for p in slice_ports}
    env = resolved_env(container)
    endpoint = {"addresses": [env["GUBER_K8S_POD_IP"]], "conditions": {"ready": True}}
    obj = {"addressType": "IPv4", "endpoints": [endpoint], "ports": slice_ports}
    (peer,) = peers_from_slice(obj, int(env["GUBER_K8S_POD_PORT"]))
    config = build_config(env, {})
    assert peer.grpc_address == config.advertise
    assert peer.peer_address == config.advertise_peer == f"10.1.2.3:{ports['peers']}"
    assert config.peer_listen_address.endswith(f":{ports['peers']}")
