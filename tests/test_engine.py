"""The sans-IO engine, its schedule and the per-peer state, against real stores.

A fake peer is a plain function from `Request` to the answer a peer would send,
serving from a real Store; faults are injected by wrapping it.
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logsync import engine, pageartifacts
from logsync.effects import STORE_EFFECTS, perform
from logsync.engine import (
    TRANSIENT_ORIGINS_TO_GIVE_UP,
    Batch,
    PullSchedule,
    Request,
    RoundReport,
    pull_round,
)
from logsync.errors import (
    ConfigError,
    PeerError,
    PeerProtocolError,
    PeerTooLargeError,
    PeerTransientError,
    ValidationError,
)
from logsync.fetchpolicy import FetchPolicy
from logsync.peerstate import PEER_STATE_FILENAME, PeerBook, PeerState, drift
from logsync.responder import EXTENSIONS, UPSTREAM_HUB, Profile, answer
from logsync.store import Store

UPSTREAM_OPS_KEYS = {"origin", "after", "limit"}


class FakePeer:
    """A peer serving one Store, upstream-shaped unless `advert` is given."""

    def __init__(self, store: Store, advert: dict | None = None) -> None:
        self.store = store
        self.advert = advert
        self.profile = UPSTREAM_HUB if advert is None else _profile_of(advert)
        self.log: list[Request] = []
        self.missing: set[str] = set()

    def __call__(self, request: Request) -> Any:
        """The answer `logsync.responder` gives (the advertisement as given, however
        malformed), or the error the client would raise for its status."""
        self.log.append(request)
        if request.path == "/sync/artifact" and request.params.get("id") in self.missing:
            return None
        status, body = answer(self.store, request.path, request.params, profile=self.profile)
        if status == 404 and request.missing_ok:
            return None
        error = FetchPolicy().error_for_status(status, str(body.get("error", "")),
                                               f"peer peer-a: GET {request.path}", "peer-a")
        if error is not None:
            raise error
        if request.path == "/sync/version_vector" and self.advert is not None:
            body["logsync"] = self.advert
        return body

    def ops_requests(self) -> list[Request]:
        return [r for r in self.log if r.path == "/sync/ops"]

    def artifact_requests(self) -> list[Request]:
        return [r for r in self.log if r.path == "/sync/artifact"]


def _profile_of(advert: dict) -> Profile:
    """The responder profile behind an advertisement (numbers it cannot use: defaults)."""
    names = advert.get("extensions")
    known = tuple(n for n in names if n in EXTENSIONS) if isinstance(names, list) else ()
    page, budget = advert.get("max_page"), advert.get("max_page_bytes")
    return Profile(extensions=known,
                   max_page=page if isinstance(page, int) and page >= 1 else 5000,
                   max_page_bytes=budget if isinstance(budget, int) and budget >= 1 else 2**40)


def logsync_peer(store: Store) -> FakePeer:
    """A logsync peer with every extension (chains, tips, keys, signatures)."""
    peer = FakePeer(store)
    peer.profile = Profile()
    return peer


def open_store(root: Path, name: str) -> Store:
    return Store.open(root / name)


def append(store: Store, count: int, **fields: Any) -> list[dict]:
    return [store.append_event("task.ask", "s", "r", "alice", body=f"op {i}", **fields)
            for i in range(count)]


def comparable(store: Store) -> dict[str, dict]:
    """Every event by id, without the local `seq`."""
    return {e["id"]: {k: v for k, v in e.items() if k != "seq"} for e in store.iter_events()}


def pull(store: Store, peer: Callable[[Request], Any], **options: Any) -> RoundReport:
    return drive(pull_round(store.replica_id, "peer-a", **options), peer, store)


def drive(round_gen: Any, perform_request: Callable[[Request], Any], store: Any) -> Any:
    """The simplest driver of a round: synchronous requests, store effects on `store`
    (`effects.perform`); what either raises is thrown into the round."""
    try:
        step = next(round_gen)
        while True:
            try:
                if isinstance(step, STORE_EFFECTS):
                    answer: Any = perform(store, step)
                elif isinstance(step, Batch):
                    answer = [_outcome(perform_request, r) for r in step.requests]
                else:
                    answer = perform_request(step)
            except Exception as exc:  # noqa: BLE001 - the round decides what it means
                step = round_gen.throw(exc)
                continue
            step = round_gen.send(answer)
    except StopIteration as stop:
        return stop.value


def _outcome(perform_request: Callable[[Request], Any], request: Request) -> Any:
    try:
        return perform_request(request)
    except PeerError as exc:
        return exc


def batches_seen(gen: Any, seen: list) -> Any:
    """The round, with every network step it yields (Request or Batch) noted in `seen`."""
    answer: Any = None
    try:
        step = next(gen)
        while True:
            if isinstance(step, Request | Batch):
                seen.append(step)
            try:
                answer = yield step
            except Exception as exc:  # noqa: BLE001 - passed on to the round
                step = gen.throw(exc)
                continue
            step = gen.send(answer)
    except StopIteration as stop:
        return stop.value


def origin_failure(report: RoundReport, origin: str, pattern: str) -> str:
    """Rule 6: the origin failed alone, with a reason matching `pattern`; the round ended."""
    progress = report.origins[origin]
    assert progress.failed and progress.error_kind == "protocol", progress
    assert re.search(pattern, progress.stop_reason), progress.stop_reason
    assert report.failed_origins() == {origin: progress.stop_reason}
    return progress.stop_reason


@pytest.fixture
def stores(tmp_path: Path):
    opened = {name: open_store(tmp_path, name) for name in ("a", "b", "c")}
    yield opened
    for store in opened.values():
        store.close()


# ── what a round pulls ──────────────────────────────────────────────


def test_pulls_exactly_the_missing_ranges(stores):
    a, b, c = stores["a"], stores["b"], stores["c"]
    append(a, 3)
    append(c, 4)
    assert pull(a, FakePeer(c)).applied == 4          # a now relays c's origin
    assert pull(b, FakePeer(a), page_limit=2).applied == 7
    append(a, 5)
    append(c, 2)
    pull(a, FakePeer(c))
    peer = FakePeer(a)
    report = pull(b, peer, page_limit=2)
    asked = [(r.params["origin"], r.params["after"]) for r in peer.ops_requests()]
    assert asked == sorted(asked)                   # one origin at a time, in order
    by_origin = {o: [after for origin, after in asked if origin == o] for o, _ in asked}
    # an upstream-shaped peer: each origin's first page overlaps our top by one op
    assert by_origin[a.replica_id] == [2, 4, 6]
    assert by_origin[c.replica_id] == [3, 5]
    assert report.origins[a.replica_id].applied == 5
    assert report.origins[c.replica_id].applied == 2
    assert comparable(b) == comparable(a)
    assert b.version_vector() == a.version_vector()


def test_never_pulls_its_own_origin(stores):
    a, b = stores["a"], stores["b"]
    append(b, 3)
    append(a, 2)
    pull(a, FakePeer(b))
    peer = FakePeer(a)
    report = pull(b, peer)
    assert b.replica_id in report.remote_vector
    assert all(r.params["origin"] != b.replica_id for r in peer.ops_requests())
    assert b.replica_id not in report.origins


def test_a_replica_restored_from_a_backup_recovers_its_own_ops_and_records_the_fork(
    tmp_path: Path,
):
    """b is restored from a copy taken after 2 ops; a already holds b's ops 1-5. The
    restored b writes one op (forking slot 3), then pulls: slots 4-5 come back as
    `restored_replica`, slot 3 is a recorded fork, and b's next op gets slot 6. Both
    pulls go between logsync peers: a recovered op must carry b's own signature."""
    a, b = open_store(tmp_path, "a"), open_store(tmp_path, "b")
    append(b, 2)
    b.close()
    backup = tmp_path / "backup"
    shutil.copytree(tmp_path / "b", backup)
    b = open_store(tmp_path, "b")
    append(b, 3)
    pull(a, logsync_peer(b))
    b.close()
    shutil.rmtree(tmp_path / "b")
    shutil.copytree(backup, tmp_path / "b")
    b = open_store(tmp_path, "b")
    assert b.version_vector()[b.replica_id] == 2
    (fork,) = append(b, 1)
    report = pull(b, logsync_peer(a))
    kinds = sorted((c["kind"], c["origin_seq"]) for c in b.list_conflicts())
    assert kinds == [("fork", 3), ("restored_replica", 4), ("restored_replica", 5)]
    assert report.origins[b.replica_id].applied == 2
    assert b.get_event(fork["id"]) is not None  # the local copy is never overwritten
    assert append(b, 1)[0]["origin_seq"] == 6
    a.close()
    b.close()


