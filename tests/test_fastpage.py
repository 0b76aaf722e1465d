"""The fast path of a page (`logsync/store/fastpage.py`, issue 12 item 2) decides nothing
the reference checks would not: on any page, tampered or not, a store applying it with the
fast path ends exactly as one applying it op by op (results, events with their rowids,
links, artifacts, chain entries and signatures, conflicts, quarantine). Planted defects
show it still refuses what the reference refuses, and that a page prepared ahead (in
another thread, by the client) is checked again before it is written."""

from __future__ import annotations

import contextlib
import copy
import gc
import sqlite3
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from conftest import CountingIds, FakeClock, RemoteKit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logsync import model, overlap, prefetch, remoteops
from logsync.chain import canonical_op
from logsync.pagechain import carries_signature
from logsync.responder import LOGSYNC_SERVER, UPSTREAM_HUB
from logsync.store import Store, chainreads, fastpage
from logsync.store import apply as apply_mod
from logsync.store.chaining import ROW_COLUMNS, canonical
from logsync.store.schema import INSERT_EVENT
from tests.test_client import StorePeer, run_round

KIT = RemoteKit()
REPLICA = "rep_" + "7" * 32
OTHER = "rep_" + "5" * 32  # an origin no page here is of
TABLES = {
    "events": "SELECT rowid, * FROM events ORDER BY rowid",
    "event_artifacts": "SELECT * FROM event_artifacts ORDER BY 1, 2",
    "artifacts": "SELECT * FROM artifacts ORDER BY id",
    "logsync_chain": "SELECT * FROM logsync_chain ORDER BY 1, 2",
    "logsync_conflicts": "SELECT * FROM logsync_conflicts ORDER BY 1",
    "logsync_quarantine": "SELECT * FROM logsync_quarantine ORDER BY 1",
}


@contextlib.contextmanager
def reference_only() -> Iterator[None]:
    """Every page judged op by op: the fast path never answers."""
    with mock.patch.object(apply_mod, "_fresh_page", lambda *a: None), \
            mock.patch.object(chainreads, "_fast_apply", lambda *a: None):
        yield


def dump(store: Store) -> dict[str, list[tuple]]:
    conn = sqlite3.connect(store.db_path)
    try:
        return {name: conn.execute(sql).fetchall() for name, sql in TABLES.items()}
    finally:
        conn.close()


