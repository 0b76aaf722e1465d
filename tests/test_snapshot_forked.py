"""The forked proof's cases (`forked_cases.py`) in an interpreter of their own.

A fork needs a process running one thread. A long test session's process need not be
one: an earlier test may leave a thread behind that only the kernel still counts, and
then the join rightly proves in-process (which the other tests cover). The cases need
the fork itself, so they run where it is certain, as in a fresh `logsync sync`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_forked_proof_cases_pass_in_a_process_of_their_own() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/forked_cases.py"], capture_output=True, text=True, timeout=300, cwd=ROOT,
        check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed is not None and int(passed.group(1)) >= 20, out[-2000:]
    assert not re.search(r"\d+ (failed|skipped|error)", out), out[-2000:]
