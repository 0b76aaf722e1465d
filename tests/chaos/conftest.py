"""tests/chaos: the nemesis and checker of ``logsync/chaos`` against real processes (issue 13).

The cluster runs (marker ``chaos``: fixed seeds, the planted defect, cleanup) take minutes,
so they run when ``tests/chaos`` (or a file in it) is named on the command line -- ``pytest
tests/chaos``, a step of its own in ``.ci/run`` -- or with ``-m chaos``, and are deselected
from a plain ``pytest``. The unit tests here (schedule, checker, proxy) always run.

What a run needs is checked per test and, when missing, skips it here and fails it under
``LOGSYNC_TESTS_STRICT=1`` (``tests/conftest.py: unavailable``): root and ip(8) for network
namespaces and the tmpfs of the full-disk fault, libfaketime for clock skew, and the
MemPalace 3.11 venv (installed on first use).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from logsync.chaos.cluster import faketime_lib
from logsync.chaos.interop import hub as H
from logsync.chaos.netns import namespaces_unavailable
from tests.conftest import unavailable

HERE = Path(__file__).resolve().parent
LINES_KEY = pytest.StashKey[list[str]]()


def _named(config: pytest.Config) -> bool:
    base = Path(config.invocation_params.dir)
    for arg in config.args:
        path = (base / str(arg).split("::")[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return "chaos" in (config.option.markexpr or "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _named(config):
        return
    keep, drop = [], []
    for item in items:
        inside = HERE in Path(str(item.path)).resolve().parents
        (drop if inside and item.get_closest_marker("chaos") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in terminalreporter.config.stash.get(LINES_KEY, []):
        terminalreporter.write_line(f"chaos: {line}")


@pytest.fixture
def record_line(request: pytest.FixtureRequest):
    """A line for the session summary (a run's verdict, mode and figures)."""
    def record(line: str) -> None:
        request.config.stash.setdefault(LINES_KEY, []).append(line)
    return record


@pytest.fixture(scope="session")
def mempalace_exe() -> Path:
    try:
        return H.ensure_mempalace()
    except H.HarnessError as exc:
        message = str(exc)
    pytest.fail(message, pytrace=False)


@pytest.fixture
def need_netns() -> None:
    reason = namespaces_unavailable()
    if reason:
        unavailable(f"network namespaces cannot be made here: {reason}")


@pytest.fixture
def need_faketime() -> None:
    if faketime_lib() is None:
        unavailable("clock faults need libfaketime (apt-get install faketime)")


@pytest.fixture
def need_mount() -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        unavailable("the full-disk fault mounts a tmpfs: it needs root and mount(8)")
