"""Static checks of the deployment files: Dockerfile, compose, Kubernetes, Prometheus, Grafana.

Nothing here builds an image or starts a container (tests/deploy/test_image.py does,
where podman can run). What can be checked without them is:
every file parses; every kproxy command line in them goes through kproxy's own argument
parser and config validation (``kproxy.cli.main`` with the runtime stubbed out), with the
image's ENV, the container env and mounted config files it would really see; ports, probe
paths and scrape targets agree with that config and with the admin routes; ``promtool``
checks the Prometheus config and rules and runs the alert unit tests; and every metric,
label and label value the dashboard and alerts name is one kproxy exports.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from kproxy import config as kconfig
from kproxy.observers.metrics import CLOSE_REASONS, SNI_REFUSAL_REASONS, Metrics, SupervisorMetrics
from kproxy.observers.telemetry import ClientTelemetry
from kproxy.protocol.tls_failures import HANDSHAKE_FAILURES
from kproxy.protocol import schema
from kproxy.runtime import Runtime      # imported before run_kproxy() stubs it out
from tests.deploy.image import (DEPLOY, DOCKERFILE, REPO, base_images, docker_context_excludes,
                                dockerfile_instructions, final_stage, image_env, image_user)

PROMETHEUS = DEPLOY / "prometheus"
KUBERNETES = DEPLOY / "kubernetes"
GRAFANA = REPO / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "kproxy.json"
COMPOSE = DEPLOY / "compose.yaml"

JOB = "kproxy"                     # the scrape job name the alerts select on
ALERTS = {"KproxyHighP99Latency", "KproxyThrottling", "KproxyErrorBurst", "KproxyDecodeFailures",
          "KproxyUpstreamUnreachable", "KproxyDown", "KproxyDeprecatedRequests",
          "KproxyMisconfiguredConnections", "KproxySniNameAtWrongSidecar", "KproxyWorkerRestarting",
          "KproxyTLSCertificateExpiringSoon", "KproxyTLSReloadFailed"}
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
# Labels Prometheus attaches to every series of a target (job/instance) or that the
# Kubernetes scrape config adds; not kproxy's, but fine in selectors and groupings.
TARGET_LABELS = {"job", "instance", "namespace", "pod"}


# ---------------------------------------------------------------- helpers

def load_yaml_docs(path: Path) -> list:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def deploy_files() -> list[Path]:
    """Every YAML and JSON file, but Helm templates (not YAML until rendered: test_helm.py
    renders them)."""
    found = []
    for root in (DEPLOY, GRAFANA):
        found += [p for p in root.rglob("*") if p.suffix in (".yaml", ".yml", ".json")
                  and "templates" not in p.relative_to(REPO).parts]
    return sorted(found)


@pytest.fixture(scope="session")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: install it with scripts/setup.sh (Debian package "
                    "'prometheus'), or put a Prometheus 2.x promtool on PATH")
    return path


def run_promtool(promtool: str, *args: str, cwd: Path | None = None) -> str:
    done = subprocess.run([promtool, *args], capture_output=True, text=True, cwd=cwd, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


# ---- Dockerfile

def instruction_json(rest: str) -> list[str]:
    value = json.loads(rest)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), rest
    return value


def healthcheck_command() -> list[str]:
    checks = [rest for word, rest in final_stage(dockerfile_instructions()) if word == "HEALTHCHECK"]
    assert len(checks) == 1, "expected one HEALTHCHECK"
    _options, sep, command = checks[0].partition("CMD ")
    assert sep, f"HEALTHCHECK without CMD: {checks[0]}"
    return instruction_json(command)


# ---- running kproxy's own CLI on a command line from a manifest

def run_kproxy(args: list[str], env: dict[str, str], monkeypatch, capsys) -> kconfig.Config:
    """``kproxy run ARGS`` with ENV, exactly as the CLI parses and validates it; returns the
    Config the proxy would start with. The runtime is stubbed: nothing listens."""
    import uvloop

    from kproxy import cli, runtime

    started = []

    class StubRuntime:
        def __init__(self, config, observers=()):
            started.append(config)

        async def run_until_signalled(self):
            return None

    monkeypatch.setattr(runtime, "Runtime", StubRuntime)
    monkeypatch.setattr(uvloop, "run", lambda coro: coro.close())
    monkeypatch.setattr(logging, "basicConfig", lambda **kwargs: None)
    for key in list(os.environ):
        if key.startswith(kconfig.ENV_PREFIX):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    root_level = logging.getLogger().level
    capsys.readouterr()
    try:
        code = cli.main(["run", *args])
    except SystemExit as exc:                  # argparse: unknown flag, missing value
        code = exc.code
    finally:
        logging.getLogger().setLevel(root_level)
    err = capsys.readouterr().err.strip()
    assert code == 0, f"`kproxy run {shlex.join(args)}` (env {env}) exits {code}: {err}"
    assert len(started) == 1
    return started[0]


def admin_routes(config: kconfig.Config) -> set[str]:
    return set(Runtime(config).admin.routes)


def probe_routes(config: kconfig.Config) -> set[str]:
    """The probe port's routes; none when the config does not enable it."""
    probes = Runtime(config).probes
    return set(probes.routes) if probes is not None else set()


# ---- compose

@cache
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def compose_env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def compose_mounts(service: dict) -> list[tuple[Path, str]]:
    """(source in the repo, target in the container) of the service's bind mounts."""
    mounts = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            source, target = volume["source"], volume["target"]
        else:
            source, target = volume.split(":")[:2]
        assert source.startswith("."), f"{volume}: expected a bind mount of a repo file"
        mounts.append(((DEPLOY / source).resolve(), target))
    return mounts


def compose_kproxy_config(monkeypatch, capsys) -> kconfig.Config:
    """The Config the compose kproxy service starts with: the image's ENTRYPOINT plus
    `command`, with the image ENV and the service's environment."""
    kproxy = compose()["services"]["kproxy"]
    assert "entrypoint" not in kproxy, "keep the image's ENTRYPOINT (kproxy run)"
    command = kproxy.get("command", [])
    command = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    return run_kproxy(command, {**image_env(), **compose_env(kproxy)}, monkeypatch, capsys)


def compose_published(service: dict) -> dict[int, int]:
    """container port -> host port."""
    published = {}
    for port in service.get("ports", []):
        host, _, container = str(port).rpartition(":")
        published[int(container.split("/")[0])] = int(host.rpartition(":")[2])
    return published


# ---- Kubernetes

# What the downward API would give pod kafka-1 in namespace kafka-test.
FIELD_REFS = {"metadata.namespace": "kafka-test", "metadata.name": "kafka-1",
              "metadata.labels['apps.kubernetes.io/pod-index']": "1"}
POD_IP = "10.1.2.3"
# The admin-token Secret, when a test creates it (by default it does not exist, as after
# a plain `kubectl apply`).
ADMIN_SECRET = {("kproxy-admin", "token"): "0123456789abcdef0123456789abcdef"}


