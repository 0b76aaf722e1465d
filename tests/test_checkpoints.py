"""A store in bulk mode (`logsync/store/checkpoints.py`): the writer's commits do not copy
the log into the database, a thread does; the log stays bounded; everything comes back
as it was when the bulk ends; close stops the thread; a kill in the middle loses nothing
committed."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from conftest import RemoteKit

from logsync import prefetch
from logsync.errors import StoreError
from logsync.responder import LOGSYNC_SERVER, UPSTREAM_HUB
from logsync.store import Store, checkpoints
from tests import test_fastpage as fastpage_tests
from tests.conftest import mounted_tmpfs
from tests.test_client import StorePeer, run_round

KIT = RemoteKit()
ORIGIN = "rep_" + "3" * 32
BODY = "x" * 3000  # a few KB per op, as RFC 003's coordination events are


def write_pages(store: Store, pages: int, per_page: int = 50, start: int = 1) -> int:
    """Apply `pages` pages of fresh ops of ORIGIN; the next origin_seq."""
    seq = start
    for _ in range(pages):
        ops = [KIT.op(ORIGIN, s, body=f"{s} {BODY}") for s in range(seq, seq + per_page)]
        result = store.apply_remote(ops, [])
        assert result.applied == per_page
        seq += per_page
    return seq


def log_state(path: Path) -> tuple[int, int]:
    """(frames in the log, frames copied) as a passive checkpoint of another connection
    finds them: equal when everything is in the database file."""
    conn = sqlite3.connect(path)
    try:
        busy, log, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert busy == 0
        return log, copied
    finally:
        conn.close()


def checkpointer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "logsync-checkpointer"]


def writer_autocheckpoint(store: Store) -> int:
    return store._writer.execute("PRAGMA wal_autocheckpoint").fetchone()[0]


def test_in_bulk_the_commits_leave_the_copy_to_the_thread(tmp_path: Path) -> None:
    with Store.open(tmp_path / "p") as store:
        with store.bulk_writes():
            write_pages(store, 3)
            assert writer_autocheckpoint(store) == 0  # set at the first transaction
            assert checkpointer_threads()
        assert store._checkpointer.wait(30)
        assert store._checkpointer.checkpoints >= 1
        log, copied = log_state(store.db_path)
        assert log == copied  # the thread copied all of it after the bulk ended
        write_pages(store, 1, start=151)  # the next transaction: SQLite's own again
        assert writer_autocheckpoint(store) == checkpoints.DEFAULT_AUTOCHECKPOINT
        assert store.origin_top(ORIGIN) == 200
        assert store.corruption() is None
    assert not checkpointer_threads()


def test_outside_bulk_nothing_changes(tmp_path: Path) -> None:
    with Store.open(tmp_path / "p") as store:
        write_pages(store, 2)
        assert writer_autocheckpoint(store) == checkpoints.DEFAULT_AUTOCHECKPOINT
        assert store._checkpointer.checkpoints == 0
        assert not checkpointer_threads()


@pytest.mark.parametrize("bounded", [True, False])
def test_the_log_stays_bounded_in_a_long_bulk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              bounded: bool) -> None:
    """The bound is what keeps the log from growing with the pull: with the commit's own
    copy taken out (a planted defect), the same writes leave a log several times larger."""
    monkeypatch.setattr(checkpoints, "BULK_LOG_BYTES", 64 * 4120)
    if not bounded:
        monkeypatch.setattr(checkpoints.Checkpointer, "committed",
                            lambda self, writer: self._wake.set() if self._bulk else None)
    with Store.open(tmp_path / "p") as store:
        store._writer.execute(f"PRAGMA journal_size_limit={64 * 4120}")
        wal = Path(f"{store.db_path}-wal")
        with store.bulk_writes():
            largest = 0
            for page in range(40):
                write_pages(store, 1, start=1 + 50 * page)
                largest = max(largest, wal.stat().st_size)
        frames = largest // (4096 + 24)
        # one page of 50 ops is 40-80 frames: bounded, the log is restarted once it
        # passes 64, so it never holds more than the bound and a page
        if bounded:
            assert frames < 64 + 100, frames
        else:
            assert frames > 500, frames
        assert store.origin_top(ORIGIN) == 2000


def test_bulks_overlap_and_the_last_one_out_ends_it(tmp_path: Path) -> None:
    with Store.open(tmp_path / "p") as store:
        first, second = store.bulk_writes(), store.bulk_writes()
        first.__enter__()
        second.__enter__()
        write_pages(store, 1)
        first.__exit__(None, None, None)
        write_pages(store, 1, start=51)
        assert writer_autocheckpoint(store) == 0  # still in the second
        second.__exit__(None, None, None)
        assert store._checkpointer.wait(30)
        write_pages(store, 1, start=101)
        assert writer_autocheckpoint(store) == checkpoints.DEFAULT_AUTOCHECKPOINT


def test_close_in_the_middle_of_a_bulk_stops_the_thread(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "p")
    bulk = store.bulk_writes()
    bulk.__enter__()
    write_pages(store, 4)
    store.close()
    assert not checkpointer_threads()
    bulk.__exit__(None, None, None)  # after close: harmless
    with Store.open(tmp_path / "p") as again:
        assert again.origin_top(ORIGIN) == 200
        assert again.corruption() is None


def test_a_thread_that_cannot_connect_leaves_the_writers_own_checkpoints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Store.open(tmp_path / "p") as store:
        def refuse() -> sqlite3.Connection:
            raise sqlite3.OperationalError("unable to open database file")
        monkeypatch.setattr(store._checkpointer, "_connect", refuse)
        with store.bulk_writes():
            assert store._checkpointer.wait(30)  # the thread gave up at once
            write_pages(store, 2)
            assert writer_autocheckpoint(store) == checkpoints.DEFAULT_AUTOCHECKPOINT
        state = store.log_state()
        assert state.failures == 1 and state.failure is not None
        assert "cannot open the store (unable to open database file)" in state.failure
        assert store.origin_top(ORIGIN) == 100


def test_a_read_only_store_has_no_bulk(tmp_path: Path) -> None:
    Store.open(tmp_path / "p").close()
    with Store.open(tmp_path / "p", read_only=True) as store, store.bulk_writes():
        assert not checkpointer_threads()


CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from conftest import RemoteKit
    from logsync.store import Store
    kit, origin = RemoteKit(), {origin!r}
    store = Store.open({palace!r})
    seq = 1
    with store.bulk_writes():
        while True:
            ops = [kit.op(origin, s, body="y" * 3000) for s in range(seq, seq + 50)]
            store.apply_remote(ops, [])
            seq += 50
            print(seq - 1, flush=True)
""")


