"""Simulation runs keep their stores in tmpfs (RAM): a run or a sweep killed outright
(SIGKILL: nothing of it runs again) leaves its directory, and the next run removes it;
a directory whose owner lives, or that is not a run's, is never touched."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logsync.sim import load_scenario, run_scenario
from logsync.sim.scratch import LOCK_NAME, claimed_dir, remove_abandoned, scratch_base

ROOT = Path(__file__).resolve().parent.parent
FAST = ROOT / "simulations" / "partition-and-heal.toml"
SLOW = ROOT / "simulations" / "broadcast-25.toml"  # runs long enough to be killed in


def _runs(base: Path, prefix: str) -> set[str]:
    return {p.name for p in base.iterdir() if p.name.startswith(prefix)}


def _group(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and int(stat.rpartition(")")[2].split()[2]) == pgid:
            members.append(int(entry.name))
    return members


def _is_resource_tracker(pid: int) -> bool:
    try:
        return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _semaphores() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("sem.mp-*")}


def _killed_mid_run(argv: list[str], prefix: str) -> set[str]:
    """Start `logsync simulate …`, SIGKILL its whole group once its directory exists
    (all but multiprocessing's resource tracker: it outlives a killed parent to unlink
    the pool's named semaphores, which a kill of it too would leave in /dev/shm); the
    directories it left."""
    base = scratch_base()
    before, semaphores = _runs(base, prefix), _semaphores()
    proc = subprocess.Popen([sys.executable, "-m", "logsync", "simulate", *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _runs(base, prefix) - before and time.monotonic() < deadline:
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.05)
        time.sleep(1.0)  # its stores are being written
    finally:
        for pid in _group(proc.pid):
            if not _is_resource_tracker(pid):
                with contextlib.suppress(ProcessLookupError):  # it ended since the listing
                    os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # every process of the group is gone
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("the resource tracker outlived its killed run by 10 s")
    assert _semaphores() - semaphores == set(), "named semaphores left in /dev/shm"
    left = _runs(base, prefix) - before
    assert left, "the killed run left no directory: nothing to test"
    for name in left:
        assert (base / name / LOCK_NAME).is_file()
    return left


@pytest.mark.parametrize("argv, prefix", [
    ([str(SLOW), "--seed", "1"], "logsync-sim-"),
    ([str(SLOW), "--seeds", "1..4", "--jobs", "2"], "logsync-sweep-"),
], ids=["one-run", "sweep"])
def test_a_run_killed_outright_is_removed_by_the_next_run(argv: list[str],
                                                          prefix: str) -> None:
    left = _killed_mid_run(argv, prefix)
    report = run_scenario(load_scenario(FAST).with_seed(1))  # the next run, in-process
    assert report.ok
    assert not left & _runs(scratch_base(), prefix)


def test_a_directory_in_use_or_not_a_runs_is_left_alone(tmp_path: Path) -> None:
    with claimed_dir("logsync-sim-", tmp_path) as live:
        (live / "n0").mkdir()
        dead = tmp_path / "logsync-sim-dead"
        dead.mkdir()
        (dead / LOCK_NAME).touch()  # its owner died: nobody holds the lock
        making = tmp_path / "logsync-sim-making"
        making.mkdir()
        (making / f"{LOCK_NAME}.making").touch()  # being made: not yet locked
        bare = tmp_path / "logsync-sweep-bare"
        bare.mkdir()  # no lock file: not ours to judge
        other = tmp_path / "other-dead"
        other.mkdir()
        (other / LOCK_NAME).touch()  # not a run's name
        target = tmp_path / "target"
        target.mkdir()
        (target / LOCK_NAME).touch()
        (tmp_path / "logsync-sim-link").symlink_to(target)  # never followed
        (tmp_path / "logsync-sim-file").write_text("x")
        assert remove_abandoned(tmp_path) == ["logsync-sim-dead"]
        assert live.is_dir() and (live / "n0").is_dir()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([
            live.name, "logsync-sim-file", "logsync-sim-link", "logsync-sim-making",
            "logsync-sweep-bare", "other-dead", "target"])
    assert not live.exists()  # the owner removes its own directory when it ends


def test_a_lock_held_by_another_process_keeps_the_directory(tmp_path: Path) -> None:
    held = tmp_path / "logsync-sweep-held"
    held.mkdir()
    (held / LOCK_NAME).touch()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], "
         "os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); "
         "time.sleep(60)", str(held / LOCK_NAME)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert remove_abandoned(tmp_path) == [] and held.is_dir()
    finally:
        holder.kill()
        holder.communicate(timeout=10)
    assert remove_abandoned(tmp_path) == ["logsync-sweep-held"] and not held.exists()


def test_the_claim_is_taken_before_the_lock_file_has_its_name(tmp_path: Path) -> None:
    with claimed_dir("logsync-sweep-", tmp_path) as path:
        assert [p.name for p in path.iterdir()] == [LOCK_NAME]
        fd = os.open(path / LOCK_NAME, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


def test_an_unreadable_scratch_place_is_no_error(tmp_path: Path) -> None:
    assert remove_abandoned(tmp_path / "missing") == []


def test_a_sweep_whose_parent_died_keeps_a_live_workers_run(tmp_path: Path) -> None:
    """Its parent SIGKILLed alone, a sweep's worker runs on in its own claimed directory:
    the sweep's directory stays until that run ends, then goes."""
    sweep = tmp_path / "logsync-sweep-orphaned"
    sweep.mkdir()
    (sweep / LOCK_NAME).touch()  # the parent's claim, released by its death
    worker = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from logsync.sim.scratch import claimed_dir\n"
         "with claimed_dir('logsync-sim-', Path(sys.argv[1])) as run:\n"
         "    (run / 'n0').mkdir(); print(run, flush=True); sys.stdin.read()",
         str(sweep)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        run = Path(worker.stdout.readline().strip())
        assert remove_abandoned(tmp_path) == [] and (run / "n0").is_dir()
    finally:
        worker.communicate("", timeout=30)  # the seed ends: the worker removes its run
    assert not run.exists()
    assert remove_abandoned(tmp_path) == ["logsync-sweep-orphaned"]


def test_a_run_being_made_keeps_its_sweep(tmp_path: Path) -> None:
    sweep = tmp_path / "logsync-sweep-making"
    (sweep / "logsync-sim-new").mkdir(parents=True)  # no lock file yet, just made
    (sweep / LOCK_NAME).touch()
    assert remove_abandoned(tmp_path) == []
    old = time.time() - 3600
    os.utime(sweep / "logsync-sim-new", (old, old))  # never finished: a crash long ago
    assert remove_abandoned(tmp_path) == ["logsync-sweep-making"]
