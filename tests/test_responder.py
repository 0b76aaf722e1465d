"""logsync.responder: every rule of the /sync/* answers as a unit test, the page
invariants as properties, and one parity test holding the server, the simulator's
`serve` and the tests' fake peer to the same (status, body)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from logsync import __version__
from logsync.errorcodes import ERRORS_CODED, ERRORS_HEADER
from logsync.errors import StoreError, ValidationError
from logsync.responder import (
    DEFAULT_INLINE_ARTIFACT_BYTES,
    DEFAULT_MAX_PAGE_BYTES,
    EVENT_OVERHEAD_BYTES,
    LOGSYNC_SERVER,
    PAGE_ENVELOPE_BYTES,
    PAGE_READ_BATCH,
    UPSTREAM_HUB,
    Profile,
    answer,
    chain_bound,
    event_size,
    int_param,
    json_bytes,
)
from logsync.server import create_app
from logsync.sim.serve import serve
from logsync.store import Store
from logsync.wire import LARGE_PAGE_CEILING, UPSTREAM_PAGE_LIMIT, parse_extensions
from tests.test_client import StorePeer

OPS = "/sync/ops"
BUDGETED = 250  # ops of the budget store: more than two read batches


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "palace") as opened:
        yield opened


def append(store: Store, count: int, **fields: Any) -> list[dict]:
    return [store.append_event("note", "main", "lobby", "alice", **fields)
            for _ in range(count)]


def ops(store: Store, profile: Profile = LOGSYNC_SERVER, **params: Any) -> tuple[int, dict]:
    params.setdefault("origin", store.replica_id)
    return answer(store, OPS, params, profile=profile)


def seqs(body: dict) -> list[int]:
    return [e["origin_seq"] for e in body["events"]]


# ── /sync/version_vector ─────────────────────────────────────────────


def test_a_logsync_profile_advertises_its_extensions_and_limits(store: Store) -> None:
    append(store, 2)
    profile = Profile(max_page=2000, max_page_bytes=1234)
    status, body = answer(store, "/sync/version_vector", {}, profile=profile)
    assert status == 200
    assert list(body) == ["replica_id", "version_vector", "logsync"]
    assert body["replica_id"] == store.replica_id
    assert body["version_vector"] == {store.replica_id: 2}
    assert body["logsync"] == {
        "version": __version__,
        "extensions": ["msgpack", "large_pages", "inline_artifacts", "notify", "chain"],
        "max_page": 2000,
        "max_page_bytes": 1234,
        "tips": {store.replica_id: [2, store.chain_digest(store.replica_id, 2).hex()]},
        "keys": {store.replica_id: store.public_key.hex()},
        "tip_sigs": {store.replica_id: store.chain_signatures(store.replica_id, [2])[2].hex()},
    }
    ext = parse_extensions(body)
    assert (ext.msgpack, ext.inline_artifacts, ext.max_page_limit, ext.page_budget,
            ext.chain) == (True, True, 2000, True, True)


def test_an_upstream_hub_advertises_nothing(store: Store) -> None:
    status, body = answer(store, "/sync/version_vector", {}, profile=UPSTREAM_HUB)
    assert (status, list(body)) == (200, ["replica_id", "version_vector"])


def test_the_vector_and_extra_hooks(store: Store) -> None:
    """`vector` replaces the store's read; `extra` gets the replica id and that vector and
    its keys sit between the vector and the advertisement (the server's profiles)."""
    seen: list[tuple[str, Mapping[str, int]]] = []

    def extra(replica_id: str, vector: Mapping[str, int]) -> dict[str, Any]:
        seen.append((replica_id, vector))
        return {"profile": {"roles": []}, "profiles": {}}

    status, body = answer(store, "/sync/version_vector", {}, profile=LOGSYNC_SERVER,
                          vector=lambda: {"rep_" + "a" * 32: 7}, extra=extra)
    assert status == 200
    assert list(body) == ["replica_id", "version_vector", "profile", "profiles", "logsync"]
    assert body["version_vector"] == {"rep_" + "a" * 32: 7}
    assert seen == [(store.replica_id, {"rep_" + "a" * 32: 7})]


# ── /sync/ops: parameters ────────────────────────────────────────────


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "origin must be a non-empty replica id"),
        ({"origin": ""}, "origin must be a non-empty replica id"),
        ({"origin": "rep_a", "after": "-1"}, "after=-1 must be a non-negative integer"),
        ({"origin": "rep_a", "after": "x"}, "after='x' is not an integer"),
        ({"origin": "rep_a", "after": "1.5"}, "after='1.5' is not an integer"),
        ({"origin": "rep_a", "limit": "0"}, "limit=0 must be a positive integer"),
        ({"origin": "rep_a", "limit": "-3"}, "limit=-3 must be a positive integer"),
        ({"origin": "rep_a", "limit": "lots"}, "limit='lots' is not an integer"),
        ({"after": "x"}, "after='x' is not an integer"),  # numbers are read before origin
        ({"origin": "rep_a", "after": True}, "after=True is not an integer"),
    ],
)
def test_bad_parameters_are_400_with_one_sentence(store: Store, params: dict,
                                                  message: str) -> None:
    coded = {"error": "bad_request", "reason": message}
    assert answer(store, OPS, params, profile=LOGSYNC_SERVER) == (400, coded)
    assert answer(store, OPS, params, profile=UPSTREAM_HUB) == (400, coded)