@pytest.fixture(scope="module")
def author(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """A signed origin: 40 ops, every fifth naming an artifact, varied metadata."""
    store = Store.open(tmp_path_factory.mktemp("author"), wall_ms=FakeClock(),
                       new_id=CountingIds("a"))
    for i in range(40):
        arts = None
        if i % 5 == 0:
            arts = [store.put_artifact("patch", f"--- a\n+++ b\n+line {i}\n", "alice")["id"]]
        store.append_event("task.ask", "s", "r", "alice", body=f"op {i} é\u2028",
                           topic="t" if i % 3 else None, status="open" if i % 4 else None,
                           metadata={"n": i, "f": i / 3, "nested": {"z": [1, None, True]}},
                           artifact_ids=arts)
    yield store
    store.close()


def replica(root: Path, name: str, author: Store, *, pinned: bool = True) -> Store:
    """A replica that knows the author's key (`pinned`), or one that has never seen it
    (its pages are then chained unchecked, as from an origin that publishes none)."""
    store = Store.open(root / name, wall_ms=FakeClock(), new_id=CountingIds("r"),
                       replica_id=REPLICA)
    if pinned:
        store.pin_keys({author.replica_id: author.public_key}, "peer")
    return store


def served(author: Store, after: int, limit: int) -> dict[str, Any]:
    """A chain page as a logsync server sends it: ops, artifacts, prev, signatures."""
    origin = author.replica_id
    events = author.list_ops(origin, after, limit)
    last = events[-1]["origin_seq"] if events else after
    sigs = {e["origin_seq"]: author.chain_signature(origin, e["origin_seq"]) for e in events
            if carries_signature(e["origin_seq"], last)}
    return {"events": events,
            "artifacts": author.get_artifacts({a for e in events for a in e["artifact_ids"]}),
            "origin": origin, "after": after, "prev": author.chain_digests_at(origin, [after])[0],
            "signatures": sigs}


# ── what a page can go through on the way ────────────────────────────


def _op(page: dict, i: int) -> dict:
    return page["events"][i % len(page["events"])]


DEFECTS = {
    "none": lambda page, i: None,
    "body altered": lambda page, i: _op(page, i).update(body="altered"),
    "invalid op": lambda page, i: _op(page, i).update(type="NOT A TYPE"),
    "op twice": lambda page, i: page["events"].insert(i % len(page["events"]),
                                                      copy.deepcopy(_op(page, i))),
    "ops swapped": lambda page, i: page["events"].reverse(),
    "op dropped": lambda page, i: page["events"].pop(i % len(page["events"])),
    "id of another op": lambda page, i: _op(page, i).update(id=_op(page, i + 1)["id"]),
    "id held": lambda page, i: _op(page, i).update(id=page["held_id"]),
    "artifact dropped": lambda page, i: page["artifacts"].clear(),
    "artifact altered": lambda page, i: [a.update(content=a["content"] + "x")
                                         for a in page["artifacts"]],
    "artifact twice": lambda page, i: page["artifacts"].extend(page["artifacts"][:1]),
    "end signature dropped": lambda page, i: page["signatures"].pop(
        page["events"][-1]["origin_seq"], None),
    "signature altered": lambda page, i: page["signatures"].update(
        {s: bytes(64) for s in page["signatures"]}),
    "prev altered": lambda page, i: page.update(prev=bytes(32)),
    "prev altered high": lambda page, i: page.update(prev=b"\xff" * 32),
    "op of another origin": lambda page, i: _op(page, i).update(
        origin_replica=OTHER, hlc=_op(page, i)["hlc"][:21] + OTHER),
    "not an op at the end": lambda page, i: page["events"].append("not an op"),
    "artifact not an object": lambda page, i: page["artifacts"].append("not an artifact"),
    "metadata altered": lambda page, i: _op(page, i).update(metadata={"n": -1}),
    "seq beyond": lambda page, i: _op(page, -1).update(origin_seq=10**6),
}


def apply(store: Store, page: dict[str, Any], chained: bool) -> Any:
    events, artifacts = page["events"], page["artifacts"]
    if chained:
        return store.apply_chained(events, artifacts, page["origin"], page["after"],
                                   page["prev"], page["signatures"])
    return store.apply_remote(events, artifacts)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(held=st.integers(0, 30), overlap=st.sampled_from([0, 0, 0, 1, 3]),
       limit=st.integers(1, 12), where=st.integers(0, 20), chained=st.booleans(),
       defect=st.sampled_from(["none"] * len(DEFECTS) + sorted(DEFECTS)),
       pinned=st.sampled_from([True, True, False]))
def test_the_fast_path_ends_exactly_where_the_reference_does(
        author, held, overlap, limit, defect, where, chained, pinned):
    """Hypothesis: any page (a slice of a signed origin, possibly overlapping what is
    held, with one planted defect; its key known or not) applied with the fast path
    leaves the store, and answers, exactly as the reference checks do."""
    with tempfile.TemporaryDirectory() as tmp:
        fast = replica(Path(tmp), "fast", author, pinned=pinned)
        slow = replica(Path(tmp), "slow", author, pinned=pinned)
        with reference_only():
            for store in (fast, slow):
                if held:
                    apply(store, served(author, 0, held), chained=True)
        page = served(author, max(0, held - overlap), limit)
        if not page["events"]:
            return
        page["held_id"] = author.list_ops(author.replica_id, 0, 1)[0]["id"]
        DEFECTS[defect](page, where)
        got = apply(fast, copy.deepcopy(page), chained)
        with reference_only():
            want = apply(slow, copy.deepcopy(page), chained)
        assert got == want
        assert dump(fast) == dump(slow)
        fast.close()
        slow.close()


def test_a_fresh_page_goes_the_fast_path_and_the_chain_verifies(author, tmp_path):
    store = replica(tmp_path, "r", author)
    with mock.patch.object(chainreads, "apply_page", side_effect=AssertionError("slow")):
        result = apply(store, served(author, 0, 40), chained=True)  # never op by op
    assert result.applied == 40
    assert store.chain_tip(author.replica_id) == author.chain_tip(author.replica_id)
    assert store.chain_signature(author.replica_id, 40) == \
        author.chain_signature(author.replica_id, 40)
    assert store.audit().ok


# ── planted defects: refused as the reference refuses ────────────────


@pytest.mark.parametrize("defect", ["body altered", "signature altered", "metadata altered",
                                    "artifact altered"])
def test_a_tampered_signed_page_is_refused_and_nothing_is_stored(author, tmp_path, defect):
    store = replica(tmp_path, "r", author)
    page = served(author, 0, 20)
    DEFECTS[defect](page, 3)
    key = author.public_key
    shas = {a["id"]: a["sha256"] for a in page["artifacts"]}
    prepared = fastpage.prepare_page(page["events"], page["origin"], 0, page["prev"], shas,
                                     key, page["signatures"])
    if defect != "artifact altered":  # its declared sha is intact: `fresh` refuses it
        assert prepared is None
    result = apply(store, page, chained=True)
    assert result.applied == 0 and result.quarantined >= 1
    assert store.version_vector() == {}


def test_a_mutant_without_the_signature_check_would_store_a_forgery(author, tmp_path):
    """The equivalence above has teeth: with the fast path's signature check planted out,
    a forged op is stored where the reference refuses it."""
    page = served(author, 0, 10)
    DEFECTS["body altered"](page, 2)
    with mock.patch.object(fastpage, "verify_digest", lambda *a: True):
        mutant = apply(replica(tmp_path, "m", author), copy.deepcopy(page), chained=True)
    with reference_only():
        reference = apply(replica(tmp_path, "r", author), copy.deepcopy(page), chained=True)
    assert mutant.applied == 10 and reference.applied == 0
    assert mutant != reference


def test_a_page_prepared_ahead_is_checked_again_when_it_is_written(author, tmp_path):
    """Prepared before an earlier page landed (its premise, our top at `after`, no longer
    holds), or for other events: never written as prepared."""
    store = replica(tmp_path, "r", author)
    page = served(author, 0, 10)
    prepared = store.prepare_chained(page["events"], page["artifacts"], page["origin"], 0,
                                     page["prev"], page["signatures"])
    assert prepared is not None and prepared.last == 10
    apply(store, page, chained=True)
    again = store.apply_chained(page["events"], page["artifacts"], page["origin"], 0,
                                page["prev"], page["signatures"], prepared=prepared)
    assert (again.applied, again.duplicates) == (0, 10)
    second = served(author, 10, 10)
    other = store.apply_chained(second["events"], second["artifacts"], second["origin"], 10,
                                second["prev"], second["signatures"], prepared=prepared)
    assert other.applied == 10  # the prepared page was for other events: not used
    assert store.version_vector() == {author.replica_id: 20}
    assert len(dump(store)["events"]) == 20


@pytest.mark.parametrize("after", [0, 5])
def test_an_unsigned_page_whose_prev_is_not_our_chain_is_a_divergence(author, tmp_path,
                                                                     after):
    """Planted defect without a key to catch it: the page's `prev` is not our chain at
    `after` (at 0: not d_0). Nothing is applied; the divergence is named."""
    store = replica(tmp_path, "r", author, pinned=False)
    if after:
        apply(store, served(author, 0, after), chained=True)
    page = served(author, after, 10)
    page["prev"] = bytes(32)
    result = apply(store, page, chained=True)
    assert (result.applied, result.diverged) == (0, {author.replica_id: after})
    assert store.version_vector().get(author.replica_id, 0) == after


def test_our_own_origin_never_goes_the_fast_path(author, tmp_path):
    store = Store.open(tmp_path / "own", replica_id=author.replica_id)
    assert store.prepare_chained(served(author, 0, 5)["events"], [], author.replica_id, 0,
                                 bytes(32)) is None


# ── the pieces ───────────────────────────────────────────────────────


texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20)
    | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(metadata=st.dictionaries(texts, json_values, max_size=4),
       optional=st.sampled_from([None, "", "x", "é"]), body=st.sampled_from([None, "", "b\n"]),
       arts=st.lists(st.sampled_from(["art_a", "art_b", "art_c"]), max_size=3))
