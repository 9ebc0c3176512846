"""The Helm chart (deploy/helm/kproxy), rendered by a real helm for each example values file.

helm is built from its Go module by scripts/setup.sh into the kproxy cache. Every object
it renders is validated against the Kubernetes API schemas (kubernetes-validate, strict:
no unknown fields) for the oldest Kubernetes the chart supports and the newest schemas
the package ships. Custom resources (ServiceMonitor, PrometheusRule) have no schema
there: the ServiceMonitor is checked against the Service it must find, the
PrometheusRule by promtool and against the repository's alert rules.

Then the properties the static deploy tests assert of deploy/kubernetes: the kproxy
container's command line, env and mounted files (the ConfigMap, and Secrets holding real
test certificates and a token) go through kproxy's own CLI and config loader; probes hit
the probe port's routes; Services, ports, the PodDisruptionBudget and the NetworkPolicy
agree with the config kproxy starts with; the pods run as non-root on a read-only root
filesystem with no capabilities.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kproxy import config as kconfig
from kproxy.embedded.kafka import default_cache_dir
from kproxy.proxy.tls import client_context, server_context
from tests.deploy.image import DEPLOY, REPO
from tests.deploy.test_deploy import (WILDCARD_HOSTS, admin_routes, image_env, image_user,
                                      k8s_container_env, k8s_expand, probe_routes, run_kproxy,
                                      promtool, run_promtool)  # noqa: F401 (promtool: a fixture)

CHART = DEPLOY / "helm" / "kproxy"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
GATEWAY_EXAMPLES = [p for p in EXAMPLES if yaml.safe_load(p.read_text()).get("mode", "gateway") == "gateway"]
SIDECAR_EXAMPLE = CHART / "examples" / "sidecar.yaml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "grafana" / "dashboards" / "kproxy.json"
SYNC_TOOL = REPO / "tools" / "sync_helm_files.py"
RELEASE, NAMESPACE = "kproxy", "kafka"
# Kinds whose schema is a CustomResourceDefinition (the Prometheus Operator's), which
# kubernetes-validate does not ship: checked structurally and by what they refer to.
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}
ADMIN_TOKEN = "0123456789abcdef0123456789abcdef"
HELM_TIMEOUT_S = 120


def helm_version() -> str:
    """The version scripts/setup.sh builds (one place for it)."""
    match = re.search(r"^HELM_VERSION=(\S+)$", (REPO / "scripts" / "setup.sh").read_text(), re.M)
    assert match, "scripts/setup.sh sets no HELM_VERSION"
    return match[1]


@pytest.fixture(scope="session")
def helm() -> str:
    path = default_cache_dir() / f"helm-{helm_version()}" / "helm"
    if not os.access(path, os.X_OK):
        pytest.fail(f"helm {helm_version()} not found at {path}: scripts/setup.sh builds it "
                    "from its Go module (needs Go)", pytrace=False)
    return str(path)


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=HELM_TIMEOUT_S,
                          env={**os.environ, "HELM_CACHE_HOME": "/nonexistent-helm-cache"})


_rendered: dict[tuple, list[dict]] = {}


def render(helm: str, values: Path, *sets: str) -> list[dict]:
    """`helm template` of the chart with a values file (and --set overrides), as objects."""
    key = (values, sets)
    if key not in _rendered:
        args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(values)]
        for item in sets:
            args += ["--set", item]
        done = run_helm(helm, *args)
        assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stderr}"
        _rendered[key] = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    return _rendered[key]


def render_fails(helm: str, values: Path, *sets: str) -> str:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(values)]
    for item in sets:
        args += ["--set", item]
    done = run_helm(helm, *args)
    assert done.returncode != 0, f"helm {' '.join(args)} rendered; expected it to refuse"
    return done.stderr


def kinds(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in kinds(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def sidecar_snippet(docs: list[dict]) -> tuple[dict, list[dict]]:
    """The container and volumes a sidecar operator adds to the broker pods (the chart
    renders them into a ConfigMap, and `helm install` prints the same text)."""
    snippet = one(docs, "ConfigMap", f"{RELEASE}-sidecar")["data"]
    return yaml.safe_load(snippet["container.yaml"]), yaml.safe_load(snippet["volumes.yaml"])


def sidecar_statefulset(docs: list[dict]) -> dict:
    """deploy/kubernetes/statefulset.yaml's broker pod with the chart's sidecar in place of
    its own kproxy container."""
    sts = yaml.safe_load((DEPLOY / "kubernetes" / "statefulset.yaml").read_text())
    container, volumes = sidecar_snippet(docs)
    spec = sts["spec"]["template"]["spec"]
    spec["containers"] = [c for c in spec["containers"] if c["name"] != "kproxy"] + [container]
    spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] != "capture"] + volumes
    return sts


def pod_of(docs: list[dict], example: Path) -> tuple[dict, dict]:
    """(pod template, kproxy container) the example runs kproxy in."""
    if example == SIDECAR_EXAMPLE:
        template = sidecar_statefulset(docs)["spec"]["template"]
    else:
        template = one(docs, "Deployment")["spec"]["template"]
    (container,) = [c for c in template["spec"]["containers"] if c["name"] == "kproxy"]
    return template, container


def container_port(container: dict, port) -> int:
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port in named, f"no container port named {port!r}"
    return named[port]


def secret_files(pki) -> dict[str, bytes]:
    """What a mounted Secret holds: cert-manager's kubernetes.io/tls keys (real test
    certificates: the SNI wildcard one, its CA) and an admin token."""
    return {"tls.crt": pki.sni.cert.read_bytes(), "tls.key": pki.sni.key.read_bytes(),
            "ca.crt": pki.ca.read_bytes(), "token": ADMIN_TOKEN.encode()}


def kproxy_in_pod(docs: list[dict], template: dict, container: dict, tmp_path: Path, pki,
                  monkeypatch, capsys) -> tuple[kconfig.Config, kconfig.Config]:
    """The Config the container starts with, through kproxy's CLI (the image's ENTRYPOINT
    plus the container's args, the image ENV plus the container's env) and through
    ``kproxy.config.load`` on the mounted config file: every volume the container mounts
    is laid out under tmp_path (ConfigMaps from the rendered ones, Secrets with real test
    certificates), and mount paths are rewritten in args, env and the config file."""
    assert container.get("command") in (None, ["kproxy", "run"]), "keep the image's ENTRYPOINT"
    env = k8s_container_env(container)
    args = [k8s_expand(str(arg), env) for arg in container.get("args", [])]
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    configmaps = {d["metadata"]["name"]: d for d in kinds(docs, "ConfigMap")}
    moved = {m["mountPath"]: str(tmp_path / m["mountPath"].lstrip("/"))
             for m in container.get("volumeMounts", [])}
    for a in moved:
        for b in moved:
            assert a == b or not b.startswith(a.rstrip("/") + "/"), f"{b} is mounted inside {a}"

    def local(text: str) -> str:
        for path, there in moved.items():
            text = text.replace(path, there)
        return text

    for mount in container.get("volumeMounts", []):
        assert "subPath" not in mount, f"{mount['name']}: a subPath mount never sees a renewed Secret"
        volume, where = volumes[mount["name"]], Path(moved[mount["mountPath"]])
        where.mkdir(parents=True)
        if "configMap" in volume:
            for key, text in configmaps[volume["configMap"]["name"]]["data"].items():
                (where / key).write_text(local(text))
        elif "secret" in volume:
            for key, data in secret_files(pki).items():
                (where / key).write_bytes(data)
        else:
            assert "emptyDir" in volume, f"{mount['name']}: unexpected volume {volume}"
    args = [local(a) for a in args]
    env = {k: local(v) for k, v in env.items()}
    full_env = {**image_env(), **env}
    (config_arg,) = [a for a in args if a.startswith("--config=")]
    config_file = config_arg.split("=", 1)[1]
    for key in kconfig.read_file(config_file):
        assert kconfig.ENV_PREFIX + key.upper() not in full_env, \
            f"{key!r} in the config file is overridden by env {kconfig.ENV_PREFIX + key.upper()}"
    via_cli = run_kproxy(args, full_env, monkeypatch, capsys)
    via_loader = kconfig.load(config_file, environ=full_env)
    return via_cli, via_loader


# ---------------------------------------------------------------- the chart's files

def test_chart_files_are_the_generated_copies():
    done = subprocess.run([sys.executable, str(SYNC_TOOL), "--check"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert yaml.safe_load((CHART / "files" / "alerts.yml").read_text()) == yaml.safe_load(ALERTS.read_text())
    assert (CHART / "files" / "kproxy.json").read_text() == DASHBOARD.read_text()


def test_examples_cover_every_mode():
    names = {p.name for p in EXAMPLES}
    assert {"gateway.yaml", "gateway-sni-tls.yaml", "sidecar.yaml", "strimzi.yaml"} <= names


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_helm_lint(helm, example):
    done = run_helm(helm, "lint", str(CHART), "--strict", "--namespace", NAMESPACE, "-f", str(example))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


# ---------------------------------------------------------------- schemas

@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_rendered_object_is_valid(helm, example):
    import kubernetes_validate

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    oldest = re.match(r">=\s*(\d+\.\d+)", chart["kubeVersion"])[1]
    versions = [f"{oldest}.0", kubernetes_validate.latest_version()]
    docs = render(helm, example)
    if example == SIDECAR_EXAMPLE:
        docs = docs + [sidecar_statefulset(docs)]
    checked = 0
    for doc in docs:
        name = f"{doc['kind']} {doc['metadata']['name']}"
        assert doc["metadata"].get("labels") is None or all(
            isinstance(v, str) for v in doc["metadata"]["labels"].values()), name
        if doc["kind"] in CUSTOM_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1", name
            continue
        for version in versions:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{example.name}: {name} is invalid for Kubernetes {version}: {exc.message} "
                            f"at {'/'.join(map(str, exc.path))}")
        checked += 1
    assert checked >= 4


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_service_monitor_finds_the_metrics_service(helm, example):
    docs = render(helm, example)
    monitor = one(docs, "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics" and re.fullmatch(r"\d+[smh]", endpoint["interval"])
    assert {"action": "replace", "targetLabel": "job", "replacement": "kproxy"} in endpoint["relabelings"]
    found = [s for s in kinds(docs, "Service")
             if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
    assert len(found) == 1, "the ServiceMonitor must select exactly the metrics Service"
    (service,) = found
    assert service["spec"]["clusterIP"] == "None", "one endpoint per pod: each kproxy scraped alone"
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    template, container = pod_of(docs, example)
    assert selects(service["spec"]["selector"], template["metadata"]["labels"])
    assert container_port(container, port["targetPort"]) == container_port(container, "kproxy-admin")


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_prometheus_rule_is_the_repos_alert_rules(helm, example, promtool, tmp_path):
    rule = one(render(helm, example), "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    run_promtool(promtool, "check", "rules", str(tmp_path / "rules.yml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_dashboard_configmap_for_the_grafana_sidecar(helm, example):
    board = one(render(helm, example), "ConfigMap", f"{RELEASE}-dashboard")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(board["data"]["kproxy.json"]) == json.loads(DASHBOARD.read_text())


# ---------------------------------------------------------------- what kproxy starts with

@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_kproxy_starts_with_the_rendered_config(helm, example, pki, tmp_path, monkeypatch, capsys):
    docs = render(helm, example)
    values = yaml.safe_load(example.read_text())
    template, container = pod_of(docs, example)
    config, loaded = kproxy_in_pod(docs, template, container, tmp_path, pki, monkeypatch, capsys)
    assert loaded == config, "kproxy.config.load and the CLI disagree"
    assert config.mode == values.get("mode", "gateway")
    assert config.listen == ("0.0.0.0", container_port(container, "kproxy-kafka"))
    assert config.admin_listen[1] == container_port(container, "kproxy-admin")
    assert "/metrics" in admin_routes(config)
    # Probes on the probe port, at routes it serves.
    assert config.probe_listen[1] == container_port(container, "kproxy-probes")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path and container_port(container, get["port"]) == config.probe_listen[1]
        assert path in probe_routes(config)
    # The advertised host is one clients can reach.
    if config.routing == "sni":
        assert config.sni_bootstrap_host == values["sni"]["bootstrapHost"]
    elif config.mode == "gateway":
        assert config.advertised_host not in WILDCARD_HOSTS
        assert config.public_host == values["advertisedHost"].replace(
            '{{ include "kproxy.fullname" . }}', RELEASE).replace("{{ .Release.Namespace }}", NAMESPACE)
    else:
        assert config.advertised_host_template == f"kafka-{{node_id}}.kafka-headless.{NAMESPACE}.svc.cluster.local"
        assert config.broker_port_rule == "fixed"
    # TLS files from the Secrets make working contexts; the token is the Secret's.
    tls = values.get("tls", {})
    assert (config.tls_server is not None) == tls.get("server", {}).get("enabled", False)
    assert (config.tls_client is not None) == tls.get("upstream", {}).get("enabled", False)
    if config.tls_server is not None:
        server_context(config.tls_server)
    if config.tls_client is not None:
        client_context(config.tls_client)
    assert (config.admin_token == ADMIN_TOKEN) == bool(values.get("adminToken", {}).get("existingSecret"))
    assert config.capture_root is not None


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_pods_run_unprivileged(helm, example):
    template, container = pod_of(render(helm, example), example)
    uid, gid = image_user()
    pod = template["spec"].get("securityContext", {})
    ctx = container["securityContext"]
    assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == uid and ctx["runAsGroup"] == gid
    assert ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"]["drop"] == ["ALL"] and not ctx["capabilities"].get("add")
    assert ctx["seccompProfile"]["type"] == "RuntimeDefault"
    if example != SIDECAR_EXAMPLE:          # the broker's pod is the operator's
        assert pod["runAsNonRoot"] is True
        assert template["spec"]["automountServiceAccountToken"] is False
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"] and resources["limits"]["memory"]
    assert "cpu" not in resources["limits"], "a CPU limit throttles relaying into client latency"
    assert template["spec"]["terminationGracePeriodSeconds"] > kconfig.DEFAULT_SHUTDOWN_TIMEOUT_S


@pytest.mark.parametrize("example", GATEWAY_EXAMPLES, ids=lambda p: p.stem)
def test_gateway_replicas_services_and_disruption_budget(helm, example, pki, tmp_path, monkeypatch, capsys):
    docs = render(helm, example)
    template, container = pod_of(docs, example)
    labels = template["metadata"]["labels"]
    deployment = one(docs, "Deployment")
    autoscalers = kinds(docs, "HorizontalPodAutoscaler")
    if autoscalers:
        (hpa,) = autoscalers
        assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
        assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        least = hpa["spec"]["minReplicas"]
    else:
        least = deployment["spec"]["replicas"]
    assert least >= 2
    pdb = one(docs, "PodDisruptionBudget")
    assert selects(pdb["spec"]["selector"]["matchLabels"], labels)
    assert pdb["spec"]["maxUnavailable"] < least
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0

    # Clients are told host:port; the Service must carry exactly those ports to the pods.
    config, _ = kproxy_in_pod(docs, template, container, tmp_path, pki, monkeypatch, capsys)
    (service,) = [s for s in kinds(docs, "Service") if s["spec"].get("clusterIP") != "None"]
    assert selects(service["spec"]["selector"], labels)
    exposed = {p["port"]: container_port(container, p["targetPort"]) for p in service["spec"]["ports"]}
    assert all(port == target for port, target in exposed.items()), "Service port != kproxy's port"
    if config.routing == "sni":
        assert set(exposed) == {config.listen[1]}
    else:
        node_ids = yaml.safe_load(example.read_text())["brokers"]["nodeIds"]
        assert set(exposed) == {config.listen[1]} | {config.port_base + n for n in node_ids}
    if service["spec"]["type"] == "NodePort":
        assert all(p["nodePort"] == p["port"] for p in service["spec"]["ports"])

    # The NetworkPolicy admits clients to every Kafka port and only Prometheus to admin.
    policy = one(docs, "NetworkPolicy")
    assert selects(policy["spec"]["podSelector"]["matchLabels"], labels)
    (client_rule,) = [r for r in policy["spec"]["ingress"]
                      if any(p["port"] == "kproxy-kafka" for p in r["ports"])]
    assert {container_port(container, p["port"]) for p in client_rule["ports"]} == set(exposed)
    clients = yaml.safe_load(example.read_text()).get("networkPolicy", {}).get("clients")
    assert client_rule.get("from") == (clients or None)
    (admin_rule,) = [r for r in policy["spec"]["ingress"]
                     if any(p["port"] == "kproxy-admin" for p in r["ports"])]
    assert admin_rule["from"], "the admin port must not be open to everyone"


def test_sidecar_renders_no_workload_and_selects_the_broker_pods(helm):
    docs = render(helm, SIDECAR_EXAMPLE)
    assert not {"Deployment", "StatefulSet", "PodDisruptionBudget", "HorizontalPodAutoscaler"} & {d["kind"] for d in docs}
    template, container = pod_of(docs, SIDECAR_EXAMPLE)
    bootstrap = one(docs, "Service", f"{RELEASE}-bootstrap")
    assert selects(bootstrap["spec"]["selector"], template["metadata"]["labels"])
    (port,) = bootstrap["spec"]["ports"]
    assert container_port(container, port["targetPort"]) == port["port"]
    policy = one(docs, "NetworkPolicy")
    peer_ports = {p["port"] for r in policy["spec"]["ingress"] for p in r["ports"] if isinstance(p["port"], int)}
    broker = next(c for c in template["spec"]["containers"] if c["name"] == "kafka")
    assert {p["containerPort"] for p in broker["ports"]} <= peer_ports, \
        "the policy selects the broker pods: it must still admit the brokers' own ports"


# ---------------------------------------------------------------- refusals

def test_gateway_without_advertised_host_does_not_render(helm):
    err = render_fails(helm, CHART / "examples" / "gateway.yaml", "advertisedHost=")
    assert "advertisedHost: required in gateway mode" in err
    err = render_fails(helm, CHART / "examples" / "gateway.yaml", "advertisedHost=0.0.0.0")
    assert "not an address clients can reach" in err


def test_gateway_refusals_name_the_value(helm):
    gateway = CHART / "examples" / "gateway.yaml"
    assert "gateway.replicas: at least 2" in render_fails(helm, gateway, "gateway.replicas=1")
    assert "upstream: required" in render_fails(helm, gateway, "upstream=")
    sni = CHART / "examples" / "gateway-sni-tls.yaml"
    assert "tls.server" in render_fails(helm, sni, "tls.server.enabled=false")
    assert "config.listen" in render_fails(helm, gateway, "config.listen=0.0.0.0:1")