def test_second_round_pulls_nothing(stores):
    a, b = stores["a"], stores["b"]
    art = a.put_artifact("patch", "--- a\n+++ b\n", "alice")
    append(a, 4, artifact_ids=[art["id"]])
    first = pull(b, FakePeer(a))
    assert (first.applied, first.artifacts) == (4, 1)
    peer = FakePeer(a)
    second = pull(b, peer)
    assert second.applied == 0 and second.origins == {}
    assert [r.path for r in peer.log] == ["/sync/version_vector"]
    assert second.as_upstream_stats("http://a")["per_origin"] == {}


# ── termination against lying or broken peers ───────────────────────


def test_lying_vector_ends_with_a_short_page(stores):
    a, b = stores["a"], stores["b"]
    append(a, 5)
    honest = FakePeer(a)

    def liar(request: Request) -> Any:
        answer = honest(request)
        if request.path == "/sync/version_vector":
            answer["version_vector"] = {a.replica_id: 10**12}
        return answer

    report = pull(b, liar, page_limit=2)
    progress = report.origins[a.replica_id]
    assert progress.applied == 5
    assert progress.stop_reason == engine.STOP_SHORT
    assert len(honest.ops_requests()) == 3
    assert len(honest.ops_requests()) <= math.ceil((5 - 0) / 2) + 1  # rule 5's bound


def test_vector_promising_an_origin_it_never_serves_stops_after_one_page(stores):
    a, b, c = stores["a"], stores["b"], stores["c"]
    append(a, 2)
    honest = FakePeer(a)

    def liar(request: Request) -> Any:
        answer = honest(request)
        if request.path == "/sync/version_vector":
            answer["version_vector"][c.replica_id] = 50
        return answer

    report = pull(b, liar)
    assert report.origins[c.replica_id].stop_reason == engine.STOP_EMPTY
    assert report.origins[a.replica_id].applied == 2
    assert sum(r.params["origin"] == c.replica_id for r in honest.ops_requests()) == 1


def test_page_that_does_not_advance_is_rejected_and_loop_ends(stores):
    a, b = stores["a"], stores["b"]
    append(a, 6)
    honest = FakePeer(a)

    def stuck(request: Request) -> Any:
        if request.path == "/sync/ops":
            request = Request(request.path, {**request.params, "after": 0})
        return honest(request)

    origin_failure(pull(b, stuck, page_limit=2), a.replica_id, "peer-a.*origin_seq=1.*above 2")
    assert b.version_vector() == {a.replica_id: 2}


def mutate_page(store: Store, change: Callable[[list[dict]], None]) -> Callable[[Request], Any]:
    honest = FakePeer(store)

    def peer(request: Request) -> Any:
        answer = honest(request)
        if request.path == "/sync/ops":
            change(answer["events"])
        return answer

    return peer


def test_op_of_another_origin_rejects_the_whole_page(stores):
    a, b, c = stores["a"], stores["b"], stores["c"]
    append(a, 4)

    def forge(events: list[dict]) -> None:
        events[2]["origin_replica"] = c.replica_id

    reason = origin_failure(pull(b, mutate_page(a, forge)), a.replica_id,
                            "peer peer-a: .*events\\[2\\] of origin")
    assert "nothing of it was stored" in reason
    assert b.counts()["events"] == 0


@pytest.mark.parametrize(
    "change",
    [
        lambda ev: ev.reverse(),
        lambda ev: ev.__setitem__(1, dict(ev[1], origin_seq=ev[0]["origin_seq"])),
        lambda ev: ev.__setitem__(0, dict(ev[0], origin_seq="1")),
        lambda ev: ev.__setitem__(0, dict(ev[0], origin_seq=True)),
        lambda ev: ev.__setitem__(0, "not an event"),
    ],
    ids=["reversed", "repeated", "string-seq", "bool-seq", "not-an-object"],
)
def test_bad_sequence_rejects_the_page_with_nothing_stored(stores, change):
    a, b = stores["a"], stores["b"]
    append(a, 3)
    origin_failure(pull(b, mutate_page(a, change)), a.replica_id, "nothing of it was stored")
    assert b.counts()["events"] == 0


def test_page_longer_than_asked_is_rejected(stores):
    a, b = stores["a"], stores["b"]
    append(a, 5)
    honest = FakePeer(a)

    def generous(request: Request) -> Any:
        if request.path == "/sync/ops":
            request = Request(request.path, {**request.params, "limit": 500})
        return honest(request)

    origin_failure(pull(b, generous, page_limit=2), a.replica_id, "holds 5 ops but at most 2")
    assert b.counts()["events"] == 0


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (["not", "a", "dict"], "answered list, not an object"),
        ({"replica_id": "bob", "version_vector": {}}, "replica_id='bob'"),
        ({"replica_id": "rep_" + "a" * 32}, "version_vector=None"),
    ],
)
def test_malformed_vector_answer_names_peer_and_problem(stores, answer, problem):
    with pytest.raises(PeerProtocolError, match="peer-a") as caught:
        pull(stores["b"], lambda request: answer)
    assert problem in str(caught.value)


