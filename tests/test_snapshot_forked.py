"""Half a proof in a forked child (`logsync/snapshot/forked.py`, `chaincheck.ChainProof`).

A child's fault must never change a result, only its time: a child that fails, dies,
overruns its deadline or answers garbage is no answer, and the ranges it held are
proven in the parent. A process with another thread never forks. No child outlives
its proof (each test checks that nothing is left to reap).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from logsync.snapshot import chaincheck, forked
from logsync.snapshot.chaincheck import ChainProof, prove_chains
from logsync.snapshot.forked import Forked
from tests.test_snapshot_chaincheck import ORIGIN, _plain_ops, alone, insert_ops, new_store


def no_child_left() -> bool:
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@pytest.fixture
def chained(tmp_path: Path) -> Path:
    path = tmp_path / "s.sqlite3"
    conn = new_store(path)
    insert_ops(conn, _plain_ops(40))
    conn.close()
    return path


@pytest.fixture(autouse=True)
def _alone() -> None:
    alone()


def test_a_child_returns_its_value_and_is_reaped() -> None:
    parent = os.getpid()
    with Forked.start(lambda: [os.getpid(), 7]) as child:
        assert child is not None
        pid, seven = child.result(30.0)
    assert seven == 7 and pid != parent
    assert no_child_left()


@pytest.mark.parametrize("work", [
    lambda: 1 / 0,                     # raises in the child
    lambda: os._exit(0),               # exits cleanly without an answer
    lambda: os.kill(os.getpid(), 9),   # dies
    lambda: "x" * (forked.MAX_ANSWER_BYTES + 1),  # answers too much
    lambda: {1, 2},                    # answers what JSON cannot hold
])
def test_a_failing_child_is_no_answer(work) -> None:
    with Forked.start(work) as child:
        assert child is not None
        assert child.result(30.0) is None
    assert no_child_left()


def test_a_child_past_its_deadline_is_killed_and_reaped() -> None:
    began = time.monotonic()
    with Forked.start(lambda: time.sleep(60)) as child:
        assert child is not None
        assert child.result(0.3) is None
    assert time.monotonic() - began < 10
    assert no_child_left()


def test_leaving_the_block_kills_a_running_child() -> None:
    with Forked.start(lambda: time.sleep(60)):
        pass
    assert no_child_left()


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
    assert no_child_left()


def test_the_forked_proof_splits_the_ranges_and_agrees(chained: Path) -> None:
    with ChainProof(chained, split=1, parts=4, fork=True) as proof:
        assert proof.forked
        assert proof.finish() == {ORIGIN} == prove_chains(chained, split=1, parts=4)
    assert no_child_left()


def test_a_child_that_dies_leaves_its_ranges_to_the_parent(
        chained: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the child dies at its first range; the parent proves them itself."""
    parent, check = os.getpid(), chaincheck._check_range

    def dies_in_child(*job):
        if os.getpid() != parent:
            os._exit(3)
        return check(*job)

    monkeypatch.setattr(chaincheck, "_check_range", dies_in_child)
    with ChainProof(chained, split=1, parts=4, fork=True) as proof:
        assert proof.forked
        assert proof.finish() == {ORIGIN}
    assert no_child_left()


def test_a_broken_chain_is_proven_by_neither_half(chained: Path) -> None:
    conn = sqlite3.connect(chained, isolation_level=None)
    conn.execute("UPDATE logsync_chain SET digest = zeroblob(32) WHERE origin_seq > 30")
    conn.close()
    assert prove_chains(chained, split=1, parts=4) == set()
    with ChainProof(chained, split=1, parts=4, fork=True) as proof:
        assert proof.forked
        assert proof.finish() == set()
    assert no_child_left()
