"""What an install from `pyproject.toml` alone must hold: every third-party module logsync
imports is a declared dependency, and `logsync sync` on a terminal (where it draws its
progress with rich) succeeds.

Why: rich once came only with the test and mutation extras, so `pip install .` then
`logsync sync` in a terminal failed with "internal error ExceptionGroup" while every
test (stdout a pipe) passed.
"""

from __future__ import annotations

import ast
import os
import pty
import re
import select
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from logsync.store import Store
from tests.test_daemon import PY, daemons, event_ids

__all__ = ["daemons"]  # the fixture, shared with tests/test_daemon.py

ROOT = Path(__file__).resolve().parent.parent
# import name -> distribution name, where the two differ
DISTRIBUTION_OF = {"nacl": "pynacl", "yaml": "pyyaml", "sse_starlette": "sse-starlette",
                   "prometheus_client": "prometheus-client"}


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {_normal(re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0])
            for spec in project["dependencies"]}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_top_levels(package: Path) -> dict[str, str]:
    """Every top-level module name imported anywhere in `package` (lazy imports inside
    functions too), with one file that imports it."""
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def test_every_third_party_import_is_a_declared_dependency() -> None:
    third_party = {name: where for name, where in imported_top_levels(ROOT / "logsync").items()
                   if name not in sys.stdlib_module_names and name != "logsync"}
    assert "rich" in third_party, "the scan must see logsync.progress's lazy rich import"
    missing = {name: where for name, where in third_party.items()
               if _normal(DISTRIBUTION_OF.get(name, name)) not in declared()}
    assert missing == {}, f"imported but not in [project] dependencies: {missing}"


def test_sync_on_a_terminal_draws_progress_and_succeeds(daemons, tmp_path: Path) -> None:
    desk = daemons("desk")
    with Store.open(desk.palace) as store:
        for i in range(30):
            store.append_event("task.note", "proj", "lobby", "desk-agent", body=f"note {i}")
    laptop = tmp_path / "laptop"
    main, child = pty.openpty()
    try:
        proc = subprocess.Popen([*PY, "--palace", str(laptop), "sync", "--peer", desk.url,
                                 "--token", desk.token, "--pull-only", "--no-snapshot"],
                                stdin=child, stdout=child, stderr=child, close_fds=True)
    finally:
        os.close(child)
    seen = _read_until_exit(main, proc, deadline=time.monotonic() + 60)
    assert proc.returncode == 0, seen
    assert "ERROR" not in seen and "Traceback" not in seen, seen
    assert len(event_ids(laptop)) == 30


def _read_until_exit(fd: int, proc: subprocess.Popen[bytes], deadline: float) -> str:
    """All the terminal showed, read until the child exits and the pty is drained."""
    chunks: list[bytes] = []
    try:
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([fd], [], [], min(left, 1.0))[0]:
                continue  # a silent child is waited for only until the deadline
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: every writer closed the pty
                break
            if not data:
                break
            chunks.append(data)
        else:
            proc.kill()
        proc.wait(timeout=10)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")