def test_the_store_refuses_what_the_parameters_let_through(store: Store) -> None:
    status, body = ops(store, origin="bad\x01origin")
    assert status == 400 and body["reason"].startswith("origin='bad\\x01origin' is invalid")
    assert ops(store, after=str(2**63)) == (
        400, {"error": "bad_request", "reason": f"after={2**63} is invalid: must be below 2**63"})


def test_huge_and_long_values_get_a_short_sentence(store: Store) -> None:
    for raw in ("9" * 5000, "y" * 5000, "1\n2"):
        status, body = ops(store, after=raw)
        assert status == 400 and body["reason"].endswith("is not an integer")
        assert len(body["reason"]) < 100 and "\n" not in body["reason"]


def test_defaults_and_empty_values_and_ints(store: Store) -> None:
    append(store, 620)
    assert seqs(ops(store)[1]) == list(range(1, 501))
    assert ops(store, after="", limit="") == ops(store)
    assert ops(store, after=3, limit=2) == ops(store, after="3", limit="2")
    assert seqs(ops(store, after=3, limit=2)[1]) == [4, 5]
    assert ops(store, after=615)[1]["count"] == 5


@given(st.integers(min_value=-(10**30), max_value=10**30))
def test_int_param_reads_every_integer_text(n: int) -> None:
    assert int_param({"after": str(n)}, "after", 0) == n
    assert int_param({"after": n}, "after", 0) == n


@given(st.text(max_size=50).filter(lambda t: not _is_int(t)))
def test_int_param_refuses_every_non_integer_text(text: str) -> None:
    """Absent or empty is the default; any other text int() refuses is one sentence."""
    if text == "":
        assert int_param({"after": text}, "after", 7) == 7
        return
    with pytest.raises(ValidationError, match=r"^after=.* is not an integer$") as caught:
        int_param({"after": text}, "after", 0)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 90


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


# ── /sync/ops: caps and extensions ───────────────────────────────────


def test_page_caps(store: Store) -> None:
    append(store, 620)
    profile = Profile(max_page=600)
    count = lambda **p: ops(store, profile, **p)[1]["count"]  # noqa: E731
    assert count(limit="1000") == UPSTREAM_PAGE_LIMIT
    assert count(limit="7") == 7
    assert count(limit="1000", ext="large_pages") == 600
    assert count(limit="550", ext="inline_artifacts,large_pages") == 550
    assert count(limit="550", ext=" Large_Pages , future_thing") == 550  # case, blanks
    assert count(limit="550", ext="inline_artifacts") == UPSTREAM_PAGE_LIMIT
    assert count(limit="550", ext="msgpack") == UPSTREAM_PAGE_LIMIT
    assert ops(store, UPSTREAM_HUB, limit="1000", ext="large_pages")[1]["count"] == 500
    only_msgpack = Profile(extensions=("msgpack",), max_page=600)
    assert ops(store, only_msgpack, limit="1000", ext="large_pages")[1]["count"] == 500


def test_an_unknown_origin_is_an_empty_page(store: Store) -> None:
    origin = "rep_" + "0" * 32
    assert ops(store, origin=origin) == (200, {"origin": origin, "events": [], "count": 0})


def test_the_page_is_upstream_shaped(store: Store) -> None:
    append(store, 3)
    status, body = ops(store, after="1")
    assert status == 200 and list(body) == ["origin", "events", "count"]
    assert body["events"] == store.list_ops(store.replica_id, 1)