@pytest.mark.parametrize("entry", [-1, "7", False, 1.5, None, 2**62 + 1, 2**63, 2**64 - 1])
def test_a_bad_vector_entry_skips_its_origin_not_the_round(stores, entry):
    """Finding 1/8: one origin's entry (2**64-1 overflowed SQL) no longer fails the round."""
    a, b = stores["a"], stores["b"]
    append(a, 2)
    honest = FakePeer(a)
    bad = "rep_" + "b" * 32

    def odd(request: Request) -> Any:
        answer = honest(request)
        if request.path == "/sync/version_vector":
            answer["version_vector"][bad] = entry
        return answer

    report = pull(b, odd)
    assert report.applied == 2 and "0..2**62" in report.skipped_origins[bad]
    assert all(r.params["origin"] != bad for r in honest.ops_requests())


def test_origin_that_is_not_a_replica_id_is_skipped_not_fatal(stores):
    a, b = stores["a"], stores["b"]
    append(a, 2)
    honest = FakePeer(a)

    def odd(request: Request) -> Any:
        answer = honest(request)
        if request.path == "/sync/version_vector":
            answer["version_vector"]["legacy-origin"] = 3
        return answer

    report = pull(b, odd)
    assert report.applied == 2
    assert "legacy-origin" in report.skipped_origins
    assert all(r.params["origin"] != "legacy-origin" for r in honest.ops_requests())


def test_store_refusing_a_page_becomes_a_protocol_error_naming_the_peer(stores):
    a, b = stores["a"], stores["b"]
    append(a, 1)

    class Refusing:
        replica_id = b.replica_id

        def version_vector(self):
            return {}

        def own_seen_top(self):
            return 0

        def missing_artifacts(self, ids):
            return list(ids)

        def apply_remote(self, events, artifacts):
            raise ValidationError("events[0].body is 300000 bytes: the maximum is 262144")

    refusing = Refusing()
    report = drive(pull_round(refusing.replica_id, "peer-a"), FakePeer(a), refusing)
    origin_failure(report, a.replica_id, "peer-a: page for origin .* refused by the store")


# ── artifacts ───────────────────────────────────────────────────────


class RecordingStore:
    """A real store that logs apply_remote calls into a shared timeline."""

    def __init__(self, store: Store, timeline: list) -> None:
        self.store = store
        self.timeline = timeline
        self.replica_id = store.replica_id

    def version_vector(self):
        return self.store.version_vector()

    def own_seen_top(self):
        return self.store.own_seen_top()

    def missing_artifacts(self, ids):
        return self.store.missing_artifacts(ids)

    def apply_remote(self, events, artifacts):
        self.timeline.append(("apply", [e["id"] for e in events], [x["id"] for x in artifacts]))
        return self.store.apply_remote(events, artifacts)


def test_artifacts_are_fetched_before_the_page_that_names_them_is_applied(stores):
    a, b = stores["a"], stores["b"]
    first = a.put_artifact("patch", "diff one\n", "alice")
    second = a.put_artifact("note", "two", "alice")
    append(a, 1)
    event = a.append_event("patch.ready", "s", "r", "alice",
                           artifact_ids=[first["id"], second["id"]])
    timeline: list = []
    peer = FakePeer(a)

    def logged(request: Request) -> Any:
        timeline.append((request.path, dict(request.params)))
        return peer(request)

    report = drive(pull_round(b.replica_id, "peer-a"), logged, RecordingStore(b, timeline))
    fetches = [i for i, step in enumerate(timeline) if step[0] == "/sync/artifact"]
    applies = [i for i, step in enumerate(timeline) if step[0] == "apply"]
    assert len(fetches) == 2 and len(applies) == 1
    assert max(fetches) < applies[0]
    assert sorted(timeline[applies[0]][2]) == sorted([first["id"], second["id"]])
    assert report.artifacts == 2
    assert b.get_event(event["id"])["artifact_ids"] == sorted([first["id"], second["id"]])
    assert b.get_artifact(first["id"])["content"] == "diff one\n"


def test_artifacts_already_held_are_not_fetched(stores):
    a, b = stores["a"], stores["b"]
    art = a.put_artifact("note", "shared", "alice")
    append(a, 1, artifact_ids=[art["id"]])
    pull(b, FakePeer(a))
    append(a, 2, artifact_ids=[art["id"]])
    peer = FakePeer(a)
    assert pull(b, peer).applied == 2
    assert peer.artifact_requests() == []


def test_batched_artifact_fetches_are_one_batch_step(stores):
    a, b = stores["a"], stores["b"]
    ids = [a.put_artifact("note", f"n{i}", "alice")["id"] for i in range(3)]
    append(a, 1, artifact_ids=ids)
    peer = FakePeer(a)
    steps: list = []

    def perform(request: Request) -> Any:
        steps.append(request)
        return peer(request)

    report = drive(batches_seen(pull_round(b.replica_id, "peer-a", batch_artifacts=True),
                                steps), perform, b)
    batches = [s for s in steps if isinstance(s, Batch)]
    assert len(batches) == 1 and len(batches[0].requests) == 3
    assert report.artifacts == 3 and report.requests == 5


def test_missing_artifact_quarantines_its_origin_and_other_origins_go_on(stores):
    a, b, c = stores["a"], stores["b"], stores["c"]
    append(c, 3)
    pull(a, FakePeer(c))
    art = a.put_artifact("note", "lost", "alice")
    append(a, 1)
    append(a, 1, artifact_ids=[art["id"]])
    append(a, 1)
    peer = FakePeer(a)
    peer.missing.add(art["id"])
    report = pull(b, peer)
    stuck = report.origins[a.replica_id]
    assert (stuck.applied, stuck.quarantined, stuck.artifacts_missing) == (1, 1, 1)
    assert stuck.stop_reason.startswith(engine.STOP_STORE)
    assert a.replica_id in report.stopped_origins()
    assert report.origins[c.replica_id].applied == 3
    assert b.version_vector() == {a.replica_id: 1, c.replica_id: 3}
    assert b.counts()["quarantined"] == 1


def test_malformed_artifact_answer_is_a_protocol_error(stores):
    a, b = stores["a"], stores["b"]
    art = a.put_artifact("note", "x", "alice")
    append(a, 1, artifact_ids=[art["id"]])
    honest = FakePeer(a)

    def wrong(request: Request) -> Any:
        if request.path == "/sync/artifact":
            return {"artifact": {"id": "art_someone_else"}}
        return honest(request)

    origin_failure(pull(b, wrong), a.replica_id, "expected {'artifact'")
    assert b.counts() == {"events": 0, "artifacts": 0, "conflicts": 0, "quarantined": 0}


