"""zstd-coded `/sync/ops` pages (RFC 004 §7): a server codes a page only for a request
whose `Accept-Encoding` lists zstd, the decoded bytes are the plain answer's, a kept
answer keeps its coding apart, and a puller decodes within its answer cap whatever a
frame announces (`logsync/zstdcoding.py`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import zstandard

from logsync.client import PeerClient, sync_once
from logsync.errors import PeerProtocolError, PeerTooLargeError
from logsync.server import create_app
from logsync.server.routes import MIN_CODED_BYTES
from logsync.store import Store
from logsync.zstdcoding import inflate_capped
from tests.test_client import live_server  # noqa: F401 - the fixture

TOKEN = "secret"
BASE = "http://127.0.0.1:8765"
PAGE = {"origin": "", "after": "0", "limit": "5000", "ext": "large_pages,inline_artifacts,chain"}


def author(store: Store, count: int) -> None:
    art = store.put_artifact("patch", "diff --git a/x b/x\n" * 200, "alice")["id"]
    for n in range(count):
        store.append_event("task.ask", "main", "lobby", "alice",
                           body=f"Please look at the flaky test {n}. " * 20,
                           artifact_ids=[art] if n % 50 == 0 else None)


async def ask(app: Any, params: dict[str, str], accept_encoding: str | None,
              msgpack_asked: bool = False) -> tuple[int, httpx.Headers, bytes]:
    """(status, headers, the body as sent: httpx would decode a coded one)."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if msgpack_asked:
        headers["Accept"] = "application/msgpack"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE,
                                 headers=headers) as client:
        client.headers.pop("accept-encoding")  # httpx's default asks for zstd too
        if accept_encoding is not None:
            client.headers["Accept-Encoding"] = accept_encoding
        async with client.stream("GET", "/sync/ops", params=params) as response:
            body = b"".join([chunk async for chunk in response.aiter_raw()])
            return response.status_code, response.headers, body


@pytest.mark.parametrize("msgpack_asked", [False, True])
def test_a_page_is_coded_only_when_asked_and_decodes_to_the_plain_answer(
        tmp_path: Path, msgpack_asked: bool) -> None:
    with Store.open(tmp_path / "s") as store:
        author(store, 300)
        app = create_app(store, token=TOKEN)
        params = dict(PAGE, origin=store.replica_id)

        async def go() -> list[tuple[int, httpx.Headers, bytes]]:
            return [await ask(app, params, coding, msgpack_asked) for coding in
                    ("identity", "zstd", None, "gzip, zstd;q=0", "zstd;q=0.5", "zstd")]

        plain, coded, unasked, refused, weighted, kept = anyio.run(go)
    status, headers, body = plain
    assert status == 200 and "content-encoding" not in headers and len(body) > 100_000
    for status, headers, data in (coded, weighted, kept):  # the last: the kept answer
        assert status == 200 and headers["content-encoding"] == "zstd"
        assert headers["vary"] == "Accept-Encoding"
        assert len(data) * 5 < len(body)
        assert zstandard.ZstdDecompressor().decompressobj().decompress(data) == body
    for _, headers, data in (unasked, refused):  # kept apart from the coded answer
        assert "content-encoding" not in headers and data == body


