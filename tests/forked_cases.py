"""Half a proof in a forked child (`logsync/snapshot/forked.py`, `chaincheck.ChainProof`).

Run in an interpreter of their own by `test_snapshot_forked.py` (a fork needs a process
running one thread, which a long test session's process need not be).

A child's fault must never change a result, only its time: a child that fails, dies,
overruns its deadline or answers garbage is no answer, and the ranges it held are
proven in the parent. A process with another thread never forks. No child outlives
its proof, nor its parent.
"""

from __future__ import annotations

import _thread
import os
import resource
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from logsync.snapshot import chaincheck, forked
from logsync.snapshot.chaincheck import ChainProof, prove_chains
from logsync.snapshot.forked import Forked
from tests.test_snapshot_chaincheck import ORIGIN, _plain_ops, alone, insert_ops, new_store


def reaped(pid: int) -> bool:
    """The child is gone and waited for (by whoever forked it)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@pytest.fixture(autouse=True)
def _alone() -> None:
    alone()


@pytest.fixture
def chained(tmp_path: Path) -> Path:
    path = tmp_path / "s.sqlite3"
    conn = new_store(path)
    insert_ops(conn, _plain_ops(40))
    conn.close()
    return path


@pytest.fixture
def parent_ranges(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The ranges this process proves itself (the child's calls count in its own copy)."""
    calls: list[tuple[Any, ...]] = []
    check = chaincheck._check_range

    def counted(*job: Any) -> int:
        calls.append(job)
        return check(*job)

    monkeypatch.setattr(chaincheck, "_check_range", counted)
    return calls


def test_a_child_returns_its_value_and_is_reaped() -> None:
    with Forked.start(lambda: [os.getpid(), 7]) as child:
        assert child is not None
        pid, seven = child.result(30.0)
    assert seven == 7 and pid == child.pid != os.getpid()
    assert reaped(child.pid)


@pytest.mark.parametrize("work", [
    lambda: 1 / 0,                     # raises in the child
    lambda: os._exit(0),               # exits cleanly without an answer
    lambda: os.kill(os.getpid(), 9),   # dies
    lambda: "x" * (forked.MAX_ANSWER_BYTES + 1),  # answers too much
    lambda: {1, 2},                    # answers what JSON cannot hold
])
def test_a_failing_child_is_no_answer(work: Any) -> None:
    with Forked.start(work) as child:
        assert child is not None
        assert child.result(30.0) is None
    assert reaped(child.pid)


def test_a_child_past_its_deadline_is_killed_and_reaped() -> None:
    began = time.monotonic()
    with Forked.start(lambda: time.sleep(60)) as child:
        assert child is not None
        assert child.result(0.3) is None
    assert time.monotonic() - began < 10
    assert reaped(child.pid)


def test_leaving_the_block_kills_a_running_child() -> None:
    with Forked.start(lambda: time.sleep(60)) as child:
        assert child is not None
    assert reaped(child.pid)


