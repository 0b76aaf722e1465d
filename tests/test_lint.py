"""The codebase stays ruff-clean (pyproject's rules), as DESIGN.md's conventions ask."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "logsync", "tests", "benchmarks"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_missing_tool_skips_here_and_fails_under_ci(monkeypatch) -> None:
    """`.ci/run` sets LOGSYNC_TESTS_STRICT=1: a fault test that cannot run there fails,
    so a green CI never hides a check that was skipped."""
    import pytest

    from tests.conftest import STRICT_ENV, unavailable

    monkeypatch.delenv(STRICT_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no tool"):
        unavailable("no tool")
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="no tool"):
        unavailable("no tool")
