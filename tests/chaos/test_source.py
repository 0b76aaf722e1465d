"""A verdict names the code it judged (`run.source_of_checkout`): the commit, and whether
`logsync/` had uncommitted changes. A matrix once ran from a tree under edit: a daemon
restarted mid-run loaded half an edit and failed every round (seed 41 mesh/disk)."""

from __future__ import annotations

import subprocess

from logsync.chaos.interop import REPO_ROOT
from logsync.chaos.run import source_of_checkout


def test_the_verdict_names_the_commit_and_whether_logsync_was_edited() -> None:
    source = source_of_checkout()
    head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert source["commit"] == head
    edited = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain",
                             "--untracked-files=no", "--", "logsync"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert source["dirty"] is bool(edited)
