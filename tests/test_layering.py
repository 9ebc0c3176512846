"""kproxy's parts form layers: no import runs upward, no two parts import each other
(``tools/import_graph.py``; the codec's own rules: tests/protocol/test_layering.py)."""

from pathlib import Path

from tools import import_graph


def test_kproxy_has_no_import_cycle_and_no_import_running_upward():
    assert import_graph.problems() == []


def _package(root: Path, files: dict[str, str]) -> Path:
    package = root / "kproxy"
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_the_check_finds_an_upward_import_a_cycle_and_a_part_in_no_layer(tmp_path):
    package = _package(tmp_path, {
        "__init__.py": "",
        "config.py": "def later():\n    from .proxy.server import X\n",           # deferred: still counts
        "proxy/__init__.py": "",
        "proxy/server.py": "from ..config import Y\n",
        "protocol/__init__.py": "import kproxy.observers.metrics\n",
        "observers/__init__.py": "",
        "observers/metrics.py": "",
        "newcomer.py": "from . import __version__\n",
    })
    found = import_graph.problems(package)
    assert found[0] == "newcomer: in no layer (add it to LAYERS in tools/import_graph.py)"
    upward = [line for line in found if line.endswith(": upward)")]
    assert [line.split(": ", 1)[1].split(" (")[0] for line in upward] == [
        "config imports proxy", "protocol imports observers"]
    assert upward[0].startswith("kproxy/config.py:2: ")
    assert [line.split(":")[0] for line in found if line.startswith("cycle")] == ["cycle among config, proxy"]
    assert len(found) == 4, found


def test_modules_in_a_loop_are_shown_unless_the_loop_is_for_type_checking_only(tmp_path):
    package = _package(tmp_path, {
        "__init__.py": "",
        "pipeline/__init__.py": "",
        "pipeline/report.py": "def section():\n    from .report_policy import policy\n",
        "pipeline/report_policy.py": "from .report import esc\n",
        "proxy/__init__.py": "",
        "proxy/relay.py": "from .memory import Arena\n",
        "proxy/memory.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .relay import Endpoint\n",
    })
    assert import_graph.module_cycles(package) == [
        "modules in a loop: kproxy.pipeline.report, kproxy.pipeline.report_policy"]


def test_the_broker_directory_and_what_it_imports_own_no_socket():
    """The broker directory (ports, advertised addresses, served nodes) is sans-I/O, like
    the codec: testable without a socket or an event loop."""
    from tests.protocol.test_layering import FORBIDDEN, imported_modules
    reached = {edge.imported for edge in import_graph.module_imports()
               if edge.importer == "kproxy.proxy.directory" and not edge.type_only}
    assert "kproxy.config" in reached and not any(name.startswith("kproxy.proxy.") and name not in
                                                  ("kproxy.proxy.directory", "kproxy.proxy.log_budget")
                                                  for name in reached), reached
    for module in ("kproxy.proxy.directory", "kproxy.proxy.log_budget", "kproxy.certs.sni",
                   "kproxy.observers.contract"):
        path = import_graph.modules()[module]
        assert not {name.split(".")[0] for name in imported_modules(path)} & FORBIDDEN, module