def test_a_small_page_goes_plain_even_to_a_puller_that_accepts_zstd(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as store:
        store.append_event("note", "main", "lobby", "alice", body="hi")
        app = create_app(store, token=TOKEN)
        status, headers, body = anyio.run(ask, app, dict(PAGE, origin=store.replica_id), "zstd")
    assert status == 200 and len(body) < MIN_CODED_BYTES
    assert "content-encoding" not in headers


def test_a_pull_takes_coded_pages_and_ends_identical(live_server: Any,  # noqa: F811
                                                     tmp_path: Path) -> None:
    served, url = live_server
    author(served, 1500)
    with Store.open(tmp_path / "coded") as coded, Store.open(tmp_path / "plain") as plain:
        report = sync_once(coded, url, TOKEN)
        import logsync.client as client_mod

        asked, client_mod.ASK_ZSTD = client_mod.ASK_ZSTD, "identity"  # type: ignore[attr-defined]
        try:
            plain_report = sync_once(plain, url, TOKEN)
        finally:
            client_mod.ASK_ZSTD = asked  # type: ignore[attr-defined]
        assert report.applied == plain_report.applied == 1500
        assert report.bytes_received * 5 < plain_report.bytes_received
        for store in (coded, plain):
            assert store.version_vector() == served.version_vector()
            assert [op["id"] for op in store.list_ops(served.replica_id, 0, 2000)] == \
                [op["id"] for op in served.list_ops(served.replica_id, 0, 2000)]


def _bomb(announced: int) -> bytes:
    """A small zstd frame of zeros whose header announces `announced` bytes."""
    writer = zstandard.ZstdCompressor(level=1).compressobj(size=announced)
    zeros = bytes(1 << 20)
    out = [writer.compress(zeros) for _ in range(announced >> 20)]
    return b"".join(out) + writer.flush()


def _hostile(body: bytes, coding: str = "zstd"):  # type: ignore[no-untyped-def]
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/sync/ops":
            assert "zstd" in request.headers["accept-encoding"]
            return httpx.Response(200, stream=httpx.ByteStream(body), headers={  # as sent
                "content-type": "application/json", "content-encoding": coding})
        return httpx.Response(404)
    return handler


def _pull_page(handler: Any, cap: int) -> Any:
    async def go() -> Any:
        async with PeerClient(BASE, TOKEN, transport=httpx.MockTransport(handler),
                              max_response_bytes=cap, attempts=1) as client:
            from logsync.wire import Request
            return await client.fetch(Request("/sync/ops", {"origin": "rep_" + "a" * 32,
                                                            "after": 0, "limit": 10}))
    return anyio.run(go)


def test_a_coded_answer_past_the_cap_is_refused_in_one_line() -> None:
    bomb = _bomb(64 << 20)
    assert len(bomb) < 64 << 10
    with pytest.raises(PeerTooLargeError) as caught:
        _pull_page(_hostile(bomb), cap=4 << 20)
    assert "decodes past the 4194304-byte cap" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_coded_answer_that_does_not_decode_is_the_peers_fault() -> None:
    with pytest.raises(PeerProtocolError) as caught:
        _pull_page(_hostile(b"\x28\xb5\x2f\xfd not a frame"), cap=4 << 20)
    assert "zstd stream does not decode" in str(caught.value)


def test_a_coding_the_puller_did_not_ask_for_is_refused() -> None:
    with pytest.raises(PeerProtocolError) as caught:
        _pull_page(_hostile(b"\x1f\x8b junk", coding="gzip"), cap=4 << 20)
    assert "'gzip'-encoded answer although zstd or identity was asked for" in str(caught.value)


def test_a_frame_announcing_300_mb_is_refused_without_allocating_it(tmp_path: Path) -> None:
    """The library's one-shot decompress allocates what the header announces; ours reads
    a chunk at a time. Measured in a child process: its peak RSS stays far below 300 MB."""
    bomb = tmp_path / "bomb.zst"
    bomb.write_bytes(_bomb(300 << 20))
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child of a grown
    # pytest would report the parent's peak
    code = textwrap.dedent(f"""
        from pathlib import Path
        from logsync.errors import PeerTooLargeError
        from logsync.zstdcoding import inflate_capped
        try:
            inflate_capped(Path({str(bomb)!r}).read_bytes(), 8 << 20, "GET", "p")
        except PeerTooLargeError:
            status = Path("/proc/self/status").read_text()
            print(next(int(line.split()[1]) for line in status.splitlines()
                       if line.startswith("VmHWM:")) // 1024)
    """)
    peak_mib = int(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                  text=True, timeout=60, check=True).stdout)
    assert peak_mib < 150


def test_inflate_capped_takes_exactly_the_cap_and_refuses_one_byte_more() -> None:
    data = b"x" * 5000
    frame = zstandard.ZstdCompressor(level=1).compress(data)
    assert inflate_capped(frame, 5000, "GET", "p") == data
    with pytest.raises(PeerTooLargeError):
        inflate_capped(frame, 4999, "GET", "p")