def test_the_byte_budget_holds_large_pages_only(store: Store) -> None:
    append(store, 12, body="b" * 10_000)
    small = Profile(max_page_bytes=35_000)
    large = ops(store, small, limit="100", ext="large_pages")[1]
    assert seqs(large) == [1, 2, 3] and large["count"] == 3
    assert len(json_bytes(large["events"])) <= 35_000
    assert ops(store, small, limit="100")[1]["count"] == 12  # upstream page: no budget
    tiny = Profile(max_page_bytes=10)
    assert seqs(ops(store, tiny, after="5", ext="large_pages")[1]) == [6]  # one, always


def test_event_size_counts_the_separator_and_survives_unencodable_events() -> None:
    event = {"id": "e", "body": "ä"}
    assert event_size(event) == len(json_bytes(event)) + EVENT_OVERHEAD_BYTES
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ValueError, match="nests too deeply"):
        json_bytes({"m": deep})
    assert event_size({"body": "abc", "metadata": deep}) == 3 + EVENT_OVERHEAD_BYTES


# ── /sync/ops: inline artifacts ──────────────────────────────────────


def test_inline_artifacts_are_the_named_ones_by_id_once(store: Store) -> None:
    first = store.put_artifact("patch", "--- a\n+++ b\n", "alice")
    second = store.put_artifact("note", "ä" * 100, "alice")
    append(store, 1, artifact_ids=[second["id"], first["id"]])
    append(store, 1, artifact_ids=[first["id"]])
    append(store, 1)
    assert "artifacts" not in ops(store)[1]
    body = ops(store, ext="inline_artifacts")[1]
    assert list(body) == ["origin", "events", "count", "artifacts"]
    wanted = sorted([first["id"], second["id"]])
    assert body["artifacts"] == [store.get_artifact(i) for i in wanted]
    assert "artifacts" not in ops(store, UPSTREAM_HUB, ext="inline_artifacts")[1]
    assert ops(store, after="2", ext="inline_artifacts")[1]["artifacts"] == []


def test_inline_artifacts_keep_their_byte_budget(store: Store) -> None:
    """RFC 004 §8.1: an event goes with the artifacts it names (counted as the JSON they
    take) or, past the budget, a budgeted page ends before it; other pages keep every
    event and inline no more artifacts from the first that does not fit."""
    big = [store.put_artifact("note", f"{i}" * 600, "alice") for i in range(3)]
    append(store, 1, artifact_ids=[a["id"] for a in big])  # one event naming three
    one = len(json_bytes(store.get_artifact(big[0]["id"]))) + 2
    for allowed, inline in ((3 * one - 1, 0), (3 * one, 3), (0, 0)):
        body = ops(store, Profile(inline_artifact_bytes=allowed), ext="inline_artifacts")[1]
        assert len(body["artifacts"]) == inline and body["count"] == 1
    arts = [store.put_artifact("note", f"{i}" * 600, "bob") for i in range(3)]
    for art in arts:  # three events naming one each
        append(store, 1, artifact_ids=[art["id"]])
    plain = ops(store, Profile(inline_artifact_bytes=2 * one), after="1",
                ext="inline_artifacts")[1]
    assert plain["count"] == 3 and [a["id"] for a in plain["artifacts"]] == sorted(
        a["id"] for a in arts[:2])
    cut = ops(store, Profile(inline_artifact_bytes=2 * one), after="1",
              ext="inline_artifacts,large_pages")[1]
    assert cut["count"] == 2 and len(cut["artifacts"]) == 2  # ends before the third


@pytest.fixture(scope="module")
def artifact_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """Signed ops (a chain with checkpoints) naming artifacts of uneven sizes, some with
    characters JSON escapes six times over."""
    with Store.open(tmp_path_factory.mktemp("arts") / "palace") as opened:
        for i in range(900):  # tiny ops among larger ones: pages with many checkpoints
            content = ("\x01" if i % 5 == 0 else "ü") * ((i * 3571) % 9000 + 1)
            art = [opened.put_artifact("note", f"{i}:{content}", "alice")] if i % 3 else []
            opened.append_event("note", "main", "lobby", "alice", body="b" * (i * 37 % 600),
                                artifact_ids=[a["id"] for a in art])
        yield opened


