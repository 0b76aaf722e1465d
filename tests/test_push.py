"""The push extension (issue 11 item 2): a replica nobody can reach pushes what a peer
lacks, and the peer takes a pushed page exactly as it would take the same page pulled."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from logsync import hostile
from logsync.client import PeerClient
from logsync.hostile.encode import to_json
from logsync.push import PushReport, _parse_push_answer, push_round
from logsync.pushed import accept_push
from logsync.server import create_app
from logsync.store import Store
from logsync.wire import Request
from tests.conftest import RemoteKit

TOKEN = "push-token"
URL = "http://127.0.0.1:8742"
KIT = RemoteKit()
JSON = {"content-type": "application/json"}


def asgi_client(app: Any, **kw: Any) -> PeerClient:
    return PeerClient(URL, TOKEN, name="desk", transport=httpx.ASGITransport(app=app),
                      attempts=1, **kw)


def push(source: Store, app: Any) -> PushReport:
    async def go() -> PushReport:
        async with asgi_client(app) as client:
            return await client.run_push(source)
    return anyio.run(go)


def pull(target: Store, handler: Callable[[httpx.Request], httpx.Response]) -> Any:
    async def go() -> Any:
        async with PeerClient(URL, TOKEN, name="peer", attempts=1,
                              transport=httpx.MockTransport(handler)) as client:
            return await client.run_round(target)
    return anyio.run(go)


@pytest.fixture
def laptop(tmp_path: Path):
    with Store.open(tmp_path / "laptop") as store:
        yield store


@pytest.fixture
def desk(tmp_path: Path):
    with Store.open(tmp_path / "desk") as store:
        yield store


def write(store: Store, count: int, **fields: Any) -> None:
    for i in range(count):
        store.append_event(fields.pop("type", "note"), "main", "lobby", "laptop-agent",
                           body=f"offline write {i}", **fields)


def test_a_push_delivers_what_the_peer_lacks_signed_and_then_nothing(
        laptop: Store, desk: Store) -> None:
    art = laptop.put_artifact("patch", "--- a/x\n+++ b/x\n+pushed\n", "laptop-agent")
    write(laptop, 199)
    laptop.append_event("patch.handoff", "main", "lobby", "laptop-agent", body="patch",
                        artifact_ids=[art["id"]])
    app = create_app(desk, token=TOKEN)
    report = push(laptop, app)
    assert report.supported is True
    assert report.pushed == 200 and report.they_lack() == {} and report.stopped() == {}
    assert desk.version_vector()[laptop.replica_id] == 200
    assert desk.get_artifacts({art["id"]})[0]["content"] == "--- a/x\n+++ b/x\n+pushed\n"
    assert [e["id"] for e in desk.list_ops(laptop.replica_id, 0, 500)] == \
        [e["id"] for e in laptop.list_ops(laptop.replica_id, 0, 500)]
    # the laptop's key came with its signed chain: the desk holds the origin as signed
    assert desk.chain_signatures(laptop.replica_id, [200])
    again = push(laptop, app)
    assert again.pushed == 0 and again.origins == {}


def test_a_peer_without_push_is_told_apart_and_nothing_is_sent(laptop: Store,
                                                                desk: Store) -> None:
    write(laptop, 3)
    report = push(laptop, create_app(desk))  # no token: no push
    assert report.supported is False and report.origins == {}
    assert laptop.replica_id not in desk.version_vector()


def test_a_push_without_the_token_is_refused(laptop: Store, desk: Store) -> None:
    write(laptop, 1)
    body = laptop_page(laptop)

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(
                app=create_app(desk, token=TOKEN)), base_url=URL) as c:
            return await c.post("/sync/push", content=body)
    answer = anyio.run(go)
    assert answer.status_code == 401
    assert laptop.replica_id not in desk.version_vector()


def test_a_push_that_is_not_json_by_its_content_type_is_415(laptop: Store, desk: Store) -> None:
    """RFC 004 §7.5: a pushed page is `application/json`; anything else is 415
    `unsupported_media_type` before the body is read, and nothing is stored."""
    write(laptop, 1)
    body = laptop_page(laptop)

    async def go(ctype: str | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {TOKEN}", "Logsync-Errors": "codes"}
        if ctype is not None:
            headers["Content-Type"] = ctype
        async with httpx.AsyncClient(transport=httpx.ASGITransport(
                app=create_app(desk, token=TOKEN)), base_url=URL) as c:
            return await c.post("/sync/push", content=body, headers=headers)
    for ctype in ("text/plain", "application/msgpack", None):
        answer = anyio.run(go, ctype)
        assert answer.status_code == 415 and answer.json()["error"] == "unsupported_media_type"
    assert laptop.replica_id not in desk.version_vector()
    assert anyio.run(go, "application/json; charset=utf-8").status_code == 200
    assert desk.version_vector()[laptop.replica_id] == 1


def laptop_page(store: Store, after: int = 0) -> bytes:
    from logsync.responder import push_page
    return push_page(store, store.replica_id, after, 500, 1 << 20, store.replica_id).body


def test_a_pushed_page_whose_prev_differs_is_not_applied(laptop: Store, desk: Store,
                                                         tmp_path: Path) -> None:
    write(laptop, 4)
    with Store.open(tmp_path / "twin") as twin:  # the same origin's ops 1-2, then 3' and 4'
        twin.apply_remote(laptop.list_ops(laptop.replica_id, 0, 2))
        desk.apply_remote(laptop.list_ops(laptop.replica_id, 0, 3))
        forged = {**json.loads(laptop_page(laptop, 2))}
        forged["chain"] = {"prev": "00" * 32, "sigs": []}
        answer = accept_push(desk, forged, "x@127.0.0.1")
    assert answer["diverged"] is True and answer["applied"] == 0
    assert desk.version_vector()[laptop.replica_id] == 3


@pytest.mark.parametrize("body,problem", [
    ([], "must be a JSON object"),
    ({"origin": "nope", "after": 0, "chain": {}}, "origin='nope'"),
    ({"origin": "rep_" + "a" * 32, "after": -1, "chain": {}}, "after=-1"),
    ({"origin": "rep_" + "a" * 32, "after": True, "chain": {}}, "after=True"),
    ({"origin": "rep_" + "a" * 32, "after": 0}, "must carry 'chain'"),
    ({"origin": "rep_" + "a" * 32, "after": 0, "chain": {"prev": "zz"}, "events": "x"},
     "not an object with a list 'events'"),
])
def test_a_malformed_push_is_one_sentence_and_stores_nothing(desk: Store, body: Any,
                                                             problem: str) -> None:
    from logsync.errors import ValidationError
    before = desk.version_vector()
    with pytest.raises(ValidationError, match=problem.replace("(", r"\(")):
        accept_push(desk, body, "x@127.0.0.1")
    assert desk.version_vector() == before


def test_a_page_above_our_top_is_a_gap_and_says_where_to_start(laptop: Store,
                                                               desk: Store) -> None:
    write(laptop, 5)
    answer = accept_push(desk, json.loads(laptop_page(laptop, 2)), "x@127.0.0.1")
    assert answer["applied"] == 0 and answer["top"] == 0 and answer["stopped"].startswith("gap")


def test_a_receiver_whose_top_does_not_advance_cannot_loop_the_pusher(laptop: Store) -> None:
    write(laptop, 50)
    posts: list[int] = []

    def stuck(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/sync/version_vector":
            return httpx.Response(200, json={
                "replica_id": "rep_" + "d" * 32, "version_vector": {},
                "logsync": {"version": "x", "extensions": ["chain", "push"],
                            "max_push_bytes": 1 << 20}})
        posts.append(1)
        return httpx.Response(200, json={"origin": laptop.replica_id, "after": 0, "top": 0,
                                         "applied": 0, "duplicates": 0, "quarantined": 0,
                                         "conflicts": 0, "stopped": None, "diverged": False})

    async def go() -> PushReport:
        async with PeerClient(URL, TOKEN, attempts=1,
                              transport=httpx.MockTransport(stuck)) as client:
            return await client.run_push(laptop)
    report = anyio.run(go)
    assert len(posts) == 1
    assert report.they_lack() == {laptop.replica_id: 50}
    assert "stayed at 0" in report.stopped()[laptop.replica_id]


@pytest.mark.parametrize("answer,problem", [
    ("nope", "not an answer for"),
    ({"origin": "rep_" + "9" * 32}, "not an answer for"),
    ({"origin": "O", "top": -1}, "top=-1"),
    ({"origin": "O", "top": 1, "applied": "1"}, "applied='1'"),
])
def test_a_malformed_push_answer_is_a_protocol_error(answer: Any, problem: str) -> None:
    from logsync.errors import PeerProtocolError
    if isinstance(answer, dict) and answer.get("origin") == "O":
        answer = {**answer, "origin": "rep_" + "1" * 32}
    with pytest.raises(PeerProtocolError, match=problem):
        _parse_push_answer(answer, "p", "rep_" + "1" * 32, 0)


def test_a_page_too_large_for_the_cap_halves_then_names_the_op(laptop: Store) -> None:
    big = laptop.put_artifact("patch", "x" * 5000, "laptop-agent")
    write(laptop, 3)
    laptop.append_event("patch.handoff", "main", "lobby", "a", body="p", artifact_ids=[big["id"]])
    gen = push_round(laptop.replica_id, "p")
    step = gen.send(None)
    assert step == Request("/sync/version_vector")
    step = gen.send({"replica_id": "rep_" + "d" * 32, "version_vector": {},
                     "logsync": {"extensions": ["chain", "push"], "max_push_bytes": 4000}})
    from logsync.effects import perform
    sizes = []
    while True:
        try:
            if isinstance(step, Request):
                body = json.loads(step.body)
                sizes.append(len(body["events"]))
                top = body["events"][-1]["origin_seq"]
                step = gen.send({"origin": laptop.replica_id, "top": top, "applied":
                                 len(body["events"]), "duplicates": 0, "quarantined": 0,
                                 "conflicts": 0})
            else:
                step = gen.send(perform(laptop, step))
        except StopIteration as done:
            report = done.value
            break
    assert sizes == [3]  # ops 1-3 fit; op 4 with its artifact never, alone or not
    assert report.origins[laptop.replica_id].reached == 3
    assert "too_large: op 4" in report.stopped()[laptop.replica_id]


# ── pushed exactly as pulled: every hostile op of the corpus ────────


BAD = "rep_" + "0" * 31 + "b"


def _hostile_cases() -> dict[str, Callable[[], list[dict]]]:
    cases: dict[str, Callable[[], list[dict]]] = {}
    for name, mutate in hostile.OP_MUTATIONS.items():
        cases[f"op:{name}"] = lambda m=mutate: [KIT.op(BAD, 1), m(KIT.op(BAD, 2)), KIT.op(BAD, 3)]
    cases["missing_artifact"] = lambda: [KIT.op(BAD, 1), KIT.op(BAD, 2, artifact_ids=[
        "art_20260702T032443_" + "e" * 12]), KIT.op(BAD, 3)]
    cases["id_collision"] = lambda: [KIT.op(BAD, 1), dict(KIT.op(BAD, 2), id=KIT.op(BAD, 1)["id"])]
    for variant in ("seq_zero", "seq_negative", "seq_float", "seq_bool", "seq_string",
                    "backwards"):
        cases[f"page:{variant}"] = lambda v=variant: hostile.bad_page(v, KIT.chain(BAD, 3))
    return cases


HOSTILE = _hostile_cases()


def _outcome(store: Store) -> tuple:
    quarantined = sorted((r["origin_seq"], r["kind"], r["reason"])
                         for r in store.list_quarantine(100))
    conflicts = sorted((r["origin_seq"], r["kind"]) for r in store.list_conflicts(100))
    return store.version_vector().get(BAD, 0), quarantined, conflicts


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_pushed_hostile_page_is_taken_exactly_as_the_same_page_pulled(
        case: str, tmp_path: Path) -> None:
    events = HOSTILE[case]()
    with Store.open(tmp_path / "pulled") as pulled, Store.open(tmp_path / "pushed") as pushed:
        prev = pulled.chain_digests_at(BAD, [0])[0].hex()
        page = {"origin": BAD, "events": events, "count": len(events), "artifacts": [],
                "chain": {"prev": prev, "sigs": []}}

        def peer(request: httpx.Request) -> httpx.Response:
            if request.url.path == "/sync/version_vector":
                return httpx.Response(200, json={
                    "replica_id": "rep_" + "e" * 32, "version_vector": {BAD: 3},
                    "logsync": {"version": "x", "max_page": 500,
                                "extensions": ["chain", "inline_artifacts"]}})
            if request.url.path == "/sync/ops":  # deep nesting needs the corpus' encoder
                return httpx.Response(200, content=to_json(page), headers=JSON)
            return httpx.Response(404, json={"error": "no such artifact"})

        report = pull(pulled, peer)
        failed = BAD in report.failed_origins()

        async def post() -> httpx.Response:
            app = create_app(pushed, token=TOKEN)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url=URL,
                                         headers={"Authorization": f"Bearer {TOKEN}"}) as c:
                return await c.post("/sync/push", content=to_json({**page, "after": 0}),
                                    headers=JSON)
        answer = anyio.run(post)
        assert answer.status_code == (400 if failed else 200), answer.text
        assert _outcome(pushed) == _outcome(pulled)
        if not failed:
            assert answer.json()["top"] == _outcome(pulled)[0]
            assert answer.json()["quarantined"] == report.quarantined


def test_a_push_of_our_own_origin_below_our_top_is_not_judged(laptop: Store,
                                                               tmp_path: Path) -> None:
    """Our own ops are recovered only by our own pull (once a round): a pusher replaying
    a forged copy of our origin cannot make us record forks at its pace."""
    write(laptop, 3)
    with Store.open(tmp_path / "liar") as liar:
        liar.apply_remote(laptop.list_ops(laptop.replica_id, 0, 1))
        forged = json.loads(laptop_page(laptop, 0))
        forged["events"][1] = dict(forged["events"][1], body="not what we wrote")
        for _ in range(3):
            answer = accept_push(laptop, forged, "x@127.0.0.1")
            assert answer["applied"] == 0 and "own origin below our top" in answer["stopped"]
    assert laptop.counts()["conflicts"] == 0


def test_a_malformed_push_pins_no_key(laptop: Store, desk: Store) -> None:
    from logsync.errors import ValidationError
    write(laptop, 2)
    page = json.loads(laptop_page(laptop))
    page["events"] = [page["events"][1], page["events"][0]]  # backwards: refused
    with pytest.raises(ValidationError):
        accept_push(desk, page, "x@127.0.0.1")
    assert laptop.replica_id not in desk.public_keys()
