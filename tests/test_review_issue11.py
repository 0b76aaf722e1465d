"""Review of issue 11 (push extension, tip-signature adoption, `status` that asks now):
each test states a behaviour that should hold and, in its docstring, what is wrong and
where. They fail against the tree they were written for."""

from __future__ import annotations

import json
import traceback
import tracemalloc
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from logsync.client import sync_once
from logsync.effects import perform
from logsync.push import PushReport, push_round
from logsync.pushed import MAX_PUSH_BYTES, accept_push
from logsync.responder import LOGSYNC_SERVER
from logsync.server import create_app
from logsync.store import Store
from logsync.wire import Request
from tests.conftest import RemoteKit

TOKEN = "review-token"
URL = "http://127.0.0.1:8742"
PEER_ID = "rep_" + "d" * 32
KIT = RemoteKit()


@pytest.fixture
def laptop(tmp_path: Path):
    with Store.open(tmp_path / "laptop") as store:
        yield store


@pytest.fixture
def desk(tmp_path: Path):
    with Store.open(tmp_path / "desk") as store:
        yield store


def write(store: Store, count: int) -> None:
    for i in range(count):
        store.append_event("note", "main", "lobby", "laptop-agent", body=f"offline {i}")


def vector_answer(max_push_bytes: int, vector: dict[str, int] | None = None) -> dict:
    return {"replica_id": PEER_ID, "version_vector": vector or {},
            "logsync": {"version": "x", "extensions": ["chain", "push", "inline_artifacts"],
                        "max_push_bytes": max_push_bytes}}


def drive_push(store: Store, receiver: Any) -> tuple[PushReport, list[bytes]]:
    """Run `push_round` sans-IO against `receiver(body) -> answer or PeerError`; the bodies
    the pusher posted."""
    gen = push_round(store.replica_id, "peer")
    posted: list[bytes] = []
    value: Any = None
    throw = False
    while True:
        try:
            step = gen.throw(value) if throw else gen.send(value)
        except StopIteration as done:
            return done.value, posted
        if isinstance(step, Request) and step.path == "/sync/version_vector":
            value = receiver(None)
        elif isinstance(step, Request):
            posted.append(step.body)
            value = receiver(step.body)
        else:
            value = perform(store, step)
        throw = isinstance(value, Exception)


# ── the pusher against a hostile or constrained receiver ─────────────────────────────


def test_a_receiver_taking_one_op_per_page_cannot_make_the_pusher_serve_the_gap_again_and_again(
        laptop: Store) -> None:
    """push.py `_push_origin`: the round's op budget (`MAX_OPS_PER_ROUND`) is counted from
    the receiver's own `applied` claim, and an origin goes on as long as the receiver's top
    advances at all. A receiver (hostile or buggy) that answers every page with its top one
    op further and `applied: 0` makes the pusher rebuild, encode and upload a page from
    every seq of the gap: gap pages of up to 5000 ops each (quadratic work, bounded only by
    the 600 s round deadline, every round). A pull stops an origin on a page shorter than
    asked; a push should stop (or count what it sent) when the receiver takes less than the
    whole page without a reason."""
    write(laptop, 300)

    def receiver(body: bytes | None) -> Any:
        if body is None:
            return vector_answer(1 << 22)
        page = json.loads(body)
        return {"origin": page["origin"], "after": page["after"], "top": page["after"] + 1,
                "applied": 0, "duplicates": 0, "quarantined": 0, "conflicts": 0,
                "stopped": None, "diverged": False}

    report, posted = drive_push(laptop, receiver)
    ops_sent = sum(len(json.loads(b)["events"]) for b in posted)
    assert ops_sent <= 2 * 300, (
        f"{len(posted)} pages and {ops_sent} ops serialised to push a gap of 300 ops")