@settings(max_examples=80, deadline=None)
@example(after=0, limit=1000, budget=200_000, exts={"chain"})  # many checkpoints
@example(after=3, limit=1000, budget=150_000, exts={"chain", "inline_artifacts"})
@example(after=900, limit=1000, budget=1024, exts={"chain", "inline_artifacts"})  # empty
@given(after=st.integers(0, 900), limit=st.integers(1, 1000),
       budget=st.integers(1024, 300_000),
       exts=st.sets(st.sampled_from(["inline_artifacts", "chain"])))
def test_a_whole_page_stays_within_its_byte_budget(artifact_store: Store, after: int,
                                                   limit: int, budget: int,
                                                   exts: set[str]) -> None:
    """RFC 004 §8.1: with `large_pages`, the whole answer (events, inline artifacts,
    chain) as JSON is at most `max_page_bytes` unless it holds one event."""
    profile = Profile(max_page=1000, max_page_bytes=budget)
    status, body = ops(artifact_store, profile, after=str(after), limit=str(limit),
                       ext=",".join(["large_pages", *sorted(exts)]))
    assert status == 200
    size = len(json_bytes(body))
    assert size <= budget or body["count"] == 1, (size, budget, body["count"])
    if body["count"] == 1 and size > budget:  # one event alone: nothing else rides along
        assert not body.get("artifacts")
    if "chain" in exts:  # the chain's part is within the bound the budget reserves for it
        assert len(json_bytes({"chain": body["chain"]})) <= chain_bound(min(limit, 1000))


# ── /sync/artifact and the rest ──────────────────────────────────────


def test_artifact_found_missing_and_empty(store: Store) -> None:
    art = store.put_artifact("log", "ünïcode log\n", "bob")
    for profile in (LOGSYNC_SERVER, UPSTREAM_HUB):
        get = lambda **p: answer(store, "/sync/artifact", p, profile=profile)  # noqa: B023,E731
        assert get(id=art["id"]) == (200, {"artifact": store.get_artifact(art["id"])})
        assert get(id="art_nope") == (404, {"error": "not_found",
                                            "reason": "artifact 'art_nope' not found"})
        assert get(id="it's") == (404, {"error": "not_found",
                                         "reason": "artifact \"it's\" not found"})
        assert get() == get(id="") == (400, {"error": "bad_request",
                                             "reason": "id must be a non-empty artifact id"})


def test_an_unknown_path_is_404_naming_the_routes(store: Store) -> None:
    status, body = answer(store, "/sync/nope", {}, profile=LOGSYNC_SERVER)
    assert status == 404
    assert body == {"error": "not_found",
                    "reason": "no route '/sync/nope'; routes are /sync/version_vector, "
                              "/sync/ops, /sync/artifact, /sync/digests"}


def test_store_faults_are_the_callers_not_a_400(store: Store) -> None:
    def broken(*args: Any, **kwargs: Any) -> list[dict]:
        raise StoreError("the disk is gone")

    store.list_ops = broken  # type: ignore[method-assign]
    with pytest.raises(StoreError, match="the disk is gone"):
        ops(store)


def test_profile_defaults_are_the_servers() -> None:
    assert (LOGSYNC_SERVER.max_page, LOGSYNC_SERVER.max_page_bytes,
            LOGSYNC_SERVER.inline_artifact_bytes) == (
        LARGE_PAGE_CEILING, DEFAULT_MAX_PAGE_BYTES, DEFAULT_INLINE_ARTIFACT_BYTES)
    assert UPSTREAM_HUB.advertisement() is None


# ── page invariants ──────────────────────────────────────────────────


@pytest.fixture(scope="module")
def budget_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """One origin's ops with bodies of uneven sizes (40 B .. 3 kB), more than two read
    batches of them."""
    with Store.open(tmp_path_factory.mktemp("budget") / "palace") as opened:
        for i in range(BUDGETED):
            opened.append_event("note", "main", "lobby", "alice",
                                body="x" * ((i * 7919) % 3000 + 40))
        yield opened


@settings(max_examples=120, deadline=None)
@given(after=st.integers(0, BUDGETED + 5), limit=st.integers(1, 600),
       budget=st.integers(1024, 400_000), large=st.booleans())
