"""The hostile suite's figures: per-mode peak RSS and worst /healthz latency.

Each test adds its row to `FIGURES`; at the end of the session they are printed in the
terminal summary and written to `hostile_figures.json` in pytest's base temp directory
(the closing note of issue 8 quotes them).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

FIGURES: dict[str, dict[str, Any]] = {}


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    if not FIGURES:
        return
    factory = getattr(config, "_tmp_path_factory", None)
    path = None
    if factory is not None:
        path = factory.getbasetemp() / "hostile_figures.json"
        path.write_text(json.dumps(FIGURES, indent=2, sort_keys=True) + "\n")
    terminalreporter.section("hostile peer figures (issue 8)")
    terminalreporter.write_line(
        f"{'mode':<26} {'finding':<8} {'max /healthz s':>14} {'peak RSS MB':>12} "
        f"{'sync exit':>9} {'secs':>6} {'problems':>8}")
    for mode, row in sorted(FIGURES.items()):
        findings = ",".join(str(f) for f in row["findings"])
        terminalreporter.write_line(
            f"{mode:<26} {findings:<8} {_show(row['max_healthz_latency_s']):>14} "
            f"{_show(row['peak_rss_mb']):>12} {_show(row['sync_exit']):>9} "
            f"{row['seconds']:>6} {row['problems']:>8}")
    if path is not None:
        terminalreporter.write_line(f"written to {path}")


def _show(value: Any) -> str:
    return "-" if value is None else str(value)