@cache
def k8s_docs() -> list[tuple[str, dict]]:
    return [(path.name, doc) for path in sorted(KUBERNETES.glob("*.yaml")) for doc in load_yaml_docs(path)]


def k8s_kind(kind: str) -> list[tuple[str, dict]]:
    return [(name, doc) for name, doc in k8s_docs() if doc.get("kind") == kind]


def statefulsets() -> list[tuple[str, dict]]:
    return k8s_kind("StatefulSet")


def pod_spec(sts: dict) -> dict:
    return sts["spec"]["template"]["spec"]


def kproxy_container(sts: dict) -> dict:
    found = [c for c in pod_spec(sts)["containers"] if c["name"] == "kproxy"]
    assert len(found) == 1, f"{sts['metadata']['name']}: expected one container named kproxy"
    return found[0]


def k8s_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) substitution in args and env values (unknown names stay as they are)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), text)


def k8s_container_env(container: dict, secrets: dict | None = None) -> dict[str, str]:
    """The container's env as Kubernetes would set it, with ``secrets`` ((name, key) ->
    value) existing; an optional secretKeyRef to a missing Secret sets nothing."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = k8s_expand(str(item["value"]), env)
        elif "secretKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["secretKeyRef"]
            value = (secrets or {}).get((ref["name"], ref["key"]))
            assert value is not None or ref.get("optional") is True, \
                f"{item['name']}: the pod cannot start until Secret {ref['name']} exists"
            if value is not None:
                env[item["name"]] = value
        else:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            assert path in FIELD_REFS, f"{item['name']}: unexpected valueFrom {item['valueFrom']}"
            env[item["name"]] = FIELD_REFS[path]
    return env


def resolve_port(container: dict, port) -> int:
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    assert port in named, f"{container['name']}: no container port named {port!r}"
    return named[port]


def kproxy_run_in_pod(sts: dict, tmp_path: Path, monkeypatch, capsys,
                      secrets: dict | None = None) -> kconfig.Config:
    """The Config the kproxy container of this StatefulSet starts with: the image's
    ENTRYPOINT plus the container's args, $(VAR)s substituted, with the image ENV, the
    container env (``secrets`` existing) and its ConfigMap volumes (written under
    tmp_path) in place."""
    container = kproxy_container(sts)
    assert "command" not in container or container["command"] == ["kproxy", "run"], \
        "the kproxy container must keep the image's ENTRYPOINT (kproxy run)"
    env = k8s_container_env(container, secrets)
    args = [k8s_expand(str(arg), env) for arg in container.get("args", [])]
    for text in args + list(env.values()):
        assert "$(" not in text, f"unresolved Kubernetes variable in {text!r}"
    volumes = {v["name"]: v for v in pod_spec(sts).get("volumes", [])}
    configmaps = {doc["metadata"]["name"]: doc for _, doc in k8s_kind("ConfigMap")}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:                   # scratch space (captures): nothing to read
            continue
        assert "configMap" in volume, f"kproxy mounts {mount['name']}, which is neither a ConfigMap nor an emptyDir"
        data = configmaps[volume["configMap"]["name"]]["data"]
        local = tmp_path / mount["mountPath"].lstrip("/")
        local.mkdir(parents=True)
        for key, text in data.items():
            (local / key).write_text(text)
        args = [arg.replace(mount["mountPath"], str(local)) for arg in args]
        env = {k: v.replace(mount["mountPath"], str(local)) for k, v in env.items()}
    env = {**image_env(), **env}
    # A config file loses to KPROXY_* env vars, the image's included: a key set in both is
    # silently ignored in the file.
    for arg in args:
        if arg.startswith("--config="):
            for key in kconfig.read_file(arg.split("=", 1)[1]):
                shadow = kconfig.ENV_PREFIX + key.upper()
                assert shadow not in env, f"{arg}: {key!r} in the file is overridden by env {shadow}"
    return run_kproxy(args, env, monkeypatch, capsys)


# ---- Prometheus relabelling (keep, drop, keepequal, dropequal, replace), enough to run the
#      Kubernetes scrape config over the pods in our manifests

def relabel(labels: dict[str, str], configs: list[dict]) -> dict[str, str] | None:
    labels = dict(labels)
    for c in configs:
        action = c.get("action", "replace")
        value = c.get("separator", ";").join(labels.get(name, "") for name in c.get("source_labels", []))
        regex = re.compile(f"(?:{c.get('regex', '(.*)')})")
        if action == "keep" and not regex.fullmatch(value):
            return None
        if action == "drop" and regex.fullmatch(value):
            return None
        if action == "keepequal" and value != labels.get(c["target_label"], ""):
            return None
        if action == "dropequal" and value == labels.get(c["target_label"], ""):
            return None
        if action == "replace":
            match = regex.fullmatch(value)
            if match:
                template = re.sub(r"\$\{?(\w+)\}?", r"\\g<\1>", c.get("replacement", "$1"))
                new = match.expand(template)
                if new:
                    labels[c["target_label"]] = new
                else:
                    labels.pop(c["target_label"], None)
        elif action not in ("keep", "drop", "keepequal", "dropequal"):
            raise NotImplementedError(action)
    return labels


def pod_sd_targets(sts: dict) -> list[dict[str, str]]:
    """The targets Prometheus' kubernetes_sd (role: pod) discovers for one pod of the set."""
    meta = {"__meta_kubernetes_namespace": FIELD_REFS["metadata.namespace"],
            "__meta_kubernetes_pod_name": FIELD_REFS["metadata.name"]}
    for key, value in sts["spec"]["template"]["metadata"].get("annotations", {}).items():
        meta["__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)] = str(value)
    targets = []
    for container in pod_spec(sts)["containers"]:
        for port in container.get("ports", []):
            targets.append({**meta, "__address__": f"{POD_IP}:{port['containerPort']}",
                            "__meta_kubernetes_pod_container_name": container["name"],
                            "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                            "__meta_kubernetes_pod_container_port_number": str(port["containerPort"])})
    return targets


# ---- NetworkPolicy (ingress), enough to evaluate our own policy: matchLabels selectors,
#      podSelector / namespaceSelector / ipBlock peers, named and numbered ports

NAMESPACE = FIELD_REFS["metadata.namespace"]


def selects(selector: dict | None, labels: dict[str, str]) -> bool:
    assert set(selector or {}) <= {"matchLabels"}, f"selector beyond matchLabels: {selector}"
    return (selector or {}).get("matchLabels", {}).items() <= labels.items()


def peer_matches(peer: dict, source: dict) -> bool:
    """``source``: {"namespace": labels of its namespace, "labels": pod labels, "ip": ...}."""
    if "ipBlock" in peer:
        import ipaddress
        block = peer["ipBlock"]
        ip = ipaddress.ip_address(source["ip"])
        return ip in ipaddress.ip_network(block["cidr"]) and \
            not any(ip in ipaddress.ip_network(e) for e in block.get("except", []))
    if "namespaceSelector" in peer:
        in_namespace = selects(peer["namespaceSelector"], source["namespace"])
    else:                                         # podSelector alone: the policy's own namespace
        in_namespace = source["namespace"].get("kubernetes.io/metadata.name") == NAMESPACE
    return in_namespace and ("podSelector" not in peer or selects(peer["podSelector"], source["labels"]))


def port_matches(entry: dict, container_port: dict) -> bool:
    if entry.get("protocol", "TCP") != container_port.get("protocol", "TCP"):
        return False
    port = entry.get("port")
    if port is None:
        return True
    if isinstance(port, str):
        return port == container_port.get("name")
    return port <= container_port["containerPort"] <= entry.get("endPort", port)


def ingress_allowed(policies: list[dict], pod_labels: dict[str, str], container_port: dict,
                    source: dict) -> bool:
    """Would ``source`` reach ``container_port`` of a pod with ``pod_labels``?"""
    applying = [p for p in policies if selects(p["spec"]["podSelector"], pod_labels)
                and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]
    if not applying:
        return True                               # no policy selects the pod: open
    for policy in applying:
        for rule in policy["spec"].get("ingress", []):
            peers_ok = "from" not in rule or any(peer_matches(peer, source) for peer in rule["from"])
            ports_ok = "ports" not in rule or any(port_matches(e, container_port) for e in rule["ports"])
            if peers_ok and ports_ok:
                return True
    return False


def namespace_labels(name: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": name}   # set by Kubernetes on every namespace


# Who knocks, as the policy's comments describe them.
CLIENT = {"namespace": namespace_labels("shop"), "labels": {"app": "checkout"}, "ip": "10.9.0.7"}
PEER_BROKER = {"namespace": namespace_labels(NAMESPACE), "labels": {"app.kubernetes.io/name": "kafka"},
               "ip": "10.1.2.4"}
PROMETHEUS_POD = {"namespace": namespace_labels("monitoring"),
                  "labels": {"app.kubernetes.io/name": "prometheus"}, "ip": "10.8.0.2"}
NEIGHBOUR = {"namespace": namespace_labels(NAMESPACE), "labels": {"app": "batch-job"}, "ip": "10.1.2.9"}
OTHER_MONITOR = {"namespace": namespace_labels("shop"), "labels": {"app.kubernetes.io/name": "prometheus"},
                 "ip": "10.9.0.8"}


# ---- PromQL: names, selectors, groupings (regular expressions are enough for our own files)

METRIC_NAME = re.compile(r"\b((?:kproxy|process)_[a-z0-9_]+)\b")
SELECTOR = re.compile(r"\b((?:kproxy|process)_[a-z0-9_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
LITERAL_ALTERNATION = re.compile(r"[A-Za-z0-9_]+(?:\|[A-Za-z0-9_]+)*")


def exporters() -> list:
    """What kproxy exports from: every process's ``Metrics``, and the supervisor's own
    series (``kproxy run --workers N``, added to its workers' merged exposition)."""
    return [Metrics(telemetry=ClientTelemetry(1)), SupervisorMetrics(2)]


def _wrappers(exporter) -> list[MetricWrapperBase]:
    """The metric wrappers an exporter holds, its per-area parts' included (``Metrics``
    hands areas such as listeners and groups to parts that build their own families)."""
    found = []
    for value in vars(exporter).values():
        if isinstance(value, MetricWrapperBase):
            found.append(value)
        elif type(value).__module__ == type(exporter).__module__ and hasattr(value, "__dict__"):
            found += [v for v in vars(value).values() if isinstance(v, MetricWrapperBase)]
    return found


@cache
def kproxy_metrics() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Every series name kproxy exposes (from the exporters' registries) -> its label
    names, and the known values of the bounded labels."""
    family_labels: dict[str, set[str]] = {}
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "summary": ("", "_sum", "_count", "_created"), "info": ("_info",)}
    names: dict[str, set[str]] = {}
    for exporter in exporters():
        for wrapper in _wrappers(exporter):
            for family in wrapper.describe():
                family_labels[family.name] = set(wrapper._labelnames)
        for family in exporter.registry.collect():
            # Label names: a wrapper's, a collector family's declared ones (it may have no
            # samples yet: plain counts published at scrape time), and any sample's.
            labels = family_labels.get(family.name, set()) | set(getattr(family, "_labelnames", ()))
            for sample in family.samples:
                labels = labels | (set(sample.labels) - {"le", "quantile"})
            for suffix in suffixes.get(family.type, ("",)):
                names[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
            for sample in family.samples:
                names.setdefault(sample.name, labels)
    metrics = Metrics()
    values = {"api": set(schema.API_NAMES.values()) | {"unknown"},
              "error": set(schema.ERROR_NAMES.values()),
              "reason": set(CLOSE_REASONS) | set(HANDSHAKE_FAILURES) | set(SNI_REFUSAL_REASONS),
              "direction": {"request", "response"},
              "compression": {s.labels["compression"] for f in metrics.registry.collect()
                              for s in f.samples if "compression" in s.labels}}
    return names, values


def check_promql(expr: str, where: str) -> list[str]:
    """Problems with the kproxy metrics, labels and label values one expression uses."""
    names, values = kproxy_metrics()
    problems = []
    used = set(METRIC_NAME.findall(expr))
    for name in sorted(used - set(names)):
        problems.append(f"{where}: {name} is not a metric kproxy exports")
    for name, body in SELECTOR.findall(expr):
        for label, op, value in MATCHER.findall(body):
            if name in names and label not in names[name] | TARGET_LABELS:
                problems.append(f"{where}: {name} has no label {label!r}")
            literals = [value] if op in ("=", "!=") else \
                value.split("|") if LITERAL_ALTERNATION.fullmatch(value) else []
            if label in values and "$" not in value:
                for literal in literals:
                    if literal not in values[label]:
                        problems.append(f"{where}: {label}={literal!r} is never exported by kproxy")
    available = set().union(*(names.get(n, set()) for n in used)) | TARGET_LABELS
    for group in GROUPING.findall(expr):
        for label in filter(None, (part.strip() for part in group.split(","))):
            if label not in available:
                problems.append(f"{where}: grouping by {label!r}, which none of {sorted(used)} has")
    return problems


# ---- Grafana

@cache
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels() -> list[dict]:
    panels = []
    for panel in dashboard()["panels"]:
        panels.append(panel)
        panels += panel.get("panels", [])          # panels inside collapsed rows
    return panels


def dashboard_queries() -> list[tuple[str, str, dict]]:
    """(where, expr, target) of every panel query."""
    return [(f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"], t)
            for p in dashboard_panels() for t in p.get("targets", [])]


def variable_query(variable: dict) -> str:
    query = variable.get("query")
    return query.get("query", "") if isinstance(query, dict) else str(query or "")


def grafana_to_promql(expr: str) -> str:
    """Grafana's variables replaced by something PromQL accepts."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", expr)
    return re.sub(r"\$\{?[A-Za-z_]\w*\}?", ".*", expr)


# ---------------------------------------------------------------- every file parses

@pytest.mark.parametrize("path", deploy_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_file_parses(path):
    if path.suffix == ".json":
        assert isinstance(json.loads(path.read_text()), dict)
    else:
        assert load_yaml_docs(path), f"{path} is empty"


def test_the_expected_files_exist():
    for path in (DOCKERFILE, COMPOSE, REPO / ".dockerignore", DASHBOARD,
                 PROMETHEUS / "prometheus.yml", PROMETHEUS / "prometheus-kubernetes.yml",
                 PROMETHEUS / "alerts.yml", PROMETHEUS / "alerts_test.yml",
                 GRAFANA / "provisioning" / "datasources" / "prometheus.yaml",
                 GRAFANA / "provisioning" / "dashboards" / "kproxy.yaml"):
        assert path.is_file(), path


# ---------------------------------------------------------------- the CLI harness itself

def test_cli_harness_catches_bad_values_and_unknown_flags(monkeypatch, capsys):
    """So that a passing manifest test means something."""
    config = run_kproxy(["--upstream=broker:9092"], {}, monkeypatch, capsys)
    assert config.upstreams == (("broker", 9092),)
    with pytest.raises(AssertionError, match="mode: must be one of"):
        run_kproxy(["--upstream=broker:9092", "--mode=mesh"], {}, monkeypatch, capsys)
    with pytest.raises(AssertionError, match="exits 2"):
        run_kproxy(["--upstream=broker:9092", "--no-such-flag=1"], {}, monkeypatch, capsys)
    with pytest.raises(AssertionError, match="fixed"):
        run_kproxy(["--upstream=b:1", "--broker-port-rule=fixed"], {}, monkeypatch, capsys)
    with pytest.raises(AssertionError, match="advertised_host: listen is 0.0.0.0"):
        run_kproxy([], {"KPROXY_UPSTREAM": "b:1", "KPROXY_LISTEN": "0.0.0.0:1234"}, monkeypatch, capsys)
    env_config = run_kproxy([], {"KPROXY_UPSTREAM": "b:1", "KPROXY_LISTEN": "0.0.0.0:1234",
                                 "KPROXY_ADVERTISED_HOST": "kproxy.example.com"}, monkeypatch, capsys)
    assert env_config.listen == ("0.0.0.0", 1234) and env_config.public_host == "kproxy.example.com"


# ---------------------------------------------------------------- Dockerfile

def test_dockerfile_base_image_is_slim_python_3_11_or_3_12():
    for image in base_images():
        assert re.fullmatch(r"python:3\.1[12]-slim(-\w+)?(@sha256:[0-9a-f]{64})?", image), image


def test_dockerfile_runs_as_a_non_root_user():
    uid, gid = image_user()
    assert uid != 0 and gid != 0
    useradd = " ".join(rest for word, rest in final_stage(dockerfile_instructions()) if word == "RUN")
    assert f"--uid {uid}" in useradd, "USER names a uid the image never creates"
    assert f"--gid {gid}" in useradd, "USER names a gid the image never creates"


def test_dockerfile_entrypoint_is_kproxy_run(capsys):
    entrypoints = [rest for word, rest in final_stage(dockerfile_instructions()) if word == "ENTRYPOINT"]
    assert [instruction_json(e) for e in entrypoints] == [["kproxy", "run"]]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kproxy"] == "kproxy.cli:main"          # what `pip install .` puts on PATH
    from kproxy import cli
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "--help"])
    assert exited.value.code == 0
    help_text = capsys.readouterr().out
    for flag in cli.RUN_FLAGS:
        assert flag in help_text
    assert not any(word == "CMD" for word, _ in final_stage(dockerfile_instructions())), \
        "a CMD would be appended to `kproxy run` when no arguments are given"


def test_dockerfile_env_binds_all_interfaces_and_exposes_the_default_ports(monkeypatch, capsys):
    # The image binds every interface, so the command must say what clients are told.
    with pytest.raises(AssertionError, match="advertised_host: listen is 0.0.0.0"):
        run_kproxy(["--upstream=broker:9092"], image_env(), monkeypatch, capsys)
    config = run_kproxy(["--upstream=broker:9092", "--advertised-host=kafka-proxy.example.com"],
                        image_env(), monkeypatch, capsys)
    defaults = kconfig.Config(upstreams=(("broker", 9092),))
    assert config.listen[1] == defaults.listen[1] == 9092
    assert config.admin_listen[1] == defaults.admin_listen[1] == 9644
    assert config.probe_listen[1] == 9645 and defaults.probe_listen is None    # the image turns it on
    # 127.0.0.1 (the default) cannot be reached from outside a container.
    assert {config.listen[0], config.admin_listen[0], config.probe_listen[0]} <= set(WILDCARD_HOSTS)
    exposed = {int(port.split("/")[0]) for word, rest in final_stage(dockerfile_instructions())
               if word == "EXPOSE" for port in rest.split()}
    assert exposed == {config.listen[1], config.admin_listen[1], config.probe_listen[1]}
    # The admin port binds everywhere, so the image must not switch capture control on.
    assert config.admin_token is None and not config.capture_allow_record_data


def test_dockerfile_installs_kproxy_from_the_repo_and_the_context_has_what_it_copies():
    instructions = dockerfile_instructions()
    copied = []
    for word, rest in instructions:
        if word == "COPY" and "--from" not in rest:
            copied += [s for s in shlex.split(rest)[:-1] if not s.startswith("--")]
    assert {"pyproject.toml", "README.md", "kproxy"} <= set(copied)   # README: pyproject's readme
    for source in copied:
        assert (REPO / source).exists(), source
        assert not docker_context_excludes(source), f".dockerignore excludes {source}"
    for module in (REPO / "kproxy").rglob("*.py"):
        relative = str(module.relative_to(REPO))
        assert not docker_context_excludes(relative), f".dockerignore excludes {relative}"
    for junk in (".venv/bin/python", ".git/HEAD", "tests/test_config.py",
                 "kproxy/__pycache__/cli.cpython-311.pyc", "kproxy.egg-info/PKG-INFO"):
        assert docker_context_excludes(junk), f".dockerignore lets {junk} into the build context"
    runs = " ".join(rest for word, rest in instructions if word == "RUN")
    assert re.search(r"pip (wheel|install)\b[^&]* \.(\s|$)", runs), "kproxy must be installed from the repo"


def test_dockerfile_healthcheck_gets_healthz_from_a_real_probe_listener():
    command = healthcheck_command()
    assert command[:2] == ["python", "-c"] and "/healthz" in command[2], command
    assert "curl" not in command[2] and "wget" not in command[2]

    async def check() -> tuple[int, int]:
        config = kconfig.build({"upstream": "127.0.0.1:1", "listen": "127.0.0.1:0",
                                "broker_port_base": 40000, "admin_listen": "127.0.0.1:0",
                                "probe_listen": "127.0.0.1:0"})
        runtime = Runtime(config)
        await runtime.start()
        port = runtime.probes.address[1]
        env = {**os.environ, **image_env(), "KPROXY_PROBE_LISTEN": f"0.0.0.0:{port}"}

        async def healthcheck() -> int:
            process = await asyncio.create_subprocess_exec(sys.executable, *command[1:], env=env,
                                                           stderr=asyncio.subprocess.DEVNULL)
            return await asyncio.wait_for(process.wait(), 30)
        try:
            up = await healthcheck()
        finally:
            await runtime.stop()
        return up, await healthcheck()

    up, down = asyncio.run(check())
    assert up == 0, "HEALTHCHECK fails against a running kproxy"
    assert down != 0, "HEALTHCHECK passes with kproxy stopped"


# ---------------------------------------------------------------- compose

def test_compose_kproxy_command_is_valid_and_its_ports_published(monkeypatch, capsys):
    services = compose()["services"]
    kproxy, kafka = services["kproxy"], services["kafka"]
    build = kproxy["build"]
    assert (DEPLOY / build["context"]).resolve() == REPO
    assert (REPO / build["dockerfile"]).resolve() == DOCKERFILE
    config = compose_kproxy_config(monkeypatch, capsys)

    assert config.mode == "gateway"
    kafka_env = compose_env(kafka)
    advertised = dict(re.findall(r"(\w+)://([^,]+)", kafka_env["KAFKA_ADVERTISED_LISTENERS"]))
    assert len(config.upstreams) == 1
    assert f"{config.upstreams[0][0]}:{config.upstreams[0][1]}" in advertised.values(), \
        "kproxy's upstream is not an address the broker advertises"
    assert config.upstreams[0][0] in services
    # Clients on the host reach kproxy at advertised_host:<the same port as in the container>.
    published = compose_published(kproxy)
    node_port = config.port_base + int(kafka_env["KAFKA_NODE_ID"])
    if config.broker_port_rule == "map":
        node_port = config.broker_port_map[int(kafka_env["KAFKA_NODE_ID"])]
    for port in (config.listen[1], node_port, config.admin_listen[1], config.probe_listen[1]):
        assert published.get(port) == port, f"port {port} not published as {port}:{port}"
    assert {config.listen[0], config.admin_listen[0], config.probe_listen[0]} <= set(WILDCARD_HOSTS)
    grace = re.fullmatch(r"(\d+)s", str(kproxy.get("stop_grace_period", "10s")))
    assert grace and int(grace[1]) > config.shutdown_timeout, \
        "stop_grace_period must leave kproxy its shutdown_timeout for in-flight requests"


def test_compose_publishes_every_port_on_loopback_only():
    for name, service in compose()["services"].items():
        for port in service.get("ports", []):
            parts = str(port).split(":")
            assert len(parts) == 3 and parts[0] == "127.0.0.1", \
                f"{name}: {port} is published on every interface; bind it to 127.0.0.1"


def test_compose_kafka_is_a_single_kraft_node():
    kafka = compose()["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:") and not kafka["image"].endswith(":latest")
    env = compose_env(kafka)
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(env["KAFKA_NODE_ID"] + "@")
    cluster_id = env["CLUSTER_ID"]
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16, "CLUSTER_ID is not a Kafka UUID"
    assert "healthcheck" in kafka
    assert compose()["services"]["kproxy"]["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_compose_mounts_are_repo_files():
    for name, service in compose()["services"].items():
        for source, target in compose_mounts(service):
            assert source.exists(), f"{name}: mounts {source}, which does not exist"
            assert REPO in source.parents, f"{name}: mounts {source} from outside the repo"


def test_compose_prometheus_config_as_mounted(promtool, tmp_path):
    """promtool on the files laid out as the container sees them (rule_files resolve
    relative to the config file, so both must land side by side)."""
    prometheus = compose()["services"]["prometheus"]
    mounts = compose_mounts(prometheus)
    for source, target in mounts:
        local = tmp_path / target.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, local)
    config_target = next(t for s, t in mounts if s == PROMETHEUS / "prometheus.yml")
    assert config_target == "/etc/prometheus/prometheus.yml", "the image reads this path by default"
    output = run_promtool(promtool, "check", "config", str(tmp_path / config_target.lstrip("/")))
    assert f"SUCCESS: {len(ALERTS)} rules found" in output


def test_compose_prometheus_scrapes_kproxy_admin_metrics(monkeypatch, capsys):
    config = compose_kproxy_config(monkeypatch, capsys)
    prometheus = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    job = jobs[JOB]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for static in job["static_configs"] for t in static["targets"]]
    assert f"kproxy:{config.admin_listen[1]}" in targets


def test_compose_grafana_provisioning_and_dashboard():
    services = compose()["services"]
    grafana = services["grafana"]
    mounts = {target: source for source, target in compose_mounts(grafana)}
    assert mounts["/etc/grafana/provisioning"] == GRAFANA / "provisioning"
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/kproxy.yaml").read_text())
    (file_provider,) = provider["providers"]
    assert file_provider["type"] == "file"
    path = file_provider["options"]["path"]
    assert mounts.get(path) == DASHBOARD.parent, f"provider path {path} is not the dashboards mount"
    home = compose_env(grafana).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        assert home == f"{path}/{DASHBOARD.name}"
    datasources = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus"
    match = re.fullmatch(r"http://([\w-]+):(\d+)", source["url"])
    assert match and match[1] in services and match[1] == "prometheus"
    assert source["jsonData"]["timeInterval"] == \
        yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())["global"]["scrape_interval"]


# ---------------------------------------------------------------- Kubernetes

def test_kubernetes_has_both_statefulset_variants_services_and_servicemonitor():
    files = {name for name, _ in statefulsets()}
    assert files == {"statefulset.yaml", "statefulset-configmap.yaml"}
    assert [doc["metadata"]["name"] for _, doc in k8s_kind("ServiceMonitor")] == ["kproxy"]
    (_, servicemonitor), = k8s_kind("ServiceMonitor")
    assert servicemonitor["apiVersion"] == "monitoring.coreos.com/v1"


@pytest.mark.parametrize("name", ["statefulset.yaml", "statefulset-configmap.yaml"])
def test_kubernetes_sidecar_args_are_valid(name, tmp_path, monkeypatch, capsys):
    sts = dict(statefulsets())[name]
    config = kproxy_run_in_pod(sts, tmp_path, monkeypatch, capsys)
    assert config.mode == "sidecar"
    assert [host for host, _ in config.upstreams] == ["127.0.0.1"], "a sidecar relays to its own pod"
    assert config.listen[0] in WILDCARD_HOSTS and config.admin_listen[0] in WILDCARD_HOSTS
    # Node N must be advertised as the DNS name of pod N of this StatefulSet.
    set_name, service = sts["metadata"]["name"], sts["spec"]["serviceName"]
    namespace = FIELD_REFS["metadata.namespace"]
    for node in range(sts["spec"]["replicas"]):
        host = config.advertised_host_template.format(node_id=node, host="ignored")
        assert host in (f"{set_name}-{node}.{service}", f"{set_name}-{node}.{service}.{namespace}",
                        f"{set_name}-{node}.{service}.{namespace}.svc.cluster.local"), host
    # Every node is advertised on kproxy's listen port (fixed), which the headless Service
    # must carry to the kproxy container.
    assert config.broker_port_rule == "fixed"
    container_ports = {p["name"]: p["containerPort"] for p in kproxy_container(sts)["ports"]}
    assert config.listen[1] in container_ports.values()
    (headless,) = [doc for _, doc in k8s_kind("Service") if doc["metadata"]["name"] == service]
    assert headless["spec"]["clusterIP"] == "None"
    service_ports = {p["port"]: container_ports.get(p["targetPort"], p["targetPort"])
                     for p in headless["spec"]["ports"]}
    assert service_ports.get(config.listen[1]) == config.listen[1], \
        "clients are sent to <pod>.<headless service>:<listen port>: the Service must map it to kproxy"
    assert headless["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()


def test_kubernetes_variants_start_kproxy_identically(tmp_path, monkeypatch, capsys):
    flags, mounted = (kproxy_run_in_pod(dict(statefulsets())[name], tmp_path / name, monkeypatch, capsys)
                      for name in ("statefulset.yaml", "statefulset-configmap.yaml"))
    assert flags == mounted


@pytest.mark.parametrize("name", ["statefulset.yaml", "statefulset-configmap.yaml"])
def test_kubernetes_probes_hit_the_probe_listener_and_annotations_the_admin_listener(name, tmp_path,
                                                                                     monkeypatch, capsys):
    sts = dict(statefulsets())[name]
    config = kproxy_run_in_pod(sts, tmp_path, monkeypatch, capsys)
    container = kproxy_container(sts)
    routes = probe_routes(config)
    assert routes == {"/healthz", "/readyz"} and routes <= admin_routes(config)
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path and path in routes
        assert resolve_port(container, get["port"]) == config.probe_listen[1]
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(config.admin_listen[1])
    assert annotations["prometheus.io/path"] == "/metrics"
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > config.shutdown_timeout


@pytest.mark.parametrize("name", ["statefulset.yaml", "statefulset-configmap.yaml"])
def test_kubernetes_kproxy_container_is_locked_down(name):
    sts = dict(statefulsets())[name]
    container = kproxy_container(sts)
    security = container["securityContext"]
    uid, gid = image_user()
    assert security["runAsNonRoot"] is True and security["runAsUser"] == uid
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]
    assert sts["spec"]["podManagementPolicy"] == "Parallel"   # KRaft voters start together


def test_kubernetes_servicemonitor_scrapes_the_admin_port(tmp_path, monkeypatch, capsys):
    (_, monitor), = k8s_kind("ServiceMonitor")
    services = [doc for _, doc in k8s_kind("Service")
                if monitor["spec"]["selector"]["matchLabels"].items() <= doc["metadata"]["labels"].items()]
    assert len(services) == 1, "the ServiceMonitor must select exactly one Service (no double scrapes)"
    (service,) = services
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    for index, (_, sts) in enumerate(statefulsets()):
        config = kproxy_run_in_pod(sts, tmp_path / str(index), monkeypatch, capsys)
        assert resolve_port(kproxy_container(sts), port["targetPort"]) == config.admin_listen[1]
        assert service["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"].get("clusterIP") == "None", "one endpoint per pod: every kproxy scraped on its own"
    jobs = [r["replacement"] for r in endpoint.get("relabelings", []) if r.get("targetLabel") == "job"]
    assert jobs == [JOB], "the alerts select on job=\"kproxy\""


def test_kubernetes_pod_discovery_finds_exactly_the_kproxy_admin_port(monkeypatch, capsys, tmp_path):
    scrape = yaml.safe_load((PROMETHEUS / "prometheus-kubernetes.yml").read_text())
    (job,) = [j for j in scrape["scrape_configs"] if j["job_name"] == JOB]
    for index, (_, sts) in enumerate(statefulsets()):
        config = kproxy_run_in_pod(sts, tmp_path / str(index), monkeypatch, capsys)
        found = [relabel({"job": JOB, "__metrics_path__": job.get("metrics_path", "/metrics"), **t},
                         job["relabel_configs"]) for t in pod_sd_targets(sts)]
        found = [t for t in found if t is not None]
        assert len(found) == 1, found
        assert found[0]["__address__"] == f"{POD_IP}:{config.admin_listen[1]}"
        assert found[0]["__metrics_path__"] == "/metrics"
        assert found[0]["job"] == JOB and found[0]["pod"] == FIELD_REFS["metadata.name"]


def test_kubernetes_admin_port_is_on_no_service_but_the_scraped_one(tmp_path, monkeypatch, capsys):
    """Only the Service the ServiceMonitor selects carries kproxy's admin port, and only it."""
    (_, monitor), = k8s_kind("ServiceMonitor")
    for index, (_, sts) in enumerate(statefulsets()):
        config = kproxy_run_in_pod(sts, tmp_path / str(index), monkeypatch, capsys)
        named = {p["name"]: p["containerPort"] for c in pod_spec(sts)["containers"] for p in c.get("ports", [])}
        for _, service in k8s_kind("Service"):
            if not service["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items():
                continue
            targets = [p for p in service["spec"]["ports"]
                       if named.get(p["targetPort"], p["targetPort"]) == config.admin_listen[1]]
            scraped = monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
            if scraped:
                assert targets and len(service["spec"]["ports"]) == 1, \
                    f"{service['metadata']['name']}: the scraped Service carries the admin port alone"
            else:
                assert not targets, f"{service['metadata']['name']} publishes kproxy's admin port"


def test_kubernetes_network_policy_admits_exactly_what_the_pods_need():
    policies = [doc for _, doc in k8s_kind("NetworkPolicy")]
    assert policies, "no NetworkPolicy: every pod in the cluster reaches kproxy's admin port"
    for name, sts in statefulsets():
        labels = sts["spec"]["template"]["metadata"]["labels"]
        ports = {p["name"]: p for c in pod_spec(sts)["containers"] for p in c.get("ports", [])}
        assert set(ports) == {"kafka-proxy", "internal", "controller", "admin", "probes"}, name
        allowed = {who: {port for port, spec in ports.items() if ingress_allowed(policies, labels, spec, source)}
                   for who, source in (("client", CLIENT), ("peer", PEER_BROKER), ("prometheus", PROMETHEUS_POD),
                                       ("neighbour", NEIGHBOUR), ("other monitor", OTHER_MONITOR))}
        assert allowed == {"client": {"kafka-proxy"},
                           "peer": {"kafka-proxy", "internal", "controller"},
                           "prometheus": {"kafka-proxy", "admin"},
                           "neighbour": {"kafka-proxy"},
                           "other monitor": {"kafka-proxy"}}, (name, allowed)
    # The scrape paths this repo ships must be among the admitted ones.
    annotations = statefulsets()[0][1]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(ports["admin"]["containerPort"])


def test_network_policy_evaluator_catches_open_rules():
    """So that the policy test above means something."""
    pod = {"app.kubernetes.io/name": "kafka"}
    admin = {"name": "admin", "containerPort": 9644}
    open_rule = {"spec": {"podSelector": {"matchLabels": pod}, "ingress": [{"ports": [{"port": "admin"}]}]}}
    any_namespace = {"spec": {"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}]}}
    numbered = {"spec": {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.9.0.0/16"}}],
                                                          "ports": [{"port": 9000, "endPort": 9700}]}]}}
    assert ingress_allowed([], pod, admin, CLIENT)
    assert ingress_allowed([open_rule], pod, admin, CLIENT)
    assert ingress_allowed([any_namespace], pod, admin, CLIENT)
    assert ingress_allowed([numbered], pod, admin, CLIENT) and not ingress_allowed([numbered], pod, admin, PROMETHEUS_POD)
    assert not ingress_allowed([{"spec": {"podSelector": {}, "ingress": []}}], pod, admin, CLIENT)


@pytest.mark.parametrize("name", ["statefulset.yaml", "statefulset-configmap.yaml"])
def test_kubernetes_capture_control_is_off_until_the_admin_secret_exists(name, tmp_path, monkeypatch, capsys):
    sts = dict(statefulsets())[name]
    container = kproxy_container(sts)
    without = kproxy_run_in_pod(sts, tmp_path / "without", monkeypatch, capsys)
    assert without.admin_token is None and not without.capture_allow_record_data
    with_secret = kproxy_run_in_pod(sts, tmp_path / "with", monkeypatch, capsys, secrets=ADMIN_SECRET)
    assert with_secret.admin_token == next(iter(ADMIN_SECRET.values()))
    # Captures land on a writable volume of their own: the root filesystem is read-only.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    assert without.capture_root in mounts, "capture_root is not a mounted volume"
    volume = volumes[mounts[without.capture_root]]
    assert "emptyDir" in volume and volume["emptyDir"].get("sizeLimit"), \
        "a capture volume without sizeLimit can fill the node's disk"
    # The token never sits in the ConfigMap kproxy reads.
    for _, configmap in k8s_kind("ConfigMap"):
        for text in configmap["data"].values():
            assert "admin_token" not in text


@pytest.mark.parametrize("variant", ["no token", "token"])
def test_kubernetes_pod_admin_listener_refuses_capture_control_without_the_token(variant, tmp_path, monkeypatch,
                                                                                 capsys):
    """The routes on the port Prometheus and the probes reach: only /capture* are protected."""
    sts = dict(statefulsets())["statefulset.yaml"]
    config = kproxy_run_in_pod(sts, tmp_path, monkeypatch, capsys,
                               secrets=ADMIN_SECRET if variant == "token" else None)
    admin = Runtime(config).admin
    assert {"/metrics", "/healthz", "/readyz"}.isdisjoint(admin.protected)
    assert {path for path in admin.routes if path.startswith("/capture")} == set(admin.protected)
    refusal = admin._authorize(None)
    assert refusal is not None and refusal[0] == (401 if variant == "token" else 403)


# ---------------------------------------------------------------- Prometheus: promtool

def test_promtool_check_rules(promtool):
    output = run_promtool(promtool, "check", "rules", str(PROMETHEUS / "alerts.yml"))
    assert f"SUCCESS: {len(ALERTS)} rules found" in output


def test_promtool_check_config(promtool):
    # From another directory, so rule_files must resolve relative to the config file.
    output = run_promtool(promtool, "check", "config", str(PROMETHEUS / "prometheus.yml"), cwd=REPO)
    assert "SUCCESS: 1 rule files found" in output and f"SUCCESS: {len(ALERTS)} rules found" in output


def test_promtool_check_kubernetes_config(promtool, tmp_path):
    """Debian's promtool is built without Kubernetes discovery: if it refuses
    kubernetes_sd_configs, check everything else (relabelling included) with the
    discovery swapped for a static target."""
    path = PROMETHEUS / "prometheus-kubernetes.yml"
    done = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True,
                          timeout=120)
    if done.returncode == 0:
        return
    assert "kubernetes_sd_configs not found" in done.stdout + done.stderr, done.stdout + done.stderr
    scrape = yaml.safe_load(path.read_text())
    for job in scrape["scrape_configs"]:
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["static_configs"] = [{"targets": [f"{POD_IP}:9644"]}]
    (tmp_path / path.name).write_text(yaml.safe_dump(scrape))
    shutil.copy(PROMETHEUS / "alerts.yml", tmp_path / "alerts.yml")
    run_promtool(promtool, "check", "config", str(tmp_path / path.name))


def test_promtool_alert_unit_tests(promtool):
    output = run_promtool(promtool, "test", "rules", "alerts_test.yml", cwd=PROMETHEUS)
    assert "SUCCESS" in output


@pytest.mark.parametrize("exporter", exporters(), ids=lambda e: type(e).__name__)
def test_promtool_lints_kproxy_exposition(promtool, exporter):
    from prometheus_client import generate_latest
    done = subprocess.run([promtool, "check", "metrics"], input=generate_latest(exporter.registry),
                          capture_output=True, timeout=60)
    assert done.returncode == 0, (done.stdout + done.stderr).decode()


# ---------------------------------------------------------------- Prometheus: alerts

def alert_rules() -> list[dict]:
    groups = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_alerts_are_the_agreed_set_and_complete():
    rules = alert_rules()
    assert {r["alert"] for r in rules} == ALERTS and len(rules) == len(ALERTS)
    for rule in rules:
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_alerts_select_the_scrape_job():
    jobs = {j["job_name"] for f in ("prometheus.yml", "prometheus-kubernetes.yml")
            for j in yaml.safe_load((PROMETHEUS / f).read_text())["scrape_configs"]}
    assert JOB in jobs
    for rule in alert_rules():
        for selected in re.findall(r'job\s*=\s*"([^"]*)"', rule["expr"]):
            assert selected == JOB, rule["alert"]


def test_every_alert_has_firing_and_silent_unit_tests():
    tests = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())
    assert tests["rule_files"] == ["alerts.yml"]
    fires, silent = set(), set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    assert fires == ALERTS, f"no firing case for {ALERTS - fires}"
    assert silent == ALERTS, f"no must-not-fire case for {ALERTS - silent}"


# ---------------------------------------------------------------- metric names

def test_alert_rules_use_kproxy_metrics_labels_and_values():
    problems = []
    for rule in alert_rules():
        problems += check_promql(rule["expr"], f"alert {rule['alert']}")
    assert not problems, "\n".join(problems)


def test_alert_unit_test_series_are_real_kproxy_series():
    tests = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())
    problems, names = [], set()
    for case in tests["tests"]:
        for series in case["input_series"]:
            problems += check_promql(series["series"], f"alerts_test {case['name']!r}")
            names |= set(METRIC_NAME.findall(series["series"]))
    assert not problems, "\n".join(problems)
    assert names, "no kproxy series in the alert tests"


def test_dashboard_uses_kproxy_metrics_labels_and_values():
    problems = []
    for where, expr, _ in dashboard_queries():
        problems += check_promql(expr, where)
    for variable in dashboard()["templating"]["list"]:
        problems += check_promql(variable_query(variable), f"variable {variable['name']}")
    assert not problems, "\n".join(problems)


def test_dashboard_shows_every_kproxy_metric():
    names, _ = kproxy_metrics()
    used = {name for _, expr, _ in dashboard_queries() for name in METRIC_NAME.findall(expr)}
    families = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in used}
    exported = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in names
                if n.startswith("kproxy_") and not n.endswith("_created")}
    assert not exported - families, f"not on the dashboard: {sorted(exported - families)}"


