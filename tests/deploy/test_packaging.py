"""kproxy as its users install it.

``python -m build`` makes the sdist and, from that sdist, the wheel (so a wheel proves the
sdist holds what a build needs). The wheel goes into a bare virtualenv: its runtime
dependencies only, at the versions in constraints.txt (pip's cache makes that quick), no
extra, no Java on PATH; that venv's ``kproxy run`` then relays a real client to the
session's Kafka broker, and its ``kproxy analyze`` names the extra that brings Spark.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from typing import NamedTuple

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import kproxy
from tests.proxy.harness import ConfluentTraffic, wait_for
from tests.proxy.wire import create_topic

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CONSTRAINTS = REPO / "constraints.txt"

# Two isolated builds (sdist, then the wheel from it), each installing the build backend into
# an environment of its own: seconds from pip's cache, a minute or more from a cold one.
BUILD_TIMEOUT_S = 300
# A venv and the wheel with its runtime dependencies (pyarrow is the big one, ~40 MB).
INSTALL_TIMEOUT_S = 300
START_TIMEOUT_S = 60.0            # an interpreter start and kproxy's imports on a busy 2-core machine
STOP_TIMEOUT_S = 30.0             # SIGTERM to exit
RELAY_TIMEOUT_S = 60.0            # a group join and the messages, through the proxy
MESSAGES = 200
# `kproxy run` logs its bootstrap listener once bound (port 0 in, the OS's port out).
LISTENING = re.compile(r"kproxy \w+ listening on 127\.0\.0\.1:(\d+)")
# User-facing text telling someone to install kproxy under the name that is not ours.
WRONG_INSTALL = re.compile(r"pip\s+install\s+['\"]?kproxy(?![\w-])")

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + INSTALL_TIMEOUT_S + 300)


class Dists(NamedTuple):
    sdist: Path
    wheel: Path


def tracked_package_files() -> set[str]:
    """Every file of the ``kproxy`` package the repository tracks (sources and data)."""
    listed = subprocess.run(["git", "ls-files", "kproxy"], cwd=REPO, capture_output=True, text=True, check=True)
    files = set(listed.stdout.split())
    assert "kproxy/__init__.py" in files, listed.stdout[:500]
    return files


def extra_requirement_names() -> set[str]:
    """What the extras add on top of the runtime dependencies."""
    runtime = {canonicalize_name(Requirement(r).name) for r in PROJECT["project"]["dependencies"]}
    extras = PROJECT["project"]["optional-dependencies"].values()
    return {canonicalize_name(Requirement(r).name) for extra in extras for r in extra} - runtime


def run_in_venv(venv: Path, *command: str, cwd: Path, timeout: float = START_TIMEOUT_S, **kwargs):
    """``command`` from the venv's bin with an environment that leads nowhere else: no
    PYTHONPATH (the checkout stays out of sight), PATH = the venv's bin only."""
    return subprocess.run([str(venv / "bin" / command[0]), *command[1:]], cwd=cwd, env=bare_env(venv),
                          capture_output=True, text=True, timeout=timeout, **kwargs)


def bare_env(venv: Path) -> dict[str, str]:
    return {"PATH": str(venv / "bin"), "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8"}


def clone_like_copy(destination: Path) -> Path:
    """The checkout's files as a clone (with work in progress) holds them: tracked and
    untracked-but-not-ignored. Building in the checkout itself would be blind to missing
    package data: setuptools adds the files listed in a leftover ``*.egg-info/SOURCES.txt``
    (an editable install's) to the sdist."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, text=True, check=True)
    for name in filter(None, listed.stdout.split("\0")):
        source = REPO / name
        if source.is_file():                     # not a deleted, still-tracked file
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> Dists:
    source, out = clone_like_copy(tmp_path_factory.mktemp("source")), tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(source)],
                           capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    sdists, wheels = list(out.glob("*.tar.gz")), list(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in out.iterdir())
    return Dists(sdists[0], wheels[0])


@pytest.fixture(scope="module")
def venv(dists, tmp_path_factory) -> Path:
    """A fresh venv holding the wheel and its runtime dependencies, nothing else (not even pip:
    this process's pip installs into it)."""
    path = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=60)
    # Away from the checkout and PYTHONPATH: pip would take the checkout's egg-info (an
    # editable install's) for kproxy already installed, and install only its dependencies.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(path / "bin" / "python"), "install", "--quiet",
         "--disable-pip-version-check", str(dists.wheel), "-c", str(CONSTRAINTS)],
        cwd=path, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    return path


def test_one_name_and_one_version_for_the_distribution():
    project = PROJECT["project"]
    assert project["name"] == kproxy.DISTRIBUTION
    assert canonicalize_name(project["name"]) != "kproxy"      # that name is someone else's
    assert "version" not in project and "version" in project["dynamic"]
    assert PROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "kproxy.__version__"}
    assert project["license-files"] == ["LICENSE"] and (REPO / "LICENSE").is_file()
    assert "Apache License" in (REPO / "LICENSE").read_text()[:200] and project["license"] == "Apache-2.0"


