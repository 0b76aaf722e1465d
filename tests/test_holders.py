"""`holders.Holders` (what each peer is known to hold) and the stream frames it spares;
frames coalesced over a window (`--coalesce-ms`)."""

from __future__ import annotations

import random
import socket
import threading
import time

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from logsync.holders import Holders
from logsync.report import OriginProgress, RoundReport
from logsync.store import Store
from logsync.watch import watch_stream
from tests.test_server_limits import TOKEN, LiveApp, raw_stream

P, Q = "rep_" + "a" * 32, "rep_" + "b" * 32
O1, O2 = "rep_" + "1" * 32, "rep_" + "2" * 32


def test_a_peer_holds_its_own_ops_and_what_it_served_nothing_else() -> None:
    h = Holders()
    assert h.holds(P, P, 10**9)  # the origin holds its own ops
    assert not h.holds(P, O1, 1) and not h.holds(None, O1, 1)
    h.note(P, {O1: 5})
    assert h.holds(P, O1, 5) and not h.holds(P, O1, 6) and not h.holds(Q, O1, 1)
    h.note(P, {O1: 3})  # never lowered
    assert h.holds(P, O1, 5)
    h.forget(P)  # its stream reconnected: maybe restored from a backup
    assert not h.holds(P, O1, 1) and h.holds(P, P, 1)


def test_a_running_round_counts_what_it_reached_and_is_noted_when_it_ends() -> None:
    h = Holders()
    report = RoundReport(peer="p")
    report.origins[O1] = OriginProgress(O1, start=0, target=9, reached=0)
    key = h.running(P, report)
    assert not h.holds(P, O1, 1)
    report.origins[O1].reached = 4  # a page applied mid-round
    assert h.holds(P, O1, 4) and not h.holds(P, O1, 5) and not h.holds(Q, O1, 1)
    h.finished(key)
    report.origins[O1].reached = 9  # after the end: no longer read
    assert h.holds(P, O1, 4) and not h.holds(P, O1, 5)


def test_the_table_is_bounded_by_forgetting() -> None:
    h = Holders(max_peers=2, max_origins=2)
    h.note(P, {O1: 1})
    h.note(Q, {O1: 1})
    h.note(O2, {O1: 1})  # a third peer: the least recently noted (P) goes
    assert not h.holds(P, O1, 1) and h.holds(Q, O1, 1) and h.holds(O2, O1, 1)
    h.note(Q, {O2: 1, P: 1})  # a third origin for Q: Q's entries are forgotten
    assert len(h._tops[Q]) <= 2


@given(st.lists(st.tuples(st.sampled_from([P, Q]), st.sampled_from([O1, O2]),
                          st.integers(0, 20), st.booleans()), max_size=40),
       st.integers(1, 3), st.integers(1, 3))
def test_holds_never_claims_more_than_was_noted(steps: list, peers: int, origins: int) -> None:
    """Sound under any bounds: only a peer's own ops and noted tops count as held (a
    forgotten entry costs a frame, a wrong one would cost latency)."""
    h, model = Holders(max_peers=peers, max_origins=origins), {}
    for peer, origin, top, forget in steps:
        if forget:
            h.forget(peer)
            model = {k: v for k, v in model.items() if k[0] != peer}
        else:
            h.note(peer, {origin: top})
            model[peer, origin] = max(model.get((peer, origin), 0), top)
        for p in (P, Q):
            for o in (O1, O2):
                for seq in range(1, 22):
                    if h.holds(p, o, seq):
                        assert seq <= model.get((p, o), 0)