def test_metric_check_catches_mistakes():
    assert check_promql('rate(kproxy_request_latency_seconds_bucket{api="Produce"}[5m])', "x") == []
    assert check_promql("kproxy_requests", "x")                          # family name, not a series
    assert check_promql('kproxy_requests_total{reason="x"}', "x")         # label it does not have
    assert check_promql('kproxy_requests_total{api!~"JoinGrup"}', "x")    # misspelt API
    assert check_promql('kproxy_connections_closed_total{reason="unreachable"}', "x")
    assert check_promql("sum by (topic) (kproxy_requests_total)", "x")    # opt-in label


# ---------------------------------------------------------------- Grafana dashboard

def test_dashboard_variables():
    board = dashboard()
    assert 36 <= board["schemaVersion"] <= 41 and board["uid"] and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    datasource = variables["datasource"]
    assert datasource["type"] == "datasource" and datasource["query"] == "prometheus"
    instance = variables["instance"]
    assert instance["type"] == "query" and instance["multi"] and instance["includeAll"]
    assert variable_query(instance) == "label_values(kproxy_build_info, instance)"
    assert instance["datasource"]["uid"] == "${datasource}"


def test_dashboard_panels_use_the_variables_and_do_not_overlap():
    panels = dashboard_panels()
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    cells = {}
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel.get("targets"), panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"])["uid"] == "${datasource}"
            for name, body in SELECTOR.findall(target["expr"]):
                if name.startswith("kproxy_"):
                    assert 'instance=~"$instance"' in body, \
                        f"{panel['title']!r}: {name} ignores $instance"
            groupings = re.findall(r"\bby\s*\(([^)]*)\)", target["expr"])
            if target.get("legendFormat") and groupings:
                grouped = {label.strip() for group in groupings for label in group.split(",")} - {"le"}
                for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", target["legendFormat"]):
                    assert label in grouped, f"{panel['title']!r}: legend uses {label!r}, not grouped by"


