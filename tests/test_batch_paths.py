"""One transaction per stream write, the paths `test_batch.py` leaves open, each checked
by planting the defect it names:

- a real SQLite store fault (SQLITE_FULL, from `PRAGMA max_page_count`) in the second
  page of a write, raised or swallowed by a caller inside the batch;
- a simulated power loss at the second page of a write (the node's mirror must not hold
  the first page: invariant 8 at restart);
- the watcher hands the pages it holds to `on_page` before it reconnects for a new
  `direct()`, and never more than `MAX_PAGES_TAKEN_TOGETHER` at once.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

import anyio
import pytest

from logsync import streamframes
from logsync.errors import StoreError
from logsync.responder import push_page
from logsync.store import Store, chainreads


def _append(store: Store, n: int, size: int = 8) -> None:
    for i in range(n):
        store.append_event("task.request", "s", "r", "a@b", body=f"op {i} " + "x" * size)


def _page(store: Store, after: int, limit: int, sender: str) -> bytes:
    return push_page(store, store.replica_id, after, limit, 1 << 20, sender).body


def _disk_nearly_full(store: Store, spare_pages: int) -> None:
    """The writer may grow the file by `spare_pages` pages more (then SQLITE_FULL)."""
    count = store._writer.execute("PRAGMA page_count").fetchone()[0]
    store._writer.execute(f"PRAGMA max_page_count = {count + spare_pages}")


@pytest.mark.parametrize("swallowed", [False, True])
def test_a_full_disk_at_the_second_page_commits_none_of_the_write(tmp_path,
                                                                  swallowed: bool) -> None:
    """SQLITE_FULL in the second (large) page: the first is rolled back with it; when a
    caller inside the batch swallows the StoreError, the small third page (which would
    fit) must not be written on its own in autocommit mode, and the batch still raises.
    Planted defect: `_atomic`'s sqlite3.Error branch inside a batch not recording
    `_batch_failure` -> the swallowed case commits the third page."""
    with Store.open(tmp_path / "p") as pub, Store.open(tmp_path / "s") as sub, \
            Store.open(tmp_path / "o") as other:
        _append(pub, 1)
        _append(pub, 20, size=20_000)
        _append(other, 1)
        pages = [_page(pub, 0, 1, pub.replica_id), _page(pub, 1, 20, pub.replica_id),
                 _page(other, 0, 1, pub.replica_id)]
        _disk_nearly_full(sub, 40)
        perform = None
        if swallowed:
            from logsync.effects import perform as real_perform
            from logsync.store.apply import ApplyResult

            def perform(effect: Any) -> Any:  # a caller inside the batch that swallows it
                try:
                    return real_perform(sub, effect)
                except StoreError:
                    return ApplyResult()
        with pytest.raises(StoreError, match="disk is full"):
            streamframes.take_pages(sub, pages, pub.replica_id, perform=perform)
        assert sub.version_vector() == {}
        assert not sub._writer.in_transaction
        _disk_nearly_full(sub, 10_000)
        taken = streamframes.take_pages(sub, pages, pub.replica_id)
        assert [t.applied for t in taken] == [1, 20, 1]


def test_a_crash_at_the_second_page_of_a_write_leaves_the_mirror_at_the_commit(
        monkeypatch) -> None:
    """Power lost inside a write's batch after its first page applied: nothing of the
    write is committed, so the node's mirror (checked against the store at restart,
    invariant 8) must not hold the first page either. The armed crash of the scenario
    faults always hits the first apply of a batch, where mirroring early is harmless;
    here it is armed at the second, after a first that applied ops. Planted defect:
    `on_notify` mirroring each page at once (`perform` without `applied`) -> violation 8
    at the restart."""
    from logsync.effects import ApplyPage
    from logsync.sim import parse_scenario, run_scenario
    from logsync.sim.driver import Driver

    real_perform, real_on_notify = Driver._perform, Driver.on_notify
    write: list[list[int]] = []  # ops each page of the write being taken applied
    armed: list[str] = []

    def on_notify(self: Driver, *args: Any, **kwargs: Any) -> Any:
        write.append([])
        try:
            return real_on_notify(self, *args, **kwargs)
        finally:
            write.pop()

    def arm_at_second_page(self: Driver, node: Any, effect: Any, source: str,
                           *rest: Any) -> Any:
        if not write or not isinstance(effect, ApplyPage):
            return real_perform(self, node, effect, source, *rest)
        if len(write[-1]) == 1 and write[-1][0] > 0 and not armed:
            armed.append(node.name)  # the write's first page applied ops: crash in the 2nd
            node.crash_on_apply = True
        result = real_perform(self, node, effect, source, *rest)
        write[-1].append(result.applied)
        return result

    monkeypatch.setattr(Driver, "on_notify", on_notify)
    monkeypatch.setattr(Driver, "_perform", arm_at_second_page)
    text = """
