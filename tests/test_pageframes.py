"""Page frames (`streamframes.py`, `server/pagestream.py`): a subscriber that asks for
them gets the ops themselves on the change stream and applies them as pulled pages; a
page it cannot trust is refused and pulled; two real daemons exchange ops with no
`/sync/ops` request after their first round."""

from __future__ import annotations

import contextlib
import json
import random
import re
import threading
import time
from collections.abc import Iterator

import anyio
import httpx

from logsync.holders import Holders
from logsync.responder import push_page
from logsync.store import Store
from logsync.streamframes import (
    DIRECT_HEADER,
    FRAMES_HEADER,
    PAGES,
    apply_page_frame,
    parse_page_frame,
)
from logsync.watch import watch_stream
from logsync.wire import REPLICA_HEADER
from tests.test_daemon import daemons, event_ids, peer, run, wait_for  # noqa: F401
from tests.test_server_limits import TOKEN, LiveApp


def _append(store: Store, n: int, prefix: str = "op") -> None:
    for i in range(n):
        store.append_event("task.request", "s", "r", "a@b", body=f"{prefix} {i}")


def _follow(live: LiveApp, sub: Store, publisher: str, direct: dict[str, str],
            names: list[tuple[str | None, int | None]], pages: list[int],
            done: threading.Event) -> None:
    """Run `watch_stream` with page frames until `done`; pages applied to `sub`."""

    async def on_page(datas: list[bytes], announced: str | None) -> None:
        assert announced == publisher  # the page stream names its server
        for data in datas:
            frame = parse_page_frame(data)
            assert frame is not None
            taken = await anyio.to_thread.run_sync(apply_page_frame, sub, frame, publisher)
            pages.append(taken.applied)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: watch_stream(
                live.url, TOKEN, lambda o, s: names.append((o, s)), rng=random.Random(1),
                replica=sub.replica_id, on_page=on_page, direct=lambda: direct))
            while not done.is_set():  # noqa: ASYNC110 - a thread sets it
                await anyio.sleep(0.02)
            tg.cancel_scope.cancel()

    anyio.run(main)


@contextlib.contextmanager
def _subscribed(tmp_path, direct: dict[str, str]) -> Iterator[tuple]:
    """A publisher on a real server and a subscriber following its page stream in a
    thread: (publisher, subscriber, live app, names, applied counts), once connected."""
    with Store.open(tmp_path / "p") as pub, Store.open(tmp_path / "s") as sub, \
            LiveApp(pub) as live:
        live.app.state.holders = Holders()
        names: list = []
        pages: list[int] = []
        done = threading.Event()
        thread = threading.Thread(target=_follow, args=(live, sub, pub.replica_id, direct,
                                                        names, pages, done), daemon=True)
        thread.start()
        try:
            assert _until(lambda: (None, None) in names, 10)  # connected
            yield pub, sub, live, names, pages
        finally:
            done.set()
            thread.join(10)
            live.srv.begin_shutdown()


def test_a_subscriber_applies_the_ops_a_page_frame_carries(tmp_path) -> None:
    """Ops (and a patch's artifact) appended on the publisher arrive inside page frames
    and are applied as pulled: same ids, bodies and artifacts, nothing named to pull."""
    with _subscribed(tmp_path, {}) as (pub, sub, live, names, pages):
        _append(pub, 3)
        art = pub.put_artifact("patch", "diff --git a/x b/x\n", "a@b")
        pub.append_event("patch.handoff", "s", "r", "a@b", body="a patch",
                         artifact_ids=[art["id"]])
        live.srv.notifier.notify()
        assert _until(lambda: sub.version_vector().get(pub.replica_id) == 4, 10), pages
        mine = {e["id"]: e["body"] for e in pub.iter_events()}
        assert {e["id"]: e["body"] for e in sub.iter_events()} == mine
        assert [a["id"] for a in sub.iter_artifacts()] == [art["id"]]
    assert sum(pages) == 4
    assert [n for n in names if n[0] is not None] == []  # nothing left to pull


def test_an_origin_the_subscriber_streams_directly_is_only_named(tmp_path) -> None:
    """Ops of an origin the subscriber says it streams from directly come as a name
    (lazy), never as a page; the publisher's own ops still come as pages."""
    with Store.open(tmp_path / "x") as other, \
            _subscribed(tmp_path, {DIRECT_HEADER: other.replica_id}) as (pub, sub, live,
                                                                         names, _):
        _append(other, 2, "x")
        page = push_page(other, other.replica_id, 0, 10, 1 << 20, other.replica_id)
        frame = parse_page_frame(page.body)
        assert frame is not None
        apply_page_frame(pub, frame, other.replica_id)  # the publisher relays x's ops
        _append(pub, 1)
        live.srv.notifier.notify()
        assert _until(lambda: (other.replica_id, 2) in names, 10), names
        assert _until(lambda: sub.version_vector().get(pub.replica_id) == 1, 10)
        assert other.replica_id not in sub.version_vector()  # named, not carried


