"""Layout shows the architecture: no import circle in `logsync/` (type-only imports count:
a circle of types is a circle of concerns), no module far over 500 lines, the sans-IO
modules import nothing that does I/O, and one copy of the replication rules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "logsync"
MAX_LINES = 520  # "about 500"
# Modules that decide, and must stay runnable under virtual time: they may import only
# each other and the standard library's pure parts.
SANS_IO = ("logsync.engine", "logsync.peerloop", "logsync.fetchpolicy", "logsync.schedule",
           "logsync.wire", "logsync.report", "logsync.effects", "logsync.responder")
IO_MODULES = ("logsync.files", "logsync.replica", "logsync.store", "logsync.client",
              "logsync.server", "logsync.daemon", "logsync.watch", "logsync.peers",
              "logsync.peerstate", "logsync.cli", "logsync.sim")
IO_STDLIB = {"socket", "ssl", "sqlite3", "subprocess", "asyncio", "os", "pathlib", "shutil",
             "tempfile", "anyio", "httpx", "uvicorn", "starlette"}
CLOCKS = {"time", "threading"}  # a deciding module takes the caller's time; hlc, which it
# reaches through the model's limits, only defaults to the system clock when given none


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(logsync modules, other top-level packages) imported anywhere in the module."""
    ours: set[str] = set()
    others: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [(base, a.name) for a in node.names]
        else:
            continue
        for module, member in targets:
            if not module.startswith("logsync"):
                others.add(module.split(".")[0])
                continue
            full = f"{module}.{member}" if member and f"{module}.{member}" in known else module
            while full not in known and "." in full:
                full = full.rpartition(".")[0]
            if full in known and full != name:
                ours.add(full)
    return ours, others


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known)[0] for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_checker_finds_a_planted_circle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_logsync() -> None:
    assert cycles(graph()) == []


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_module_is_far_over_500_lines(name: str) -> None:
    lines = modules()[name].read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{name} has {lines} lines; split it by job"


@pytest.mark.parametrize("name", SANS_IO)
def test_the_deciding_modules_reach_no_io(name: str) -> None:
    """Everything a sans-IO module imports, transitively, is sans-IO too."""
    known = modules()
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        ours, others = imports_of(current, known[current], known)
        assert not (others & IO_STDLIB), f"{current} (from {name}) imports {others & IO_STDLIB}"
        if current in SANS_IO:
            assert not (others & CLOCKS), f"{current} imports {others & CLOCKS}"
        todo.extend(ours)
    reached = sorted(m for m in seen if m.startswith(IO_MODULES))
    assert reached == [], f"{name} reaches {reached}"