def test_a_valid_op_chains_the_same_from_its_row_as_as_sent(metadata, optional, body, arts):
    """What lets the fast path hash each op once: the bytes of the validated row (what
    `extend_chains` and `verify` hash) are the bytes of the op as served (what
    `pagechain.verify_page` hashes)."""
    op = KIT.op(KIT.origin(1), 3, metadata=metadata, topic=optional, to_agent=optional,
                status=None, body=body, artifact_ids=arts)
    try:
        row = remoteops.validate_remote_event(op)
    except model.ValidationError:
        return
    shas = {"art_a": "a" * 64, "art_b": "b" * 64, "art_c": "c" * 64}
    values = tuple(row[c] for c in ROW_COLUMNS)
    assert canonical(values, {a: shas[a] for a in row["artifact_ids"]}) == \
        canonical_op(op, [shas[a] for a in arts])


@pytest.mark.parametrize("count", [0, 1, 5, 21, 255, 256, 1024, 1300])
@pytest.mark.parametrize("variables", [32766, 40])
def test_multi_row_inserts_write_what_executemany_writes(tmp_path, count, variables):
    """Same rows, same order, same rowids; a build allowing fewer variables than a chunk
    needs falls back to executemany."""
    conns = [sqlite3.connect(tmp_path / f"{n}.db") for n in ("plain", "chunked")]
    rows = [tuple(f"{c}{i}" if c != "origin_seq" else i for c in ROW_COLUMNS)
            for i in range(count)]
    for conn in conns:
        conn.execute(f"CREATE TABLE events ({', '.join(ROW_COLUMNS)})")
        conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, variables)
    conns[0].executemany(INSERT_EVENT, rows)
    fastpage.run_chunks(conns[1], INSERT_EVENT, rows, fastpage.plan_rows(INSERT_EVENT, rows))
    read = "SELECT rowid, * FROM events ORDER BY rowid"
    assert conns[0].execute(read).fetchall() == conns[1].execute(read).fetchall()