def test_a_page_not_from_the_stream_peer_or_altered_is_refused_and_pulled(tmp_path) -> None:
    with Store.open(tmp_path / "p") as pub, Store.open(tmp_path / "s") as sub:
        _append(pub, 3)
        body = json.loads(push_page(pub, pub.replica_id, 0, 10, 1 << 20,
                                    pub.replica_id).body)
        frame = parse_page_frame(json.dumps(body))
        assert frame is not None and frame.last == 3
        stranger = apply_page_frame(sub, frame, "rep_" + "e" * 32)  # `from` is not the peer
        assert stranger.applied == 0 and stranger.lacking
        body["events"][1]["body"] = "forged by a relay"
        forged = apply_page_frame(sub, parse_page_frame(json.dumps(body)), pub.replica_id)
        assert forged.lacking and forged.applied <= 1  # stops at the forged op
        assert all(e["body"] != "forged by a relay" for e in sub.iter_events())
        assert parse_page_frame(b"[1, 2]") is None and parse_page_frame(b"{") is None


def test_a_bad_direct_header_is_refused_in_one_sentence(tmp_path) -> None:
    with Store.open(tmp_path / "p") as pub, LiveApp(pub) as live:
        live.app.state.holders = Holders()
        answer = httpx.get(live.url + "/logstream/stream", timeout=5, headers={
            "Authorization": f"Bearer {TOKEN}", FRAMES_HEADER: PAGES,
            REPLICA_HEADER: "rep_" + "5" * 32, DIRECT_HEADER: "rep_" + "1" * 32 + ",nope"})
        live.srv.begin_shutdown()
    assert answer.status_code == 400
    assert answer.json() == {"error": "bad_request", "reason": "X-Logsync-Direct: direct "
                             "origin 'nope' is not a replica id"}


def _streams(metrics: str) -> int:
    found = re.search(r"^logsync_sse_clients (\S+)$", metrics, re.M)
    return int(float(found.group(1))) if found else 0


def _ops_requests(metrics: str) -> int:
    return sum(int(float(m)) for m in re.findall(
        r'logsync_http_requests_total\{route="/sync/ops",status="[^"]*"\} (\S+)', metrics))


def test_two_daemons_exchange_ops_in_frames_without_pulling(daemons) -> None:  # noqa: F811
    """After the first rounds, appends on either side arrive inside page frames: the
    other daemon serves no `/sync/ops` request for them."""
    a, b = daemons("a", interval=60), daemons("b", interval=60)
    peer(a, b)
    peer(b, a)
    # each follows the other's stream (a stream that connects later begins with a full
    # round, whose /sync/ops requests would count below), and the first rounds are over
    wait_for(lambda: all(_streams(d.get("/metrics").text) == 1 for d in (a, b)), 15,
             "the daemons never followed each other's stream", b)

    def settled() -> bool:  # no /sync/ops request for 0.7 s: the catch-up rounds are over
        first = [_ops_requests(d.get("/metrics").text) for d in (a, b)]
        time.sleep(0.7)
        return first == [_ops_requests(d.get("/metrics").text) for d in (a, b)]

    wait_for(settled, 15, "the first rounds never ended", b)
    before = {d.url: _ops_requests(d.get("/metrics").text) for d in (a, b)}
    ids = []
    for who in (a, b, a, b, a):
        out = run(who.palace, "append", "--type", "task.request", "--stream", "s", "--room",
                  "r", "--from-agent", "pi@a", "--json")
        ids.append(json.loads(out.stdout)["id"])
    wait_for(lambda: set(ids) <= event_ids(a.palace) and set(ids) <= event_ids(b.palace), 10,
             "the appends never reached both daemons", b)
    after = {d.url: _ops_requests(d.get("/metrics").text) for d in (a, b)}
    assert after == before, (before, after)
    assert a.stop() == 0 and b.stop() == 0