# ── extensions ──────────────────────────────────────────────────────

ADVERT = {"version": "0.1.0", "extensions": ["msgpack", "large_pages", "inline_artifacts"],
          "max_page": 2000}


def test_inline_artifacts_used_when_advertised(stores):
    a, b = stores["a"], stores["b"]
    ids = [a.put_artifact("note", f"n{i}", "alice")["id"] for i in range(3)]
    append(a, 2, artifact_ids=ids)
    peer = FakePeer(a, advert=ADVERT)
    report = pull(b, peer)
    assert peer.artifact_requests() == []
    ops = peer.ops_requests()[0]
    assert ops.params["ext"] == "large_pages,inline_artifacts"
    assert ops.params["limit"] == 2000 and ops.accept_msgpack
    assert (report.applied, report.artifacts) == (2, 3)
    assert sorted(report.extensions) == ["inline_artifacts", "large_pages", "msgpack"]


def test_artifacts_left_out_of_an_inline_page_are_fetched_one_by_one(stores):
    a, b = stores["a"], stores["b"]
    ids = [a.put_artifact("note", f"n{i}", "alice")["id"] for i in range(3)]
    append(a, 1, artifact_ids=ids)
    honest = FakePeer(a, advert=ADVERT)

    def partial(request: Request) -> Any:
        answer = honest(request)
        if request.path == "/sync/ops":
            answer["artifacts"] = answer["artifacts"][:1]
        return answer

    report = pull(b, partial)
    assert len(honest.artifact_requests()) == 2
    assert report.artifacts == 3 and report.applied == 1


def test_mempalace_shaped_peer_gets_upstream_requests_only(stores):
    a, b = stores["a"], stores["b"]
    art = a.put_artifact("note", "n", "alice")
    append(a, 3, artifact_ids=[art["id"]])
    peer = FakePeer(a)
    report = pull(b, peer, page_limit=5000)
    for request in peer.log:
        assert not request.accept_msgpack
    for request in peer.ops_requests():
        assert set(request.params) == UPSTREAM_OPS_KEYS
        assert request.params["limit"] == 500
    assert len(peer.artifact_requests()) == 1
    assert report.extensions == [] and report.applied == 3


def test_unasked_inline_artifacts_are_ignored(stores):
    a, b = stores["a"], stores["b"]
    art = a.put_artifact("note", "n", "alice")
    append(a, 1, artifact_ids=[art["id"]])
    honest = FakePeer(a)

    def volunteering(request: Request) -> Any:
        answer = honest(request)
        if request.path == "/sync/ops":
            answer["artifacts"] = "something else entirely"
        return answer

    assert pull(b, volunteering).artifacts == 1
    assert len(honest.artifact_requests()) == 1


def test_tampered_artifact_is_quarantined_and_its_op_never_visible(stores):
    a, b = stores["a"], stores["b"]
    art = a.put_artifact("patch", "--- a\n+++ b\n", "alice")
    event = append(a, 1, artifact_ids=[art["id"]])[0]
    honest = FakePeer(a)

    def tampering(request: Request) -> Any:
        answer = honest(request)
        if request.path == "/sync/artifact":
            answer["artifact"]["content"] = "--- a\n+++ b\n+rm -rf /\n"
        return answer

    report = pull(b, tampering)
    assert report.applied == 0 and report.quarantined == 2
    assert report.stopped_origins() == {a.replica_id: report.origins[a.replica_id].stop_reason}
    assert b.get_event(event["id"]) is None and b.get_artifact(art["id"]) is None


def test_extensions_can_be_declined_and_malformed_adverts_ignored(stores):
    a, b = stores["a"], stores["b"]
    append(a, 1)
    peer = FakePeer(a, advert=ADVERT)
    pull(b, peer, use_extensions=False)
    assert "ext" not in peer.ops_requests()[0].params
    assert engine.parse_extensions({"logsync": "yes"}) == engine.Extensions()
    assert engine.parse_extensions(
        {"logsync": {"extensions": ["large_pages"], "max_page": 10**9}}
    ).max_page_limit == engine.LARGE_PAGE_CEILING
    assert engine.parse_extensions(
        {"logsync": {"extensions": ["large_pages"], "max_page": "many"}}
    ).max_page_limit == engine.UPSTREAM_PAGE_LIMIT


def test_page_limit_must_be_positive(stores):
    a, b = stores["a"], stores["b"]
    append(a, 1)
    with pytest.raises(ValidationError, match="page_limit=0"):
        pull(b, FakePeer(a), page_limit=0)


def test_errors_thrown_in_stop_their_origin_and_keep_partial_progress(stores):
    a, b, c = stores["a"], stores["b"], stores["c"]
    append(c, 2)
    pull(a, FakePeer(c))
    append(a, 2)
    honest = FakePeer(a)
    first_origin, second = sorted([a.replica_id, c.replica_id])

    def flaky(request: Request) -> Any:
        if request.path == "/sync/ops" and request.params["origin"] != first_origin:
            raise PeerTransientError("peer-a: GET /sync/ops timed out", peer="peer-a")
        return honest(request)

    report = RoundReport(peer="peer-a")
    drive(pull_round(b.replica_id, "peer-a", report=report), flaky, b)
    assert report.applied == 2 and b.version_vector() == {first_origin: 2}
    assert report.origins[second].error_kind == "transport"
    assert pull(b, FakePeer(a)).applied == 2


@pytest.mark.parametrize("batch", [False, True])
def test_a_failing_origin_that_sorts_first_does_not_stop_the_others(stores, batch):
    """Finding 8: a bad origin first in order used to fail the whole round."""
    a, b, c = stores["a"], stores["b"], stores["c"]
    append(c, 3)
    pull(a, FakePeer(c))
    append(a, 3)
    honest = FakePeer(a)
    first_origin, second = sorted([a.replica_id, c.replica_id])

    def broken_first(request: Request) -> Any:
        if request.path == "/sync/ops" and request.params["origin"] == first_origin:
            raise PeerTransientError("peer-a: GET /sync/ops answered 500", peer="peer-a")
        return honest(request)

    report = drive(pull_round(b.replica_id, "peer-a", batch_artifacts=batch), broken_first, b)
    assert report.origins[second].applied == 3
    assert report.origins[first_origin].error_kind == "transport"
    assert b.version_vector() == {second: 3}
    # A batch answer carries each request's own outcome: the good origin's first page,
    # fetched side by side with the failing one, is used, not asked for again.
    asked = [r.params["origin"] for r in honest.log if r.path == "/sync/ops"]
    assert asked.count(second) == 1