def test_a_fresh_page_validates_each_artifact_once(author, tmp_path):
    """The fast path validates a page's artifacts once (deciding it is fresh) and stores
    those: the same rows as the reference, which validates them for its own checks."""
    page = served(author, 0, 20)
    assert len(page["artifacts"]) == 4
    real, calls = model.validate_remote_artifact, []

    def counting(raw):  # type: ignore[no-untyped-def]
        calls.append(raw["id"])
        return real(raw)

    fast, slow = replica(tmp_path, "fast", author), replica(tmp_path, "slow", author)
    with mock.patch.object(model, "validate_remote_artifact", counting):
        assert apply(fast, page, chained=True).applied == 20
    assert sorted(calls) == sorted(a["id"] for a in page["artifacts"])
    with reference_only():
        apply(slow, page, chained=True)
    assert dump(fast) == dump(slow)


def test_insert_rows_writes_what_executemany_writes_links_and_artifacts(tmp_path):
    """The links and artifacts of a page go in as multi-row statements: the same rows and
    rowids as executemany, `OR IGNORE` still ignoring a link held twice."""
    conns = [sqlite3.connect(tmp_path / f"{n}.db") for n in ("plain", "chunked")]
    links = [(f"ev{i // 2}", f"art{i % 7}") for i in range(700)] + [("ev0", "art0")]
    for conn in conns:
        conn.execute("CREATE TABLE event_artifacts (event_id, artifact_id, "
                     "PRIMARY KEY (event_id, artifact_id))")
    conns[0].executemany(fastpage.INSERT_LINK, links)
    fastpage.insert_rows(conns[1], fastpage.INSERT_LINK, links)
    fastpage.insert_rows(conns[1], fastpage.INSERT_LINK, [])
    read = "SELECT rowid, * FROM event_artifacts ORDER BY rowid"
    assert conns[0].execute(read).fetchall() == conns[1].execute(read).fetchall()
    assert len(conns[1].execute(read).fetchall()) == 700  # the link held twice, once


def test_bulk_settings_hold_while_any_overlapping_round_runs_then_are_restored():
    """Overlapping rounds (several origins, several peers) share one change of the
    interpreter's settings; those found before the first come back after the last,
    whatever the order, also when a round fails."""
    before = (sys.getswitchinterval(), gc.get_threshold())
    bulk = (pytest.approx(overlap.SWITCH_INTERVAL_S),
            (overlap.GC_YOUNG_THRESHOLD, *before[1][1:]))
    first, second = overlap.bulk_settings(), overlap.bulk_settings()
    first.__enter__()
    assert (sys.getswitchinterval(), gc.get_threshold()) == bulk
    second.__enter__()
    first.__exit__(None, None, None)
    assert (sys.getswitchinterval(), gc.get_threshold()) == bulk
    second.__exit__(None, None, None)
    assert (sys.getswitchinterval(), gc.get_threshold()) == before
    with pytest.raises(RuntimeError), overlap.bulk_settings():
        raise RuntimeError("a failed round restores them too")
    assert (sys.getswitchinterval(), gc.get_threshold()) == before