def test_no_user_facing_text_installs_the_other_kproxy():
    wrong = []
    for top in ("kproxy", "deploy", "docs", "scripts", "Makefile"):
        paths = [REPO / top] if (REPO / top).is_file() else (REPO / top).rglob("*")
        for path in paths:
            if path.is_file() and "__pycache__" not in path.parts:
                text = path.read_text(errors="replace")
                wrong += [f"{path.relative_to(REPO)}: {m[0]!r}" for m in WRONG_INSTALL.finditer(text)]
    assert not wrong, f"the package to install is {kproxy.DISTRIBUTION}: {wrong}"


def test_sdist_holds_what_a_build_needs(dists):
    with tarfile.open(dists.sdist) as sdist:
        top, *_ = sdist.getnames()[0].split("/")
        names = {name.partition("/")[2] for name in sdist.getnames()}
    assert top == f"{canonicalize_name(kproxy.DISTRIBUTION).replace('-', '_')}-{kproxy.__version__}"
    missing = ({"pyproject.toml", "README.md", "LICENSE"} | tracked_package_files()) - names
    assert not missing, f"the sdist lacks {sorted(missing)}"


def test_wheel_holds_the_package_its_data_and_metadata(dists):
    with zipfile.ZipFile(dists.wheel) as wheel:
        names = set(wheel.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = HeaderParser().parsestr(wheel.read(info).decode())
    missing = tracked_package_files() - names
    assert not missing, f"the wheel lacks {sorted(missing)} (pyproject.toml: [tool.setuptools.package-data])"
    assert {"kproxy/admin/web/index.html", "kproxy/pipeline/log4j2.properties"} <= names
    assert metadata["Name"] == kproxy.DISTRIBUTION and metadata["Version"] == kproxy.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert info.replace("METADATA", "licenses/LICENSE") in names
    assert set(metadata.get_all("Provides-Extra")) == set(PROJECT["project"]["optional-dependencies"])
    assert metadata.get_all("Classifier") == PROJECT["project"]["classifiers"]


def test_the_bare_venv_has_kproxy_and_its_runtime_dependencies_only(venv, tmp_path):
    probe = run_in_venv(venv, "python", "-c", """if True:
        import importlib.metadata as metadata, json, os
        import kproxy
        from kproxy.pipeline.cli import LOG4J_CONFIG
        from kproxy.admin.live_web import WEB_DIR
        print(json.dumps({"file": kproxy.__file__, "version": kproxy.__version__,
                          "installed": metadata.version(kproxy.DISTRIBUTION),
                          "dists": [d.metadata["Name"] for d in metadata.distributions()],
                          "web": sorted(p.name for p in WEB_DIR.iterdir()),
                          "log4j": os.path.isfile(LOG4J_CONFIG)}))""", cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert Path(found["file"]).is_relative_to(venv), found["file"]        # not the checkout
    assert found["version"] == found["installed"] == kproxy.__version__
    extras_installed = {canonicalize_name(name) for name in found["dists"]} & extra_requirement_names()
    assert not extras_installed, f"a bare install brought extras: {sorted(extras_installed)}"
    assert found["web"] == sorted(p.name for p in (REPO / "kproxy" / "admin" / "web").iterdir())
    assert found["log4j"]
    assert shutil.which("java", path=bare_env(venv)["PATH"]) is None

    helped = run_in_venv(venv, "kproxy", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "run" in helped.stdout, helped.stdout + helped.stderr


def test_analyze_without_spark_names_the_extra_to_install(venv, tmp_path):
    analyzed = run_in_venv(venv, "kproxy", "analyze", str(tmp_path), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert analyzed.returncode == 2, analyzed.stdout + analyzed.stderr
    assert f"pip install '{kproxy.DISTRIBUTION}[analysis]'" in analyzed.stderr, analyzed.stderr


def test_installed_kproxy_run_relays_a_client_to_kafka(venv, kafka_cluster, tmp_path):
    log_path = tmp_path / "kproxy.log"
    with log_path.open("wb") as log:
        proxy = subprocess.Popen(
            [str(venv / "bin" / "kproxy"), "run", "--upstream", kafka_cluster.bootstrap_servers,
             "--listen", "127.0.0.1:0", "--broker-port-base", "0", "--admin-listen", "off"],
            cwd=tmp_path, env=bare_env(venv), stdout=log, stderr=subprocess.STDOUT)
    try:
        def bound_port() -> str | None:
            assert proxy.poll() is None, f"kproxy exited with {proxy.returncode}: {log_path.read_text()}"
            found = LISTENING.search(log_path.read_text())
            return found and found[1]
        bootstrap = f"127.0.0.1:{wait_for(bound_port, START_TIMEOUT_S, 'kproxy to listen')}"

        from confluent_kafka.admin import AdminClient
        advertised = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=RELAY_TIMEOUT_S).brokers
        upstream = {(node.host, node.port) for node in kafka_cluster.nodes}
        assert advertised and not {(b.host, b.port) for b in advertised.values()} & upstream, \
            "the client was handed the broker's own address"

        traffic = ConfluentTraffic(bootstrap, create_topic(bootstrap), RELAY_TIMEOUT_S)
        traffic.start()
        traffic.wait_for_progress(MESSAGES, "from the installed wheel")
        traffic.finish()
        assert not traffic.delivery_errors and traffic.delivered and traffic.delivered <= traffic.consumed
    finally:
        if proxy.poll() is None:
            proxy.send_signal(signal.SIGTERM)
        try:
            code = proxy.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait()
            raise
    assert code == 0, log_path.read_text()[-3000:]