def test_a_kill_in_the_middle_of_a_bulk_keeps_every_committed_page(tmp_path: Path) -> None:
    palace = tmp_path / "p"
    code = CHILD.format(tests=str(Path(__file__).parent), origin=ORIGIN, palace=str(palace))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert proc.stdout is not None
    committed, deadline = 0, time.monotonic() + 60
    try:
        while committed < 1500 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            committed = int(line)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
    assert committed >= 1500, "the child did not get far enough"
    with Store.open(palace) as store:
        assert store.corruption() is None
        top = store.origin_top(ORIGIN)
        assert top >= committed and top % 50 == 0
        assert store.version_vector()[ORIGIN] == top


@pytest.fixture
def author(tmp_path: Path) -> Iterator[Store]:
    """A signed origin of 40 ops, some naming an artifact."""
    with Store.open(tmp_path / "author") as store:
        for i in range(40):
            arts = [store.put_artifact("patch", f"+line {i}\n", "alice")["id"]] \
                if i % 5 == 0 else None
            store.append_event("task.ask", "s", "r", "alice", body=f"op {i}",
                               artifact_ids=arts)
        yield store


@pytest.mark.parametrize(("profile", "limit", "bulk"), [
    ("logsync", 8, True), ("hub", 8, True), ("logsync", 500, False), ("hub", 500, False)])