def test_dashboard_has_the_agreed_panels():
    exprs = "".join(expr for _, expr, _ in dashboard_queries()).replace(" ", "")
    for needle in ("sum by (api) (rate(kproxy_requests_total",
                   "histogram_quantile(0.5, sum by (le, api) (rate(kproxy_request_latency_seconds_bucket",
                   "histogram_quantile(0.99, sum by (le, api) (rate(kproxy_request_latency_seconds_bucket",
                   "kproxy_fetch_long_poll_seconds_bucket", "kproxy_throttled_responses_total",
                   "histogram_quantile(0.99, sum by (le, api) (rate(kproxy_throttle_time_seconds_bucket",
                   "sum by (api, error) (rate(kproxy_response_errors_total",
                   "kproxy_client_received_bytes_total", "kproxy_client_sent_bytes_total",
                   "kproxy_upstream_received_bytes_total", "kproxy_upstream_sent_bytes_total",
                   "kproxy_connections_open", "kproxy_connections_opened_total",
                   "sum by (reason) (rate(kproxy_connections_closed_total",
                   "kproxy_produced_records_total", "kproxy_fetched_records_total",
                   "kproxy_produced_bytes_total", "kproxy_fetched_bytes_total",
                   "sum by (compression) (rate(kproxy_produce_batches_total",
                   "sum by (compression) (rate(kproxy_fetch_batches_total",
                   "kproxy_decode_failures_total", "kproxy_opaque_requests_total",
                   "kproxy_requests_in_flight"):
        assert needle.replace(" ", "") in exprs, needle
    (build_info,) = [p for p in dashboard_panels() if p["title"] == "Build info"]
    assert build_info["type"] == "table" and "kproxy_build_info" in build_info["targets"][0]["expr"]