def test_transient_failures_in_a_row_end_the_round(stores):
    """A peer that went away mid-round: after a few origins, stop asking."""
    a, b = stores["a"], stores["b"]
    origins = [f"rep_{n:032x}" for n in range(1, 6)]

    def gone(request: Request) -> Any:
        if request.path == "/sync/version_vector":
            return {"replica_id": a.replica_id, "version_vector": dict.fromkeys(origins, 3)}
        raise PeerTransientError("peer-a: connection refused", peer="peer-a")

    report = RoundReport(peer="peer-a")
    with pytest.raises(PeerTransientError):
        drive(pull_round(b.replica_id, "peer-a", report=report), gone, b)
    assert sum(p.failed for p in report.origins.values()) == TRANSIENT_ORIGINS_TO_GIVE_UP


def test_an_answer_too_large_halves_the_page_until_it_passes(stores):
    """Finding 7: a page past the client's byte cap was refused forever."""
    a, b = stores["a"], stores["b"]
    append(a, 9)
    honest = FakePeer(a)
    asked: list[int] = []

    def capped(request: Request) -> Any:
        if request.path == "/sync/ops":
            asked.append(request.params["limit"])
            if request.params["limit"] > 2:
                raise PeerTooLargeError("peer-a: answer larger than the cap", peer="peer-a")
        return honest(request)

    report = pull(b, capped, page_limit=8)
    assert report.applied == 9 and not report.failed_origins()
    assert asked[:3] == [8, 4, 2] and set(asked[3:]) == {2}


def test_an_answer_too_large_even_for_one_op_fails_only_its_origin(stores):
    a, b = stores["a"], stores["b"]
    append(a, 2)

    def never(request: Request) -> Any:
        if request.path == "/sync/ops":
            raise PeerTooLargeError("peer-a: answer larger than the cap", peer="peer-a")
        return FakePeer(a)(request)

    report = pull(b, never, page_limit=4)
    assert report.origins[a.replica_id].failed and b.counts()["events"] == 0


def test_a_round_applies_at_most_its_op_budget(stores, monkeypatch):
    """Finding 9: a peer serving valid pages forever held the round open."""
    a, b = stores["a"], stores["b"]
    append(a, 7)
    report = RoundReport(peer="peer-a", ops_budget=5)
    drive(pull_round(b.replica_id, "peer-a", page_limit=2, report=report), FakePeer(a), b)
    assert report.applied == 5 and report.capped
    assert b.version_vector() == {a.replica_id: 5}
    assert pull(b, FakePeer(a)).applied == 2


def test_report_as_upstream_stats_has_the_upstream_shape(stores):
    a, b = stores["a"], stores["b"]
    append(a, 2)
    report = pull(b, FakePeer(a))
    stats = report.as_upstream_stats("http://127.0.0.1:1")
    assert list(stats) == ["peer_url", "peer_replica", "pulled_events", "pulled_artifacts",
                           "per_origin", "remote_version_vector", "remote_profile",
                           "remote_profiles"]
    assert stats["per_origin"] == {a.replica_id: 2}
    assert stats["peer_replica"] == a.replica_id
    full = report.as_dict()
    json.dumps(full)
    assert full["totals"]["applied"] == 2 and full["requests"] == 2


# ── convergence property ────────────────────────────────────────────

NODES = ("n0", "n1", "n2")
action = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(NODES), st.integers(1, 4)),
    st.tuples(st.just("pull"), st.sampled_from(NODES), st.sampled_from(NODES),
              st.integers(1, 5), st.integers(0, 6)),
)


def interrupted(peer: FakePeer, fail_at: int) -> Callable[[Request], Any]:
    """The peer, but the `fail_at`-th request of the round (0 = never) times out."""
    count = [0]

    def perform(request: Request) -> Any:
        count[0] += 1
        if count[0] == fail_at:
            raise PeerTransientError("timed out", peer="x")
        return peer(request)

    return perform


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(action, max_size=18), st.booleans())
def test_replicas_pulling_from_each_other_in_any_interleaving_converge(actions, extensions):
    with tempfile.TemporaryDirectory() as tmp:
        nodes = {name: open_store(Path(tmp), name) for name in NODES}
        try:
            advert = ADVERT if extensions else None
            for step in actions:
                if step[0] == "append":
                    art = nodes[step[1]].put_artifact("note", f"{step}", "agent")
                    append(nodes[step[1]], step[2], artifact_ids=[art["id"]])
                elif step[1] != step[2]:
                    peer = interrupted(FakePeer(nodes[step[2]], advert), step[4])
                    try:
                        store = nodes[step[1]]
                        drive(pull_round(store.replica_id, step[2], page_limit=step[3]), peer,
                              store)
                    except PeerTransientError:
                        pass
            for puller in NODES:
                for source in NODES:
                    if puller != source:
                        drive(pull_round(nodes[puller].replica_id, source),
                              FakePeer(nodes[source], advert), nodes[puller])
            views = [comparable(nodes[n]) for n in NODES]
            vectors = [nodes[n].version_vector() for n in NODES]
            artifacts = [list(nodes[n].iter_artifacts()) for n in NODES]
            assert views[0] == views[1] == views[2]
            assert vectors[0] == vectors[1] == vectors[2]
            assert artifacts[0] == artifacts[1] == artifacts[2]
            assert all(nodes[n].counts()["conflicts"] == 0 for n in NODES)
        finally:
            for store in nodes.values():
                store.close()


# ── the pull schedule ───────────────────────────────────────────────


def schedule(**options: Any) -> PullSchedule:
    return PullSchedule(random.Random(7), **options)


def test_first_round_is_due_at_start():
    plan = schedule(interval=15)
    assert plan.wait_time(100.0) is None
    assert plan.start(100.0) == 100.0 and plan.is_due(100.0)


def test_success_schedules_the_next_round_within_the_jitter():
    plan = schedule(interval=10, jitter=0.2)
    plan.start(0)
    dues = []
    for now in range(0, 200, 20):
        plan.begin(now)
        assert not plan.is_due(now + 1000)
        dues.append(plan.succeeded(now) - now)
    assert all(8 <= d <= 12 for d in dues) and len(set(dues)) > 1


def test_failures_back_off_exponentially_up_to_the_cap():
    plan = schedule(backoff_base=1, backoff_cap=8)
    plan.start(0)
    delays = []
    for _ in range(7):
        plan.begin(0)
        delays.append(plan.failed(0))
    bounds = [1, 2, 4, 8, 8, 8, 8]
    assert all(b / 2 <= d <= b for d, b in zip(delays, bounds, strict=True))
    plan.begin(0)
    assert plan.succeeded(0) >= 15 * 0.9 and plan.failures == 0


def test_retry_after_is_honoured_even_by_notifications():
    plan = schedule(backoff_base=1, debounce=0.05)
    plan.start(0)
    plan.begin(0)
    assert plan.failed(0, retry_after=30) == 30
    assert plan.notified(5) == 30


