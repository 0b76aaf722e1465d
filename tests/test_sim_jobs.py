"""`logsync simulate --seeds A..B --jobs N`: the seeds on N worker processes, with output
identical to a serial run's (only the wall-clock line, and `wall_seconds` /
`elapsed_seconds` in JSON, may differ); a seed whose run raises or whose worker dies is
one sentence in its place; Ctrl-C ends the pool; a bad --jobs is one sentence; however a
sweep ends, its runs' directories (stores in tmpfs, that is RAM) are gone."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from logsync.cli import cli
from logsync.cli.sim import MAX_JOBS, sweep_summary, worker_count
from logsync.sim import load_scenario, run_scenario
from logsync.sim.report import summary_text
from logsync.sim.scratch import scratch_base

ROOT = Path(__file__).resolve().parent.parent
FAST = str(ROOT / "simulations" / "partition-and-heal.toml")  # about 1 s a seed
WALL_TEXT = re.compile(r"^  wall clock .*$", re.M)
WALL_JSON = re.compile(r'"(wall|elapsed)_seconds": [0-9.]+')


def _simulate(*args: str) -> Any:
    return CliRunner().invoke(cli, ["simulate", *args])


def _scratch() -> set[str]:
    """The run and sweep directories in the simulator's scratch place now."""
    base = scratch_base()
    return {p.name for p in base.iterdir()
            if p.name.startswith(("logsync-sim-", "logsync-sweep-"))}


def test_two_jobs_print_what_one_job_prints_byte_for_byte() -> None:
    for fmt in ([], ["--json"]):
        serial = _simulate(FAST, "--seeds", "1..3", "--jobs", "1", *fmt)
        parallel = _simulate(FAST, "--seeds", "1..3", "--jobs", "2", *fmt)
        assert serial.exit_code == parallel.exit_code == 0, serial.output + parallel.output
        wall = WALL_JSON if fmt else WALL_TEXT
        assert len(wall.findall(serial.output)) == (2 if fmt else 1)
        assert wall.sub("*", serial.output) == wall.sub("*", parallel.output)
    summary = json.loads(parallel.output)
    assert [s["seed"] for s in summary["seeds"]] == [1, 2, 3]
    assert len({s["trace_hash"] for s in summary["seeds"]}) == 3
    # the same hashes as each seed run on its own, here
    scenario = load_scenario(FAST)
    assert summary["seeds"][2]["trace_hash"] == run_scenario(scenario.with_seed(3)).trace_hash


def test_failing_seeds_are_listed_alike_and_exit_1(tmp_path: Path) -> None:
    # n0 cut off until the heal cannot catch up within a millisecond: every seed fails
    stuck = tmp_path / "stuck.toml"
    stuck.write_text(_stuck_text())
    serial = _simulate(str(stuck), "--seeds", "1..3", "--jobs", "1")
    parallel = _simulate(str(stuck), "--seeds", "1..3", "--jobs", "0")
    assert serial.exit_code == parallel.exit_code == 1
    assert "3 failed (1, 2, 3)" in parallel.output
    assert WALL_TEXT.sub("*", serial.output) == WALL_TEXT.sub("*", parallel.output)


def _stuck_text() -> str:
    return """
name = "stuck"
duration = "4s"
[nodes]
count = 3
[sync]
interval = "1s"
[[workload]]
rate = 10
[[fault]]
kind = "isolate"
node = "n0"
at = 1
[expect]
converge_within = "1ms"
"""


# A run for sweep_summary, pickled to the workers by reference: seed 3 raises, seed 5 kills
# its worker process outright, the others run for real.
def flaky_run(scenario: Any) -> Any:
    if scenario.seed == 3:
        raise ValueError("planted\nfailure")
    if scenario.seed == 5 and os.environ.get("LOGSYNC_TEST_IN_WORKER") != "no":
        os._exit(7)
    return run_scenario(scenario)


def test_a_seed_that_raises_or_kills_its_worker_is_one_sentence_in_its_place(
        tmp_path: Path) -> None:
    small = tmp_path / "small.toml"
    small.write_text(_stuck_text().replace('"1ms"', '"20s"').replace('at = 1', 'at = 1\n'
                                                                     'until = 2'))
    scenario = load_scenario(str(small))
    started, before = time.monotonic(), _scratch()
    summary = sweep_summary(scenario, range(1, 8), 2, flaky_run)
    assert time.monotonic() - started < 120
    assert _scratch() - before == set()  # the broken pool's workers left nothing
    assert summary["runs"] == 7 and summary["failed_seeds"] == [3, 5]
    assert [s["seed"] for s in summary["seeds"]] == [1, 2, 3, 4, 5, 6, 7]
    assert summary["seeds"][2]["error"] == "the run raised ValueError: planted failure"
    assert summary["seeds"][4]["error"] == "its worker process died before the run finished"
    assert all(s["ok"] and "error" not in s for i, s in enumerate(summary["seeds"])
               if i not in (2, 4))
    text = summary_text(summary, "small")
    assert "2 failed (3, 5)" in text and "Traceback" not in text
    lines = text.splitlines()
    assert "  seed 3: error: the run raised ValueError: planted failure" in lines
    assert lines.index("  seed 3: error: the run raised ValueError: planted failure") \
        < lines.index("  seed 5: error: its worker process died before the run finished")
    # the serial sweep reports the raising seed alike (seed 5 only dies in a worker)
    os.environ["LOGSYNC_TEST_IN_WORKER"] = "no"
    try:
        serial = sweep_summary(scenario, range(1, 5), 1, flaky_run)
    finally:
        del os.environ["LOGSYNC_TEST_IN_WORKER"]
    assert serial["seeds"] == summary["seeds"][:4]


def test_bad_jobs_is_one_sentence_and_the_count_is_bounded(tmp_path: Path) -> None:
    for raw in ("-1", "two"):
        result = _simulate(FAST, "--seeds", "1..2", "--jobs", raw)
        assert result.exit_code == 2
        message = result.output.strip().splitlines()[-1]
        assert message == (f"Error: Invalid value for --jobs: {raw!r} is not allowed: --jobs "
                           "takes a whole number >= 0 (worker processes; 0 = every core), "
                           "e.g. --jobs 2")
    alone = _simulate(FAST, "--seed", "1", "--jobs", "2")
    assert alone.exit_code == 2 and "pass --seeds A..B" in alone.output
    assert worker_count(None, 10) == 1 and worker_count(2, 1) == 1
    assert worker_count(10_000, 10_000) == MAX_JOBS
    assert 1 <= worker_count(0, 3) <= 3


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_stops_the_pool_and_its_workers(how: str) -> None:
    """Ctrl-C reaches the whole process group; SIGTERM (`timeout`, a service manager)
    only the parent, which must stop its workers itself."""
    before = _scratch()
    proc = subprocess.Popen(
        [sys.executable, "-m", "logsync", "simulate", FAST, "--seeds", "1..200", "--jobs",
         "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
        # as from a terminal: a test run started in the background (`cmd &` without job
        # control) ignores SIGINT, and an ignored signal stays ignored across exec
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(3)  # the workers are running seeds
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
        else:
            os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)  # reaped, its pipes closed
    assert proc.returncode == 130 and out == "", err
    assert re.fullmatch(r"Error: interrupted: \d+ of 200 seeds had finished and no run was "
                        r"left going", err.strip()), err
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # nothing of the group is left
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("a worker outlived Ctrl-C")
    assert _scratch() - before == set()  # the stopped runs' stores are gone too