def test_a_child_dies_with_its_parent() -> None:
    """A parent killed by SIGKILL mid-proof: the kernel ends the child too (Linux)."""
    read_fd, write_fd = os.pipe()
    middle = os.fork()
    if middle == 0:  # the parent to be killed
        try:
            os.close(read_fd)
            child = Forked.start(lambda: time.sleep(60))
            os.write(write_fd, str(child.pid if child else 0).encode())
            time.sleep(60)
        finally:
            os._exit(1)
    os.close(write_fd)
    grandchild = int(os.read(read_fd, 64) or b"0")
    os.close(read_fd)
    os.kill(middle, 9)
    os.waitpid(middle, 0)
    assert grandchild > 0
    end = time.monotonic() + 10
    while time.monotonic() < end and _alive(grandchild):
        time.sleep(0.05)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for init to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_descriptor_past_1023_is_read() -> None:
    """`select()` cannot watch such a descriptor; the child's pipe may well be one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.fail(f"this test needs 1100 descriptors; the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    held = []
    try:
        while not held or held[-1] < 1030:
            held.append(os.open(os.devnull, os.O_RDONLY))
        with Forked.start(lambda: 42) as child:
            assert child is not None and child._fd is not None and child._fd > 1023
            assert child.result(30.0) == 42
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_process_with_another_thread_never_forks(chained: Path) -> None:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, args=(30,))
    other.start()
    try:
        assert Forked.start(lambda: 1) is None
        with ChainProof(chained, split=1, parts=4, fork=True) as proof:
            assert not proof.forked
            assert proof.finish() == {ORIGIN}
    finally:
        stop.set()
        other.join()


def test_a_thread_python_does_not_count_still_counts() -> None:
    """A thread started below `threading` (as C code would) is seen by the kernel."""
    lock = _thread.allocate_lock()
    lock.acquire()
    done = _thread.allocate_lock()
    done.acquire()

    def hold() -> None:
        lock.acquire(timeout=30)
        done.release()

    _thread.start_new_thread(hold, ())
    try:
        assert threading.active_count() == 1
        assert not forked.may_fork()
    finally:
        lock.release()
        done.acquire(timeout=30)
    alone()
    end = time.monotonic() + 10
    while not forked.may_fork() and time.monotonic() < end:
        time.sleep(0.05)  # the raw thread has released `done`; it ends a moment later
    assert forked.may_fork()


def test_the_child_proves_its_share_and_its_answer_is_used(
        chained: Path, parent_ranges: list[tuple[Any, ...]]) -> None:
    with ChainProof(chained, split=1, parts=4, fork=True) as proof:
        assert proof.forked
        assert proof.finish() == {ORIGIN}
    assert 0 < len(parent_ranges) < 4  # the rest came from the child
    assert prove_chains(chained, split=1, parts=4) == {ORIGIN}


@pytest.mark.parametrize("answer", [None, [True, True], [4], "x", [1, 2, 3], [10.0, 10.0]])
def test_a_child_answer_of_the_wrong_shape_is_proven_again_here(
        chained: Path, parent_ranges: list[tuple[Any, ...]],
        monkeypatch: pytest.MonkeyPatch, answer: Any) -> None:
    """Planted: the child's answer replaced; the parent proves every range itself."""
    real = Forked.result

    def planted(self: Forked, deadline_s: float) -> Any:
        real(self, deadline_s)  # reap the real child
        return answer

    monkeypatch.setattr(Forked, "result", planted)
    with ChainProof(chained, split=1, parts=4, fork=True) as proof:
        assert proof.forked
        assert proof.finish() == {ORIGIN}
    assert len(parent_ranges) == 4


def test_a_child_that_dies_leaves_its_ranges_to_the_parent(
        chained: Path, parent_ranges: list[tuple[Any, ...]]) -> None:
    """Planted: the child dies at its first range; the parent proves them itself."""
    parent, check = os.getpid(), chaincheck._check_range

    def dies_in_child(*job: Any) -> int:
        if os.getpid() != parent:
            os._exit(3)
        return check(*job)

    chaincheck._check_range = dies_in_child  # restored by parent_ranges' monkeypatch
    with ChainProof(chained, split=1, parts=4, fork=True) as proof:
        assert proof.forked
        assert proof.finish() == {ORIGIN}
    assert len(parent_ranges) == 4


def test_a_broken_chain_is_proven_by_neither_half(chained: Path) -> None:
    conn = sqlite3.connect(chained, isolation_level=None)
    conn.execute("UPDATE logsync_chain SET digest = zeroblob(32) WHERE origin_seq > 30")
    conn.close()
    assert prove_chains(chained, split=1, parts=4) == set()
    with ChainProof(chained, split=1, parts=4, fork=True) as proof:
        assert proof.forked
        assert proof.finish() == set()