def test_a_pull_of_more_than_a_page_runs_in_bulk_and_leaves_it(
        author: Store, tmp_path: Path, profile: str, limit: int, bulk: bool) -> None:
    """The client puts the store in bulk from the first page it fetches ahead (or
    prepares) to the end of the round, from a logsync peer or a MemPalace hub; a round
    of one page does not."""
    seen: list[int] = []
    real = Store.apply_chained, Store.apply_remote

    def spy_chained(self, *args, **kw):  # type: ignore[no-untyped-def]
        seen.append(self._checkpointer._bulk)
        return real[0](self, *args, **kw)

    def spy_remote(self, *args, **kw):  # type: ignore[no-untyped-def]
        seen.append(self._checkpointer._bulk)
        return real[1](self, *args, **kw)

    replica = fastpage_tests.replica(tmp_path, "r", author)
    peer = StorePeer(author, profile=LOGSYNC_SERVER if profile == "logsync" else UPSTREAM_HUB)
    with mock.patch.object(Store, "apply_chained", spy_chained), \
            mock.patch.object(Store, "apply_remote", spy_remote), \
            mock.patch.object(prefetch, "CORES", 2):
        run_round(replica, peer, page_limit=limit)
    assert seen
    assert (max(seen) == 1) is bulk
    assert not replica._checkpointer.bulk and replica.log_copied(30)
    assert replica.version_vector() == author.version_vector() | replica.version_vector()
    replica.close()
    assert not checkpointer_threads()


def test_a_clean_close_after_a_bulk_leaves_the_database_file_alone(tmp_path: Path) -> None:
    """The checkpointer's connection is closed first, so an interrupt it never used cannot
    abort the checkpoint SQLite makes as the store's last connection closes: after a
    bulk, a later write and a close, the file alone holds every op."""
    palace = tmp_path / "p"
    with Store.open(palace) as store:
        with store.bulk_writes():
            write_pages(store, 3)
        assert store.log_copied(30)
        write_pages(store, 1, start=151)
        store.origin_top(ORIGIN)  # a reader connection, opened after the checkpointer's
    assert sorted(p.name for p in palace.iterdir() if p.name.startswith("logstream")) == \
        ["logstream.sqlite3"]
    conn = sqlite3.connect(f"{(palace / 'logstream.sqlite3').as_uri()}?immutable=1", uri=True)
    try:
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 200
    finally:
        conn.close()


def test_no_thread_to_be_had_leaves_the_writers_own_checkpoints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")
    with Store.open(tmp_path / "p") as store:
        monkeypatch.setattr(threading.Thread, "start", refuse)
        with store.bulk_writes():
            write_pages(store, 2)
            assert writer_autocheckpoint(store) == checkpoints.DEFAULT_AUTOCHECKPOINT
        assert store.log_copied(1)
        state = store.log_state()
        assert state.failures == 1 and state.failure is not None
        assert "cannot start the checkpointer thread (can't start new thread)" in state.failure
    assert store._closed  # and it closed without raising


def test_a_busy_checkpoint_is_not_counted_as_a_copy() -> None:
    class Busy:
        def execute(self, sql: str) -> Busy:
            return self

        def fetchone(self) -> tuple[int, int, int]:
            return (1, -1, -1)

    checkpointer = checkpoints.Checkpointer(lambda: sqlite3.connect(":memory:"),
                                            Path("/nonexistent-wal"))
    checkpointer._checkpoint(Busy())  # type: ignore[arg-type]
    state = checkpointer.state()
    assert (state.checkpoints, state.busy, state.failures, state.failure) == (0, 1, 0, None)


def test_a_full_disk_in_a_bulk_is_a_store_error_and_loses_nothing_committed(
        tmp_path: Path) -> None:
    """A disk that fills in the middle of a bulk: the write that cannot be made is one
    StoreError naming the full disk, every page committed before it is still there, the
    thread's failed copies are only noted, and the store closes and reopens cleanly."""
    with mounted_tmpfs(tmp_path / "small", "4m") as mount:
        palace = mount / "p"
        store = Store.open(palace)
        seq = 1
        try:
            with store.bulk_writes(), pytest.raises(StoreError) as caught:
                while seq < 100_000:  # bounded: 4 MiB holds far fewer
                    seq = write_pages(store, 1, start=seq)
            assert "disk is full" in str(caught.value)
            committed = store.origin_top(ORIGIN)
            assert committed == seq - 1 and committed > 0
        finally:
            store.close()
        assert not checkpointer_threads()
        with Store.open(palace) as again:
            assert again.origin_top(ORIGIN) == committed
            assert again.corruption() is None