def test_dashboard_queries_are_valid_promql(promtool, tmp_path):
    """Every panel query, Grafana variables filled in, as a recording rule for promtool."""
    rules = [{"record": f"dashboard:panel_{re.sub(r'[^a-z0-9]', '_', where.lower())}",
              "expr": grafana_to_promql(expr)} for where, expr, _ in dashboard_queries()]
    (tmp_path / "dashboard_rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": rules}]}))
    output = run_promtool(promtool, "check", "rules", str(tmp_path / "dashboard_rules.yml"))
    assert f"SUCCESS: {len(rules)} rules found" in output


# ---------------------------------------------------------------- /metrics on the admin port

def test_admin_listener_serves_the_scrape_path():
    routes = admin_routes(kconfig.build({"upstream": "b:1"}))
    assert {"/healthz", "/readyz"} <= routes
    if "/metrics" not in routes:
        pytest.skip("the admin listener does not serve /metrics yet (metrics wiring pending); "
                    "scrape configs, annotations and the ServiceMonitor all point there")


def test_every_metric_the_dashboard_and_alerts_use_is_served_by_a_running_kproxy():
    """Scrape a real kproxy's /metrics (HELP/TYPE lines name every family, with or without
    samples yet) and find each name the dashboard and the alert rules query."""
    import urllib.request

    from tests.proxy.harness import ProxyThread

    used = set()
    for _, expr, _ in dashboard_queries():
        used |= set(METRIC_NAME.findall(expr))
    for rule in alert_rules():
        used |= set(METRIC_NAME.findall(rule["expr"]))
    assert len(used) >= 20
    with ProxyThread(upstream="127.0.0.1:1", broker_port_base=40000, client_telemetry=True) as proxy:
        with urllib.request.urlopen(proxy.admin_url + "/metrics", timeout=10) as r:
            exposition = r.read().decode()
    # The supervisor of `kproxy run --workers N` serves its workers' merged exposition plus
    # these (tests/proxy/test_workers_e2e.py scrapes a real one).
    from prometheus_client import generate_latest
    exposition += generate_latest(SupervisorMetrics(2).registry).decode()
    families = {line.split()[2] for line in exposition.splitlines() if line.startswith("# TYPE ")}
    series = {line.split("{")[0].split()[0] for line in exposition.splitlines()
              if line and not line.startswith("#")}
    suffixes = ("_bucket", "_sum", "_count", "_total", "_created")
    missing = sorted(name for name in used
                     if name not in series and name not in families
                     and not any(name.endswith(s) and name[: -len(s)] in families for s in suffixes))
    assert not missing, f"used by dashboard/alerts but not served: {missing}"