@pytest.mark.parametrize("status", [413, 408])
def test_the_pusher_sends_smaller_pages_when_the_receiver_refuses_a_body_as_too_large_or_too_slow(
        laptop: Store, status: int) -> None:
    """push.py `_push_origin`: the page size halves only when our own encoding exceeds the
    advertised `max_push_bytes`. A 413 (a reverse proxy's smaller body cap: nginx's default
    is 1 MB) or a 408 (the receiver's 10 s body deadline: a 32 MB page needs ~26 Mbit/s of
    uplink, a 2.5 MB page of 5000 small ops ~2 Mbit/s) is a `PeerRequestError` that stops
    the origin as `failed`, and the next round sends the very same page again: a laptop on
    a slow link or behind such a proxy can never push. A pull halves its page on
    `PeerTooLargeError`; the push should halve on 413/408 too."""
    from logsync.errors import PeerRequestError, PeerTransientError
    write(laptop, 400)
    taken = {"top": 0}

    def receiver(body: bytes | None) -> Any:
        if body is None:
            return vector_answer(MAX_PUSH_BYTES)
        if len(body) > 20_000:  # what the proxy / the link lets through in time
            kind = PeerTransientError if status == 408 else PeerRequestError  # as fetchpolicy
            return kind(f"peer: POST /sync/push answered {status}", peer="peer", status=status)
        page = json.loads(body)
        assert page["after"] == taken["top"]
        taken["top"] = page["events"][-1]["origin_seq"]
        return {"origin": page["origin"], "after": page["after"], "top": taken["top"],
                "applied": len(page["events"]), "duplicates": 0, "quarantined": 0,
                "conflicts": 0, "stopped": None, "diverged": False}

    report, _ = drive_push(laptop, receiver)
    assert report.they_lack() == {}, report.stopped()


def test_the_pusher_never_builds_a_page_above_its_own_push_cap_whatever_the_receiver_advertises(
        laptop: Store) -> None:
    """wire.py `parse_extensions` / push.py `push_round`: `max_push_bytes` is taken from
    the receiver's advertisement with no upper bound and used as the byte budget of the
    page *and of its inline artifacts* (`responder.push_page`). A receiver advertising
    2**40 makes the pusher read and encode up to 5000 ops with every artifact they name
    into one in-memory body (gigabytes with large artifacts). A pull caps what it takes at
    its own `max_response_bytes`; a push should cap what it builds at its own ceiling
    (`pushed.MAX_PUSH_BYTES`), whatever the peer says."""
    for i in range(10):  # 10 artifacts of 4 MB (the artifact maximum): 40 MB in all
        art = laptop.put_artifact("file", chr(ord("a") + i) * 4_000_000, "agent")
        laptop.append_event("patch.handoff", "main", "lobby", "agent", body=f"p{i}",
                            artifact_ids=[art["id"]])

    def receiver(body: bytes | None) -> Any:
        if body is None:
            return vector_answer(1 << 40)
        page = json.loads(body)
        return {"origin": page["origin"], "after": page["after"],
                "top": page["events"][-1]["origin_seq"], "applied": len(page["events"]),
                "duplicates": 0, "quarantined": 0, "conflicts": 0, "stopped": None,
                "diverged": False}

    _, posted = drive_push(laptop, receiver)
    sizes = [len(b) for b in posted]
    del posted
    assert max(sizes) <= MAX_PUSH_BYTES, f"pushed bodies of {sizes} bytes"


# ── the receiver ────────────────────────────────────────────────────────────────────


def test_a_pushed_body_is_decoded_within_the_container_bound_a_pulled_answer_has(
        desk: Store) -> None:
    """server/pushroute.py `sync_push`: the body (up to 32 MB) is handed to `json.loads`
    with no bound on the arrays and objects it decodes to. A pulled answer is refused
    above `answers.MAX_CONTAINERS` (1 000 000) before decoding, because "a 60 MB body of
    empty arrays decodes to gigabytes"; a pusher's 32 MB of `[],` decodes to ~10 million
    lists (~700 MB) per request, and 256 requests may be in flight. Here a 9 MB body of
    3 million empty arrays makes the receiver allocate ~200 MB before it is refused."""
    own = desk.replica_id
    body = (b'{"origin": "' + own.encode() + b'", "after": 0, "chain": {}, "events": ['
            + b"[]," * 3_000_000 + b"[]]}")
    app = create_app(desk, token=TOKEN)

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=URL,
                                     headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            return await c.post("/sync/push", content=body,
                                headers={"content-type": "application/json"})

    tracemalloc.start()
    try:
        answer = anyio.run(post)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 400 <= answer.status_code < 500
    assert peak < 64 * 1024 * 1024, f"a {len(body)}-byte push made the receiver allocate " \
                                     f"{peak // (1024 * 1024)} MB"