def test_a_page_is_a_gap_free_run_within_its_budget(budget_store: Store, after: int,
                                                    limit: int, budget: int,
                                                    large: bool) -> None:
    """A page is the next ops of the origin above `after`, in order, none skipped; never
    more than asked or the cap; with large pages never over the byte budget unless it is
    a single op, and never stopped short of it while ops remain."""
    store = budget_store
    profile = Profile(max_page=BUDGETED * 2, max_page_bytes=budget)
    params = {"after": str(after), "limit": str(limit)}
    if large:
        params["ext"] = "large_pages"
    status, body = ops(store, profile, **params)
    assert status == 200
    events = body["events"]
    rest = store.list_ops(store.replica_id, after, BUDGETED * 2, max_limit=BUDGETED * 2)
    assert events == rest[: len(events)]
    assert body["count"] == len(events)
    cap = BUDGETED * 2 if large else UPSTREAM_PAGE_LIMIT
    assert len(events) <= min(limit, cap)
    spent = sum(event_size(e) for e in events)
    if not large:
        assert len(events) == min(limit, cap, len(rest))
        return
    assert len(json_bytes(body)) <= budget or len(events) == 1
    if len(events) < min(limit, len(rest)):  # stopped early: only because of the budget
        assert spent + event_size(rest[len(events)]) > budget - PAGE_ENVELOPE_BYTES


def test_a_budgeted_page_reads_in_bounded_batches(budget_store: Store) -> None:
    """However large the page asked for, the store is read PAGE_READ_BATCH ops at a time
    and no further than the budget needs."""
    asked: list[int] = []
    real = budget_store.list_ops

    class Counting:
        replica_id = budget_store.replica_id

        def list_ops(self, *args: Any, **kwargs: Any) -> list[dict]:
            asked.append(args[2])
            return real(*args, **kwargs)

    body = ops(Counting(), Profile(max_page_bytes=4000), ext="large_pages",  # type: ignore[arg-type]
               limit="5000", origin=budget_store.replica_id)[1]
    assert 1 <= body["count"] < PAGE_READ_BATCH and asked == [PAGE_READ_BATCH]
    asked.clear()
    body = ops(Counting(), Profile(), ext="large_pages", limit="5000",  # type: ignore[arg-type]
               origin=budget_store.replica_id)[1]
    assert body["count"] == BUDGETED and max(asked) == PAGE_READ_BATCH


# ── one answer, three transports ─────────────────────────────────────


def test_the_server_answers_an_unencodable_artifact_500_not_400(store: Store) -> None:
    """Encoding is the server's part: an answer it holds but cannot encode is its fault
    (500, one sentence), never the client's 400."""
    art = store.put_artifact("note", "n", "alice")
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    real = store.get_artifact
    store.get_artifact = lambda i: {**real(i), "metadata": deep}  # type: ignore[method-assign]
    got = _from_server(store, [("/sync/artifact", {"id": art["id"]})])
    assert got == [(500, {"error": "internal",
                          "reason": "the answer to /sync/artifact cannot be encoded "
                                    "(the payload nests too deeply to encode as JSON)"})]


TOKEN = "secret"
ENVIRONMENT = ("profile", "profiles")  # the server's node description (clock, platform)


def _requests(store: Store, origin: str, art_id: str) -> list[tuple[str, dict[str, str]]]:
    other = "rep_" + "0" * 32
    return [
        ("/sync/version_vector", {}),
        (OPS, {"origin": origin}),
        (OPS, {"origin": origin, "after": "2", "limit": "2"}),
        (OPS, {"origin": origin, "limit": "1000"}),
        (OPS, {"origin": origin, "limit": "1000", "ext": "large_pages"}),
        (OPS, {"origin": origin, "ext": "inline_artifacts"}),
        (OPS, {"origin": origin, "ext": "LARGE_PAGES,inline_artifacts,future"}),
        (OPS, {"origin": origin, "after": "", "limit": ""}),
        (OPS, {"origin": other}),
        (OPS, {}),
        (OPS, {"origin": origin, "after": "-1"}),
        (OPS, {"origin": origin, "limit": "0"}),
        (OPS, {"origin": origin, "limit": "abc"}),
        (OPS, {"origin": origin, "after": "1.5"}),
        (OPS, {"origin": origin, "after": str(2**63)}),
        (OPS, {"origin": "bad\x01origin"}),
        ("/sync/artifact", {"id": art_id}),
        ("/sync/artifact", {"id": "art_missing"}),
        ("/sync/artifact", {}),
    ]


def _without_push(body: dict) -> None:
    """The server advertises `push` because it has a token (pushes need an authenticated
    peer), and `snapshot`, a file only HTTP serves (RFC 004 §7.6); the simulated and
    fake peers take no pushes and serve no snapshot. Everything else must match."""
    advert = body.get("logsync")
    if isinstance(advert, dict):
        assert advert["extensions"][-2:] == ["push", "snapshot"]
        advert["extensions"] = advert["extensions"][:-2]
        assert advert.pop("max_push_bytes") > 0