def _until(predicate, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_the_watcher_reads_each_frame_by_its_event_type() -> None:
    """A tops frame names its origins (and `more` asks for a full round); one it cannot
    read costs nothing; the page frames one read brings go to `on_page` together, in
    order with the other frames; an upstream frame is read as before."""
    import httpx

    from logsync.streamframes import tops_frame
    from logsync.watch import _follow

    seen: list = []
    batches: list[list[bytes]] = []
    tops = tops_frame({"rep_" + "1" * 32: 7}, more=True)
    reads = [
        b"event: logsync-page\ndata: {1}\n\nevent: logsync-page\ndata: {2}\n\n" + tops
        + b"event: logsync-tops\ndata: {\"tops\": {\"nope\": 1}}\n\n"
        + b"event: logsync-page\ndata: {3}\n\nevent: logsync-page\r\ndata: {4",
        b"}\r\n\r\nevent: logsync-tops\ndata: {\"tops\": {\"rep_" + b"2" * 32 + b"\": 0}}\n\n"
        + b"data: {\"origin_replica\": \"rep_" + b"3" * 32 + b"\", \"origin_seq\": 4}\n\n",
    ]

    async def body():
        for chunk in reads:
            yield chunk

    async def on_page(datas: list[bytes], announced: str | None) -> None:
        assert announced == "rep_" + "9" * 32
        batches.append([d.strip() for d in datas])

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"X-Logsync-Replica": "rep_" + "9" * 32},
                              content=body())

    async def main() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
            await _follow(http, "http://peer/logstream/stream",
                          lambda o, s: seen.append((o, s)), on_page)

    anyio.run(main)
    assert batches == [[b"{1}", b"{2}"], [b"{3}"], [b"{4}"]]
    assert seen == [(None, None), ("rep_" + "1" * 32, 7), (None, None),
                    ("rep_" + "3" * 32, 4)]


def test_a_page_that_cannot_be_encoded_is_named_instead(tmp_path, monkeypatch) -> None:
    """A page the responder cannot encode (or that does not fit whole) is named, so the
    subscriber pulls it and the pull path reports what is wrong; nothing raises."""
    from logsync import streamframes
    from logsync.outbox import Write

    def unencodable(*args, **kwargs):
        raise ValueError("the payload nests too deeply to encode as JSON")

    with Store.open(tmp_path / "p") as pub:
        _append(pub, 2)
        write = Write(pages={pub.replica_id: (0, 2)})
        bodies, named = streamframes.write_parts(pub, write, pub.replica_id)
        assert len(bodies) == 1 and named == {}
        monkeypatch.setattr(streamframes, "push_page", unencodable)
        bodies, named = streamframes.write_parts(pub, write, pub.replica_id)
        assert bodies == [] and named == {pub.replica_id: 2}


def test_a_new_direct_peer_reconnects_the_stream_to_name_it(tmp_path, monkeypatch) -> None:
    """The peers a subscriber streams from become known after its first rounds: the
    watcher reconnects at the next frame boundary so the publisher hears them."""
    from logsync.server import stream as stream_mod

    heard: list[str | None] = []
    real = stream_mod.parse_direct

    def spy(value, is_id):  # type: ignore[no-untyped-def]
        heard.append(value)
        return real(value, is_id)

    monkeypatch.setattr(stream_mod, "parse_direct", spy)
    other = "rep_" + "7" * 32
    known: dict[str, str] = {}
    with _subscribed(tmp_path, known) as (pub, _, live, names, _pages):
        known[DIRECT_HEADER] = other  # a first round named the peer
        _append(pub, 1)
        live.srv.notifier.notify()
        assert _until(lambda: names.count((None, None)) == 2, 10), names
        assert _until(lambda: other in heard, 5), heard
    assert heard[0] is None


def test_an_unreadable_page_asks_for_a_full_round_and_a_write_is_bounded(tmp_path,
                                                                         monkeypatch) -> None:
    from logsync import streamframes
    from logsync.outbox import Write

    with Store.open(tmp_path / "p") as pub, Store.open(tmp_path / "s") as sub:
        took = streamframes.take_page(sub, b"{not json", pub.replica_id)
        assert took.pull == (None, None) and took.applied == 0
        _append(pub, 3)
        page = push_page(pub, pub.replica_id, 0, 3, 1 << 20, pub.replica_id).body
        noted: list = []
        took = streamframes.take_page(sub, page, None, served=noted.append)
        assert took.pull == (pub.replica_id, 3) and noted == []  # peer not known: pulled
        took = streamframes.take_page(sub, page, pub.replica_id,
                                      served=noted.append)
        assert took.pull is None and took.applied == 3 and noted == [{pub.replica_id: 3}]
        monkeypatch.setattr(streamframes, "WRITE_BYTES", 1)
        others = {f"rep_{i:032x}": (0, 1) for i in range(3)}
        write = Write(pages={pub.replica_id: (0, 3), **others})
        bodies, named = streamframes.write_parts(pub, write, pub.replica_id)
        assert len(bodies) == 1 and named == {o: 1 for o in others}  # the rest is named