def test_a_malformed_pushed_page_pins_no_key(desk: Store) -> None:
    """pushed.py `accept_push`: the page's published key is pinned (`PinKeys`) before the
    page is checked at all, so a page refused as malformed (400) still leaves a key in
    `logsync_keys`, although RFC 004 §7.5 says "A malformed page is 400 and nothing of
    it is stored" (and a pull pins only keys of origins the peer holds ops of). A pusher
    can so pin a key for any origin this replica does not hold yet, with a page carrying
    no op at all; ops that origin later signs with its real key are then refused here."""
    from logsync.errors import ValidationError
    origin = "rep_" + "7" * 32  # not derived from the key: pinned on first sight
    key = bytes(range(32))
    page = {"origin": origin, "after": 0, "from": origin, "chain": {"prev": None},
            "events": "not a list of ops", "logsync": {"keys": {origin: key.hex()}}}
    with pytest.raises(ValidationError):
        accept_push(desk, page, "x@127.0.0.1")
    assert origin not in desk.public_keys(), "a refused push pinned its key"


# ── tip signatures ──────────────────────────────────────────────────────────────────


def test_a_pull_round_with_nothing_new_takes_no_write_transaction(tmp_path: Path,
                                                                    monkeypatch) -> None:
    """engine.py `_compare_tips` / store/chainreads.py `adopt_tip_signatures`: every origin
    whose advertised tip equals ours and comes with a `tip_sig` is handed to adoption,
    including the ones we already hold signed (every origin, between two logsync
    replicas in sync), and `adopt_tip_signatures` opens its `BEGIN IMMEDIATE` before it
    looks. So every full pull round of every peer, every interval, takes the store's
    write lock (competing with MemPalace's own writer) to write nothing. `pin_keys` reads
    first for exactly this reason ("the usual round: nothing to write"); adoption should
    too (or the engine should offer only tips we hold unsigned)."""
    from tests.test_client import StorePeer
    with Store.open(tmp_path / "a") as a, Store.open(tmp_path / "b") as b:
        write(b, 5)

        def pull() -> Any:
            return sync_once(a, URL, "secret",
                             transport=httpx.MockTransport(StorePeer(b, profile=LOGSYNC_SERVER)))
        first = pull()
        assert first.applied == 5 and a.chain_signatures(b.replica_id, [5])
        writes: list[str] = []
        real = a._atomic

        def counting(*args: Any, **kw: Any) -> Any:
            caller = traceback.extract_stack(limit=2)[0]
            writes.append(f"{Path(caller.filename).name}:{caller.name}")
            return real(*args, **kw)
        monkeypatch.setattr(a, "_atomic", counting)
        again = pull()
        assert again.applied == 0
        assert writes == [], f"write transactions in a round with nothing new: {writes}"


# ── status ──────────────────────────────────────────────────────────────────────────


def test_status_does_not_call_a_peer_whose_chain_differs_in_sync(tmp_path: Path) -> None:
    """peercheck.py `probe_one` / cli/status.py `_exit_code`: "in sync both ways" (exit 0)
    is decided from the vectors' counts alone. The same vector answer carries the peer's
    chain tips (`tips`), but they are never compared: a peer holding a different op 2 of
    an origin (a fork, a re-minted op: exactly what the daemon then records as a
    `divergence` every round) is reported `in sync both ways`, `in_sync: true`, exit 0."""
    from logsync import peers as peers_mod
    from logsync.cli.status import EXIT_IN_SYNC, _exit_code
    from logsync.peercheck import probe_one
    from logsync.responder import answer
    origin = KIT.origin(7)
    with Store.open(tmp_path / "mine") as mine, Store.open(tmp_path / "theirs") as theirs:
        mine.apply_remote([KIT.op(origin, 1), KIT.op(origin, 2)])
        theirs.apply_remote([KIT.op(origin, 1), KIT.op(origin, 2, body="another op 2")])
        assert mine.version_vector() == theirs.version_vector() == {origin: 2}
        assert mine.chain_digests_at(origin, [2]) != theirs.chain_digests_at(origin, [2])

        def peer(request: httpx.Request) -> httpx.Response:
            status, body = answer(theirs, request.url.path, dict(request.url.params),
                                  profile=LOGSYNC_SERVER)
            return httpx.Response(status, json=body)

        probe = anyio.run(lambda: probe_one(
            peers_mod.Peer(url=URL, token="t", name="desk"), mine.version_vector(),
            deadline_s=2, transport=httpx.MockTransport(peer),
            digest_at=lambda o, seq: mine.chain_digests_at(o, [seq])[0]))
        entry = {"name": "desk", "url": URL, **probe.as_dict()}
        assert probe.reachable
        assert _exit_code([entry]) != EXIT_IN_SYNC, (
            f"a peer whose op 2 of {origin} differs from ours is reported in sync: {entry}")
        assert entry["diverged"] == [origin]