@pytest.mark.parametrize(("profile", "entered"), [(LOGSYNC_SERVER, 1), (UPSTREAM_HUB, 0)])
def test_bulk_settings_are_taken_once_per_round_only_when_pages_are_prepared(
        author, tmp_path, profile, entered):
    """A round preparing pages ahead takes the settings once; a pull from a peer without
    chains (a MemPalace hub) prepares none and leaves the interpreter alone."""
    calls = []

    @contextlib.contextmanager
    def spy():  # type: ignore[no-untyped-def]
        calls.append("enter")
        with overlap.bulk_settings():
            yield

    with mock.patch.object(prefetch, "bulk_settings", spy), \
            mock.patch.object(prefetch, "CORES", 2):
        run_round(replica(tmp_path, "r", author), StorePeer(author, profile=profile),
                  page_limit=8)
    assert len(calls) == entered


def test_a_pull_prepares_pages_ahead_and_ends_as_the_reference(author, tmp_path):
    """The client prepares each prefetched chain page in a worker thread; the store uses
    it, and the pull ends exactly as one judged op by op."""
    used, seen = [], []
    real = Store.apply_chained

    def spy(self, *args, prepared=None, **kw):  # type: ignore[no-untyped-def]
        used.append(prepared is not None)
        seen.append((sys.getswitchinterval(), gc.get_threshold()[0]))
        return real(self, *args, prepared=prepared, **kw)

    fast, slow = replica(tmp_path, "fast", author), replica(tmp_path, "slow", author)
    peer = StorePeer(author, profile=LOGSYNC_SERVER)
    before = sys.getswitchinterval()
    with mock.patch.object(Store, "apply_chained", spy), \
            mock.patch.object(prefetch, "CORES", 2):  # as on a machine with a core to spare
        run_round(fast, peer, page_limit=8)
    # from the first page prepared ahead (the second) to the end of the round
    assert (pytest.approx(overlap.SWITCH_INTERVAL_S), overlap.GC_YOUNG_THRESHOLD) == seen[-1]
    assert sys.getswitchinterval() == before  # and restored
    with reference_only():
        run_round(slow, peer, page_limit=8)
    assert any(used) and len(used) == 5
    assert dump(fast)["events"] == dump(slow)["events"]
    assert dump(fast)["logsync_chain"] == dump(slow)["logsync_chain"]


def test_first_pages_of_several_origins_are_prepared_while_the_first_is_pulled(tmp_path):
    """A round fetches the first pages of several origins at once (a `Batch`): each is
    prepared while the origins before it are pulled, and the store uses it."""
    authors = []
    for n in range(3):
        author = Store.open(tmp_path / f"author{n}")
        for i in range(12):
            author.append_event("task.ask", "s", "r", "alice", body=f"{n} {i}")
        authors.append(author)
    relay = Store.open(tmp_path / "relay")
    for author in authors:
        run_round(relay, StorePeer(author, profile=LOGSYNC_SERVER))
    used: list[tuple[str, int, bool]] = []
    real = Store.apply_chained

    def spy(self, events, artifacts, origin, after, *args, prepared=None, **kw):  # type: ignore[no-untyped-def]
        used.append((origin, after, prepared is not None))
        return real(self, events, artifacts, origin, after, *args, prepared=prepared, **kw)

    target = Store.open(tmp_path / "target")
    with mock.patch.object(Store, "apply_chained", spy), \
            mock.patch.object(prefetch, "CORES", 2):  # as on a machine with a core to spare
        report = run_round(target, StorePeer(relay, profile=LOGSYNC_SERVER))
    assert report.applied == 36
    firsts = {origin: ready for origin, after, ready in used if after == 0}
    assert len(firsts) == 3 and sum(firsts.values()) >= 2
    assert target.version_vector() == relay.version_vector()
    assert target.audit().ok


def test_one_core_prepares_nothing_ahead(author, tmp_path):
    """With nothing to overlap with, the client leaves each page to its apply."""
    used = []
    real = Store.apply_chained

    def spy(self, *args, prepared=None, **kw):  # type: ignore[no-untyped-def]
        used.append(prepared is not None)
        return real(self, *args, prepared=prepared, **kw)

    target = replica(tmp_path, "r", author)
    with mock.patch.object(Store, "apply_chained", spy), mock.patch.object(prefetch, "CORES", 1):
        run_round(target, StorePeer(author, profile=LOGSYNC_SERVER), page_limit=8)
    assert used and not any(used)
    assert target.version_vector() == author.version_vector()