def test_a_peer_that_ignores_accept_encoding_is_pulled_as_before(tmp_path: Path) -> None:
    """Upstream's server never codes: asked for zstd, it answers plain, taken as ever
    (against a real MemPalace hub: `tests/interop/test_replication_interop.py`)."""
    from tests.test_client import StorePeer

    with Store.open(tmp_path / "s") as source, Store.open(tmp_path / "t") as target:
        author(source, 20)
        peer = StorePeer(source)
        report = sync_once(target, BASE, TOKEN, transport=httpx.MockTransport(peer))
        assert report.applied == 20 and target.version_vector() == source.version_vector()
    pages = [c for c in peer.calls if c.url.path == "/sync/ops"]
    assert pages and all(c.headers["accept-encoding"] == "zstd, identity" for c in pages)
    vectors = [c for c in peer.calls if c.url.path == "/sync/version_vector"]
    assert vectors and all(c.headers["accept-encoding"] == "identity" for c in vectors)


def _json_page(size: int) -> bytes:
    """A zstd frame of a JSON page that decodes to about `size` bytes."""
    body = b'{"origin": "rep_' + b"a" * 32 + b'", "events": [], "count": 0, "pad": "'
    return zstandard.ZstdCompressor(level=1).compress(body + b"x" * size + b'"}')


def test_decoded_bytes_count_against_what_answers_in_flight_may_hold() -> None:
    """Review 2026-12-03: eight 2 KB coded answers decoding to 60 MB each passed a bound
    eight plain ones could not (only wire bytes were counted): 760 MiB held. What zstd
    decodes to is held under the client's one bound on answers in flight."""
    from logsync.answers import InFlight

    frame = _json_page(20 << 20)
    shared = InFlight(30 << 20)
    with shared.lease("GET a", "p") as first:
        inflate_capped(frame, 64 << 20, "GET a", "p", first)  # holds ~20 MiB
        with pytest.raises(PeerTooLargeError, match="answers in flight passed 31457280 bytes"), \
                shared.lease("GET b", "p") as second:
            inflate_capped(frame, 64 << 20, "GET b", "p", second)
        assert shared.held > 20 << 20  # the refused one gave back what it took
    assert shared.held == 0
    with shared.lease("GET b", "p") as second:
        assert len(inflate_capped(frame, 64 << 20, "GET b", "p", second)) > 20 << 20


def test_the_client_holds_a_coded_answers_decoded_bytes_under_its_bound() -> None:
    page = _json_page(8 << 20)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=httpx.ByteStream(page), headers={
            "content-type": "application/json", "content-encoding": "zstd"})

    async def fetch(others_hold: int) -> Any:
        from logsync.wire import Request

        async with PeerClient(BASE, TOKEN, transport=httpx.MockTransport(handler),
                              attempts=1) as client:
            with client._in_flight.lease("others", "p") as take:  # answers being read
                take(client._in_flight.most - others_hold)
                answer, size = await client.fetch(Request("/sync/ops", {"origin": "x"}))
            assert client._in_flight.held == 0
            return answer, size

    answer, size = anyio.run(fetch, 16 << 20)
    assert len(answer["pad"]) == 8 << 20 and size == len(page)
    with pytest.raises(PeerTooLargeError, match="answers in flight passed"):
        anyio.run(fetch, 4 << 20)


def test_a_cut_short_frame_is_named_as_such() -> None:
    """Review 2026-12-03: half a frame decoded silently to a prefix, and the refusal
    blamed the JSON; the frame's header says what it decodes to."""
    frame = _json_page(1 << 20)
    with pytest.raises(PeerProtocolError, match="its zstd stream ends inside a frame"):
        inflate_capped(frame[: len(frame) // 2], 64 << 20, "GET", "p")


def test_every_accept_encoding_line_counts_for_pages_as_for_snapshots(tmp_path: Path) -> None:
    """Review 2026-12-03: `identity` then `zstd` on two lines coded the snapshot and not
    the page (two copies of the rule); one rule reads every line now."""
    with Store.open(tmp_path / "s") as store:
        author(store, 300)
        app = create_app(store, token=TOKEN)

        async def go() -> httpx.Headers:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url=BASE) as client:
                request = client.build_request(
                    "GET", "/sync/ops", params=dict(PAGE, origin=store.replica_id),
                    headers=[("Authorization", f"Bearer {TOKEN}"),
                             ("Accept-Encoding", "identity"), ("Accept-Encoding", "zstd")])
                response = await client.send(request, stream=True)
                await response.aclose()
                return response.headers

        assert anyio.run(go)["content-encoding"] == "zstd"
