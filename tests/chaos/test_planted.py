"""The checker catches a planted defect: a daemon that loses every tenth op it applies
(``tests/chaos/planted.py``) fails the run, the verdict names the lost acknowledged appends
and where they are missing (checked here against the files themselves), the command
prints the replay line -- and the failed run leaves nothing behind."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

import pytest

from logsync.chaos import netns
from logsync.chaos.__main__ import main


@pytest.mark.chaos
def test_a_lost_write_daemon_fails_the_run_with_its_losses_named(
    tmp_path: Path, mempalace_exe: Path, capsys: pytest.CaptureFixture[str], need_netns: None,
) -> None:
    out = tmp_path / "run"
    code = main(["--seed", "5", "--nodes", "3", "--mix", "none", "--window", "12",
                 "--converge-timeout", "10", "--daemon-module", "tests.chaos.planted",
                 "--out", str(out), "--quiet"])
    printed = capsys.readouterr().out
    assert code == 1, printed
    assert "FAIL" in printed and "acknowledged append(s) lost" in printed
    assert ("replay: python -m logsync.chaos --seed 5 --topology mesh --mix none --nodes 3 "
            "--mode netns --window 12 --rounds 1 --converge-timeout 10 "
            "--daemon-module tests.chaos.planted") in printed  # every non-default setting
    verdict = json.loads((out / "verdict.json").read_text())
    lost = verdict["rounds"][0]["verdict"]["lost"]
    assert verdict["ok"] is False and verdict["lost"] == len(lost) > 0
    for entry in lost:
        # lost where a planted daemon applied it, and wherever pulled from one after that
        # (a hub too: it trusts the prefix); never where it was appended
        assert entry["missing_on"] and entry["appended_on"] not in entry["missing_on"], entry
        for name in entry["missing_on"]:
            db = out / "palaces" / name / "logstream.sqlite3"
            with contextlib.closing(sqlite3.connect(db)) as conn:
                held = conn.execute("SELECT count(*) FROM events WHERE id = ?",
                                    (entry["id"],)).fetchone()[0]
            assert held == 0, f"the checker says {entry['id']} is missing on {name}"
    assert verdict["rounds"][0]["verdict"]["gaps"], "a lost op leaves a hole in a prefix"
    assert verdict["leftovers"] == [] and verdict["cleanup_problems"] == []
    assert netns.find([verdict["tag"]]).describe() == []