def _from_server(store: Store, requests: list[tuple[str, dict[str, str]]]) -> list[tuple]:
    async def go() -> list[tuple]:
        transport = httpx.ASGITransport(app=create_app(store, token=TOKEN))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1",
                                     headers={"Authorization": f"Bearer {TOKEN}",
                                              ERRORS_HEADER: ERRORS_CODED}) as c:
            out = []
            for path, params in requests:
                got = await c.get(path, params=params)
                body = {k: v for k, v in got.json().items() if k not in ENVIRONMENT}
                _without_push(body)
                out.append((got.status_code, body))
            return out

    return anyio.run(go)


def _from_fake_peer(store: Store, profile: Profile,
                    requests: list[tuple[str, dict[str, str]]]) -> list[tuple]:
    transport = httpx.MockTransport(StorePeer(store, profile=profile))
    with httpx.Client(transport=transport, base_url="http://peer.test",
                      headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        return [(got.status_code, got.json())
                for got in (c.get(path, params=params) for path, params in requests)]


def test_server_simulator_and_fake_peer_answer_alike(tmp_path: Path) -> None:
    """The same store and requests give the same (status, body) from the real server, the
    simulator's `serve` and the tests' `StorePeer` (as a logsync server and, for the two
    that can be one, as an upstream hub): a future copy of a rule cannot drift."""
    with Store.open(tmp_path / "served") as store, Store.open(tmp_path / "other") as other:
        art = store.put_artifact("patch", "--- a/x\n+++ b/x\n+ü\n", "alice")
        other.append_event("note", "main", "lobby", "bob")
        store.apply_remote(other.list_ops(other.replica_id))
        append(store, 3, body="héllo ☃")
        append(store, 1, artifact_ids=[art["id"]])
        append(store, 600)
        requests = _requests(store, store.replica_id, art["id"])
        server = _from_server(store, requests)
        sim = [serve(store, path, params, logsync=True, max_page=LARGE_PAGE_CEILING)
               for path, params in requests]
        fake = _from_fake_peer(store, LOGSYNC_SERVER, requests)
        for request, mine, simulated, faked in zip(requests, server, sim, fake, strict=True):
            assert mine == simulated == faked, request
        assert {status for status, _ in server} == {200, 400, 404}
        upstream_sim = [serve(store, path, params, logsync=False, max_page=LARGE_PAGE_CEILING)
                        for path, params in requests]
        upstream_fake = _from_fake_peer(store, UPSTREAM_HUB, requests)
        assert upstream_sim == [tuple(a) for a in upstream_fake]
        assert "logsync" not in upstream_sim[0][1]


def test_a_server_never_advertises_a_budget_a_puller_cannot_take(store: Store) -> None:
    """RFC 004 §8.1: `max_page_bytes` is at most 32 MiB, half the 64 MiB a puller takes,
    and at least 1024, so an empty page with its envelope and chain fits it too."""
    from logsync.client import MAX_RESPONSE_BYTES
    from logsync.errors import ValidationError as Refused
    from logsync.responder import MAX_PAGE_BYTES_CEILING
    assert MAX_PAGE_BYTES_CEILING * 2 == MAX_RESPONSE_BYTES
    create_app(store, max_page_bytes=MAX_PAGE_BYTES_CEILING)
    for wrong in (MAX_PAGE_BYTES_CEILING + 1, 1023, 1):
        with pytest.raises(Refused, match=f"max_page_bytes={wrong} must be from 1024 "):
            create_app(store, max_page_bytes=wrong)


_texts = st.text(max_size=20)  # any code point, lone surrogates included
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | _texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_texts, inner, max_size=3),
    max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(_json_values)
def test_json_bytes_is_json_dumps_with_ensure_ascii_off(value: Any) -> None:
    """The shared encoder writes exactly what `json.dumps(value, ensure_ascii=False)` does
    (upstream's bytes), and fails where it fails."""
    import json

    def outcome(encode: Any) -> tuple[str, Any]:
        try:
            return "ok", encode()
        except (ValueError, TypeError) as exc:  # UnicodeEncodeError is a ValueError
            return "error", type(exc)

    assert outcome(lambda: json_bytes(value)) == \
        outcome(lambda: json.dumps(value, ensure_ascii=False).encode("utf-8"))