def test_notifications_pull_soon_and_bursts_collapse():
    plan = schedule(interval=15, debounce=0.5)
    plan.start(0)
    plan.begin(0)
    plan.succeeded(0)
    assert plan.notified(3.0) == 3.5
    assert plan.notified(3.2) == 3.5
    assert plan.is_due(3.5) and not plan.is_due(3.4)


def test_notification_during_a_round_triggers_another_right_after():
    plan = schedule(interval=15, debounce=0.25)
    plan.start(0)
    plan.begin(0)
    assert plan.notified(1) is None
    assert plan.succeeded(2) == 2.25


def test_schedule_settings_are_checked():
    with pytest.raises(ValidationError, match="interval=-1"):
        schedule(interval=-1)
    with pytest.raises(ValidationError, match="jitter=1.5"):
        schedule(jitter=1.5)


# ── per-peer state ──────────────────────────────────────────────────


def test_drift_is_what_the_peer_holds_beyond_us():
    assert drift({"r1": 10, "r2": 3, "r3": 4}, {"r1": 4, "r2": 5}) == {"r1": 6, "r3": 4}


def test_peer_state_transitions_and_upstream_entry(stores):
    a, b = stores["a"], stores["b"]
    append(a, 3)
    state = PeerState(name="laptop", url="http://127.0.0.1:9")
    state.record_attempt(1000.0)
    state.record_failure(PeerTransientError("peer laptop: GET /sync/version_vector timed out"),
                         1000.0)
    assert (state.reachable, state.last_error_kind, state.consecutive_failures) == (
        False, "transport", 1)
    report = pull(b, FakePeer(a))
    state.record_success(report, 1_700_000_000.0)
    entry = state.as_upstream_peer_entry()
    assert list(entry)[:11] == ["name", "url", "replica_id", "reachable", "last_error",
                                "last_error_at", "last_success_at", "last_pulled_events",
                                "last_pulled_artifacts", "remote_version_vector", "profile"]
    assert entry["reachable"] is True and entry["last_error"] is None
    assert entry["last_success_at"] == "2023-11-14T22:13:20Z"
    assert entry["last_error_at"] == "1970-01-01T00:16:40Z"
    assert entry["replica_id"] == a.replica_id and entry["last_pulled_events"] == 3
    assert entry["drift"] == {} and entry["consecutive_failures"] == 0
    append(a, 2)
    assert state.as_upstream_peer_entry()["drift"] == {}
    behind = pull(b, FakePeer(a), page_limit=1, use_extensions=False)
    assert behind.applied == 2
    stale = {a.replica_id: 3}
    state.remote_version_vector = a.version_vector()
    assert state.as_upstream_peer_entry(stale)["drift"] == {a.replica_id: 2}
    assert state.as_upstream_peer_entry(stale)["drift_total"] == 2


def test_peer_book_round_trips_through_the_palace_atomically(tmp_path):
    book = PeerBook()
    state = book.get("laptop", "http://127.0.0.1:9")
    state.record_failure(PeerProtocolError("peer laptop: bad page"), 5.0)
    book.get("desk", "http://127.0.0.1:10").remote_version_vector = {"rep_" + "1" * 32: 4}
    path = book.save(tmp_path)
    assert path.name == PEER_STATE_FILENAME
    assert [p.name for p in tmp_path.iterdir()] == [PEER_STATE_FILENAME]
    again = PeerBook.load(tmp_path)
    assert again.to_json() == book.to_json()
    assert again.peers["laptop"].last_error == "peer laptop: bad page"
    again.retain({"desk"})
    assert list(again.peers) == ["desk"]
    assert PeerBook.load(tmp_path / "nowhere").peers == {}


def test_corrupt_peer_state_is_one_clear_error(tmp_path):
    (tmp_path / PEER_STATE_FILENAME).write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        PeerBook.load(tmp_path)
    (tmp_path / PEER_STATE_FILENAME).write_text('{"peers": {"x": {"url": 1}}}')
    with pytest.raises(ConfigError, match="not an object with a name"):
        PeerBook.load(tmp_path)


# ── targeted rounds (after change notifications) ──────────────────────


def test_choose_targets_falls_back_to_a_full_round_until_the_peer_is_known():
    notified = {"rep_" + "a" * 32: 5}
    assert engine.choose_targets(notified, {}, "rep_" + "f" * 32, {}, extensions_known=False,
                                 since_full=1.0, interval=15.0) is None
    assert engine.choose_targets(notified, {}, "rep_" + "f" * 32, {}, extensions_known=True,
                                 since_full=30.0, interval=15.0) is None


def test_a_round_without_notifications_is_always_full_anti_entropy():
    """The timer's round must fetch the vector, however recent the last full round."""
    assert engine.choose_targets({}, {}, "rep_" + "f" * 32, {}, extensions_known=True,
                                 since_full=0.5, interval=15.0) is None


def test_choose_targets_keeps_only_origins_we_lack_and_nobody_is_pulling():
    a, b, c, own = ("rep_" + x * 32 for x in "abcf")
    notified = {a: 5, b: 3, c: 9, own: 7}
    chosen = engine.choose_targets(notified, {a: 5, b: 1}, own, {c: 9}, extensions_known=True,
                                   since_full=1.0, interval=15.0)
    assert chosen == {b: 3}
    assert engine.choose_targets({c: 10}, {}, own, {c: 9}, extensions_known=True,
                                 since_full=1.0, interval=15.0) == {c: 10}


def test_targeted_origin_pulls_one_origin_without_the_vector(stores):
    a, b, c = stores["a"], stores["b"], stores["c"]
    append(a, 3)
    append(c, 2)
    pull(b, FakePeer(c))
    peer = FakePeer(a)
    report = RoundReport(peer="a")
    gen = engine.targeted_origin("a", a.replica_id, 3, engine.Extensions(), report)
    progress = drive(gen, peer, b)
    assert [r.path for r in peer.log] == ["/sync/ops"]
    assert (progress.applied, progress.reached, progress.stop_reason) == (3, 3, "caught up")
    assert b.version_vector()[a.replica_id] == 3
    again = FakePeer(a)
    done = drive(engine.targeted_origin("a", a.replica_id, 3, engine.Extensions(),
                                        RoundReport(peer="a")), again, b)
    assert done.stop_reason == "caught up" and again.log == []