def test_the_stream_sends_no_frame_for_what_the_subscriber_holds(tmp_path) -> None:
    """A real server and `watch_stream`: the subscriber named in the header gets no frame
    for the op it is known to hold, the next one it does; a subscriber that names no
    replica (a MemPalace hub, an old logsync) gets every frame."""
    with Store.open(tmp_path / "p") as store, LiveApp(store) as live:
        holders = Holders()
        live.app.state.holders = holders
        origin = store.replica_id
        seen: dict[str | None, list[int]] = {P: [], None: []}
        connected = {P: threading.Event(), None: threading.Event()}

        def on_change(who: str | None):
            def note(o: str | None, seq: int | None) -> None:
                if o is None:
                    connected[who].set()
                elif o == origin and seq is not None:
                    seen[who].append(seq)
            return note

        async def main() -> None:
            async with anyio.create_task_group() as tg:
                for who in (P, None):
                    tg.start_soon(lambda w=who: watch_stream(
                        live.url, TOKEN, on_change(w), rng=random.Random(1), replica=w))
                with anyio.fail_after(20):
                    while not all(e.is_set() for e in connected.values()):  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                holders.note(P, {origin: 1})  # after the connect, which forgets
                for body in ("one", "two"):
                    await anyio.to_thread.run_sync(
                        lambda b=body: store.append_event("t", "s", "r", "a@b", body=b))
                live.srv.notifier.notify()
                with anyio.fail_after(20):
                    while len(seen[None]) < 2 or not seen[P]:  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                await anyio.sleep(0.3)  # a late frame for seq 1 would show up here
                tg.cancel_scope.cancel()

        anyio.run(main)
        live.srv.begin_shutdown()
    assert seen[None] == [1, 2]
    assert seen[P] == [2]


def _chunks(sock: socket.socket, want_events: int, within: float) -> list[int]:
    """Events per HTTP chunk (one chunk = one write of the stream) until `want_events`,
    within `within` seconds in all (heartbeats must not extend the wait)."""
    deadline = time.monotonic() + within

    def recv() -> bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"fewer than {want_events} events within {within} s")
        sock.settimeout(left)
        return sock.recv(65536)

    data = b""
    while b"\r\n\r\n" not in data:
        data += recv()
    body = data.split(b"\r\n\r\n", 1)[1]
    counts: list[int] = []
    while sum(counts) < want_events:
        while b"\r\n" not in body:
            body += recv()
        size_line, rest = body.split(b"\r\n", 1)
        size = int(size_line.split(b";")[0], 16)
        while len(rest) < size + 2:
            rest += recv()
        chunk, body = rest[:size], rest[size + 2:]
        if chunk.count(b"event: logstream"):
            counts.append(chunk.count(b"event: logstream"))
    return counts


@pytest.mark.parametrize(("coalesce", "gap"), [(0.0, 0.3), (1.0, 0.1)])
def test_frames_within_the_window_go_out_in_one_write(tmp_path, coalesce: float,
                                                      gap: float) -> None:
    """The first change after a quiet spell is written at once; changes within the window
    after it wait and go out together. With no window (the planted defect) each change
    is its own write. (Gaps and window wide apart: a loaded machine must not decide.)"""
    with Store.open(tmp_path / "p") as store, LiveApp(store) as live:
        live.app.state.frame_coalesce_s = coalesce
        sock = raw_stream(live.port)
        try:
            deadline = time.monotonic() + 10
            while live.srv.sse_clients < 1 and time.monotonic() < deadline:
                time.sleep(0.02)  # the stream holds its slot
            time.sleep(0.2)  # and has read where it starts
            for body in ("one", "two", "three"):
                store.append_event("t", "s", "r", "a@b", body=body)
                live.srv.notifier.notify()
                time.sleep(gap)
            counts = _chunks(sock, 3, 20)
        finally:
            sock.close()
            live.srv.begin_shutdown()
    assert counts == ([1, 2] if coalesce else [1, 1, 1])


def test_a_first_round_counts_for_the_peer_its_report_names() -> None:
    """Before a peer's id is known (its first round), what the round reaches counts for
    the id the vector answer names, while it runs and after: no page frame echoes back
    what the peer itself just served."""
    h = Holders()
    report = RoundReport(peer="p")
    report.origins[O1] = OriginProgress(O1, start=0, target=9, reached=3)
    key = h.running(None, report)
    assert not h.holds(P, O1, 1)  # the peer is not known yet
    report.peer_replica = P  # the vector answer arrived
    assert h.holds(P, O1, 3) and not h.holds(P, O1, 4) and not h.holds(Q, O1, 1)
    h.finished(key)
    assert h.holds(P, O1, 3)
    nobody = h.running(None, RoundReport(peer="q"))
    h.finished(nobody)  # a round that never learnt its peer notes nothing
    assert set(h._tops) == {P}
