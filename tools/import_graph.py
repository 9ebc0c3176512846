#!/usr/bin/env python3
"""kproxy's import graph among its parts, checked against the layers they are meant to form.

A part is a subpackage of ``kproxy`` or one of its top-level modules. Every import
counts, wherever it stands (module level, inside a function, under ``TYPE_CHECKING``):
an import deferred to first use still makes the importer depend on what it names.

    python tools/import_graph.py            # problems (cycles, imports running upward); exit 1 if any
    python tools/import_graph.py --graph    # and every part's imports, layer by layer

``LAYERS`` is the map (bottom first; kproxy/__init__.py and docs/architecture.md tell it
in words): a part may import its own layer's other parts only if no cycle results, and
any part of a lower layer.
"""

from __future__ import annotations

import argparse
import ast
import functools
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kproxy"
ROOT = "kproxy"          # the package itself (``from . import __version__``)

# Bottom first. A part imports only parts of its own layer or of lower ones.
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer.split()) for layer in (
    "kproxy patterns spelling settings_file readiness http_limits allocator telemetry_settings",  # leaves
    "protocol",                                  # the sans-I/O codec
    "policy",                                    # rules over decoded requests
    "observers certs",                           # fed events; TLS files and SNI names
    "config",                                    # one frozen config of typed sections
    "proxy",                                     # asyncio, the only owner of sockets
    "probes",                                    # /healthz and /readyz, a process of their own
    "admin",                                     # the HTTP faces
    "startup_log runtime",                       # wiring
    "workers",                                   # kproxy run --workers N
    "embedded pipeline",                         # brokers on loopback; the capture analysis
    "cli",                                       # the commands
    "__main__",
))


@dataclass(frozen=True)
class Import:
    """One import of one part (or module) by another, where it stands."""
    importer: str
    imported: str
    file: str
    line: int
    type_only: bool = False          # under ``if TYPE_CHECKING:``: never runs

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.importer} imports {self.imported}"


def parts(package: Path = PACKAGE) -> set[str]:
    return {p.stem if p.is_file() else p.name for p in package.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()} | {ROOT}


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        relative = (package.name, *path.relative_to(package).with_suffix("").parts)
        out[".".join(relative[:-1] if relative[-1] == "__init__" else relative)] = path
    return out


def _type_only_lines(tree: ast.Module) -> set[int]:
    """Lines of the imports under ``if TYPE_CHECKING:``."""
    return {node.lineno for block in ast.walk(tree) if isinstance(block, ast.If)
            and getattr(block.test, "id", getattr(block.test, "attr", None)) == "TYPE_CHECKING"
            for stmt in block.body for node in ast.walk(stmt) if isinstance(node, (ast.Import, ast.ImportFrom))}


def module_imports(package: Path = PACKAGE) -> tuple[Import, ...]:
    """Every import of one of kproxy's modules by another, as the module it reaches (read
    once per process)."""
    return _module_imports(package)


@functools.cache
def _module_imports(package: Path) -> tuple[Import, ...]:
    known = modules(package)

    def reached(name: str) -> str | None:            # the module a dotted name lies in
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found = []
    for importer, path in known.items():
        here = importer.split(".") if path.name == "__init__.py" else importer.split(".")[:-1]
        tree = ast.parse(path.read_text(), str(path))
        type_only = _type_only_lines(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = ".".join(here[:len(here) - node.level + 1] + [node.module or ""] if node.level
                                  else [node.module or ""]).rstrip(".")
                targets = [f"{module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                imported = reached(target)
                if imported is not None and imported != importer and not importer.startswith(imported + "."):
                    found.append(Import(importer, imported, str(path.relative_to(package.parent)),
                                        node.lineno, node.lineno in type_only))
    return tuple(found)


def imports(package: Path = PACKAGE) -> list[Import]:
    """Every import from one part into another."""
    known = parts(package)

    def part(module: str) -> str:                    # names that are no part belong to the package
        below = module.split(".")[1:2]
        return below[0] if below and below[0] in known else ROOT

    return [Import(part(edge.importer), part(edge.imported), edge.file, edge.line, edge.type_only)
            for edge in module_imports(package) if part(edge.importer) != part(edge.imported)]


def layer_of(part: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if part in layer), None)


def cycles(edges: list[Import]) -> list[list[str]]:
    """Groups of parts that import each other, directly or around a loop (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in edges:
        graph[edge.importer].add(edge.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def problems(package: Path = PACKAGE) -> list[str]:
    """Parts missing from ``LAYERS``, imports running upward, and cycles; empty when the
    layering holds."""
    edges = imports(package)
    out = [f"{part}: in no layer (add it to LAYERS in tools/import_graph.py)"
           for part in sorted(parts(package)) if layer_of(part) is None]
    out += [f"{edge} (layer {layer_of(edge.importer)} importing layer {layer_of(edge.imported)}: upward)"
            for edge in edges if None not in (layer_of(edge.importer), layer_of(edge.imported))
            and layer_of(edge.imported) > layer_of(edge.importer)]
    for group in cycles(edges):
        where = [str(edge) for edge in edges if edge.importer in group and edge.imported in group]
        out.append(f"cycle among {', '.join(group)}: " + "; ".join(where))
    return out


def module_cycles(package: Path = PACKAGE) -> list[str]:
    """Modules that import each other when they run (imports for type checking left out):
    shown, not failed, since a deferred import inside one package is a choice, not a slip."""
    edges = [edge for edge in module_imports(package) if not edge.type_only]
    return [f"modules in a loop: {', '.join(group)}" for group in cycles(edges)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", action="store_true", help="also print every part's imports")
    args = parser.parse_args(argv)
    if args.graph:
        graph: dict[str, set[str]] = defaultdict(set)
        for edge in imports():
            graph[edge.importer].add(edge.imported)
        for number, layer in enumerate(LAYERS):
            for part in sorted(layer):
                print(f"{number:2} {part:18} -> {', '.join(sorted(graph[part])) or '-'}")
    found = problems()
    for line in found + module_cycles():
        print(line)
    if not found:
        print(f"{len(parts())} parts on {len(LAYERS)} layers: no cycle, no import running upward")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