def test_a_targeted_round_keeps_the_peers_last_vector_and_raises_what_it_reached():
    a, b = "rep_" + "a" * 32, "rep_" + "b" * 32
    state = PeerState(name="p", url="http://p")
    full = RoundReport(peer="p", peer_replica=a, remote_vector={a: 5, b: 3},
                       extensions=["msgpack"], local_vector_after={a: 5, b: 3})
    state.record_success(full, 100.0)
    targeted = RoundReport(peer="p", local_vector_after={a: 8, b: 3})
    targeted.origins[a] = engine.OriginProgress(origin=a, start=5, target=8, reached=8,
                                                applied=3)
    state.record_targeted(targeted, 101.0)
    assert state.remote_version_vector == {a: 8, b: 3}
    assert state.extensions == ["msgpack"] and state.replica_id == a
    assert state.last_pulled_events == 3 and state.total_pulled_events == 3
    assert state.drift == {} and state.last_success_at == 101.0


def test_a_full_round_fetches_first_pages_of_several_origins_side_by_side(stores, tmp_path):
    """With a driver that takes Batch steps, the first pages of up to FIRST_PAGES_AT_ONCE
    origins go out together right after the vector; the store still applies one page
    (one transaction) at a time and ends identical."""
    a, b = stores["a"], stores["b"]
    others = [open_store(tmp_path, f"o{i}") for i in range(5)]
    for i, other in enumerate(others):
        append(other, i + 1)
        a.apply_remote(other.list_ops(other.replica_id))
        other.close()
    steps: list[Any] = []
    peer = FakePeer(a)

    def perform(request: Request) -> Any:
        return peer(request)

    report = drive(batches_seen(pull_round(b.replica_id, "a", batch_artifacts=True), steps),
                   perform, b)
    batches = [s for s in steps if isinstance(s, Batch)]
    assert [len(s.requests) for s in batches] == [engine.FIRST_PAGES_AT_ONCE]  # then 1 alone
    assert all(r.path == "/sync/ops" for s in batches for r in s.requests)
    assert report.applied == 15 and b.version_vector() == a.version_vector()
    assert comparable(b) == comparable(a)


def test_a_forged_far_future_op_of_ours_is_compared_once_not_every_round(stores):
    """Finding 12: restore recovery re-pulled our whole origin from 0 on every round."""
    a, b = stores["a"], stores["b"]
    append(b, 3)
    pull(a, FakePeer(b))
    stamp = f"{int(time.time() * 1000) + 10**10:013d}-000000-{b.replica_id}"
    forged = {**b.list_ops(b.replica_id, 0, 1)[0], "id": "evt_forged", "origin_seq": 9,
              "hlc": stamp, "seq": 99}
    a._writer.execute(  # what a hostile peer holds under our origin
        "INSERT INTO events (id, type, stream, room, from_agent, body, created_at, "
        "metadata_json, origin_replica, origin_seq, hlc) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        (forged["id"], forged["type"], forged["stream"], forged["room"], forged["from_agent"],
         "", forged["created_at"], "{}", b.replica_id, 9, stamp))
    peer = FakePeer(a)
    first = pull(b, peer)
    assert first.conflicts == 1 and b.list_conflicts()[0]["kind"] == "forged_origin"
    asked_before = len(peer.ops_requests())
    second = pull(b, peer)
    again = peer.ops_requests()[asked_before:]
    # one small page overlapping our top by one (no chains here), never from 0
    assert [r.params["after"] for r in again] == [2]
    assert second.applied == 0 and second.origins[b.replica_id].start == 3
    assert b.append_event("task.note", "s", "r", "lead")["origin_seq"] == 10


def test_an_origin_takes_at_most_its_share_of_a_round(stores, monkeypatch):
    """Finding 9: an origin served endlessly must not starve the origins after it."""
    a, b, c = stores["a"], stores["b"], stores["c"]
    append(c, 2)
    pull(a, FakePeer(c))
    append(a, 7)
    monkeypatch.setattr(engine, "MAX_OPS_PER_ORIGIN", 3)
    report = pull(b, FakePeer(a), page_limit=2)
    assert report.origins[a.replica_id].applied == 3 and report.capped
    assert report.origins[c.replica_id].applied == 2


def test_a_failing_origin_backs_off_and_a_clean_round_clears_it(stores):
    """Rule 6: a failed origin is retried with backoff on later rounds, not every round."""
    a, b, c = stores["a"], stores["b"], stores["c"]
    append(c, 2)
    pull(a, FakePeer(c))
    append(a, 2)
    honest = FakePeer(a)
    broken = {c.replica_id}

    def flaky(request: Request) -> Any:
        if request.path == "/sync/ops" and request.params["origin"] in broken:
            raise PeerTransientError("peer-a: answered 500", peer="peer-a")
        return honest(request)

    backoff = engine.OriginBackoff(rng=random.Random(3), base=10.0, cap=40.0)
    delays = []
    for n in range(4):
        report = drive(pull_round(b.replica_id, "peer-a", held_back=backoff.held(100.0 * n)),
                       flaky, b)
        backoff.record(report, 100.0 * n)
        count, until = backoff.failures[c.replica_id]
        delays.append(until - 100.0 * n)
        assert count == n + 1 and c.replica_id in backoff.held(100.0 * n + 1)
    assert 5 <= delays[0] <= 10 and 20 <= delays[2] <= 40 and 20 <= delays[3] <= 40
    asked = len(honest.ops_requests())
    drive(pull_round(b.replica_id, "peer-a", held_back=backoff.held(400.0)), flaky, b)
    assert len(honest.ops_requests()) == asked  # held back: not even asked
    broken.clear()
    report = drive(pull_round(b.replica_id, "peer-a", held_back=backoff.held(1000.0)), flaky, b)
    backoff.record(report, 1000.0)
    assert report.origins[c.replica_id].applied == 2 and not backoff.failures


def test_a_page_cut_by_the_peers_byte_budget_is_followed_in_the_same_round(stores):
    """A peer that keeps a byte budget serves pages shorter than asked: that means "the
    rest next page", not "no more" (the round used to stop after one page per origin)."""
    a, b = stores["a"], stores["b"]
    append(a, 9)
    advert = {"version": "x", "extensions": ["large_pages"], "max_page": 5000,
              "max_page_bytes": 1000}
    honest = FakePeer(a, advert=advert)

    def budgeted(request: Request) -> Any:
        answer = honest(request)
        if request.path == "/sync/ops":
            answer["events"] = answer["events"][:2]  # what the budget let through
            answer["count"] = len(answer["events"])
        return answer

    report = pull(b, budgeted)
    assert report.applied == 9 and report.origins[a.replica_id].stop_reason == "caught up"
    unbudgeted = FakePeer(a, advert={**advert, "max_page_bytes": None})
    fresh = open_store(Path(tempfile.mkdtemp()), "fresh")
    try:
        def cut(request: Request) -> Any:
            answer = unbudgeted(request)
            if request.path == "/sync/ops":
                answer["events"] = answer["events"][:2]
            return answer

        short = pull(fresh, cut)
        assert short.applied == 2
        assert short.origins[a.replica_id].stop_reason == engine.STOP_SHORT
    finally:
        fresh.close()