name = "crash-inside-a-write"
duration = "6s"
[nodes]
count = 5
[topology]
kind = "ring"
k = 1
[network]
latency = "20ms"
[sync]
interval = "2s"
coalesce = "300ms"
[[workload]]
rate = 60
[expect]
converge_within = "20s"
"""
    report = run_scenario(parse_scenario(text, source="crash.toml").with_seed(2))
    assert armed, "no write carried two pages"
    assert any("inside an apply transaction" in f for f in report.faults), report.faults
    assert report.ok, report.text()


def _follow_reads(reads: list[bytes], direct_changes_after: int | None = None,
                  raises: type[BaseException] | None = None
                  ) -> tuple[list[list[bytes]], int, list[Any]]:
    """`watch._follow` over `reads` (one network read each): the page batches handed to
    `on_page`, how many times `direct()` was read, and the batches and `on_change` notes
    in the order they came."""
    import httpx

    from logsync.watch import _follow

    batches: list[list[bytes]] = []
    log: list[Any] = []
    calls = [0]

    def direct() -> dict[str, str]:
        calls[0] += 1
        if direct_changes_after is not None and calls[0] > direct_changes_after:
            return {"X-Logsync-Direct": "rep_" + "7" * 32}
        return {}

    async def body():  # type: ignore[no-untyped-def]
        for chunk in reads:
            yield chunk

    async def on_page(datas: list[bytes], announced: str | None) -> None:
        batches.append([d.strip() for d in datas])
        log.append(batches[-1])

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body())

    async def main() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
            with pytest.raises(raises) if raises else contextlib.nullcontext():
                await _follow(http, "http://peer/logstream/stream",
                              lambda o, s: log.append((o, s)), on_page, direct)

    anyio.run(main)
    return batches, calls[0], log


def test_the_watcher_hands_its_pages_on_before_reconnecting_for_a_new_direct() -> None:
    """`direct()` changes at the end of the second page frame of a read (its first
    read is at the connect, then one at each frame's end): the two pages are taken
    before the connection ends, and the third is not read. Planted defect: dropping
    the `_take` before `return True` -> the page is lost (only the full round of the
    reconnect would bring it back)."""
    frame = b"event: logsync-page\ndata: {%d}\n\n"
    batches, calls, _ = _follow_reads([frame % 1 + frame % 2 + frame % 3],
                                   direct_changes_after=2)
    assert batches == [[b"{1}", b"{2}"]] and calls == 3


def test_the_watcher_takes_at_most_the_cap_of_pages_together() -> None:
    """One read bringing more page frames than `MAX_PAGES_TAKEN_TOGETHER`: handed on in
    batches of at most the cap, in order. Planted defect: no flush at the cap -> one
    batch of all of them (one transaction, and memory, the size of the read)."""
    from logsync.watch import MAX_PAGES_TAKEN_TOGETHER as cap

    n = cap * 2 + 3
    read = b"".join(b"event: logsync-page\ndata: {%d}\n\n" % i for i in range(n))
    batches, _, _ = _follow_reads([read])
    assert [len(b) for b in batches] == [cap, cap, 3]
    assert [d for b in batches for d in b] == [b"{%d}" % i for i in range(n)]


def test_the_watcher_takes_at_most_a_mib_of_page_json_together(monkeypatch) -> None:
    """One read bringing page frames of more bytes than `MAX_PAGE_BYTES_TAKEN_TOGETHER`
    (a read's size is the HTTP client's choice): handed on in batches that pass the
    bound by one frame at most, in order. Planted defect: no byte bound -> one batch."""
    from logsync import watch

    monkeypatch.setattr(watch, "MAX_PAGE_BYTES_TAKEN_TOGETHER", 100)
    frames = [b"{%d%s}" % (i, b"x" * 30) for i in range(10)]  # 33 bytes of data each
    read = b"".join(b"event: logsync-page\ndata: %s\n\n" % f for f in frames)
    batches, _, _ = _follow_reads([read])
    assert [len(b) for b in batches] == [3, 3, 3, 1]  # 3 frames of 34 bytes reach 100
    assert [d for b in batches for d in b] == frames


class _Loop:
    """A `PeerLoop` stand-in: the frames a `PeerTask` notes."""

    def __init__(self) -> None:
        self.frames: list[tuple[str | None, int | None]] = []

    def frame(self, origin: str | None, seq: int | None, now: float) -> None:
        self.frames.append((origin, seq))


def test_the_daemons_take_pages_notes_holders_on_the_loop_never_under_the_writer(
        tmp_path, monkeypatch) -> None:
    """`PeerTask.take_pages` (the daemon's path: a worker thread, holder notes through
    the event loop): every note runs while the store's writer is free (the loop never
    waits on a write lock its worker holds), `applied()` once for the write, what is
    lacking goes to the loop; a store fault loses the whole write and asks for a full
    round. Planted defect: notes from inside the batch -> the writer is held."""
    import anyio

    from logsync.holders import Holders
    from logsync.peertask import PeerTask

    with Store.open(tmp_path / "p") as pub, Store.open(tmp_path / "s") as sub, \
            Store.open(tmp_path / "o") as other:
        _append(pub, 4)
        _append(other, 6)
        relay = pub.replica_id
        pages = [_page(pub, 0, 2, relay), _page(pub, 2, 2, relay),
                 _page(other, 0, 3, relay), _page(other, 4, 2, relay)]  # the last: a gap
        holders, woke = Holders(), []
        writer_held: list[bool] = []
        real_note = holders.note

        def note(peer: str, tops: dict[str, int]) -> None:
            writer_held.append(sub._write_lock.locked())
            real_note(peer, tops)

        holders.note = note  # type: ignore[method-assign]
        made: list[PeerTask] = []

        async def main() -> None:
            made.append(PeerTask(peer=None, scope=anyio.CancelScope(),  # type: ignore[arg-type]
                                 loop=_Loop(), replica=relay))  # type: ignore[arg-type]
            await made[0].take_pages(pages, sub, holders, lambda: woke.append(1))

        anyio.run(main)
        task = made[0]
        assert writer_held == [False]  # one note for the write, the writer free
        assert holders.holds(relay, other.replica_id, 6)
        assert woke == [1]
        assert task.loop.frames == [(other.replica_id, 6)]  # type: ignore[attr-defined]
        assert sub.version_vector() == {relay: 4, other.replica_id: 3}

        task.loop.frames.clear()  # type: ignore[attr-defined]
        fresh = [_page(other, 3, 1, relay), _page(other, 4, 2, relay)]
        real = chainreads.apply_prepared
        calls: list[int] = []

        def faulting(conn, *args, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(1)
            if len(calls) == 2:
                raise sqlite3.OperationalError("disk I/O error")
            return real(conn, *args, **kwargs)

        monkeypatch.setattr(chainreads, "apply_prepared", faulting)
        with pytest.raises(StoreError, match="disk I/O error"):
            anyio.run(main_with(task, fresh, sub, holders, woke))
        assert task.loop.frames == [(None, None)]  # type: ignore[attr-defined]
        assert sub.version_vector() == {relay: 4, other.replica_id: 3} and woke == [1]


def main_with(task: Any, pages: list[bytes], store: Store, holders: Any,
              woke: list[int]) -> Any:
    async def main() -> None:
        await task.take_pages(pages, store, holders, lambda: woke.append(1))
    return main


def test_the_watcher_takes_pending_pages_before_a_tops_frame_of_the_same_read() -> None:
    """Pages then a tops frame in one read: the pages reach `on_page` before the tops
    frame's origins reach `on_change` (a tops frame names what the pages before it may
    already have brought: noted first, it would cost a needless pull). The first tests
    check the batches and the notes apart, not their order. Planted defect: the flush
    after `_data` -> the tops is noted first."""
    from logsync.streamframes import tops_frame

    origin = "rep_" + "1" * 32
    read = (b"event: logsync-page\ndata: {1}\n\n" + tops_frame({origin: 7})
            + b"event: logsync-page\ndata: {2}\n\n")
    _, _, log = _follow_reads([read])
    assert log == [(None, None), [b"{1}"], (origin, 7), [b"{2}"]]


def test_the_frames_before_an_over_long_line_of_the_same_read_are_still_taken(
        monkeypatch) -> None:
    from logsync import watch

    monkeypatch.setattr(watch, "MAX_LINE_BYTES", 1000)
    read = b"event: logsync-page\ndata: {1}\n\ndata: " + b"x" * 2000 + b"\n"
    batches, _, _ = _follow_reads([read], raises=watch.LineTooLong)
    assert batches == [[b"{1}"]]


def test_a_swallowed_constraint_violation_inside_a_batch_lets_no_later_write_in(
        tmp_path, monkeypatch) -> None:
    """An IntegrityError (a bug: remote writes never raise one by design) in the second
    page, swallowed by a caller inside the batch: the third page is not written on its
    own and the batch raises the IntegrityError. Planted defect: the IntegrityError
    branch of `_atomic` inside a batch not recording `_batch_failure`."""
    from logsync.effects import perform as real_perform
    from logsync.store.apply import ApplyResult

    real = chainreads.apply_prepared
    calls: list[int] = []

    def failing(conn, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 2:
            raise sqlite3.IntegrityError("UNIQUE constraint failed: planted")
        return real(conn, *args, **kwargs)

    with Store.open(tmp_path / "p") as pub, Store.open(tmp_path / "s") as sub, \
            Store.open(tmp_path / "o") as other:
        _append(pub, 4)
        _append(other, 2)
        pages = [_page(pub, 0, 2, pub.replica_id), _page(pub, 2, 2, pub.replica_id),
                 _page(other, 0, 2, pub.replica_id)]

        def swallowing(effect: Any) -> Any:
            try:
                return real_perform(sub, effect)
            except sqlite3.IntegrityError:
                return ApplyResult()

        monkeypatch.setattr(chainreads, "apply_prepared", failing)
        with pytest.raises(sqlite3.IntegrityError, match="planted"):
            streamframes.take_pages(sub, pages, pub.replica_id, perform=swallowing)
        assert sub.version_vector() == {}
