"""Each guard of the fast path (`store/fastpage.py`) on its own. The equivalence test in
`test_fastpage.py` shows the fast path ends where the reference does, but a guard backed
by a later check can be lost without that test noticing; mutation testing found these
unguarded. Here each is called directly: `prepare_page` answers None for a page it must
not prepare (never raises), `fresh` answers None whenever an op might not be fresh."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import CountingIds, FakeClock

from logsync.chain import chain_start
from logsync.store import Store, fastpage
from tests.test_fastpage import REPLICA, served


@pytest.fixture(scope="module")
def author(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    store = Store.open(tmp_path_factory.mktemp("author"), wall_ms=FakeClock(),
                       new_id=CountingIds("a"))
    for i in range(12):
        arts = [store.put_artifact("patch", f"+line {i}\n", "alice")["id"]] if i % 4 == 0 \
            else None
        store.append_event("task.ask", "s", "r", "alice", body=f"op {i}", artifact_ids=arts)
    yield store
    store.close()


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(tmp_path / "r", wall_ms=FakeClock(), new_id=CountingIds("r"),
                       replica_id=REPLICA)
    yield store
    store.close()


def prepare(page: dict[str, Any], *, key: bytes | None = None, after: int | None = None,
            prev: bytes | None = None) -> fastpage.Prepared | None:
    shas = {a["id"]: a["sha256"] for a in page["artifacts"]}
    return fastpage.prepare_page(page["events"], page["origin"],
                                 page["after"] if after is None else after,
                                 page["prev"] if prev is None else prev, shas, key,
                                 page["signatures"])


def fresh(store: Store, prepared: fastpage.Prepared, page: dict[str, Any], *,
          tip: Any = "held", top: int | None = None) -> Any:
    with store._atomic(durable=False) as conn:
        held_top, held_tip = fastpage.origin_state(conn, prepared.origin)
        return fastpage.fresh(conn, prepared, held_tip if tip == "held" else tip,
                              held_top if top is None else top, page["artifacts"])


@pytest.mark.parametrize("other", ["rep_" + "0" * 32, "rep_" + "f" * 32])  # below, above
def test_an_op_of_another_origin_is_never_prepared(author: Store, other: str) -> None:
    page = copy.deepcopy(served(author, 0, 6))
    op = page["events"][2]
    op.update(origin_replica=other, hlc=op["hlc"][:21] + other)  # a valid op, of `other`
    assert prepare(page) is None
    assert prepare(copy.deepcopy(served(author, 0, 6))) is not None  # the page as served


@pytest.mark.parametrize("junk", ["not an op", None, 7, ["a list"]])
def test_a_page_ending_in_something_not_an_op_is_not_prepared(author: Store, junk: Any) -> None:
    page = copy.deepcopy(served(author, 0, 4))
    page["events"].append(junk)
    assert prepare(page, key=author.public_key) is None
    assert prepare(page) is None


def test_signatures_are_kept_only_when_checked_under_a_key(author: Store) -> None:
    page = served(author, 0, 12)
    assert page["signatures"]  # the page carries its end signature
    unchecked = prepare(page)  # no key known: nothing is verified, so nothing is kept
    assert unchecked is not None and all(s is None for *_, s in unchecked.chain)
    checked = prepare(page, key=author.public_key)
    assert checked is not None
    assert {seq for _, seq, _, s in checked.chain if s is not None} == set(page["signatures"])


@pytest.mark.parametrize("prev", [bytes(32), b"\xff" * 32])
def test_a_first_page_must_chain_from_the_start(author: Store, replica: Store,
                                                prev: bytes) -> None:
    page = served(author, 0, 4)
    forged = prepare(page, prev=prev)  # the digests then chain from `prev`
    assert forged is not None and fresh(replica, forged, page) is None
    honest = prepare(page)
    assert honest is not None and honest.prev == chain_start(author.replica_id)
    assert fresh(replica, honest, page) is not None


def test_nothing_chained_takes_only_a_page_from_the_start(author: Store,
                                                          replica: Store) -> None:
    page = served(author, 3, 4)
    # a page above seq 3 announced as chained from d_0: the store holds nothing
    prepared = prepare(page, prev=chain_start(author.replica_id))
    assert prepared is not None and prepared.after == 3
    assert fresh(replica, prepared, page, tip=None, top=0) is None
    start = prepare(served(author, 0, 4))
    assert start is not None
    assert fresh(replica, start, served(author, 0, 4), tip=None, top=2) is None


def test_a_page_below_our_top_is_not_fresh_even_from_our_tip(author: Store,
                                                             replica: Store) -> None:
    first = served(author, 0, 4)
    assert replica.apply_chained(first["events"], first["artifacts"], first["origin"], 0,
                                 first["prev"], first["signatures"]).applied == 4
    page = served(author, 4, 4)
    prepared = prepare(page)
    assert prepared is not None
    assert fresh(replica, prepared, page) is not None  # from our tip at our top: fresh
    tip = (4, page["prev"])
    for top in (5, 6, 3):
        assert fresh(replica, prepared, page, tip=tip, top=top) is None
    assert fresh(replica, prepared, page, tip=(4, bytes(32)), top=4) is None


def test_an_artifact_held_with_another_sha_than_prepared_is_not_fresh(
        author: Store, replica: Store) -> None:
    page = served(author, 0, 4)  # op 1 names an artifact the page carries
    named = page["events"][0]["artifact_ids"]
    assert named
    replica.apply_remote([], page["artifacts"])  # held now, with its real sha
    shas = {a["id"]: "0" * 64 for a in page["artifacts"]}  # prepared under another sha
    prepared = fastpage.prepare_page(page["events"], page["origin"], 0, page["prev"], shas,
                                     None, page["signatures"])
    assert prepared is not None and prepared.shas == {named[0]: "0" * 64}
    assert fresh(replica, prepared, page) is None
    assert fresh(replica, prepare(page), page) is not None  # the real sha: fresh


def test_an_artifact_carried_twice_is_left_to_the_reference(author: Store) -> None:
    artifacts = served(author, 0, 4)["artifacts"]
    assert fastpage.carried_artifacts(artifacts) is not None
    assert fastpage.carried_artifacts(artifacts + artifacts[:1]) is None


def test_page_shas_reads_what_is_held_and_ignores_what_is_not_an_artifact(
        author: Store, replica: Store) -> None:
    page = served(author, 0, 9)
    held, carried = page["artifacts"][0], page["artifacts"][1]
    replica.apply_remote([], [held])
    junk = ["not an artifact", {"id": 7, "sha256": "x"}, {"id": "art_x"},
            {"id": held["id"], "sha256": "f" * 64}]  # a held sha is never overridden
    with replica._atomic(durable=False) as conn:
        shas = fastpage.page_shas(conn, page["events"], [carried, *junk])
        assert fastpage.held_shas(conn, [held["id"], "art_missing"]) == \
            {held["id"]: held["sha256"]}
    assert shas == {held["id"]: held["sha256"], carried["id"]: carried["sha256"]}


@pytest.mark.parametrize("where", [0, 2, -1])
def test_a_non_op_in_a_signed_page_is_refused_never_raised(author: Store, replica: Store,
                                                           where: int) -> None:
    """`Store.apply_chained` is public: a caller's page holding something that is not an
    op (the wire refuses those before the store) stores nothing of it and raises nothing,
    on the fast path and on the reference path it falls back to (`pagechain.verify_page`)."""
    replica.pin_keys({author.replica_id: author.public_key}, "peer")
    page = copy.deepcopy(served(author, 0, 4))
    page["events"].insert(where if where >= 0 else len(page["events"]), "not an op")
    result = replica.apply_chained(page["events"], page["artifacts"], page["origin"], 0,
                                   page["prev"], page["signatures"])
    assert result.applied == 0 and replica.version_vector() == {}
    assert result.stopped