def test_origin_backoff_stays_bounded_whatever_origins_a_peer_invents():
    class Failed:
        def __init__(self, origins):
            self.origins = dict.fromkeys(origins)

        def failed_origins(self):
            return dict.fromkeys(self.origins, "failed: x")

    backoff = engine.OriginBackoff(rng=random.Random(1), max_tracked=100)
    for n in range(20):
        backoff.record(Failed([f"rep_{n:08x}{i:024x}" for i in range(500)]), 10.0 * n)
        assert len(backoff.failures) <= 100
    backoff.record(Failed([]), 10_000.0)
    assert not backoff.failures  # lapsed


def test_failing_origins_that_end_a_round_are_held_back_next_round(stores):
    """Three transient failures in a row end a round; they must not end every round, or the
    origins sorted after them starve."""
    a, b = stores["a"], stores["b"]
    append(a, 2)
    good = a.replica_id
    bad = [f"rep_{n:032x}" for n in range(1, 4)]  # sort before `good`
    assert all(o < good for o in bad)
    honest = FakePeer(a)

    def peer(request: Request) -> Any:
        if request.path == "/sync/version_vector":
            answer = honest(request)
            answer["version_vector"].update(dict.fromkeys(bad, 5))
            return answer
        if request.params.get("origin") in bad:
            raise PeerTransientError("peer-a: GET /sync/ops answered 500", peer="peer-a")
        return honest(request)

    backoff = engine.OriginBackoff(rng=random.Random(1))
    report = RoundReport(peer="peer-a")
    with pytest.raises(PeerTransientError):
        drive(pull_round(b.replica_id, "peer-a", report=report), peer, b)
    backoff.record(report, 0.0)
    assert set(backoff.held(1.0)) == set(bad)
    again = drive(pull_round(b.replica_id, "peer-a", held_back=backoff.held(1.0)), peer, b)
    assert again.origins[good].applied == 2


def test_a_refused_far_slot_does_not_hide_ops_lost_in_a_restore(stores, tmp_path):
    """Review finding: a forged op of ours at 2**62, remembered from before a restore, made
    the restored palace never ask for its own lost ops (then re-use their slots)."""
    a, b = stores["a"], stores["b"]
    b.signing_key = None  # an unsigned origin: the restore rule alone, through a hub
    append(b, 3)
    pull(a, FakePeer(b))
    lost = append(b, 7)  # b writes 4..10, a gets them, then b is restored to 3
    pull(a, FakePeer(b))
    far = f"{int(time.time() * 1000) + 10**10:013d}-000000-{b.replica_id}"
    a._writer.execute(
        "INSERT INTO events (id, type, stream, room, from_agent, body, created_at, "
        "metadata_json, origin_replica, origin_seq, hlc) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        ("evt_far", "note", "s", "r", "x", "", lost[0]["created_at"], "{}", b.replica_id,
         2**62, far))
    pull(b, FakePeer(a))  # b refuses the far slot: it is now "seen"
    assert b.own_seen_top() == 2**62
    b._writer.execute("DELETE FROM events WHERE origin_replica = ? AND origin_seq > 3",
                      (b.replica_id,))  # the restore (the conflicts ledger came with it)
    report = pull(b, FakePeer(a))
    assert report.origins[b.replica_id].start == 3  # only above what we hold
    assert b.version_vector()[b.replica_id] == 10
    assert b.append_event("task.note", "s", "r", "lead")["origin_seq"] == 11


def test_a_stopped_origin_reports_how_far_the_store_took_it(stores, remote):
    """Kills the mutant "the engine ignores the high-water of a stopped origin": a page
    whose third op is bad leaves the origin at 2, and the report must say 2 (status and
    drift read it), not where the round started."""
    b = stores["b"]
    origin = remote.origin(5)
    page = [remote.op(origin, 1), remote.op(origin, 2), remote.op(origin, 3, type="Bad Type"),
            remote.op(origin, 4)]

    def peer(request: Request) -> Any:
        if request.path == "/sync/version_vector":
            return {"replica_id": "rep_" + "a" * 32, "version_vector": {origin: 4}}
        return {"origin": origin, "events": page, "count": len(page)}

    report = pull(b, peer)
    progress = report.origins[origin]
    assert progress.stop_reason.startswith(engine.STOP_STORE)
    assert progress.reached == 2 and b.version_vector() == {origin: 2}


def test_a_page_naming_too_many_artifacts_asks_for_fewer_ops_and_fetches_in_bounded_batches(
    stores: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review finding: a hostile page naming 256 fresh artifacts per op made the round build
    1.28 M requests on the event loop. Past MAX_ARTIFACTS_PER_PAGE the origin halves its
    page (rule 7), and artifact requests go out ARTIFACTS_PER_BATCH at a time."""
    a, b = stores["a"], stores["b"]
    monkeypatch.setattr(pageartifacts, "MAX_ARTIFACTS_PER_PAGE", 6)
    monkeypatch.setattr(pageartifacts, "ARTIFACTS_PER_BATCH", 2)
    for i in range(4):
        ids = [a.put_artifact("note", f"n{i}-{k}", "alice")["id"] for k in range(3)]
        append(a, 1, artifact_ids=ids)
    peer = FakePeer(a)
    steps: list = []
    report = drive(batches_seen(pull_round(b.replica_id, "peer-a", batch_artifacts=True),
                                steps), peer, b)
    limits = [r.params["limit"] for r in peer.ops_requests()]
    assert limits[0] > 2 and min(limits) <= 2  # 12 artifacts > 6: asked again for less
    batches = [s for s in steps if isinstance(s, Batch)]
    assert batches and max(len(s.requests) for s in batches) <= 2
    assert report.applied == 4 and report.artifacts == 12
    assert comparable(b) == comparable(a)


def test_a_vector_full_of_junk_names_a_bounded_few_and_counts_the_rest(stores):
    """A hostile vector of 5 000 junk entries: 100 named in the report (and so in the
    peer's saved state and `sync --json`), the rest one count; the good origin is pulled."""
    from logsync.wire import MAX_SKIPPED_LISTED, SKIPPED_MORE

    a, b = stores["a"], stores["b"]
    append(a, 2)
    honest = FakePeer(a)

    def odd(request: Request) -> Any:
        answer = honest(request)
        if request.path == "/sync/version_vector":
            answer["version_vector"].update({f"junk-{i:05}": 1 for i in range(5000)})
        return answer

    report = pull(b, odd)
    assert report.applied == 2
    assert len(report.skipped_origins) == MAX_SKIPPED_LISTED + 1
    assert report.skipped_origins[SKIPPED_MORE].startswith("4900 more entries")
    line = report.skipped_line()
    assert line is not None and "more than 100 origins" in line and "'junk-00000'" in line
    assert len(line) < 300
